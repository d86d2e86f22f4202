"""The README's table of which layout each built-in GPT size needs (README, "Choosing a layout"), computed from the
training image's memory estimate (workloads/gpt/sizes.py memory_gb) and the catalogue's accelerator memory.

    python -m tools.layout_table
"""

from __future__ import annotations

import sys
from pathlib import Path

from config.catalogue import CATALOGUE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "training_image"))

from efa_training.workloads.gpt.sizes import MODEL_SIZES, memory_gb  # noqa: E402  (the image's own estimate)

SIZES = ("125m", "350m", "1.3b", "6.7b", "13b", "30b", "70b")
GPU_NODES = (1, 2, 8)
DEGREES = (1, 2, 4, 8)


def _gpu_cell(size: str, nodes: int, instance: str) -> str:
    """The smallest tensor-parallel degree whose estimate fits at micro-batch 1, with the estimate."""
    it, cfg = CATALOGUE[instance], MODEL_SIZES[size]
    world = nodes * it.workers_per_node
    for t in (d for d in DEGREES if it.workers_per_node % d == 0 and cfg.n_head % d == 0):
        gb = memory_gb(cfg, micro_batch=1, world=world, tensor_parallel=t, strategy="fsdp")
        if gb <= it.memory_gb_per_worker:
            return f"tp {t}: {gb:.0f} GB"
    return "does not fit"


def _neuron_cell(size: str, instance: str) -> str:
    """Trainium trains with DDP semantics (each NeuronCore a whole replica): the estimate against a core's share."""
    it = CATALOGUE[instance]
    gb = memory_gb(MODEL_SIZES[size], micro_batch=1, world=it.workers_per_node, strategy="ddp")
    return f"{gb:.0f} GB: {'fits' if gb <= it.memory_gb_per_worker else 'does not fit'}"


def table() -> str:
    p5, trn1 = CATALOGUE["p5.48xlarge"], CATALOGUE["trn1.32xlarge"]
    head = [f"{n} node{'s' if n > 1 else ''} ({n * p5.workers_per_node} GPUs)" for n in GPU_NODES]
    lines = [
        f"| size | p5.48xlarge, {' | p5.48xlarge, '.join(head)} | trn1.32xlarge (a NeuronCore: "
        f"{trn1.memory_gb_per_worker:g} GB) |",
        "|---|" + "---|" * (len(GPU_NODES) + 1),
    ]
    for size in SIZES:
        cells = [_gpu_cell(size, n, "p5.48xlarge") for n in GPU_NODES] + [_neuron_cell(size, "trn1.32xlarge")]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
