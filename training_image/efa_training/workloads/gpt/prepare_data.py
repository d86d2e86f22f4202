"""The GPT workload's data: text files to uint16 token shards with a byte-level tokenizer (`prepare-data`).

Byte-level: each UTF-8 byte is a token (0..255), 256 separates documents (one file = one document). No vocabulary file
and no network. The holdout split is taken from the end of every document, so both splits see every source.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from efa_training.workloads.gpt.data import EOT_TOKEN, SPLITS, TOKEN_DTYPE, VOCAB_SIZE, write_shard


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(TOKEN_DTYPE)


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens if int(t) < 256).decode("utf-8", errors="replace")


def prepare(files: list[Path], output: Path, val_fraction: float, shard_tokens: int) -> dict:
    output.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for f in files:
        doc = encode(f.read_text(encoding="utf-8", errors="replace"))
        cut = len(doc) - int(round(len(doc) * val_fraction))
        eot = np.array([EOT_TOKEN], dtype=TOKEN_DTYPE)
        parts["train"] += [doc[:cut], eot]
        if cut < len(doc):
            parts["val"] += [doc[cut:], eot]
    info: dict = {
        "tokenizer": "byte",
        "vocab_size": VOCAB_SIZE,
        "eot_token": EOT_TOKEN,
        "dtype": "uint16",
        "documents": len(files),
        "splits": {},
    }
    for split, chunks in parts.items():
        tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=TOKEN_DTYPE)
        for old in output.glob(f"{split}_*.bin"):
            old.unlink()  # a re-run must not leave shards of a previous, larger corpus behind
        n_shards = max(1, -(-tokens.size // shard_tokens))
        for i in range(n_shards):
            if tokens.size:
                write_shard(output / f"{split}_{i:06d}.bin", tokens[i * shard_tokens : (i + 1) * shard_tokens])
        info["splits"][split] = {"tokens": int(tokens.size), "shards": n_shards if tokens.size else 0}
    (output / "dataset.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
