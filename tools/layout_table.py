"""The README's table of what each built-in GPT size needs per accelerator in each layout (README, "Choosing a
layout"), computed from the training image's memory estimate (workloads/gpt/sizes.py memory_gb) and the catalogue.

    python -m tools.layout_table
"""

from __future__ import annotations

import sys
from pathlib import Path

from config.catalogue import CATALOGUE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "training_image"))

from efa_training.workloads.gpt.sizes import MODEL_SIZES, memory_gb  # noqa: E402  (the image's own estimate)

SIZES = ("125m", "350m", "1.3b", "6.7b", "13b", "30b", "70b")
GPU, NEURON = "p5.48xlarge", "trn1.32xlarge"
NODES = 8  # p5.48xlarge nodes: 64 GPUs
DEGREES = (1, 2, 4, 8)
STAGES = (2, 4)  # pipeline stages beside 8-way tensor parallelism (on 8 nodes: 4 and 2 data-parallel replicas)
MICRO_BATCHES = (1, 8)  # sequences per worker: the smallest, and the gpt workload's default batch_size


def _cell(gbs: list[float], limit: float) -> str:
    """The estimates at each micro-batch, GB, those above `limit` struck through."""
    return " / ".join(f"{gb:.0f}" if gb <= limit else f"~~{gb:.0f}~~" for gb in gbs)


def _gpu_cell(cfg, world: int, degree: int, limit: float, stages: int = 1) -> str:
    if cfg.n_head % degree or cfg.n_layer % stages:
        return "n/a"  # the degrees must divide the heads and the layers
    estimates = [
        memory_gb(cfg, micro_batch=b, world=world, tensor_parallel=degree, strategy="fsdp", pipeline_parallel=stages)
        for b in MICRO_BATCHES
    ]
    return _cell(estimates, limit)


def table() -> str:
    gpu, neuron = CATALOGUE[GPU], CATALOGUE[NEURON]
    world = NODES * gpu.workers_per_node
    lines = [
        "| size | "
        + " | ".join([*(f"fsdp, tp {t}" for t in DEGREES), *(f"tp 8, pp {p}" for p in STAGES)])
        + " | trn1.32xlarge, DDP |",
        "|---|" + "---|" * (len(DEGREES) + len(STAGES) + 1),
    ]
    for size in SIZES:
        cfg = MODEL_SIZES[size]
        gpu_cells = [_gpu_cell(cfg, world, t, gpu.memory_gb_per_worker) for t in DEGREES]
        gpu_cells += [_gpu_cell(cfg, world, 8, gpu.memory_gb_per_worker, p) for p in STAGES]
        trn = [memory_gb(cfg, micro_batch=b, world=neuron.workers_per_node, strategy="ddp") for b in MICRO_BATCHES]
        lines.append(f"| {size} | " + " | ".join([*gpu_cells, _cell(trn, neuron.memory_gb_per_worker)]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
