"""The GPT workload's `train`: its pre-flight checks, then the Trainer under torchrun, the process group always torn
down (so a failing rank does not leave its peers waiting on a dead group)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from efa_training.runtime.distributed import destroy_distributed, init_distributed
from efa_training.workloads.gpt.preflight import check_before_start
from efa_training.workloads.gpt.trainer import Trainer

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


def train(cfg: TrainConfig, expected_nodes: int | None) -> int:
    check_before_start(cfg, expected_nodes)
    try:
        return Trainer(cfg, init_distributed(cfg.device)).fit()
    finally:
        destroy_distributed()  # always, so a failing rank does not leave peers waiting on a dead group
