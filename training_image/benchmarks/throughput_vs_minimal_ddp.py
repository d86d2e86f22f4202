"""Benchmark: train.py throughput vs a minimal hand-written DDP loop (goal: ratio >= 0.95).

    python training_image/benchmarks/throughput_vs_minimal_ddp.py --work /tmp/bench
CPU, 2 processes, same model/data/batch. Runs alternate (A B A B ...) so drifting load on a
shared machine hits both sides; the median of the per-run throughputs is compared.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from common import TRAIN, ensure_dataset, tokens_per_second, torchrun, train_records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    p.add_argument("--model", default="mini", help="model size (default mini)")
    p.add_argument("--steps", type=int, default=150, help="steps per run (default 150)")
    p.add_argument("--repeats", type=int, default=3, help="runs per side (default 3)")
    p.add_argument("--skip", type=int, default=10, help="warm-up steps excluded (default 10)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-"))
    data = ensure_dataset(work)
    ours, minimal = [], []
    for r in range(args.repeats):
        ckpt = work / f"ckpt-throughput-{r}"
        out = torchrun(
            TRAIN,
            [
                "--data",
                str(data),
                "--checkpoint-dir",
                str(ckpt),
                "--model",
                args.model,
                "--max-steps",
                str(args.steps),
                "--checkpoint-every",
                str(10 * args.steps),
                "--micro-batch-size",
                "8",
                "--seed",
                "1",
            ],
        )
        emf, summary = train_records(out)
        tps_step = summary["tokens_seen"] // summary["steps"]
        ours.append(tokens_per_second([e["StepTimeSeconds"] for e in emf], tps_step, args.skip))
        ref = json.loads(
            torchrun(
                Path(__file__).parent / "minimal_ddp_loop.py",
                ["--data", str(data), "--model", args.model, "--steps", str(args.steps)],
            )
        )
        minimal.append(tokens_per_second(ref["step_times"], ref["tokens_per_step"], args.skip))
    result = {
        "benchmark": "throughput_vs_minimal_ddp",
        "model": args.model,
        "steps": args.steps,
        "train_py_tokens_per_s": [round(x) for x in ours],
        "minimal_tokens_per_s": [round(x) for x in minimal],
        "ratio_of_medians": round(statistics.median(ours) / statistics.median(minimal), 3),
        "goal": ">= 0.95",
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
