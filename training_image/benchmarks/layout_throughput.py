"""Benchmark: train.py's step throughput in each model-parallel layout against FSDP alone, the same processes.

    python training_image/benchmarks/layout_throughput.py --work /tmp/bench
CPU (gloo), 4 processes, the same model, data and micro-batch per replica: FSDP over 4 replicas against dp 2 x tp 2
(two replicas, each split over 2 ranks: half the samples per step), pp 2 x dp 2 (two replicas of a 2-stage pipeline,
each step's micro-batch of 8 cut into 2 microbatches run by 1F1B) and pp 2 x tp 2 (one replica). Reported as tokens/s
(the replicas' tokens) and as steps/s. On CPU tensor parallelism only adds collectives (two all-reduces per block
forward and two backward), a pipeline adds its bubble ((P-1)/(m+P-1) of the step idle) and sends, and both cut the
data parallelism; the layouts pay on GPUs, where they fit models FSDP alone cannot (README, "Choosing a layout").
Runs alternate (A B C D A B ...) so drifting load on a shared machine hits every side; medians are compared.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from common import TRAIN, ensure_dataset, tokens_per_second, torchrun, train_records

LAYOUTS = {  # name -> train.py's layout flags, on 4 processes
    "fsdp_dp4": [],
    "dp2_tp2": ["--tensor-parallel", "2"],
    "pp2_dp2": ["--pipeline-parallel", "2"],
    "pp2_tp2": ["--pipeline-parallel", "2", "--tensor-parallel", "2"],
}


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
    p.add_argument("--model", default="mini", help="model size (default mini: 4 heads and 4 layers, which 2 divides)")
    p.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="runs per layout (default 3)")
    p.add_argument("--skip", type=int, default=5, help="warm-up steps excluded (default 5)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-"))
    data = ensure_dataset(work)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in LAYOUTS}
    for r in range(args.repeats):
        for name, layout in LAYOUTS.items():
            runs[name].append(_run(work, data, f"{name}-{r}", args, layout))
    fsdp_tokens = statistics.median(t for t, _ in runs["fsdp_dp4"])
    result = {"benchmark": "layout_throughput", "model": args.model, "processes": 4}
    for name, measured in runs.items():
        result[f"{name}_tokens_per_s"] = [round(t) for t, _ in measured]
        result[f"{name}_steps_per_s"] = round(statistics.median(s for _, s in measured), 3)
        result[f"{name}_tokens_ratio_to_fsdp"] = round(statistics.median(t for t, _ in measured) / fsdp_tokens, 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
