"""Benchmark: train.py's step throughput with tensor parallelism (2-D: dp x tp) against FSDP alone, same processes.

    python training_image/benchmarks/tensor_parallel_throughput.py --work /tmp/bench
CPU (gloo), 4 processes, the same model, data and micro-batch per replica: FSDP over 4 replicas against dp 2 x tp 2
(two replicas, each split over 2 ranks: half the samples per step). Reported as tokens/s (the replicas' tokens) and
as steps/s. On CPU tensor parallelism only adds collectives (two all-reduces per block forward and two backward) and
halves the data parallelism; the layout pays on GPUs, where it fits models FSDP alone cannot (README, "Choosing a
layout"). Runs alternate (A B A B ...) so drifting load on a shared machine hits both sides; medians are compared.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from common import TRAIN, ensure_dataset, tokens_per_second, torchrun, train_records


def _run(work: Path, data: Path, name: str, args: argparse.Namespace, layout: list[str]) -> tuple[float, float]:
    """(tokens/s, steps/s) of one run, the first `args.skip` steps left out."""
    flags = ["--data", str(data), "--checkpoint-dir", str(work / name), "--model", args.model, "--strategy", "fsdp"]
    flags += ["--max-steps", str(args.steps), "--checkpoint-every", str(10 * args.steps), "--micro-batch-size", "8"]
    emf, summary = train_records(torchrun(TRAIN, [*flags, "--seed", "1", *layout], nproc=4))
    times = [e["StepTimeSeconds"] for e in emf]
    tokens = tokens_per_second(times, summary["tokens_seen"] // summary["steps"], args.skip)
    return tokens, 1 / statistics.median(times[args.skip :])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    p.add_argument("--model", default="mini", help="model size (default mini: 4 heads, so tp 2 divides them)")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="runs per layout (default 3)")
    p.add_argument("--skip", type=int, default=5, help="warm-up steps excluded (default 5)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-"))
    data = ensure_dataset(work)
    fsdp, grid = [], []
    for r in range(args.repeats):
        fsdp.append(_run(work, data, f"fsdp-{r}", args, []))
        grid.append(_run(work, data, f"grid-{r}", args, ["--tensor-parallel", "2"]))
    result = {
        "benchmark": "tensor_parallel_throughput",
        "model": args.model,
        "processes": 4,
        "fsdp_dp4_tokens_per_s": [round(t) for t, _ in fsdp],
        "dp2_tp2_tokens_per_s": [round(t) for t, _ in grid],
        "fsdp_dp4_steps_per_s": round(statistics.median(s for _, s in fsdp), 3),
        "dp2_tp2_steps_per_s": round(statistics.median(s for _, s in grid), 3),
        "tokens_ratio_of_medians": round(
            statistics.median(t for t, _ in grid) / statistics.median(t for t, _ in fsdp), 3
        ),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
