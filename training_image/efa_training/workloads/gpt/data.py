"""Token shards on disk and a deterministic, resumable batch iterator.

Shard format (`{split}_{index:06d}.bin`): a 32-byte header, then uint16 tokens.
  header = magic b"GPTSHARD" | uint32 version | uint32 itemsize (2) | uint64 n_tokens
           | uint32 1 + largest token id (0: not recorded) | 4 pad bytes
The header lets a reader reject a wrong dtype, a truncated file or token ids beyond the
model's vocabulary before training starts instead of failing mid-run or training on garbage. A sidecar
`dataset.json` records the tokenizer and split sizes for humans (the training code does not read it).

Data position: the loader is a pure function of (seed, sample index), and one
integer `samples_consumed` (global, summed over ranks) is the whole resumable
state. Because it does not depend on the world size, an elastic restart with a
different number of nodes continues from the same place in the data.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from efa_training.runtime.errors import UsageError
from efa_training.runtime.storage import write_atomically

MAGIC = b"GPTSHARD"
VERSION = 1
HEADER = struct.Struct("<8sIIQ8x")  # 32 bytes
# In the first 4 pad bytes: 1 + the largest token id, so the vocabulary check at start reads one number per
# shard instead of every token. 0 (shards written before it was recorded) means "scan the shard".
MAX_ID = struct.Struct("<I")
MAX_ID_OFFSET = 24
TOKEN_DTYPE = np.uint16
EOT_TOKEN = 256  # byte-level tokenizer: ids 0..255 are bytes, 256 ends a document
VOCAB_SIZE = 257
SPLITS = ("train", "val")


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """Write one shard atomically (temp name, fsync, rename)."""
    tokens = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE)
    header = bytearray(HEADER.pack(MAGIC, VERSION, TOKEN_DTYPE().itemsize, tokens.size))
    MAX_ID.pack_into(header, MAX_ID_OFFSET, int(tokens.max()) + 1 if tokens.size else 0)
    write_atomically(path, bytes(header), tokens.tobytes())


def open_shard(path: Path) -> np.memmap:
    size = path.stat().st_size
    if size < HEADER.size:
        raise UsageError(
            "shard", str(path), f"file of {size} bytes is shorter than the header", "shards written by prepare_data.py"
        )
    with open(path, "rb") as f:
        magic, version, itemsize, n_tokens = HEADER.unpack(f.read(HEADER.size))
    if magic != MAGIC or version != VERSION:
        raise UsageError(
            "shard",
            str(path),
            "not a token shard (bad magic/version)",
            f"header {MAGIC.decode()} v{VERSION} from prepare_data.py",
        )
    if itemsize != TOKEN_DTYPE().itemsize:
        raise UsageError("shard dtype", str(path), f"{itemsize}-byte tokens", "uint16 (2-byte) tokens")
    if size != HEADER.size + n_tokens * itemsize:
        raise UsageError(
            "shard", str(path), f"size {size} does not match header ({n_tokens} tokens): truncated?", "a complete shard"
        )
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER.size, shape=(n_tokens,))


def max_token_id(path: Path) -> int | None:
    """The largest token id in a shard (None if it is empty): from the header, else by a scan."""
    tokens = open_shard(path)
    with open(path, "rb") as f:
        (recorded,) = MAX_ID.unpack(f.read(HEADER.size)[MAX_ID_OFFSET : MAX_ID_OFFSET + MAX_ID.size])
    if recorded:
        return recorded - 1
    return int(tokens.max()) if tokens.size else None


def list_shards(data_dir: Path, split: str) -> list[Path]:
    if not data_dir.exists():
        raise UsageError("--data", str(data_dir), "directory does not exist", "a directory made by prepare_data.py")
    if not data_dir.is_dir():
        raise UsageError("--data", str(data_dir), "not a directory", "a directory made by prepare_data.py")
    shards = sorted(data_dir.glob(f"{split}_*.bin"))
    if not shards:
        raise UsageError(
            "--data", str(data_dir), f"no {split}_*.bin shards found", "a directory made by prepare_data.py"
        )
    return shards


class TokenStream:
    """All shards of one split seen as one long token array, without loading them."""

    def __init__(self, data_dir: Path, split: str) -> None:
        self.shards = [open_shard(p) for p in list_shards(data_dir, split)]
        self.starts = np.cumsum([0] + [s.size for s in self.shards])
        self.n_tokens = int(self.starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        out = np.empty(length, dtype=np.int64)
        filled = 0
        i = int(np.searchsorted(self.starts, start, side="right") - 1)
        while filled < length:
            shard, lo = self.shards[i], start + filled - int(self.starts[i])
            take = min(length - filled, shard.size - lo)
            out[filled : filled + take] = shard[lo : lo + take]
            filled += take
            i += 1
        return out


@dataclass
class BatchSpec:
    seq_len: int
    micro_batch: int
    rank: int
    world_size: int
    seed: int


class SequenceBatches:
    """Yields (inputs, targets) int64 CPU tensors of shape [micro_batch, seq_len].

    Sample k is the window tokens[k*T : k*T+T+1] of the split; each epoch visits
    all samples in a seeded permutation. Each global micro-step consumes
    world_size*micro_batch samples; rank r takes its own contiguous slice.
    """

    def __init__(self, stream: TokenStream, spec: BatchSpec, samples_consumed: int = 0, shuffle: bool = True) -> None:
        self.stream, self.spec, self.shuffle = stream, spec, shuffle
        self.n_samples = (stream.n_tokens - 1) // spec.seq_len
        if self.n_samples < 1:
            raise UsageError(
                "--data",
                "train split",
                f"{stream.n_tokens} tokens is less than one sequence of {spec.seq_len + 1}",
                "more text, or a smaller --seq-len",
            )
        self.position = samples_consumed
        self._perm_epoch, self._perm = -1, np.arange(0)

    def _sample_index(self, global_index: int) -> int:
        epoch, offset = divmod(global_index, self.n_samples)
        if not self.shuffle:
            return offset
        if epoch != self._perm_epoch:
            # Per-epoch permutation from (seed, epoch) only: identical on every rank and after resume.
            self._perm = np.random.default_rng([self.spec.seed, epoch]).permutation(self.n_samples)
            self._perm_epoch = epoch
        return int(self._perm[offset])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spec
        first = self.position + s.rank * s.micro_batch
        rows = [
            self.stream.read(self._sample_index(first + j) * s.seq_len, s.seq_len + 1) for j in range(s.micro_batch)
        ]
        self.position += s.world_size * s.micro_batch
        batch = torch.from_numpy(np.stack(rows))
        return batch[:, :-1], batch[:, 1:]
