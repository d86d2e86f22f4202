"""Helpers for the benchmark scripts: dataset, torchrun invocation, parsing train.py output."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

IMAGE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(IMAGE))
# The image's entry points run as the launcher runs them (`python -m`), with the package on every child's path.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(IMAGE), os.environ.get("PYTHONPATH")]))
TRAIN = ["-m", "efa_training.train"]
VALIDATE = ["-m", "efa_training.validate"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_dataset(work: Path) -> Path:
    from efa_training import prepare_data
    from efa_training.workloads.gpt import sample as synthetic_corpus

    data = work / "data"
    if not (data / "dataset.json").exists():
        synthetic_corpus.write_corpus(work / "corpus", documents=16, sentences=1500)
        prepare_data.main(["--input", str(work / "corpus"), "--output", str(data), "--val-fraction", "0.05"])
    return data


def torchrun(script: Path | list[str], args: list[str], nproc: int = 2) -> str:
    """torchrun of a benchmark's own script (a path) or of an image entry point (TRAIN); its stdout."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{free_port()}",
        *([str(script)] if isinstance(script, Path) else script),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", RUN_ID="bench")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return p.stdout


def train_records(stdout: str) -> tuple[list[dict], dict]:
    lines = stdout.splitlines()
    emf = [json.loads(line) for line in lines if line.startswith("{") and '"_aws"' in line]
    summary = [json.loads(line)["summary"] for line in lines if line.startswith('{"summary"')][-1]
    return emf, summary


def tokens_per_second(step_times: list[float], tokens_per_step: int, skip: int) -> float:
    """Aggregate throughput after `skip` warm-up steps: tokens / time, not a mean of rates."""
    timed = step_times[skip:]
    return tokens_per_step * len(timed) / sum(timed)
