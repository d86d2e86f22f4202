"""One training step as every rank agrees on it (StepResult), and what the run reports of its steps (StepMeter): rank
0's metrics lines (loss, tokens/s, MFU against the GPU's peak, the stragglers' figures) and the summary's figures."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from efa_training.runtime.distributed import Runtime
from efa_training.runtime.metrics import MetricsLogger, peak_tflops
from efa_training.runtime.stragglers import Stragglers
from efa_training.workloads.gpt.model import ModelConfig, flops_per_token

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


@dataclass
class StepResult:
    """One optimizer step as every rank agrees on it."""

    loss: float  # mean over ranks
    grad_norm: float  # the global norm
    stop_requested: bool  # SIGTERM/SIGINT reached at least one rank
    seconds: float


class StepMeter:
    """Per-step metrics lines (rank 0) and the figures of the run's summary."""

    def __init__(self, cfg: TrainConfig, mcfg: ModelConfig, rt: Runtime, start_step: int, replicas: int) -> None:
        """`replicas`: the data-parallel degree (the world size over the tensor- and pipeline-parallel degrees)."""
        self.metrics = MetricsLogger(cfg.run_id, enabled=rt.is_main, model=cfg.model)
        # measured by every rank at each metrics line
        self.stragglers = Stragglers(rt, cfg.run_id) if Stragglers.enabled(rt) else None
        self.log_every, self.max_steps, self.world_size = cfg.log_every, cfg.max_steps, rt.world_size
        self.tokens_per_step = replicas * cfg.micro_batch_size * cfg.grad_accum_steps * mcfg.seq_len
        self.peak = peak_tflops(torch.cuda.get_device_name(rt.device)) if rt.device_type == "cuda" else None
        self.flops_per_token = flops_per_token(mcfg)
        self.start_step, self.started = start_step, time.perf_counter()
        self.step_times: list[float] = []
        self.throughput: list[float] = []  # tokens/s of the steps after the first
        self.loss = float("nan")

    def record(self, step: int, result: StepResult, lr: float, longest_save: float = 0.0) -> None:
        """`longest_save`: the longest checkpoint save so far (CheckpointSaveSeconds: the launcher's stop-by margin)."""
        self.loss = result.loss
        self.step_times.append(result.seconds)
        tps = self.tokens_per_step / result.seconds
        if step > self.start_step + 1:
            self.throughput.append(tps)  # the first step after (re)start includes warm-up and compilation
        # A non-finite loss or gradient is reported on whatever step it comes (the NonFiniteLoss alarm needs its line).
        finite = math.isfinite(result.loss) and math.isfinite(result.grad_norm)
        if step % self.log_every == 0 or step == self.max_steps or not finite:
            mfu = 100.0 * self.flops_per_token * tps / (self.peak * 1e12 * self.world_size) if self.peak else None
            flagged = {} if finite else {"NonFiniteLoss": 1.0}
            if longest_save:
                flagged["CheckpointSaveSeconds"] = longest_save
            extra, properties = self.stragglers.measure() if self.stragglers else ({}, {})
            self.metrics.step(step, result.loss, tps, result.seconds, mfu, properties, LearningRate=lr, **flagged,
                              **extra)  # fmt: skip

    def figures(self) -> dict:
        return {
            "final_loss": self.loss if math.isfinite(self.loss) else None,  # NaN: nothing trained
            "mean_tokens_per_second": float(np.mean(self.throughput)) if self.throughput else None,
            "wall_seconds": time.perf_counter() - self.started,
        }
