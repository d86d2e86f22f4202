"""The model as the run trains it: wrapped for DDP, sharded with FSDP2 (and split by tensor parallelism), or plain on
XLA; its optimizer and schedule, and the replicas' checksums.

model.py is the network alone (what validate.py loads); this module adds what training puts around it.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from efa_training.runtime.distributed import Runtime
from efa_training.workloads.gpt.model import GPT, ModelConfig, count_params

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from efa_training.train_config import TrainConfig

# A model of at most this many parameters is built whole on every rank, seeded alike, then sharded: its initial
# weights are the single-process run's in every layout (at 1.3b, 5.2 GB of fp32 per process, host memory every
# training type has). A larger one is built on the meta device and initialised shard by shard: a 13B model never
# exists in full on one process (52 GB of host memory per rank in fp32).
WHOLE_MAX_PARAMETERS = 1_500_000_000


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(cfg: TrainConfig, mcfg: ModelConfig, rt: Runtime, mesh: DeviceMesh | None = None) -> torch.nn.Module:
    """`mesh`: the (pp, dp, tp) mesh of a tensor- or pipeline-parallel run (parallel.py), None otherwise; with
    pipeline parallelism the model is this rank's stage of it (pipeline.keep_stage)."""
    seed_everything(cfg.seed)  # identical initial weights on every rank
    if cfg.strategy == "fsdp":
        return _fully_sharded(cfg, mcfg, rt, mesh)
    model: Any = GPT(mcfg).to(rt.device)
    if cfg.compile:
        model = torch.compile(model)
    if rt.device_type == "xla":
        model.tie_weights()  # .to(xla) untied the head from the embedding (GPT.tie_weights says why)
        return model  # Neuron: gradients are all-reduced with xm.reduce_gradients, no DDP wrapper
    return DDP(model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)


def _fully_sharded(cfg: TrainConfig, mcfg: ModelConfig, rt: Runtime, mesh: DeviceMesh | None) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from efa_training.workloads.gpt.parallel import apply_tensor_parallel

    whole = count_params(mcfg) <= WHOLE_MAX_PARAMETERS
    if whole:
        model = GPT(mcfg).to(rt.device)
    else:
        with torch.device("meta"):
            model = GPT(mcfg)
    if mesh is not None and mesh["pp"].size() > 1:
        from efa_training.workloads.gpt.pipeline import keep_stage  # here: pipelining's import costs others nothing

        keep_stage(model, mesh["pp"].get_local_rank(), mesh["pp"].size())
    if mesh is not None and mesh["tp"].size() > 1:
        apply_tensor_parallel(model.blocks, mesh)
    shards = mesh["dp"] if mesh is not None else None  # FSDP2 over dp; None: every rank
    # bf16 compute with fp32 gradient reduction on accelerators; fp32 throughout on CPU.
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if rt.device_type == "cuda"
        else MixedPrecisionPolicy()
    )
    for block in model.blocks.values():
        if cfg.compile:
            block.compile()
        fully_shard(block, mesh=shards, mp_policy=mp)
    fully_shard(model, mesh=shards, mp_policy=mp)  # root holds embeddings/head (tied weights stay together)
    if whole:
        return model
    model.to_empty(device=rt.device)
    # On CUDA, DTensor's RNG tracker takes rank 0's state and offsets it per shard. On CPU it
    # has no tracker and each rank draws its shard from its own generator: seeding by rank
    # keeps the shards different (the same seed everywhere would copy one shard into all).
    seed_everything(cfg.seed + rt.rank)
    model.init_weights()
    return model


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, rt: Runtime) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    # Decay matrices only; biases and LayerNorm gains are not regularised (GPT-2 practice).
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=rt.device_type == "cuda" or None)


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to lr * min_lr_ratio at max_steps: a factor of the peak lr."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        span = max(1, cfg.max_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))


def grad_sync_context(
    model: torch.nn.Module, strategy: str, last_micro_step: bool
) -> contextlib.AbstractContextManager:
    """All-reduce gradients on the last micro-step only; earlier ones accumulate locally."""
    if strategy == "fsdp":
        from torch.distributed.fsdp import FSDPModule

        assert isinstance(model, FSDPModule)  # fully_shard made it one
        model.set_requires_gradient_sync(last_micro_step)
        return contextlib.nullcontext()
    if isinstance(model, DDP) and not last_micro_step:
        return model.no_sync()
    return contextlib.nullcontext()


def replica_checksums(model: torch.nn.Module, strategy: str, rt: Runtime) -> list[float] | None:
    """Every rank's checksum of its parameters (gathered; rank 0 reports them in the summary).

    With replicated parameters (DDP, XLA) they must be equal: a difference means gradients were
    not all-reduced (or were reduced differently) and the replicas have drifted apart. FSDP ranks
    hold different shards, so there is nothing to compare (None).
    """
    if strategy == "fsdp":
        return None
    sums = torch.zeros(rt.world_size, dtype=torch.float64, device=rt.device)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            values = p.detach().double()
            sums[rt.rank] += (i + 1) * values.sum() + values.square().sum()  # weighted by tensor: swaps show
    dist.all_reduce(sums)  # each rank fills its own slot: a gather built from the per-step collective
    return sums.tolist()
