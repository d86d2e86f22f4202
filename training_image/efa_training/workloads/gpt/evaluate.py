"""The GPT workload's validation: mean cross-entropy per token (`val_loss`, lower is better) of a checkpoint on the
holdout split, in fp32 on one device so that the value is comparable across devices."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from efa_training.runtime.errors import UsageError
from efa_training.runtime.run_paths import data_dir
from efa_training.workloads.gpt.data import TokenStream
from efa_training.workloads.gpt.model import GPT
from efa_training.workloads.gpt.saved_model import find_and_load

METRIC = "val_loss"


@torch.no_grad()
def evaluate(model: GPT, data: Path, batch_size: int, max_batches: int, device: torch.device) -> tuple[float, int]:
    """Mean cross-entropy per predicted token over non-overlapping windows of the val split."""
    stream = TokenStream(data, "val")
    seq = model.cfg.seq_len
    n_windows = (stream.n_tokens - 1) // seq
    if n_windows < 1:
        raise UsageError(
            "--data",
            str(data),
            f"val split has {stream.n_tokens} tokens, fewer than one window of {seq + 1}",
            "a larger --val-fraction in prepare_data.py",
        )
    model.eval().to(device)
    total, count = 0.0, 0
    for b, start in enumerate(range(0, n_windows, batch_size)):
        if max_batches and b >= max_batches:
            break
        rows = [stream.read(k * seq, seq + 1) for k in range(start, min(start + batch_size, n_windows))]
        batch = torch.from_numpy(np.stack(rows)).to(device)
        loss = model(batch[:, :-1], batch[:, 1:])  # fp32 on purpose: comparable across devices
        total += float(loss) * batch[:, 1:].numel()
        count += batch[:, 1:].numel()
    return total / count, count


def evaluate_newest(root: Path, args: argparse.Namespace, device: torch.device) -> tuple[float, Path, dict, dict]:
    """(val_loss, checkpoint, its meta, {tokens_evaluated}) of the newest loadable checkpoint under root, on the
    data, batch size and batch count validate.py's flags name."""
    model, meta, path = find_and_load(root)
    measured, tokens = evaluate(model, Path(data_dir(args)), args.batch_size, args.max_batches, device)
    return measured, path, meta, {"tokens_evaluated": tokens}
