"""Click-through data in the Criteo display-advertising format: parsing, and a compact binary form.

Text format (Criteo's Kaggle and 1 TB click logs): one impression per line, 40 tab-separated fields:
    label (0/1) | I1..I13 integer counts (may be empty) | C1..C26 categorical values, 32-bit hex hashes (may be empty)
`prepare-data --format criteo` turns such files into `{split}_{index:06d}.ctr` shards of fixed-size records
(CTR_RECORD, 157 bytes, no padding) behind a 32-byte header, as the token shards are: the label, the integer features
already transformed as DLRM does (log(1 + max(x, 0)), missing as 0) and the 26 hashes as unsigned 32-bit ints; the
model maps a hash to a row of its table with `hash % rows`. A worker's position in the data is one integer, the
samples it has consumed: worker w of W reads blocks t*W + w of `batch` records (ctr_batches), so a worker that is
replaced continues exactly where the one it replaces stopped.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from efa_training.runtime.errors import UsageError
from efa_training.runtime.storage import write_atomically

N_DENSE = 13
N_SPARSE = 26
FIELDS = 1 + N_DENSE + N_SPARSE
CTR_RECORD = np.dtype([("label", "u1"), ("dense", "<f4", (N_DENSE,)), ("sparse", "<u4", (N_SPARSE,))])
MAGIC = b"CTRSHARD"
VERSION = 1
HEADER = struct.Struct("<8sIIQ8x")  # magic | version | record size | records | pad: 32 bytes, as the token shards'
SUFFIX = ".ctr"
SPLITS = ("train", "val")  # as the token shards'


def parse_lines(lines: list[str], source: str = "") -> np.ndarray:
    """Records of Criteo text lines; a malformed line is a UsageError naming its file and line number."""
    out = np.zeros(len(lines), dtype=CTR_RECORD)
    for i, line in enumerate(lines):
        parts = line.rstrip("\r\n").split("\t")
        try:
            if len(parts) != FIELDS:
                raise ValueError(f"{len(parts)} tab-separated fields, not {FIELDS}")
            label = int(parts[0])
            if label not in (0, 1):
                raise ValueError(f"label {parts[0]!r} is not 0 or 1")
            counts = [int(x) if x else 0 for x in parts[1 : 1 + N_DENSE]]
            hashes = [int(x, 16) if x else 0 for x in parts[1 + N_DENSE :]]
            if any(not 0 <= h < 2**32 for h in hashes):
                raise ValueError("a categorical value is not a 32-bit hex hash")
        except ValueError as err:
            raise UsageError(
                "--input", f"{source}:{i + 1}", str(err), "Criteo lines: label, 13 integers, 26 hex hashes"
            ) from None
        out[i]["label"] = label
        out[i]["dense"] = np.log1p(np.maximum(np.array(counts, dtype=np.float64), 0.0))
        out[i]["sparse"] = hashes
    return out


def write_records(path: Path, records: np.ndarray) -> None:
    """One shard, atomically, as the token shards are written."""
    header = HEADER.pack(MAGIC, VERSION, CTR_RECORD.itemsize, len(records))
    write_atomically(path, header, np.ascontiguousarray(records, dtype=CTR_RECORD).tobytes())


def open_records(path: Path) -> np.ndarray:
    """A shard's records, memory-mapped; a wrong or truncated file is a UsageError."""
    size = path.stat().st_size
    if size < HEADER.size:
        raise UsageError("shard", str(path), f"{size} bytes, shorter than the header", "shards of prepare_data.py")
    with open(path, "rb") as f:
        magic, version, itemsize, count = HEADER.unpack(f.read(HEADER.size))
    if magic != MAGIC or version != VERSION or itemsize != CTR_RECORD.itemsize:
        raise UsageError(
            "shard", str(path), "not a Criteo record shard of this version", "prepare_data.py --format criteo"
        )
    if size != HEADER.size + count * itemsize:
        raise UsageError("shard", str(path), f"{size} bytes, not the header's {count} records", "a complete shard")
    return np.memmap(path, dtype=CTR_RECORD, mode="r", offset=HEADER.size, shape=(count,))


class CtrRecords:
    """Every shard of one split, read as one sequence of records."""

    def __init__(self, folder: Path, split: str) -> None:
        paths = sorted(folder.glob(f"{split}_*{SUFFIX}"))
        if not paths:
            raise UsageError("--data", str(folder), f"no {split}_*{SUFFIX} shards", "prepare_data.py --format criteo")
        self.shards = [open_records(p) for p in paths]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.n = int(self.starts[-1])
        if self.n == 0:
            raise UsageError("--data", str(folder), f"the {split} split is empty", "at least one record")

    def take(self, indices: np.ndarray) -> np.ndarray:
        """The records at these global indices (taken modulo the split's size: epochs wrap)."""
        indices = np.asarray(indices) % self.n
        shard = np.searchsorted(self.starts, indices, side="right") - 1
        out = np.empty(len(indices), dtype=CTR_RECORD)
        for s in np.unique(shard):
            rows = shard == s
            out[rows] = self.shards[s][indices[rows] - self.starts[s]]
        return out


def block_indices(worker: int, workers: int, batch: int, position: int) -> np.ndarray:
    """The record indices of the batch a worker reads at `position` (samples it consumed, a multiple of `batch`):
    its block t*workers + worker, t = position // batch."""
    block = (position // batch) * workers + worker
    return np.arange(block * batch, (block + 1) * batch)


def ctr_batches(records: CtrRecords, worker: int, workers: int, batch: int, position: int) -> Iterator[np.ndarray]:
    while True:
        yield records.take(block_indices(worker, workers, batch, position))
        position += batch
