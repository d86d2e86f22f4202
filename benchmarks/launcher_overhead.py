"""Benchmark: a user's training script under the platform's launcher against the same script under plain torchrun.

The script is benchmarks/workload_script.py (DDP on an MLP, 2 CPU processes, gloo, a metric line every 10 steps);
it reports its own steady-state steps per second and when its first step ended. "Platform": `launch.py train` with a
declaration in WORKLOAD (the contract's environment, the platform's torchrun with its rendezvous, every worker behind
exit_relay, the main node's lines read into metrics). "Plain": `torchrun --standalone --nproc-per-node 2` with the
same files. Start-up: from the command's start to the end of the first step. Goal: throughput >= 0.98 of plain's.
Usage: .venv/bin/python benchmarks/launcher_overhead.py [--runs 5] [--steps 3000]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
DECLARATION = {
    "image": {"directory": "examples/torch_ddp"},  # checked at parse time only: the benchmark runs from benchmarks/
    "train": ["python", "workload_script.py"],
    "validate": ["python", "workload_script.py"],
    "metric": {"name": "loss", "direction": "lower"},
    "metrics": {"loss": "loss=([0-9.eE+-]+)"},
}
sys.path.insert(0, str(ROOT))

from contracts.workload import parse_workload  # noqa: E402


def _run(platform: bool, steps: int, declaration: str) -> tuple[float, float]:
    """(steps per second after warm-up, seconds from the command's start to the end of the first step)."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        hyper = json.dumps({"max_steps": steps})
        (folder / "c").mkdir()  # the launcher makes the contract's folders; plain torchrun is given them
        (folder / "hyperparameters.json").write_text(hyper)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "AWS_BATCH_"))}
        env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ACCELERATORS_PER_NODE="2", MAX_RESTARTS="0")
        env.update(HYPERPARAMETERS_FILE=str(folder / "hyperparameters.json"), CHECKPOINT_DIR=str(folder / "c"))
        env.update(WORKLOAD=declaration, RUN_ID="bench", PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")
        where = ["--data", str(folder), "--checkpoint-dir", str(folder / "c"), "--run-dir", str(folder / "run")]
        launch = [sys.executable, str(ROOT / "training_image/launch.py"), "train", "--run-id", "bench"]
        plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        command = [*launch, "--hyperparameters", hyper, *where] if platform else [*plain, "workload_script.py"]
        start = time.time()
        done = subprocess.run(command, cwd=HERE, env=env, check=True, capture_output=True, text=True)
        line = next(line for line in done.stdout.splitlines() if line.startswith('{"bench"'))
        bench = json.loads(line)["bench"]
        return bench["steps_per_s"], bench["first_step_at"] - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each, alternating (medians reported)")
    parser.add_argument("--steps", type=int, default=3000, help="steps per run")
    args = parser.parse_args()
    declaration = json.dumps(parse_workload("bench", DECLARATION, ROOT).as_json())
    samples: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.runs):
        for platform in (False, True):  # alternating, so a slow minute of the machine hits both
            samples[platform].append(_run(platform, args.steps, declaration))
    medians = {p: (statistics.median(r for r, _ in s), statistics.median(t for _, t in s)) for p, s in samples.items()}
    for platform, name in ((False, "plain torchrun"), (True, "platform launcher")):
        rate, startup = medians[platform]
        print(f"{name:18s} {rate:7.1f} steps/s  start-up {startup:5.2f} s  (median of {args.runs})")
    ratio = medians[True][0] / medians[False][0]
    print(
        f"throughput ratio {ratio:.3f} (goal >= 0.98); start-up overhead {medians[True][1] - medians[False][1]:+.2f} s"
    )


if __name__ == "__main__":
    main()
