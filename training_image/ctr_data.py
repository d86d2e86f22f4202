"""Click-through data in the Criteo display-advertising format: parsing, a compact binary form, and a generator.

Text format (Criteo's Kaggle and 1 TB click logs): one impression per line, 40 tab-separated fields:
    label (0/1) | I1..I13 integer counts (may be empty) | C1..C26 categorical values, 32-bit hex hashes (may be empty)
`prepare_data.py --format criteo` turns such files into `{split}_{index:06d}.ctr` shards of fixed-size records
(CTR_RECORD, 157 bytes, no padding) behind a 32-byte header, as the token shards are: the label, the integer features
already transformed as DLRM does (log(1 + max(x, 0)), missing as 0) and the 26 hashes as unsigned 32-bit ints; the
model maps a hash to a row of its table with `hash % rows`. A worker's position in the data is one integer, the
samples it has consumed: worker w of W reads blocks t*W + w of `batch` records (ctr_batches), so a worker that is
replaced continues exactly where the one it replaces stopped.

The generator writes Criteo-format text whose labels follow a known logistic model (true_logit), so a test or the
local run measures quality against the best any model can do, without downloading anything.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from data import write_atomically
from errors import UsageError

N_DENSE = 13
N_SPARSE = 26
FIELDS = 1 + N_DENSE + N_SPARSE
CTR_RECORD = np.dtype([("label", "u1"), ("dense", "<f4", (N_DENSE,)), ("sparse", "<u4", (N_SPARSE,))])
MAGIC = b"CTRSHARD"
VERSION = 1
HEADER = struct.Struct("<8sIIQ8x")  # magic | version | record size | records | pad: 32 bytes, as data.HEADER
SUFFIX = ".ctr"


# ---- text -> records --------------------------------------------------------------------------------------------


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


# ---- a generator with a known answer ----------------------------------------------------------------------------


def _weights(seed: int, cardinality: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The true model: one weight per categorical value of each feature, one per dense feature, a bias; and the
    mean count of each dense feature (its values are Poisson counts)."""
    rng = np.random.default_rng(seed)
    # Scaled so that the logit's spread is about 1.3 and about a quarter of impressions are clicks, as in Criteo's
    # logs: the bias offsets the categorical weights' expected sum under the Zipf frequencies.
    sparse_w = rng.normal(0.0, 0.25, size=(N_SPARSE, cardinality))
    dense_w, mean_counts = rng.normal(0.0, 0.3, size=N_DENSE), rng.uniform(0.5, 20.0, size=N_DENSE)
    return sparse_w, dense_w, np.array([-1.2 - float((sparse_w @ zipf(cardinality)).sum())]), mean_counts


def zipf(cardinality: int) -> np.ndarray:
    """How often each value id occurs: the k-th most common in proportion to 1/k."""
    weights = 1 / np.arange(1, cardinality + 1, dtype=np.float64)
    return weights / weights.sum()


def value_hash(feature: int, value: np.ndarray) -> np.ndarray:
    """The 32-bit hash the generator writes for a feature's value id (distinct per feature, spread over 2**32)."""
    return (
        (value.astype(np.uint64) * np.uint64(2654435761) + np.uint64(feature * 97_531 + 1)) % np.uint64(2**32)
    ).astype(np.uint32)


def true_logit(records: np.ndarray, seed: int, cardinality: int) -> np.ndarray:
    """The generator's own logit for records it wrote: what a perfect model predicts."""
    sparse_w, dense_w, bias, mean_counts = _weights(seed, cardinality)
    centred = records["dense"].astype(np.float64) - np.log1p(mean_counts)
    logit = np.full(len(records), bias[0]) + centred @ dense_w
    for f in range(N_SPARSE):
        ids = np.arange(cardinality)
        lookup = dict(zip(value_hash(f, ids).tolist(), sparse_w[f].tolist(), strict=True))
        logit += np.array([lookup[h] for h in records["sparse"][:, f].tolist()])
    return logit


def generate(path: Path, rows: int, seed: int = 0, cardinality: int = 100) -> None:
    """`rows` Criteo-format lines whose labels are drawn from true_logit; values Zipf-distributed, as in real logs."""
    rng = np.random.default_rng(seed + 1)
    sparse_w, dense_w, bias, mean_counts = _weights(seed, cardinality)
    ids = rng.choice(cardinality, size=(rows, N_SPARSE), p=zipf(cardinality))
    counts = rng.poisson(lam=mean_counts, size=(rows, N_DENSE))
    missing = rng.random((rows, N_DENSE)) < 0.05  # Criteo leaves fields empty; parse_lines reads them as 0
    counts[missing] = 0  # so the true model sees what a reader of the file sees
    dense = np.log1p(counts)
    logit = bias[0] + (dense - np.log1p(mean_counts)) @ dense_w + sparse_w[np.arange(N_SPARSE), ids].sum(axis=1)
    labels = rng.random(rows) < 1 / (1 + np.exp(-logit))
    hashes = np.stack([value_hash(f, ids[:, f]) for f in range(N_SPARSE)], axis=1)
    with open(path, "w") as f:
        for r in range(rows):
            ints = ["" if missing[r, i] else str(counts[r, i]) for i in range(N_DENSE)]
            f.write("\t".join([str(int(labels[r])), *ints, *(f"{h:08x}" for h in hashes[r])]) + "\n")


# ---- quality ----------------------------------------------------------------------------------------------------


def log_loss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits, computed stably (log(1 + e^x) - y*x)."""
    x = logits.astype(np.float64)
    return float(np.mean(np.logaddexp(0.0, x) - labels * x))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve: the probability that a random click scores above a random non-click (ties half)."""
    labels = labels.astype(bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    # Average ranks over ties (1-based), so equal scores count half.
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))
