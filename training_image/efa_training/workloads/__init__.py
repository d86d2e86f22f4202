"""The workloads this image trains, and the one place that picks one: every entry point asks here, nothing else
names a workload.

  gpt     the GPT decoder, strategies ddp and fsdp, run under torchrun               (workloads/gpt/)
  ctr-ps  the click-through model on parameter servers, strategy ps, run under its
          own supervisor                                                            (workloads/ctr_ps/)

A workload imports the runtime and the checkpoint library, never another workload; the runtime imports no workload
(the launcher's choice of runner goes through `runner` here). Each function imports its workload when called, so the
launcher stays free of torch and a run imports only its own workload. A registry of workload specs would replace
these functions one for one.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from efa_training.runtime.run_paths import data_dir

if TYPE_CHECKING:
    import torch

    from efa_training.runtime.launch.rendezvous import LaunchPlan
    from efa_training.train_config import TrainConfig

GPT, CTR_PS = "gpt", "ctr-ps"
WORKLOAD_OF_STRATEGY = {"ddp": GPT, "fsdp": GPT, "ps": CTR_PS}
WORKLOAD_OF_FORMAT = {"text": GPT, "criteo": CTR_PS}  # prepare-data --format
# torchrun restarts every worker of a node when one fails, which a parameter server must not do
# (workloads/ctr_ps/supervisor.py says why).
RUNNERS = {GPT: "torchrun", CTR_PS: "supervisor"}


def workload_for(strategy: str | None) -> str:
    """The workload of a --strategy (unset: the default ddp; an unknown one: gpt, whose train.py refuses it)."""
    return WORKLOAD_OF_STRATEGY.get(strategy or "ddp", GPT)


def runner(strategy: str | None) -> str:
    """How the launcher runs `train` with this --strategy: "torchrun", or "supervisor" (the workload's own)."""
    return RUNNERS[workload_for(strategy)]


def supervisor_environment(plan: LaunchPlan) -> dict[str, str]:
    """The supervisor's node layout, from the plan torchrun would have had."""
    from efa_training.workloads.ctr_ps.nodes import ps_environment

    return ps_environment(plan)


def train(cfg: TrainConfig, expected_nodes: int | None, argv: list[str]) -> int:
    """The `train` command's workload, run in this process; its exit code (runtime/errors.py)."""
    if workload_for(cfg.strategy) == CTR_PS:
        from efa_training.workloads.ctr_ps import run as ctr_ps

        return ctr_ps.train(cfg, expected_nodes, argv)
    from efa_training.workloads.gpt import run as gpt

    return gpt.train(cfg, expected_nodes)


def evaluate(root: Path, args: argparse.Namespace, device: torch.device) -> tuple[str, tuple[float, Path, dict, dict]]:
    """(metric, (value, checkpoint, its meta, extra fields)) of the newest loadable checkpoint under root, on the
    holdout split of validate.py's data: the workload is the one whose checkpoints the folder holds."""
    from efa_training.workloads.ctr_ps import evaluate as ctr_ps

    if ctr_ps.holds_ps_checkpoints(root):  # the sparse model: log-loss (the gate) and AUC of click predictions
        return ctr_ps.METRIC, ctr_ps.evaluate_newest(root, Path(data_dir(args)))
    from efa_training.workloads.gpt import evaluate as gpt

    return gpt.METRIC, gpt.evaluate_newest(root, args, device)


def prepare_data(fmt: str, files: list[Path], output: Path, val_fraction: float, shard_size: int) -> dict:
    """The `prepare-data` command's shards of one format; the dataset.json it wrote."""
    if WORKLOAD_OF_FORMAT[fmt] == CTR_PS:
        from efa_training.workloads.ctr_ps.prepare_data import prepare_criteo

        return prepare_criteo(files, output, val_fraction, shard_size)
    from efa_training.workloads.gpt.prepare_data import prepare

    return prepare(files, output, val_fraction, shard_size)
