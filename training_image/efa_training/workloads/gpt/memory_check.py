"""The refusal of a run whose estimated peak memory (sizes.memory_gb) exceeds its GPUs', naming settings that fit.

The advice is a whole command line's worth: layout, micro-batch AND gradient accumulation, judged at that
accumulation, for the estimate grows with it (accumulating micro-steps keeps whole fp32 gradients; a pipeline's
microbatches follow it). Advice judged at the run's own accumulation fitted only until the user raised
--grad-accum-steps as told, and the run was refused again (issue 51). The global batch, replicas x micro-batch x
accumulation, is kept: the advice changes how a step is cut, not what it trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt.sizes import ModelConfig, memory_gb

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


class Fit(NamedTuple):
    micro_batch: int
    tensor_parallel: int
    pipeline_parallel: int
    grad_accum: int
    gb: float

    def flags(self) -> str:
        return (
            f"--strategy fsdp --tensor-parallel {self.tensor_parallel} --pipeline-parallel {self.pipeline_parallel} "
            f"--micro-batch-size {self.micro_batch} --grad-accum-steps {self.grad_accum}"
        )


def check_memory(cfg: TrainConfig, env: Mapping[str, str]) -> None:
    """A run over its GPUs' memory (ACCELERATOR_MEMORY_GB, the catalogue's) is refused in one line naming the first
    fit (`fit`). GPUs only: on Trainium the Neuron compiler plans memory itself."""
    limit = float(env.get("ACCELERATOR_MEMORY_GB") or 0)
    if not limit or env.get("ACCELERATOR_KIND") != "gpu" or cfg.strategy == "ps":
        return
    world, per_node = int(env.get("WORLD_SIZE") or 1), int(env.get("LOCAL_WORLD_SIZE") or 1)
    layout = {"tensor_parallel": cfg.tensor_parallel, "pipeline_parallel": cfg.pipeline_parallel}
    need = _need(cfg.model_config(), cfg.micro_batch_size, cfg.grad_accum_steps, world, cfg.strategy, **layout)
    if need <= limit:
        return
    sequences = world // (cfg.tensor_parallel * cfg.pipeline_parallel) * cfg.micro_batch_size * cfg.grad_accum_steps
    found = fit(cfg.model_config(), cfg.micro_batch_size, sequences, world, per_node, limit)
    raise UsageError(
        "--model",
        cfg.model,
        f"needs about {need:.0f} GB per GPU with --strategy {cfg.strategy}, --tensor-parallel {cfg.tensor_parallel}, "
        f"--pipeline-parallel {cfg.pipeline_parallel}, --micro-batch-size {cfg.micro_batch_size} and "
        f"--grad-accum-steps {cfg.grad_accum_steps} on {world} workers, more than their {limit:g} GB",
        f"{found.flags()} (about {found.gb:.0f} GB; the global batch of {sequences} sequences kept)"
        if found
        else f"more nodes, or a smaller global batch: no layout of {world} workers fits {sequences} sequences a step",
    )


def fit(mcfg: ModelConfig, micro_batch: int, sequences: int, world: int, per_node: int, limit: float) -> Fit | None:
    """The first layout (_layouts' order) at the largest micro-batch up to `micro_batch` whose estimate, at the
    accumulation that keeps `sequences` a step (replicas x micro-batch x accumulation), fits in `limit` GB."""
    for b in range(micro_batch, 0, -1):
        for t, p in _layouts(mcfg, per_node, world):
            per_step = world // (t * p) * b  # sequences one micro-step of every replica takes
            if sequences % per_step:
                continue  # no whole accumulation keeps the global batch
            accum = sequences // per_step
            gb = _need(mcfg, b, accum, world, "fsdp", tensor_parallel=t, pipeline_parallel=p)
            if gb <= limit:
                return Fit(b, t, p, accum, gb)
    return None


def _need(mcfg: ModelConfig, micro_batch: int, accum: int, world: int, strategy: str, **layout: int) -> float:
    return memory_gb(mcfg, micro_batch=micro_batch, world=world, strategy=strategy, microbatches=accum, **layout)


def _layouts(mcfg: ModelConfig, per_node: int, world: int) -> list[tuple[int, int]]:
    """(tp, pp) a run of `world` workers could take: tensor parallelism first, inside a node, then pipeline stages
    across nodes (torchtitan's and Megatron-LM's order: tp's traffic needs a node's links; a pipeline idles in its
    bubble)."""
    pairs = [
        (t, p)
        for t in range(1, per_node + 1)
        for p in range(1, mcfg.n_layer + 1)
        if per_node % t == 0 and mcfg.n_head % t == 0 and mcfg.n_layer % p == 0 and world % (t * p) == 0
    ]
    return sorted(pairs, key=lambda tp: (tp[1], tp[0]))
