"""Criteo-format click logs with a known answer: the labels follow a known logistic model (true_logit), so a test
or the local run measures quality against the best any model can do, without downloading anything.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from efa_training.workloads.ctr_ps.criteo import N_DENSE, N_SPARSE


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
