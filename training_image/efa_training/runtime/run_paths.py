"""Where a run's data and checkpoints are, from explicit flags or from the pipeline's layout.

Two ways to name the same places, so the scripts work both by hand and from the job definitions:
  explicit:  --data /fsx/datasets/wikitext --checkpoint-dir /fsx/checkpoints/run-7
  layout:    --datasets-root /fsx/datasets --dataset wikitext --checkpoints-root /fsx/checkpoints --run-id run-7
AWS Batch passes `Ref::name` only as a whole argument, hence roots plus names. The roots default to
$FSX_MOUNT/datasets and $FSX_MOUNT/checkpoints (the EKS pods set FSX_MOUNT and pass only names).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from efa_training.runtime.errors import UsageError


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in a command line (`--flag VALUE` or `--flag=VALUE`), or None."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def add_layout_flags(p: argparse.ArgumentParser, *, checkpoints: bool = True) -> None:
    fsx = os.environ.get("FSX_MOUNT")
    p.add_argument(
        "--datasets-root",
        default=f"{fsx}/datasets" if fsx else None,
        help="with --dataset: data is DATASETS_ROOT/DATASET (default: $FSX_MOUNT/datasets)",
    )
    p.add_argument(
        "--dataset", default=None, help="dataset name under --datasets-root (a leading 'datasets/' is accepted)"
    )
    if checkpoints:
        p.add_argument(
            "--checkpoints-root",
            default=f"{fsx}/checkpoints" if fsx else None,
            help="with --run-id: checkpoints are CHECKPOINTS_ROOT/RUN_ID (default: $FSX_MOUNT/checkpoints)",
        )


def data_dir(args: argparse.Namespace) -> str:
    if args.data:
        return args.data
    if args.dataset and args.datasets_root:
        root = Path(args.datasets_root)
        name = Path(args.dataset.strip("/"))
        if name.parts and name.parts[0] == root.name:  # "datasets/wikitext" under /fsx/datasets
            name = Path(*name.parts[1:])
        return str(root / name)
    raise UsageError(
        "--data",
        None,
        "no dataset given",
        "--data DIR, env DATA_DIR, or --dataset NAME with --datasets-root (or env FSX_MOUNT)",
    )


def checkpoint_dir(args: argparse.Namespace, flag: str) -> str:
    explicit = getattr(args, flag.lstrip("-").replace("-", "_"))
    if explicit:
        return explicit
    run_id = os.environ.get("RUN_ID") if args.run_id in (None, "local") else args.run_id
    if args.checkpoints_root and run_id:
        return str(Path(args.checkpoints_root) / run_id)
    raise UsageError(
        flag,
        None,
        "no checkpoint directory given",
        f"{flag} DIR, env CHECKPOINT_DIR, or --run-id with --checkpoints-root (or env FSX_MOUNT)",
    )


def expected_nodes_error(expected: int | None) -> str | None:
    """A message if torchrun's node count (GROUP_WORLD_SIZE) differs from --expected-nodes."""
    if expected is None:
        return None
    actual = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    return None if actual == expected else f"{actual} node(s) joined, --expected-nodes is {expected}"


NODE_LOCAL_ENV = "CHECKPOINT_NODE_LOCAL"


def node_local_checkpoints(env: Mapping[str, str]) -> bool:
    """Whether each node writes its own checkpoint folder (SageMaker's /opt/ml/checkpoints) instead of one shared
    folder (FSx for Lustre): env CHECKPOINT_NODE_LOCAL=1 (checkpointing/store.py says what changes)."""
    text = env.get(NODE_LOCAL_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise UsageError(NODE_LOCAL_ENV, text, "not a switch", "1 (a folder per node) or 0/unset (one shared folder)")
    return text == "1"
