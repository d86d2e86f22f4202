"""Benchmark: train.py throughput vs a minimal hand-written DDP loop (goal: ratio >= 0.95).

    python training_image/benchmarks/throughput_vs_minimal_ddp.py --work /tmp/bench [--pairs 16] [--through launcher]
CPU, 2 processes, same model/data/batch. Runs alternate in pairs (A B A B ...) so drifting load on a shared machine
hits both sides; the ratio of each pair and their median are reported, and the median over the quietest quarter (the
pairs whose minimal loop ran fastest). `--through launcher` starts train.py as a node does (launch.py: the platform's
torchrun, rendezvous, exit relay, watchdog, metrics reading), `torchrun` (default) as plain torchrun; both sides
report the CPU seconds of each role of their process tree (workers, torchrun's agent, the launcher): on these 2-core
machines every CPU second outside the workers is taken from them, which a GPU host's spare cores would absorb.
"""

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from common import (
    TRAIN,
    cpu_seconds_by_role,
    ensure_dataset,
    launcher_cmd,
    tokens_per_second,
    torchrun_cmd,
    train_records,
)

HERE = Path(__file__).parent


def ours(args: argparse.Namespace, data: Path, ckpt: Path) -> tuple[float, dict[str, float]]:
    flags = ["--data", str(data), "--checkpoint-dir", str(ckpt), "--model", args.model, "--max-steps", str(args.steps)]
    flags += ["--checkpoint-every", str(10 * args.steps), "--micro-batch-size", "8", "--seed", "1"]
    shutil.rmtree(ckpt, ignore_errors=True)  # a run resumes from its folder: each starts at step 0
    cmd, env = launcher_cmd(flags) if args.through == "launcher" else torchrun_cmd(TRAIN, flags)
    out, roles = cpu_seconds_by_role(cmd, env)
    emf, summary = train_records(out)
    tps_step = summary["tokens_seen"] // summary["steps"]
    return tokens_per_second([e["StepTimeSeconds"] for e in emf], tps_step, args.skip), roles


def minimal(args: argparse.Namespace, data: Path) -> tuple[float, dict[str, float]]:
    flags = ["--data", str(data), "--model", args.model, "--steps", str(args.steps)]
    out, roles = cpu_seconds_by_role(*torchrun_cmd(HERE / "minimal_ddp_loop.py", flags))
    ref = json.loads(out)
    return tokens_per_second(ref["step_times"], ref["tokens_per_step"], args.skip), roles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    p.add_argument("--model", default="mini", help="model size (default mini)")
    p.add_argument("--steps", type=int, default=150, help="steps per run (default 150)")
    p.add_argument("--pairs", type=int, default=3, help="alternating pairs of runs (default 3)")
    p.add_argument("--skip", type=int, default=10, help="warm-up steps excluded (default 10)")
    p.add_argument("--through", choices=("torchrun", "launcher"), default="torchrun", help="how train.py starts")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-"))
    data = ensure_dataset(work)
    pairs: list[dict[str, Any]] = []
    for r in range(args.pairs):
        train_py, train_roles = ours(args, data, work / f"ckpt-throughput-{args.through}-{r}")
        loop, loop_roles = minimal(args, data)
        pairs.append({"train_py": round(train_py), "minimal": round(loop), "ratio": round(train_py / loop, 3),
                      "train_py_cpu_s": _rounded(train_roles), "minimal_cpu_s": _rounded(loop_roles)})  # fmt: skip
        print(json.dumps(pairs[-1]), flush=True)
    quiet = sorted(pairs, key=lambda pair: -pair["minimal"])[: max(1, len(pairs) // 4)]
    result = {
        "benchmark": "throughput_vs_minimal_ddp",
        "through": args.through,
        "model": args.model,
        "steps": args.steps,
        "pairs": len(pairs),
        "median_ratio": statistics.median(pair["ratio"] for pair in pairs),
        "median_ratio_quietest_quarter": statistics.median(pair["ratio"] for pair in quiet),
        "train_py_cpu_outside_workers": _share(pair["train_py_cpu_s"] for pair in pairs),
        "minimal_cpu_outside_workers": _share(pair["minimal_cpu_s"] for pair in pairs),
        "goal": ">= 0.95",
    }
    print(json.dumps(result, indent=2))


def _rounded(roles: dict[str, float]) -> dict[str, float]:
    return {role: round(seconds, 2) for role, seconds in sorted(roles.items())}


def _share(runs) -> float:
    """The CPU seconds outside the workers as a share of the workers' own, over all runs."""
    runs = list(runs)
    workers = sum(run.get("workers", 0.0) for run in runs)
    return round(sum(s for run in runs for role, s in run.items() if role != "workers") / workers, 4)


if __name__ == "__main__":
    main()
