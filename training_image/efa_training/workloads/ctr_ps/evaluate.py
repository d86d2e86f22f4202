"""Validation of the sparse click-through model (the parameter servers' checkpoints, cuts.py): log-loss, the gate's
metric (lower is better, as val_loss is), and AUC on the holdout split, both of the newest loadable checkpoint.

The rows are read from every server's shard (server g holds rows r % servers == g) where a batch needs them, through
memory maps, so validation needs the host memory of the rows it touches, not of the tables (ShardedTable).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from efa_training.checkpointing.format import CheckpointDamaged, newest_meta, step_dirs, verify
from efa_training.runtime.console import log
from efa_training.runtime.errors import UsageError
from efa_training.workloads.ctr_ps.criteo import CtrRecords
from efa_training.workloads.ctr_ps.model import CtrConfig, CtrModel, table_rows

METRIC = "val_logloss"
BATCH = 4096


def holds_ps_checkpoints(root: Path) -> bool:
    meta = (root, _read(root)) if (root / "meta.json").exists() else newest_meta(root)
    return meta is not None and meta[1].get("format") == "ps"


def _read(path: Path) -> dict:
    import json

    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


class ShardedTable:
    """Every server's rows (table f's row r is global row f * rows + r, held by server r % servers), read where they
    are needed: the shards are memory-mapped (torch.load mmap=True), so a reader holds only the rows it gathers. A
    whole ctr-large table is 66 GB; a Trainium environment validates on trn1.2xlarge, which has 32 GiB."""

    def __init__(self, shards: list[torch.Tensor]) -> None:
        self.shards = shards

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        flat, servers = rows.reshape(-1), len(self.shards)
        out = torch.empty(len(flat), *self.shards[0].shape[1:], dtype=self.shards[0].dtype)
        for g, shard in enumerate(self.shards):
            mine = flat % servers == g
            out[mine] = shard[flat[mine] // servers]
        return out.reshape(*rows.shape, *self.shards[0].shape[1:])


def load(path: Path, with_optimizer: bool = False) -> tuple[CtrModel, ShardedTable, dict]:
    """The dense model and the embedding rows of every server; with `with_optimizer`, meta also carries the rows'
    Adagrad accumulators ("accum", a ShardedTable too) and the dense optimizer's state."""
    meta = verify(path, "ps")  # sizes and CRC-32 of every shard, as the servers' resume checks them
    model_cfg = meta["config"]["model"]
    cfg = CtrConfig(model_cfg["rows"], model_cfg["dim"], tuple(model_cfg["bottom"]), tuple(model_cfg["top"]))
    shards = [torch.load(path / f"server_{g}.pt", weights_only=True, mmap=True) for g in range(meta["world_size"])]
    dense = torch.load(path / "dense.pt", weights_only=True)
    model = CtrModel(cfg)
    model.load_state_dict(dense["model"])
    if with_optimizer:
        meta = {**meta, "accum": ShardedTable([s["accum"] for s in shards]), "optimizer": dense["optimizer"]}
    return model.eval(), ShardedTable([s["table"] for s in shards]), meta


@torch.no_grad()
def predict(model: CtrModel, table: ShardedTable, records: np.ndarray) -> np.ndarray:
    logits = []
    for start in range(0, len(records), BATCH):
        batch = records[start : start + BATCH]
        rows = table_rows(torch.from_numpy(batch["sparse"].astype(np.int64)), model.cfg.rows)
        dense = torch.from_numpy(np.ascontiguousarray(batch["dense"]))
        logits.append(model(dense, table[rows]).double().numpy())
    return np.concatenate(logits)


def load_newest(root: Path, with_optimizer: bool = False) -> tuple[CtrModel, ShardedTable, dict, Path]:
    """`load` of a step_* checkpoint, or of the newest loadable one of a checkpoint folder (damaged ones skipped)."""
    candidates = [root] if (root / "meta.json").exists() else step_dirs(root)
    if not candidates:
        raise UsageError("--checkpoint", str(root), "contains no checkpoints", "a --checkpoint-dir of train.py")
    for path in candidates:
        try:
            return (*load(path, with_optimizer), path)
        except (CheckpointDamaged, OSError, RuntimeError, KeyError) as exc:
            log(f"WARNING skipping {path}: {type(exc).__name__}: {exc}")
    raise RuntimeError(f"no loadable checkpoint under {root}")


def evaluate_newest(root: Path, data: Path) -> tuple[float, Path, dict, dict]:
    """(log-loss, checkpoint, its meta, {auc, samples_evaluated}) of the newest loadable checkpoint under root."""
    records = CtrRecords(data, "val")
    model, table, meta, path = load_newest(root)
    holdout = records.take(np.arange(records.n))
    logits = predict(model, table, holdout)
    labels = holdout["label"].astype(np.float64)
    extra = {"auc": auc(labels, logits), "samples_evaluated": int(records.n)}
    return log_loss(labels, logits), path, meta, extra


def base_rate_log_loss(data: Path) -> float:
    """The holdout log-loss of the model that predicts the training split's click rate for every record: what a
    click-through model must beat to have learned anything (the denominator of He et al.'s normalized entropy,
    "Practical Lessons from Predicting Clicks on Ads at Facebook", 2014). Deterministic: labels only, no model."""
    train = CtrRecords(data, "train")
    clicks = sum(float(shard["label"].astype(np.float64).sum()) for shard in train.shards)
    rate = min(max(clicks / train.n, 1e-12), 1 - 1e-12)
    holdout = CtrRecords(data, "val")
    labels = np.concatenate([shard["label"].astype(np.float64) for shard in holdout.shards])
    return log_loss(labels, np.full(len(labels), math.log(rate / (1 - rate))))


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
