"""The run's one handle on its checkpoints: the resume, then a save at every step the schedule names.

The trainer reports every finished step; the manager alone decides whether to save at it (schedule.py says which
steps). The saving and the resume are store.py's CheckpointStore: torch.save of the full state for DDP,
torch.distributed.checkpoint shards for FSDP2, both atomic and verified.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from efa_training.checkpointing.schedule import SaveSchedule, young_daly_steps
from efa_training.checkpointing.state import TrainerState
from efa_training.checkpointing.store import CheckpointStore
from efa_training.runtime.console import log
from efa_training.runtime.distributed import Runtime


class SaveSettings(Protocol):
    """The run settings the manager reads (the train command's TrainConfig has them)."""

    checkpoint_dir: str
    strategy: str  # fsdp: DCP shards; any other: one full state
    keep_last: int
    checkpoint_every: int
    max_steps: int
    mtbf_hours: float


def young_daly_interval(save_s: float, step_times: list[float], mtbf_hours: float, rt: Runtime) -> int:
    """The Young/Daly interval from the slowest rank's figures, agreed by one all-reduce, so every rank saves at
    the same steps."""
    times = sorted(step_times[1:] or step_times)  # the first step after a (re)start includes warm-up
    measured = torch.tensor([save_s, times[len(times) // 2]], dtype=torch.float64, device=rt.device)
    dist.all_reduce(measured, op=dist.ReduceOp.MAX)
    save_s, step_s = measured.tolist()
    steps, seconds = young_daly_steps(save_s, step_s, mtbf_hours)
    if rt.is_main:
        log(
            f"checkpoint: every {steps} steps (Young/Daly: sqrt(2 x {save_s:.3g} s per save x {mtbf_hours:g} h "
            f"MTBF) = {seconds:.0f} s at {step_s:.3g} s per step)"
        )
    return steps


class CheckpointManager:
    """Resumes the run, then saves at the steps the schedule names; counts what saving cost."""

    def __init__(
        self,
        cfg: SaveSettings,
        rt: Runtime,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        config_record: dict,
        node_local: bool = False,
    ) -> None:
        self.store = CheckpointStore(
            Path(cfg.checkpoint_dir),
            "dcp" if cfg.strategy == "fsdp" else "full",
            cfg.keep_last,
            rt.rank,
            rt.world_size,
            local_rank=rt.local_rank,
            node_local=node_local,
        )
        self.schedule = SaveSchedule(cfg.checkpoint_every, cfg.max_steps)
        self.mtbf_hours, self.rt, self.config_record = cfg.mtbf_hours, rt, config_record
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.last_saved = -1  # the step of the newest checkpoint, -1 before there is one
        self.saves, self.save_seconds = 0, 0.0  # the training stall caused by saving, in this process
        self.longest_save = 0.0  # seconds: what a stop before a deadline must leave room for (launch/stop_by.py)

    def resume(self) -> tuple[TrainerState, Path | None]:
        """The newest loadable checkpoint restored into model, optimizer, scheduler and RNGs, or a fresh state."""
        resumed = self.store.load_latest(self.model, self.optimizer, self.scheduler, self.rt.device)
        if resumed is None:
            return TrainerState(), None
        state, path = resumed
        self.last_saved = state.step
        return state, path

    def after_step(self, state: TrainerState, stopping: bool, step_times: list[float]) -> Path | None:
        """Save if this step is a save step (collective: every rank calls it with the same arguments)."""
        if not self.schedule.due(state.step, stopping):
            return None
        started = time.perf_counter()
        path = self.store.save(self.model, self.optimizer, self.scheduler, state, self.config_record, self.rt.mark_step)
        seconds = time.perf_counter() - started
        self.save_seconds += seconds
        self.longest_save = max(self.longest_save, seconds)
        if self.schedule.measures_at(state.step, stopping, self.saves):
            self.schedule.every = young_daly_interval(seconds, step_times, self.mtbf_hours, self.rt)
        self.saves += 1
        self.last_saved = state.step
        if self.rt.is_main:
            log(f"checkpoint: saved {path}{' (SIGTERM)' if stopping else ''}")
        return path
