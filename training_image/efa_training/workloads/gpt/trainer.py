"""The training loop: a small Trainer, as in pytorch/examples' ddp-tutorial-series (multinode.py) and torchtitan.

`train_step` runs one optimizer step: the micro-steps (gradients synchronised on the last one only), clipping, the
optimizer and scheduler, and one small all-reduce that carries the loss, the gradient norm and whether any rank was
asked to stop. `fit` runs steps until the last one or a stop, and hands each finished step to the metrics, the
divergence guard (runtime/divergence.py) and the checkpoint manager (checkpointing/manager.py), which alone decides
whether to save. Training is seeded; the CPU kernels used here are deterministic, so CPU runs resume bit for bit.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from efa_training.checkpointing.lock import take_folder
from efa_training.checkpointing.manager import CheckpointManager
from efa_training.checkpointing.state import TrainerState
from efa_training.runtime.console import log
from efa_training.runtime.distributed import Runtime, collective_timeout_after_warm_up
from efa_training.runtime.divergence import DivergenceGuard
from efa_training.runtime.errors import EXIT_STOPPED, UsageError
from efa_training.runtime.run_paths import node_local_checkpoints
from efa_training.runtime.signals import StopFlag
from efa_training.workloads.gpt.builders import (
    build_model,
    build_optimizer,
    build_scheduler,
    grad_sync_context,
    replica_checksums,
    seed_everything,
)
from efa_training.workloads.gpt.data import BatchSpec, SequenceBatches, TokenStream
from efa_training.workloads.gpt.meter import StepMeter, StepResult
from efa_training.workloads.gpt.model import GPT
from efa_training.workloads.gpt.saved_model import find_and_load

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from efa_training.train_config import TrainConfig
    from efa_training.workloads.gpt.pipeline import Pipeline


def _refuse_on_xla(cfg: TrainConfig, rt: Runtime) -> None:
    """What the XLA device does not train (Neuron's model parallelism is neuronx-distributed's, not used here)."""
    if rt.device_type != "xla":
        return
    for name, degree in (("--tensor-parallel", cfg.tensor_parallel), ("--pipeline-parallel", cfg.pipeline_parallel)):
        if degree > 1:
            raise UsageError(
                name, degree, "not supported on the xla device (neuronx-distributed's, not used here)", "1"
            )
    if cfg.strategy == "fsdp":
        raise UsageError("--strategy", "fsdp", "FSDP2 is not supported on the xla device", "ddp")


class Trainer:
    """One rank's training run: built from the config, resumed from the newest good checkpoint, then `fit`."""

    def __init__(self, cfg: TrainConfig, rt: Runtime) -> None:
        _refuse_on_xla(cfg, rt)
        # torch.use_deterministic_algorithms is not called: it imports inductor (+1 s per process), and the CPU
        # kernels used here are deterministic already (the resume test checks it bit for bit).
        self.cfg, self.rt, self.mcfg = cfg, rt, cfg.model_config()
        self.stop = StopFlag()
        self.mesh = self._mesh()
        self.pipeline: Pipeline | None = None
        # Each data-parallel replica's rank and count: the ranks of one tensor-parallel group, and of one pipeline,
        # read the same batches.
        self.replica, self.replicas = (
            (self.mesh["dp"].get_local_rank(), self.mesh["dp"].size()) if self.mesh else (rt.rank, rt.world_size)
        )
        self.model = build_model(cfg, self.mcfg, rt, self.mesh)
        self.clip: Callable[[list[torch.nn.Parameter], float], torch.Tensor] = torch.nn.utils.clip_grad_norm_
        if self.mesh is not None:  # imported here: the others pay nothing for DTensor or pipelining
            from efa_training.workloads.gpt import parallel, pipeline

            self.clip = parallel.clip_grad_norm
            if cfg.pipeline_parallel > 1:
                assert isinstance(self.model, GPT)  # FSDP2 keeps the class (as an FSDP subclass of it)
                self.pipeline = pipeline.build(
                    self.model, self.mesh, cfg.grad_accum_steps, cfg.micro_batch_size, rt.device
                )
                self.clip = self.pipeline.clip_grad_norm
        self.optimizer = build_optimizer(self.model, cfg, rt)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        seed_everything(cfg.seed + rt.rank)  # per-rank streams (dropout); replaced by the checkpoint's on resume
        self.checkpoints = self._open_checkpoints()
        self.state = self._start()
        self.batches = self._batches(self.state)
        self.meter = StepMeter(cfg, self.mcfg, rt, self.state.step, self.replicas)
        self.guard = DivergenceGuard(cfg, rt.is_main)
        self.samples_per_step = self.replicas * cfg.micro_batch_size * cfg.grad_accum_steps
        self.checksums: list[float] | None = None

    def _mesh(self) -> DeviceMesh | None:
        """The (pp, dp, tp) device mesh of a tensor- or pipeline-parallel run (parallel.py), else None."""
        if self.cfg.tensor_parallel == 1 and self.cfg.pipeline_parallel == 1:
            return None
        from efa_training.workloads.gpt import parallel

        return parallel.device_mesh(self.rt, self.cfg.tensor_parallel, self.cfg.pipeline_parallel)

    def _open_checkpoints(self) -> CheckpointManager:
        """The folder's writer lock, held until the process ends, then the manager that resumes and saves in it."""
        cfg, rt = self.cfg, self.rt
        node_local = node_local_checkpoints(os.environ)
        if node_local and rt.device_type == "xla":
            # The node-local manifest travels by an object broadcast, which the XLA backend does not offer.
            raise UsageError("CHECKPOINT_NODE_LOCAL", "1", "not supported on the xla device", "0 (a shared folder)")
        # Held until the process ends; the run id tells this run's earlier attempt (waited for) from another run.
        self._lock = take_folder(Path(cfg.checkpoint_dir), rt, node_local, run_id=cfg.named_run_id())
        return CheckpointManager(
            cfg,
            rt,
            self.model,
            self.optimizer,
            self.scheduler,
            {"train": asdict(cfg), "model": asdict(self.mcfg)},
            node_local,
        )

    def _start(self) -> TrainerState:
        """Where the run starts: its newest good checkpoint, else --init-from's weights, else afresh (rank 0 says)."""
        cfg, rt = self.cfg, self.rt
        state, resumed_from = self.checkpoints.resume()
        start = f"resumed from {resumed_from}" if resumed_from else "starting fresh"
        initial = cfg.initial_model_dir()
        if resumed_from is None and initial is not None:  # a run's own checkpoint wins over its initial model
            start = f"starting from the weights of {self._start_from(initial)}"
        if rt.is_main:
            log(
                f"train: {start} at step "
                f"{state.step}; world={rt.world_size} device={rt.device_type} strategy={cfg.strategy} "
                f"model={cfg.model} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
            )
        return state

    def _start_from(self, folder: Path) -> Path:
        """The weights of another run's newest loadable checkpoint (incremental training); the optimizer, the
        schedule, the step and the data position start afresh. Refused (exit 2) for another model size."""
        try:
            initial, meta, path = find_and_load(folder, flag="--init-from")
        except RuntimeError as err:  # none of its checkpoints loads
            raise UsageError("--init-from", str(folder), str(err), "a run with a loadable checkpoint") from None
        if meta["config"]["model"] != asdict(self.mcfg):
            raise UsageError(
                "--init-from",
                str(path),
                f"a {meta['config']['train'].get('model')} model, not this run's {self.cfg.model}",
                "a checkpoint of the same model size and sequence length",
            )
        weights = initial.state_dict()
        if self.cfg.strategy == "fsdp":
            mine = self.model.state_dict()  # a pipeline stage's parts only
            weights = {k: v for k, v in weights.items() if k in mine}
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True))
        else:
            target = (
                self.model.module if isinstance(self.model, torch.nn.parallel.DistributedDataParallel) else self.model
            )
            target.load_state_dict(weights)  # copies into the parameters in place: the head stays tied
        return path

    def _batches(self, state: TrainerState) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        spec = BatchSpec(self.mcfg.seq_len, self.cfg.micro_batch_size, self.replica, self.replicas, self.cfg.seed)
        batches = SequenceBatches(
            TokenStream(Path(self.cfg.data), "train"), spec, samples_consumed=state.samples_consumed
        )
        if self.rt.device_type != "xla":
            return iter(batches)
        parallel_loader = importlib.import_module("torch_xla.distributed.parallel_loader")  # Neuron image only
        # Neuron docs: MpDeviceLoader overlaps host-to-device copies and inserts mark_step per batch.
        return iter(parallel_loader.MpDeviceLoader(batches, self.rt.device))

    def fit(self) -> int:
        """Train to the last step, or until a stop is requested: 143 if stopped before the last step, else 0."""
        self.model.train()
        stopping, started = False, self.state.step
        while self.state.step < self.cfg.max_steps and not stopping:
            result = self.train_step()
            self.meter.record(
                self.state.step, result, float(self.scheduler.get_last_lr()[0]), self.checkpoints.longest_save
            )
            # After the metrics line (the NonFiniteLoss alarm sees the step), before any save.
            self.guard.check(self.state.step, result.loss, result.grad_norm, self.checkpoints.last_saved)
            stopping = result.stop_requested
            if self.state.step == started + 1:  # warmed up: a collective this long is hung, after the watchdog saw it
                collective_timeout_after_warm_up(self.rt, os.environ, result.seconds * self.cfg.log_every)
            if stopping or self.state.step == self.cfg.max_steps:
                # Before the final save, so the save's barrier stays the last collective before teardown
                # (a collective right before destroy_process_group made gloo abort at exit, 3 runs in 8).
                self.checksums = replica_checksums(self.model, self.cfg.strategy, self.rt)
            self.checkpoints.after_step(self.state, stopping, self.meter.step_times)
        self._summary(stopping)
        # Every rank exits the same way, whichever of them got the signal.
        return EXIT_STOPPED if stopping and self.state.step < self.cfg.max_steps else 0

    def train_step(self) -> StepResult:
        started = time.perf_counter()
        if self.pipeline:
            with self.rt.autocast():
                loss_sum = self.pipeline.step(*self._step_batches())
        else:
            loss_sum = self._accumulate_gradients()
        if self.rt.xm is not None:
            self.rt.xm.reduce_gradients(self.optimizer)  # the one gradient all-reduce, after the last micro-step
        # The global norm (all-reduced gradients, or FSDP's sharded norm): the same on every rank. With
        # --grad-clip 0 an infinite bound measures without clipping.
        grad_norm = self.clip(list(self.model.parameters()), self.cfg.grad_clip or math.inf)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # Neuron docs: cut right after optimizer.step(). The device loader cuts too, before every batch, so with
        # gradient accumulation each micro-batch's forward and backward is a graph of its own (test_xla_path.py).
        self.rt.mark_step()
        self.state.advance(self.samples_per_step, self.meter.tokens_per_step)
        loss, norm, stop_votes = self._agree(loss_sum, grad_norm)
        return StepResult(loss, norm, stop_votes > 0, time.perf_counter() - started)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        waited = time.perf_counter()
        x, y = next(self.batches)
        if self.meter.stragglers:
            self.meter.stragglers.data_wait += time.perf_counter() - waited
        return x.to(self.rt.device, non_blocking=True), y.to(self.rt.device, non_blocking=True)

    def _accumulate_gradients(self) -> torch.Tensor:
        loss_sum = torch.zeros((), device=self.rt.device)
        for micro in range(self.cfg.grad_accum_steps):
            x, y = self._next_batch()
            last = micro == self.cfg.grad_accum_steps - 1
            with grad_sync_context(self.model, self.cfg.strategy, last):
                with self.rt.autocast():
                    loss = self.model(x, y) / self.cfg.grad_accum_steps
                loss.backward()
            loss_sum += loss.detach()
        return loss_sum

    def _step_batches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's micro-batches stacked: the pipeline's microbatches (it splits them again along the batch)."""
        batches = [self._next_batch() for _ in range(self.cfg.grad_accum_steps)]
        return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])

    def _agree(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float, float]:
        """(mean loss, gradient norm, stop votes) from one tiny all-reduce, so every rank stops at the same step.
        .tolist() is the step's one host sync."""
        norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
        stats = torch.stack(
            [
                loss_sum.float(),
                torch.tensor(float(self.stop.requested), device=self.rt.device),
                norm.float().to(self.rt.device) / self.rt.world_size,
            ]
        )
        dist.all_reduce(stats)
        loss, stop_votes, norm_value = stats.tolist()
        return loss / (self.rt.world_size // self.cfg.pipeline_parallel), norm_value, stop_votes  # the last stage's

    def _summary(self, stopped: bool) -> None:
        if self.rt.is_main and self.checksums and len(set(self.checksums)) > 1:
            log(
                f"train: WARNING the ranks' parameters differ (checksums {self.checksums}): gradients were not "
                "all-reduced the same way on every rank"
            )
        figures = self.meter.figures()
        self.meter.metrics.summary(
            {
                "run_id": self.cfg.run_id,
                "steps": self.state.step,
                "start_step": self.meter.start_step,
                "final_loss": figures["final_loss"],
                "tokens_seen": self.state.tokens_seen,
                "mean_tokens_per_second": figures["mean_tokens_per_second"],
                "wall_seconds": figures["wall_seconds"],
                "world_size": self.rt.world_size,
                "strategy": self.cfg.strategy,
                "model": self.cfg.model,
                "last_checkpoint_step": self.checkpoints.last_saved,
                "stopped_by_sigterm": stopped,
                "checkpoints_saved": self.checkpoints.saves,
                "checkpoint_seconds": self.checkpoints.save_seconds,
                "replica_checksums": self.checksums,
            }
        )
