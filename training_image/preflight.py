"""What train.py refuses before any process group exists, each with one line and exit code 2 (or 4, diverged).

Every rank runs the same checks on the same inputs, so all ranks reach the same verdict without a collective,
and a wrong flag costs seconds instead of a failed step on every node.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from checkpoint_format import STRATEGY_OF_FORMAT, newest_meta
from ctr_data import CtrRecords
from ctr_model import CTR_SIZES
from data import list_shards, max_token_id, open_shard
from distributed import resolve_device
from divergence import check_not_diverged
from errors import UsageError
from model import ModelConfig
from run_paths import expected_nodes_error

if TYPE_CHECKING:
    from train_config import TrainConfig


def check_before_start(cfg: TrainConfig, expected_nodes: int | None) -> None:
    nodes_problem = expected_nodes_error(expected_nodes)
    if nodes_problem:
        raise UsageError("--expected-nodes", expected_nodes, nodes_problem, "the job's node count")
    resolve_device(cfg.device)
    if cfg.strategy == "ps":  # the sparse model: Criteo records, ps.py's checkpoints
        CtrRecords(Path(cfg.data), "train")
        check_reusable(Path(cfg.checkpoint_dir), cfg.strategy, cfg.model, _json(asdict(CTR_SIZES[cfg.model])))
        probe_writable(Path(cfg.checkpoint_dir))
        return
    check_data(Path(cfg.data), cfg.model_config())
    check_not_diverged(cfg)
    # A wrong or unwritable --checkpoint-dir fails in one line, not at the first save.
    check_reusable(Path(cfg.checkpoint_dir), cfg.strategy, cfg.model, asdict(cfg.model_config()))
    probe_writable(Path(cfg.checkpoint_dir))


def check_data(data_dir: Path, mcfg: ModelConfig) -> None:
    """A wrong --data is the commonest mistake; token ids beyond the vocabulary would end in an IndexError (a
    device-side assert on GPU) mid-run. The largest id of each shard is in its header: one number per shard."""
    tokens = 0
    for shard in list_shards(data_dir, "train"):
        tokens += open_shard(shard).size
        largest = max_token_id(shard)
        if largest is not None and largest >= mcfg.vocab_size:
            raise UsageError(
                "shard",
                str(shard),
                f"holds token id {largest}, beyond the model's vocabulary of {mcfg.vocab_size} ids",
                "shards tokenized for this model's vocabulary",
            )
    if tokens < mcfg.seq_len + 1:
        raise UsageError(
            "--seq-len",
            mcfg.seq_len,
            f"the train split of {data_dir} has only {tokens} tokens",
            f"at most {max(tokens - 1, 0)} for this data, or more data",
        )


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


def _json(config: dict) -> dict:
    """As meta.json holds it: tuples become lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def probe_writable(root: Path) -> None:
    """Create the directory and write+delete a file in it, so a read-only or unmounted volume is a
    one-line usage error at start-up, not a traceback at the first save."""
    probe = root / f".write-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            "--checkpoint-dir",
            str(root),
            f"not writable ({type(exc).__name__}: {exc.strerror or exc})",
            "a writable directory (is the shared file system mounted?)",
        ) from None
