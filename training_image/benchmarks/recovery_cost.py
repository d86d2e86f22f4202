"""Benchmark: what a failure costs, for a few checkpoint intervals K, and the interval Young/Daly would pick.

    python training_image/benchmarks/recovery_cost.py --work /tmp/bench
CPU, 2 processes. For each K, training is killed at a random step (seeded), twice:
  job:    SIGKILL to torchrun and every worker (a host lost, a container killed); the same command is
          started again and resumes from the newest checkpoint.
  worker: SIGKILL to one worker; torchrun (--max-restarts 1) restarts the group in place.
Reported per kill: seconds from the kill to the first step completed after it (process start, rendezvous,
checkpoint verification and load, the first step), and the steps redone (trained before the kill, after
the checkpoint that was resumed). The expected cost of a failure is recovery + (K/2) steps redone on
average; checkpointing costs C per K steps. Minimising the sum gives the Young/Daly interval
sqrt(2 * C * MTBF) (Young 1974, Daly 2006), printed for the measured C and a few MTBFs.
"""

import argparse
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import TRAIN, ensure_dataset, free_port, train_records

STEP = re.compile(r'"Step": (\d+)')


def command(data: Path, ckpt: Path, model: str, steps: int, every: int, max_restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{free_port()}",
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        "0.1",
        *TRAIN,
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
    ]


class Job:
    def __init__(self, cmd: list[str], out: Path) -> None:
        self.out = out
        env = dict(os.environ, OMP_NUM_THREADS="1", RUN_ID="bench", PYTHONUNBUFFERED="1")
        with open(out, "w") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def steps(self) -> list[int]:
        return [int(m) for m in STEP.findall(self.out.read_text())]

    def wait_for_step(self, predicate, timeout: float = 300) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            steps = self.steps()
            if steps and predicate(steps):
                return steps[-1]
            if self.proc.poll() is not None:
                raise SystemExit(f"job ended early: {self.out.read_text()[-3000:]}")
            time.sleep(0.005)
        raise SystemExit("timed out")

    def workers(self) -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    pids.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                continue
        return pids

    def kill_all(self) -> None:
        for pgid in [self.proc.pid, *self.workers()]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(30)


def resumed_step(log: str) -> int:
    found = re.findall(r"resumed from .*step_(\d+)", log)
    return int(found[-1]) if found else 0


def trial(data: Path, work: Path, model: str, every: int, mode: str, rng: random.Random) -> dict:
    ckpt = work / f"ckpt-{mode}-{every}"
    kill_at = rng.randint(every + 1, 3 * every)  # after at least one checkpoint, anywhere in an interval
    steps = 3 * every + 10
    job = Job(command(data, ckpt, model, steps, every, 1 if mode == "worker" else 0), work / f"{mode}-{every}-a.log")
    done = job.wait_for_step(lambda s: s[-1] >= kill_at)
    if mode == "job":
        t_kill = time.monotonic()
        job.kill_all()
        job = Job(command(data, ckpt, model, steps, every, 0), work / f"{mode}-{every}-b.log")
        job.wait_for_step(lambda s: True)
    else:
        before = len(job.steps())
        t_kill = time.monotonic()
        os.kill(job.workers()[-1], signal.SIGKILL)
        job.wait_for_step(lambda s: len(s) > before)
    recovery = time.monotonic() - t_kill
    resumed = resumed_step(job.out.read_text())
    job.kill_all()
    return {
        "every": every,
        "mode": mode,
        "killed_after_step": done,
        "resumed_from": resumed,
        "steps_redone": done - resumed,
        "seconds_to_first_new_step": round(recovery, 2),
    }


def save_and_step_seconds(data: Path, work: Path, model: str) -> tuple[float, float]:
    out = subprocess.run(
        command(data, work / "ckpt-cost", model, 40, 5, 0),
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1", RUN_ID="bench"),
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    emf, summary = train_records(out.stdout)
    return summary["checkpoint_seconds"] / summary["checkpoints_saved"], statistics.median(
        e["StepTimeSeconds"] for e in emf[1:]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="", help="scratch directory (default: a temp dir)")
    p.add_argument("--model", default="mini", help="model size (default mini)")
    p.add_argument("--every", default="5,10,20", help="checkpoint intervals K to try (default 5,10,20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill points (default 0)")
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-"))
    data = ensure_dataset(work)
    rng = random.Random(args.seed)
    save_s, step_s = save_and_step_seconds(data, work, args.model)
    trials = [
        trial(data, work, args.model, int(k), mode, rng) for k in args.every.split(",") for mode in ("job", "worker")
    ]
    from efa_training.checkpointing.schedule import young_daly_steps  # the image's own (common put it on sys.path)

    young_daly = {
        f"{h} h": {
            "seconds": round(young_daly_steps(save_s, step_s, h)[1], 1),
            "steps": young_daly_steps(save_s, step_s, h)[0],
        }
        for h in (1, 24, 168)
    }
    print(
        json.dumps(
            {
                "benchmark": "recovery_cost",
                "model": args.model,
                "seconds_per_save": round(save_s, 4),
                "median_step_seconds": round(step_s, 4),
                "trials": trials,
                "young_daly_interval_by_mtbf": young_daly,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
