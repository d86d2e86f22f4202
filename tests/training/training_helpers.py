"""Helpers shared by the training image tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TRAINING_IMAGE = Path(__file__).resolve().parents[2] / "training_image"
TESTS = Path(__file__).resolve().parent  # slow_train.py: train.py with test-only delays and faults
# The image's entry points by their script names, run as the launcher runs them: `python -m`, the package on the path.
MODULES = {
    "train.py": "efa_training.train",
    "validate.py": "efa_training.validate",
    "prepare_data.py": "efa_training.prepare_data",
    "sanity_check.py": "efa_training.runtime.sanity",
    "exit_relay.py": "efa_training.runtime.exit_relay",
}
# TRAINING_PYTHON runs the launched processes on another interpreter (the images' PyTorch line: .venv-xla).
PYTHON = os.environ.get("TRAINING_PYTHON", sys.executable)

# Shared by the reference run and the resume tests: they must be the same job to compare bit for bit.
TRAIN_STEPS = 30
CHECKPOINT_EVERY = 10


def shared(tmp_path_factory, name: str, build: Callable[[Path], T]) -> T:
    """`build(folder)` once per test run, even across pytest-xdist workers, which each have a session of their own.

    xdist hands a module's tests to either worker, so each would otherwise repeat every module and session fixture
    (a real multi-process training run each). The workers share the parent of their base temp folders: the first
    to get there builds under a file lock, the others wait and load its pickled result. What `build` returns
    (and writes under `folder`) is then read by tests on both workers: a test that changes it works on a copy.
    A build that fails leaves no result, so the next worker builds again and reports its own error."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder (pytest-N), shared by its workers only
    folder, result = root / f"shared-{name}", root / f"shared-{name}.pickle"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, or when a worker dies
        if result.exists():
            return pickle.loads(result.read_bytes())
        shutil.rmtree(folder, ignore_errors=True)  # a failed build's leftovers
        folder.mkdir()
        value = build(folder)
        result.write_bytes(pickle.dumps(value))
        return value


def make_dataset(corpus_dir: Path, data_dir: Path) -> None:
    from efa_training import prepare_data
    from efa_training.workloads.gpt import sample as synthetic_corpus

    synthetic_corpus.write_corpus(corpus_dir)
    assert prepare_data.main(["--input", str(corpus_dir), "--output", str(data_dir), "--val-fraction", "0.1"]) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra: str) -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RUN_ID="test")
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TRAINING_IMAGE), os.environ.get("PYTHONPATH")]))
    for name in (
        "TRAIN_TEST_BATCH_DELAY_S",
        "TRAIN_TEST_NAN_FROM_BATCH",
        "TRAIN_TEST_HOLD_WHILE",
        "LAUNCH_EXIT_CODE_DIR",
    ):
        e.pop(name, None)
    e.update(extra)
    return e


def train_args(
    data: Path, ckpt: Path, *, steps: int = TRAIN_STEPS, every: int = CHECKPOINT_EVERY, strategy: str = "ddp"
) -> list[str]:
    return [
        "--data",
        str(data),
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        "--seed",
        "7",
        "--strategy",
        strategy,
        "--model",
        "tiny",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "3",
        "--micro-batch-size",
        "8",
        "--grad-accum-steps",
        "2",
    ]


def entry(script: str) -> str:
    """What runs `script`: a test's own file by its path, an image entry point by its module name."""
    return str(TESTS / script) if (TESTS / script).exists() else MODULES[script]


def script_args(script: str) -> list[str]:
    """`script` on a python (or torchrun) command line: a file by its path, a module after -m."""
    target = entry(script)
    return [target] if target.endswith(".py") else ["-m", target]


def torchrun_cmd(script: str, args: list[str], nproc: int, max_restarts: int = 0) -> list[str]:
    return [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--nnodes",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"localhost:{free_port()}",
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        "0.1",
        *script_args(script),
        *args,
    ]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    checkpoint_dir: Path | None = None

    def emf(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{") and '"_aws"' in line]

    def losses(self) -> list[float]:
        return [r["Loss"] for r in self.emf()]

    def summary(self) -> dict:
        return [json.loads(line)["summary"] for line in self.stdout.splitlines() if line.startswith('{"summary"')][-1]


def torchrun(
    script: str, args: list[str], nproc: int = 2, max_restarts: int = 0, timeout: float = 120, **env_extra: str
) -> Run:
    p = subprocess.run(
        torchrun_cmd(script, args, nproc, max_restarts),
        env=env(**env_extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(p.returncode, p.stdout, p.stderr)


def single_process(script: str, args: list[str], timeout: float = 120, **env_extra: str) -> Run:
    """The script without torchrun: train.py then runs as a world of one."""
    p = subprocess.run(
        [PYTHON, *script_args(script), *args], env=env(**env_extra), capture_output=True, text=True, timeout=timeout
    )
    return Run(p.returncode, p.stdout, p.stderr)


class Background:
    """A torchrun job in its own session, so the test can signal it or kill the whole group."""

    def __init__(
        self, script: str, args: list[str], workdir: Path, nproc: int = 2, max_restarts: int = 0, **env_extra: str
    ) -> None:
        self.out, self.err = workdir / "stdout.txt", workdir / "stderr.txt"
        with open(self.out, "w") as stdout, open(self.err, "w") as stderr:  # the child keeps its own copies
            self.proc = subprocess.Popen(
                torchrun_cmd(script, args, nproc, max_restarts),
                env=env(**env_extra),
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )

    def wait_for(self, predicate, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"job ended early ({self.proc.returncode}): {self.err.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill_group()
                raise AssertionError("timed out waiting for the job")
            time.sleep(0.02)

    def workers(self) -> list[int]:
        """PIDs of torchrun's direct children (the worker processes)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                pids.append(int(stat.parent.name))
        return pids

    def worker_of_rank(self, rank: int) -> int:
        """PID of the worker torchrun started with RANK=rank."""
        for pid in self.workers():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return pid
        raise AssertionError(f"no worker with RANK={rank}")

    def kill_group(self) -> None:
        """SIGKILL torchrun and every worker at once, like a container being killed.

        torchrun starts each worker in a session of its own, so killing torchrun's
        group alone would leave the workers running."""
        workers = self.workers()
        for pgid in [self.proc.pid, *workers]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(30)
        for pid in workers:  # reaped by init; wait until they are really gone
            while Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
                time.sleep(0.01)

    def finish(self, timeout: float = 120) -> Run:
        self.proc.wait(timeout)
        return Run(self.proc.returncode, self.out.read_text(), self.err.read_text())


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def checkpoint_steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in ckpt.glob("step_*") if (p / "meta.json").exists())


def final_model_state(ckpt: Path) -> dict:
    import torch

    newest = max(ckpt.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return torch.load(newest / "state.pt", map_location="cpu", weights_only=True)["model"]


def launched(script: str, args: list[str], nproc: int = 2, timeout: float = 120, **env_extra: str) -> Run:
    """torchrun behind exit_relay, run the way launch.py runs it, so the workers' exit codes survive."""
    cmd = torchrun_cmd("exit_relay.py", [entry(script), *args], nproc)
    runner = (
        "import os, sys; sys.path.insert(0, sys.argv[1]); from efa_training.runtime.launch import process; "
        "sys.exit(process.run_torchrun(sys.argv[2:], dict(os.environ)))"
    )
    p = subprocess.run(
        [PYTHON, "-c", runner, str(TRAINING_IMAGE), *cmd],
        env=env(**env_extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(p.returncode, p.stdout, p.stderr)


def error_lines(stderr: str, prog: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(f"{prog}: error: ")]
