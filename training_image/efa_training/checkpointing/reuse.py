"""Whether a run may reuse a checkpoint folder: refused when its newest checkpoint is another strategy's or model's.

Loading it would fail with a size mismatch, make DCP overwrite part of the model, or skip every checkpoint and
silently train from step 0. Reads only meta.json, before any process group exists (each workload's pre-flight), and
only one that passes the resume's own check of it (format.check_meta): a damaged newest checkpoint is the resume's
to set aside, not a reason to refuse the run.
"""

from __future__ import annotations

from pathlib import Path

from efa_training.checkpointing.format import STRATEGY_OF_FORMAT, newest_meta
from efa_training.runtime.errors import UsageError


def check_reusable(root: Path, strategy: str, model_name: str, model_config: dict) -> None:
    """Refuse a --checkpoint-dir whose newest checkpoint another --strategy or --model wrote.

    Loading it would fail with a size mismatch, make DCP overwrite part of the model, or skip
    every checkpoint and silently train from step 0. Reads only meta.json.
    """
    found = newest_meta(root)
    if found is None:
        return
    path, meta = found
    problems = _differences(meta, strategy, model_name, model_config)
    if problems:
        raise UsageError(
            "--checkpoint-dir",
            str(root),
            f"holds checkpoints of {' '.join(problems)} (newest: {path.name}), "
            f"this run is --strategy {strategy} --model {model_name}",
            "the same --strategy/--model (and --seq-len) as those checkpoints, or a new --checkpoint-dir",
        )


def _differences(meta: dict, strategy: str, model_name: str, model_config: dict) -> list[str]:
    config = meta["config"]
    held_strategy = STRATEGY_OF_FORMAT.get(meta["format"], repr(meta["format"]))
    held_model = (config.get("train") or {}).get("model", "?")
    held_arch = config.get("model")
    problems = []
    if held_strategy != strategy:
        problems.append(f"--strategy {held_strategy}")
    if held_model != model_name:
        problems.append(f"--model {held_model}")
    elif isinstance(held_arch, dict) and held_arch != model_config:
        differ = sorted(k for k in set(held_arch) | set(model_config) if held_arch.get(k) != model_config.get(k))
        problems.append("model " + ", ".join(f"{k}={held_arch.get(k)}" for k in differ))
    return problems


def as_meta_json(config: dict) -> dict:
    """A config as meta.json holds it: tuples become lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
