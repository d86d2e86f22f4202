"""Benchmark: how much checkpointing at the default interval slows training (goal: < 5%).

The default interval is Young/Daly's, sqrt(2 * save time * MTBF) (train.py --checkpoint-every 0), so the stall
at it is save_time / interval = sqrt(save_time / (2 * MTBF)); --every K measures a fixed K instead.

    python training_image/benchmarks/checkpoint_stall.py --work /tmp/bench
Two measurements, CPU, 2 processes:
1. In-run: train.py times every save (summary.checkpoint_seconds / checkpoints_saved). The
   stall at interval K is save_time / (K * step_time). Both numbers come from the same run,
   so load from other processes on a shared machine cancels out.
2. A/B wall time: the same job with checkpoints every --every steps vs only the final save
   (train.py always saves at the last step, so both sides pay that one). Noisy on a shared
   machine; reported for completeness.
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from common import TRAIN, ensure_dataset, torchrun, train_records


def run(data: Path, ckpt: Path, model: str, steps: int, every: int) -> tuple[list[dict], dict]:
    out = torchrun(
        TRAIN,
        [
            "--data",
            str(data),
            "--checkpoint-dir",
            str(ckpt),
            "--model",
            model,
            "--max-steps",
            str(steps),
            "--checkpoint-every",
            str(every),
            "--seed",
            "1",
        ],
    )
    return train_records(out)


def main() -> None:
    # The image's own modules, on sys.path once `common` is imported.
    from efa_training import train_config
    from efa_training.checkpointing.schedule import young_daly_steps

    mtbf_hours = train_config.build_parser().get_default("mtbf_hours")  # train.py's --mtbf-hours default
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    p.add_argument("--model", default="mini", help="model size (default mini)")
    p.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    p.add_argument(
        "--every",
        type=int,
        default=0,
        help="checkpoint interval in steps (default 0: train.py's Young/Daly interval for the measured "
        f"save time and {mtbf_hours:g} h MTBF)",
    )
    p.add_argument("--dense-every", type=int, default=20, help="dense interval for the in-run save timing (default 20)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-"))
    data = ensure_dataset(work)

    emf, summary = run(data, work / "ckpt-stall-dense", args.model, args.steps, args.dense_every)
    save_s = summary["checkpoint_seconds"] / summary["checkpoints_saved"]
    step_s = statistics.median(e["StepTimeSeconds"] for e in emf)
    every = args.every or young_daly_steps(save_s, step_s, mtbf_hours)[0]
    walls = {}
    for name, k in (("none", args.steps), ("default", min(every, args.steps))):
        walls[name] = run(data, work / f"ckpt-stall-{name}", args.model, args.steps, k)[1]["wall_seconds"]
    print(
        json.dumps(
            {
                "benchmark": "checkpoint_stall",
                "model": args.model,
                "steps": args.steps,
                "seconds_per_save": round(save_s, 4),
                "median_step_seconds": round(step_s, 4),
                "default_interval_steps": every,
                "in_run_overhead_at_default_interval": round(save_s / (every * step_s), 5),
                "ab_wall_seconds": {k: round(v, 2) for k, v in walls.items()},
                "ab_overhead_default_vs_none": round(walls["default"] / walls["none"] - 1, 4),
                "goal": "< 0.05",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
