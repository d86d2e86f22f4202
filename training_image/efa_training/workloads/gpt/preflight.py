"""What the GPT workload refuses before any process group exists, each with one line and exit code 2 (or 4, diverged).

The platform's checks first (runtime/preflight.py), then the data, a repeat of a diverged run, and the checkpoint
folder. Every rank runs the same checks on the same inputs, so all ranks reach the same verdict without a collective.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from efa_training.checkpointing.format import step_dirs
from efa_training.checkpointing.reuse import check_reusable
from efa_training.runtime.divergence import check_not_diverged
from efa_training.runtime.errors import UsageError
from efa_training.runtime.preflight import check_platform, probe_writable
from efa_training.workloads.gpt.data import list_shards, max_token_id, open_shard
from efa_training.workloads.gpt.saved_model import fused_attention
from efa_training.workloads.gpt.sizes import ModelConfig, memory_gb

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


def check_before_start(cfg: TrainConfig, expected_nodes: int | None) -> None:
    check_platform(expected_nodes, cfg.device)
    check_layout(cfg.tensor_parallel, os.environ, cfg.pipeline_parallel, cfg.model_config().n_layer)
    check_memory(cfg, os.environ)
    check_data(Path(cfg.data), cfg.model_config())
    check_not_diverged(cfg)
    # A wrong or unwritable --checkpoint-dir fails in one line, not at the first save.
    check_reusable(Path(cfg.checkpoint_dir), cfg.strategy, cfg.model, asdict(cfg.model_config()))
    check_not_fused(Path(cfg.checkpoint_dir))
    probe_writable(Path(cfg.checkpoint_dir))


def check_layout(tensor_parallel: int, env: Mapping[str, str], pipeline_parallel: int = 1, layers: int = 1) -> None:
    """A tensor-parallel group is consecutive ranks and must stay inside a node (its collectives run on every layer:
    NVLink, not EFA), so the degree divides the node's workers (torchrun's LOCAL_WORLD_SIZE); the pipeline's stages
    times that group must divide the world (WORLD_SIZE), the rest being data-parallel replicas (the refusal names
    the stage counts that also divide the model's `layers`)."""
    per_node, world = int(env.get("LOCAL_WORLD_SIZE") or 1), int(env.get("WORLD_SIZE") or 1)
    if tensor_parallel > 1 and per_node % tensor_parallel:
        divisors = ", ".join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)
        raise UsageError(
            "--tensor-parallel",
            tensor_parallel,
            f"does not divide a node's {per_node} workers (a tensor-parallel group stays inside one node)",
            f"one of {divisors}",
        )
    if pipeline_parallel > 1 and world % (tensor_parallel * pipeline_parallel):
        stages = ", ".join(
            str(d) for d in range(1, world + 1) if world % (d * tensor_parallel) == 0 and layers % d == 0
        )
        raise UsageError(
            "--pipeline-parallel",
            pipeline_parallel,
            f"times --tensor-parallel {tensor_parallel} does not divide the {world} workers",
            f"one of {stages}",
        )


def check_memory(cfg: TrainConfig, env: Mapping[str, str]) -> None:
    """A run whose estimated peak memory (sizes.memory_gb) exceeds its GPUs' (ACCELERATOR_MEMORY_GB, the catalogue's)
    is refused, naming the first layout (_layouts' order) that fits at the run's micro-batch, else at the largest
    smaller micro-batch that fits (the global batch is replicas x micro-batch x accumulation: the refusal says to keep
    it with --grad-accum-steps). GPUs only: on Trainium the Neuron compiler plans memory itself."""
    limit = float(env.get("ACCELERATOR_MEMORY_GB") or 0)
    if not limit or env.get("ACCELERATOR_KIND") != "gpu" or cfg.strategy == "ps":
        return
    world, per_node, mcfg = int(env.get("WORLD_SIZE") or 1), int(env.get("LOCAL_WORLD_SIZE") or 1), cfg.model_config()
    layout = {"tensor_parallel": cfg.tensor_parallel, "pipeline_parallel": cfg.pipeline_parallel}
    need = _need(cfg, cfg.micro_batch_size, world, cfg.strategy, **layout)
    if need <= limit:
        return
    fitting = [
        (b, t, p, gb)
        for b in range(cfg.micro_batch_size, 0, -1)
        for t, p in _layouts(mcfg, per_node, world)
        if (gb := _need(cfg, b, world, "fsdp", tensor_parallel=t, pipeline_parallel=p)) <= limit
    ]
    raise UsageError(
        "--model",
        cfg.model,
        f"needs about {need:.0f} GB per GPU with --strategy {cfg.strategy}, --tensor-parallel {cfg.tensor_parallel}, "
        f"--pipeline-parallel {cfg.pipeline_parallel} and --micro-batch-size {cfg.micro_batch_size} on {world} "
        f"workers, more than their {limit:g} GB",
        f"--strategy fsdp --tensor-parallel {fitting[0][1]} --pipeline-parallel {fitting[0][2]} --micro-batch-size "
        f"{fitting[0][0]} (about {fitting[0][3]:.0f} GB; raise --grad-accum-steps to keep the global batch)"
        if fitting
        else f"more nodes: no layout of {world} workers fits it",
    )


def _need(cfg: TrainConfig, micro_batch: int, world: int, strategy: str, **layout: int) -> float:
    return memory_gb(
        cfg.model_config(),
        micro_batch=micro_batch,
        world=world,
        strategy=strategy,
        microbatches=cfg.grad_accum_steps,
        **layout,
    )


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


def check_not_fused(checkpoint_dir: Path) -> None:
    """Resuming a run whose checkpoints a release up to 0.8.0 wrote is refused: their attention had one fused qkv
    layer, whose optimizer state has no place in this model's three. They still validate and seed a new run."""
    for step in step_dirs(checkpoint_dir) if checkpoint_dir.is_dir() else []:
        meta_file = step / "meta.json"
        if meta_file.is_file() and fused_attention(json.loads(meta_file.read_text())):
            raise UsageError(
                "--checkpoint-dir",
                str(checkpoint_dir),
                f"holds {step.name}, written by release 0.8.0 or earlier (one fused qkv layer)",
                "finish that run with its release's image, or start a new run from it with --init-from",
            )


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
