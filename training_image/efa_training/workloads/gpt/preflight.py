"""What the GPT workload refuses before any process group exists, each with one line and exit code 2 (or 4, diverged).

The platform's checks first (runtime/preflight.py), then the data, a repeat of a diverged run, and the checkpoint
folder. Every rank runs the same checks on the same inputs, so all ranks reach the same verdict without a collective.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from efa_training.checkpointing.format import sound_metas
from efa_training.checkpointing.reuse import check_reusable
from efa_training.runtime.divergence import check_not_diverged
from efa_training.runtime.errors import UsageError
from efa_training.runtime.preflight import check_platform, probe_writable
from efa_training.workloads.gpt.data import list_shards, max_token_id, open_shard
from efa_training.workloads.gpt.memory_check import check_memory
from efa_training.workloads.gpt.saved_model import fused_attention
from efa_training.workloads.gpt.sizes import ModelConfig

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


def check_not_fused(checkpoint_dir: Path) -> None:
    """Resuming a run whose checkpoints a release up to 0.8.0 wrote is refused: their attention had one fused qkv
    layer, whose optimizer state has no place in this model's three. They still validate and seed a new run.
    Only checkpoints whose meta.json passes the resume's own check are read: a damaged one (garbage, incomplete)
    is not a verdict on the run; the resume sets it aside and falls back to the previous one."""
    for step, meta in sound_metas(checkpoint_dir):
        if fused_attention(meta):
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
