"""The model as the run trains it: wrapped for DDP, sharded with FSDP2, or plain on XLA; its optimizer and schedule.

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
from torch.nn.parallel import DistributedDataParallel as DDP

from efa_training.runtime.distributed import Runtime
from efa_training.workloads.gpt.model import GPT, ModelConfig

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_model(cfg: TrainConfig, mcfg: ModelConfig, rt: Runtime) -> torch.nn.Module:
    seed_everything(cfg.seed)  # identical initial weights on every rank
    if cfg.strategy == "fsdp":
        return _fully_sharded(cfg, mcfg, rt)
    model: Any = GPT(mcfg).to(rt.device)
    if cfg.compile:
        model = torch.compile(model)
    if rt.device_type == "xla":
        model.tie_weights()  # .to(xla) untied the head from the embedding (GPT.tie_weights says why)
        return model  # Neuron: gradients are all-reduced with xm.reduce_gradients, no DDP wrapper
    return DDP(model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)


def _fully_sharded(cfg: TrainConfig, mcfg: ModelConfig, rt: Runtime) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Build on the meta device and initialise after sharding: a 13B model never exists in full
    # on one process (it would need 52 GB of host memory per rank in fp32).
    with torch.device("meta"):
        model = GPT(mcfg)
    # bf16 compute with fp32 gradient reduction on accelerators; fp32 throughout on CPU.
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if rt.device_type == "cuda"
        else MixedPrecisionPolicy()
    )
    for block in model.blocks:
        if cfg.compile:
            block.compile()
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)  # root holds embeddings/head (tied weights stay together)
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
