"""Asynchronous against synchronous parameter-server training, with equal workers and with a straggler (ps.py).

    python training_image/benchmarks/ps_staleness.py --work /tmp/ps-bench [--repeats 2]

The same generated Criteo data (40,000 records, a known best AUC), ctr-tiny, 2 servers and 2 workers on this machine,
300 steps of 128 records per worker; staleness 0 (synchronous), 4 (the default bound) and -1 (unbounded), each with
both workers at full speed and with worker 1 at half speed (PS_SLOW_WORKER=1:2, which sleeps as long as its step
took). Reports, per configuration: the job's samples per second while both workers train (the sum of their rates),
the wall time of the whole job, and the AUC and log-loss on the holdout. Every worker reads its own share of the
data (criteo.block_indices), so with a straggler the job still ends when the straggler has read its share: an
asynchronous job gains throughput while both run, not an earlier end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import TRAIN, VALIDATE, free_port

STEPS, BATCH = 300, 128
CONFIGS = [(s, slow) for s in (0, 4, -1) for slow in ("", "1:2")]


def ensure_data(work: Path) -> Path:
    from efa_training import prepare_data
    from efa_training.workloads.ctr_ps import sample as ctr_data

    data = work / "data"
    if not (data / "dataset.json").exists():
        work.mkdir(parents=True, exist_ok=True)
        ctr_data.generate(work / "day_0.txt", 40_000, seed=5, cardinality=100)
        args = [
            "--format",
            "criteo",
            "--input",
            str(work / "day_0.txt"),
            "--output",
            str(data),
            "--val-fraction",
            "0.1",
        ]
        assert prepare_data.main(args) == 0
    return data


def run(work: Path, data: Path, staleness: int, slow: str, repeat: int) -> dict:
    ckpt = work / f"ckpt-{staleness}-{slow.replace(':', 'x') or 'equal'}-{repeat}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PS_REGISTRY": f"127.0.0.1:{free_port()}", "PS_WORKERS_PER_NODE": "2"}
    env.pop("PS_SLOW_WORKER", None)
    if slow:
        env["PS_SLOW_WORKER"] = slow
    args = ["--strategy", "ps", "--model", "ctr-tiny", "--data", str(data), "--checkpoint-dir", str(ckpt)]
    args += ["--max-steps", str(STEPS), "--batch-size", str(BATCH), "--lr", "0.02", "--ps-servers-per-node", "2"]
    args += ["--staleness", str(staleness), "--log-every", "50", "--checkpoint-every", str(STEPS)]
    began = time.perf_counter()
    out = subprocess.run([sys.executable, *TRAIN, *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    assert out.returncode == 0, out.stderr[-2000:]
    workers = [json.loads(line)["ps_worker_summary"] for line in out.stdout.splitlines() if "ps_worker_summary" in line]
    check = [sys.executable, *VALIDATE, "--checkpoint", str(ckpt), "--data", str(data)]
    verdict = json.loads(subprocess.run([*check, "--baseline", "1"], capture_output=True, text=True).stdout)["verdict"]
    return {
        "samples_per_second": sum(w["samples_per_second"] for w in workers),
        "wall_seconds": wall,
        "auc": verdict["auc"],
        "logloss": verdict["value"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    data = ensure_data(args.work)
    print("| staleness | workers | samples/s while both train | job wall (s) | AUC | log-loss |")
    print("|---|---|---|---|---|---|")
    for staleness, slow in CONFIGS:
        runs = [run(args.work, data, staleness, slow, r) for r in range(args.repeats)]

        def median(key: str, runs: list[dict] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        name = {0: "0 (synchronous)", -1: "-1 (asynchronous)"}.get(staleness, str(staleness))
        workers = "worker 1 at half speed" if slow else "equal"
        auc = "-".join(f"{r['auc']:.3f}" for r in runs)
        print(
            f"| {name} | {workers} | {median('samples_per_second'):,.0f} | {median('wall_seconds'):.1f} | {auc} | "
            f"{median('logloss'):.4f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
