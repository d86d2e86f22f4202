"""Turn text files into uint16 token shards with a byte-level tokenizer.

    python prepare_data.py --input corpus/ --output /fsx/datasets/wikitext --val-fraction 0.05

Byte-level: each UTF-8 byte is a token (0..255), 256 separates documents (one
file = one document). No vocabulary file and no network. The holdout split is
taken from the end of every document, so both splits see every source.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import ctr_data
from data import EOT_TOKEN, SPLITS, TOKEN_DTYPE, VOCAB_SIZE, write_shard
from errors import UsageError, exit_with_usage_error

TEXT_SUFFIXES = {".txt", ".md", ".text", ".rst", ".py", ".json", ".csv", ".tsv", ""}


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(TOKEN_DTYPE)


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens if int(t) < 256).decode("utf-8", errors="replace")


def find_inputs(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError("--input", item, "no such file or directory", "text files or folders of them")
    if not files:
        raise UsageError("--input", inputs, "no text files found", f"files ending in {sorted(TEXT_SUFFIXES)}")
    return files


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


def prepare_criteo(files: list[Path], output: Path, val_fraction: float, shard_records: int) -> dict:
    """Criteo text (ctr_data.py) to record shards; the holdout is the end of every file, as for text."""
    output.mkdir(parents=True, exist_ok=True)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as text:
            lines = [line for line in text if line.strip()]
        cut = len(lines) - int(round(len(lines) * val_fraction))
        parts["train"].append(ctr_data.parse_lines(lines[:cut], str(f)))
        parts["val"].append(ctr_data.parse_lines(lines[cut:], str(f)))
    info: dict = {"format": "criteo", "record_bytes": ctr_data.CTR_RECORD.itemsize, "files": len(files), "splits": {}}
    for split, chunks in parts.items():
        records = np.concatenate(chunks)
        for old in output.glob(f"{split}_*"):
            old.unlink()  # a re-run must not leave shards of a previous, larger input behind
        n_shards = -(-len(records) // shard_records)
        for i in range(n_shards):
            chunk = records[i * shard_records : (i + 1) * shard_records]
            ctr_data.write_records(output / f"{split}_{i:06d}{ctr_data.SUFFIX}", chunk)
        info["splits"][split] = {
            "records": len(records),
            "shards": n_shards,
            "click_rate": round(float(records["label"].mean()), 4) if len(records) else None,
        }
    (output / "dataset.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="text files or directories (searched recursively)")
    p.add_argument("--output", required=True, help="directory for {train,val}_NNNNNN.bin shards and dataset.json")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.05,
        help="fraction of each document held out for validation (default 0.05)",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=100_000_000,
        help="tokens per shard file (default 100M = 200 MB); with --format criteo, records per shard (157 bytes each)",
    )
    p.add_argument(
        "--format",
        choices=("text", "criteo"),
        default="text",
        help="text: byte-level token shards for the GPT models; criteo: Criteo click logs (label, 13 integers, "
        "26 hex hashes per line) to record shards for the ctr-* models (default text)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not 0.0 < args.val_fraction < 1.0:
            raise UsageError("--val-fraction", args.val_fraction, "out of range", "0 < fraction < 1")
        if args.shard_tokens < 1:
            raise UsageError("--shard-tokens", args.shard_tokens, "must be positive", ">= 1")
        out = Path(args.output)
        if out.exists() and not out.is_dir():
            raise UsageError("--output", args.output, "is a file", "a directory (created if missing)")
        if args.format == "criteo":
            info = prepare_criteo(find_inputs(args.input), out, args.val_fraction, args.shard_tokens)
        else:
            info = prepare(find_inputs(args.input), out, args.val_fraction, args.shard_tokens)
    except UsageError as err:
        exit_with_usage_error("prepare_data.py", err)
    print(json.dumps({"prepare_data": info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
