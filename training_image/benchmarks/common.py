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


def cpu_seconds_by_role(cmd: list[str], env: dict, poll: float = 0.2) -> tuple[str, dict[str, float]]:
    """Run `cmd`; (its stdout, CPU seconds (user + system) spent by each role of its process tree): `workers` (the
    training processes), `agent` (torchrun), `launcher` (launch.py and its threads), `other`. Each process's last
    sample before it ended counts, so up to `poll` seconds of a process's end may be missed."""
    import threading
    import time

    import psutil

    seen: dict[int, tuple[str, float]] = {}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:  # the root ended between the poll and the listing
                break
            for p in tree:
                try:
                    line, times = " ".join(p.cmdline()), p.cpu_times()
                except psutil.Error:
                    continue
                # A process that has ended (a zombie) has no command line left: its role is the one seen first.
                role = seen[p.pid][0] if p.pid in seen and not line else _role(line)
                seen[p.pid] = (role, times.user + times.system)
            time.sleep(poll)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    watcher.join()
    if proc.returncode:
        raise SystemExit(stderr[-3000:])
    roles: dict[str, float] = {}
    for role, seconds in seen.values():
        roles[role] = roles.get(role, 0.0) + seconds
    return stdout, roles


def _role(cmdline: str) -> str:
    if "torch.distributed.run" in cmdline:
        return "agent"
    if "launch.py" in cmdline:
        return "launcher"
    if "efa_training.train" in cmdline or "minimal_ddp_loop" in cmdline:
        return "workers"
    return "other"


def launcher_cmd(args: list[str], nproc: int = 2) -> tuple[list[str], dict]:
    """`launch.py train` as a Batch/EKS node runs it (the platform's torchrun, rendezvous, exit relay, watchdog)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RUN_ID="bench", ACCELERATORS_PER_NODE=str(nproc), MAX_RESTARTS="0")
    env["MASTER_PORT"] = str(free_port())
    return [sys.executable, str(IMAGE / "launch.py"), "train", *args], env


def torchrun_cmd(script: Path | list[str], args: list[str], nproc: int = 2) -> tuple[list[str], dict]:
    """torchrun of a benchmark's own script (a path) or of an image entry point (TRAIN), and its environment."""
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
    return cmd, dict(os.environ, OMP_NUM_THREADS="1", RUN_ID="bench")


def torchrun(script: Path | list[str], args: list[str], nproc: int = 2) -> str:
    """torchrun of a benchmark's own script (a path) or of an image entry point (TRAIN); its stdout."""
    cmd, env = torchrun_cmd(script, args, nproc)
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
