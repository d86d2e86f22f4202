"""Benchmark: from a hang to the attempt's end, under the platform's launcher on CPU (2 processes, gloo).

The training is tests/training/test_hang_watchdog.py's script: three progress lines, then rank 1 stops (SIGSTOP) or
loops outside any collective, and rank 0 waits in all_reduce. Measured from the last progress line the launcher
printed to its exit (code 6): the floor (HANG_TIMEOUT_SECONDS), the watchdog's poll, then pausing every worker, taking
each one's stacks in turn, writing the evidence and ending torchrun. What is reported beyond the floor is what the
watchdog adds to a hang's cost; on a cluster the floor dominates (default 1800 s).
Usage: .venv/bin/python benchmarks/hang_to_end.py [--runs 3] [--floor 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "training_image"))

from contracts.workload import parse_workload  # noqa: E402
from tests.training.test_hang_watchdog import HANGING_SCRIPT  # noqa: E402
from tests.training.training_helpers import free_port  # noqa: E402

DECLARATION = {
    "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/hangs:v1"},
    "validate": ["python", "train.py"],
    "metric": {"name": "loss", "direction": "lower"},
    "metrics": {"loss": "loss=([0-9.]+)"},
}


def _once(hang: str, floor: float) -> float:
    """Seconds from the last progress line to the launcher's exit."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "train.py").write_text(HANGING_SCRIPT)
        declared = parse_workload("hangs", {**DECLARATION, "train": [sys.executable, str(folder / "train.py")]}, ROOT)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "AWS_BATCH_"))}
        env.update(OMP_NUM_THREADS="1", ACCELERATORS_PER_NODE="2", MAX_RESTARTS="0", HANG=hang)
        env.update(WORKLOAD=declared.variable, HANG_TIMEOUT_SECONDS=str(floor), MASTER_PORT=str(free_port()))
        where = ["--data", scratch, "--checkpoint-dir", str(folder / "c"), "--run-dir", str(folder / "run")]
        command = [sys.executable, str(ROOT / "training_image/launch.py"), "train", "--run-id", "bench", *where]
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        last = time.monotonic()
        assert proc.stdout is not None
        for line in proc.stdout:
            if "loss=" in line:
                last = time.monotonic()
        code = proc.wait()
        assert code == 6, code
        return time.monotonic() - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--floor", type=float, default=3.0, help="HANG_TIMEOUT_SECONDS")
    args = parser.parse_args()
    for hang in ("stopped", "stuck"):
        took = [_once(hang, args.floor) for _ in range(args.runs)]
        median = statistics.median(took)
        print(f"rank 1 {hang:8s} last progress -> exit {median:5.2f} s (median of {args.runs}; floor {args.floor:g} s, "
              f"{median - args.floor:+.2f} s beyond it)")  # fmt: skip


if __name__ == "__main__":
    main()
