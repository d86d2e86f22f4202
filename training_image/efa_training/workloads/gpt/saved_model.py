"""A model from a checkpoint on disk, verified as train.py's resume verifies it: what validation evaluates and what an
incremental run (train.py --init-from) starts from. Either format (DDP's full state, FSDP2's DCP shards), read by one
process on the CPU: a checkpoint written on any device loads here (tests/training/test_xla_path.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from efa_training.checkpointing.format import CheckpointDamaged, step_dirs, verify
from efa_training.runtime.console import log
from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt.model import GPT, ModelConfig, fused_qkv


def load_model(ckpt_dir: Path) -> tuple[GPT, dict]:
    """A checkpoint that passes the same verification as train.py's resume (manifest sizes and CRCs), loaded."""
    meta = verify(ckpt_dir, None)
    model = GPT(ModelConfig(**meta["config"]["model"]))
    if meta["format"] == "full":
        state = torch.load(ckpt_dir / "state.pt", map_location="cpu", weights_only=True)["model"]
    else:
        import torch.distributed.checkpoint as dcp

        # DCP loads by key: a checkpoint of a release up to 0.8.0 holds each attention's fused qkv layer.
        state = fused_qkv(model.state_dict()) if fused_attention(meta) else model.state_dict()
        # Single process reads the shards of any layout (FSDP, tensor-parallel) back into full tensors.
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({"model": state}, checkpoint_id=str(ckpt_dir), no_dist=True)
    model.load_state_dict(state)  # a fused qkv is split on load (model.split_fused_qkv)
    return model, meta


def fused_attention(meta: dict) -> bool:
    """Whether a checkpoint was written by a release up to 0.8.0, whose attention had one fused qkv layer: its
    training settings lack --tensor-parallel, which 0.9.0 added with the split."""
    return "tensor_parallel" not in meta.get("config", {}).get("train", {})


def find_and_load(checkpoint: Path, flag: str = "--checkpoint") -> tuple[GPT, dict, Path]:
    """A step_* checkpoint, or the newest loadable one of a checkpoint folder (damaged ones skipped, not moved)."""
    if (checkpoint / "meta.json").exists():
        try:
            return (*load_model(checkpoint), checkpoint)
        except CheckpointDamaged as exc:
            raise RuntimeError(f"checkpoint {checkpoint} is damaged: {exc}") from None
    if not checkpoint.is_dir():
        raise UsageError(
            flag,
            str(checkpoint),
            "not a checkpoint or checkpoint directory",
            "a step_* directory or the --checkpoint-dir of train.py",
        )
    candidates = step_dirs(checkpoint)
    if not candidates:
        raise UsageError(flag, str(checkpoint), "contains no checkpoints", "a --checkpoint-dir of train.py")
    for path in candidates:  # newest first, as train.py resumes; damaged ones are skipped, not moved
        try:
            return (*load_model(path), path)
        # DCP raises CheckpointException, a BaseException in torch 2.13: caught by name, not by Exception.
        except (Exception, CheckpointException) as exc:
            reason = str(exc) if isinstance(exc, CheckpointDamaged) else f"{type(exc).__name__}: {exc}"
            log(f"WARNING skipping {path}: {reason.splitlines()[0] if reason else ''}")
    raise RuntimeError(f"no loadable checkpoint under {checkpoint}")
