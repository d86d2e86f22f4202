"""examples/hf_trainer, a Hugging Face Transformers `Trainer` script that imports nothing of the platform, runs
through the contract on CPU with real processes: declared (the declaration synth checks), trained by the platform's
launcher on 2 processes, resumed by the Trainer from its own checkpoint after the whole job was SIGKILLed, refusing a
bad hyperparameter with 2, and validated through the gate. One job serves the training, resume and validation tests:
its first attempt killed, its second run to the end.
(Its save on SIGTERM is in train.py but not tested here: the DDP example's SIGTERM test through launch.py, torchrun
and the relay failed under CI load, see test_example_workloads.py.)"""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from efa_training.runtime.metrics import parse_emf_lines
from tests.training import example_runs
from tests.training import training_helpers as th

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hf_trainer"
COMPLETE = "checkpoint-complete.json"  # train.py's marker: every rank has saved its part of checkpoint-<step>
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example-hf")]


def _launch(folder: Path, mode: str, *args: str) -> list[str]:
    return example_runs.launch(folder, mode, *args)


def _env() -> dict:
    return example_runs.job_env("hf-trainer", 2, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")


def _train_command(tmp_path: Path, hyperparameters: dict) -> list[str]:
    return _launch(tmp_path, "train", "--hyperparameters", json.dumps(hyperparameters))


def _train(tmp_path: Path, hyperparameters: dict) -> subprocess.CompletedProcess:
    command = _train_command(tmp_path, hyperparameters)
    return subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=180)


def _state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "trainer_state.json").read_text())


def _complete_steps(tmp_path: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in (tmp_path / "c").glob(f"checkpoint-*/{COMPLETE}"))


def _descendants(root: int) -> list[int]:
    """Every process below `root` (launch.py -> torchrun -> relays -> train.py), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _kill_everything(proc: subprocess.Popen) -> None:
    """SIGKILL the job and every process under it at once, like a container being killed (torchrun starts its
    workers in sessions of their own, so the launcher's group alone would leave them running)."""
    pids = _descendants(proc.pid)
    for pgid in {proc.pid, *(os.getpgid(pid) for pid in pids if Path(f"/proc/{pid}").exists())}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)
    for pid in pids:  # reaped by init; wait until they are really gone
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "Z" not in th._state(pid) and time.monotonic() < deadline:
            time.sleep(0.01)


@dataclass
class Attempts:
    folder: Path  # the job's folders: c/ (CHECKPOINT_DIR), run/ (the run's, MODEL_DIR under it)
    killed: str  # what the first attempt printed before the SIGKILL
    saved: int  # the newest complete checkpoint the SIGKILL left
    resumed: subprocess.CompletedProcess  # the second attempt, the same command, to max_steps = saved + 10


@pytest.fixture(scope="module")
def attempts(tmp_path_factory) -> Attempts:
    """One job on 2 processes, SIGKILLed whole (no chance to save) once its first checkpoint is complete, then run
    again to the end: shared by the training, resume and validation tests, since every launch spends ~10 s importing
    torch and transformers."""
    folder = tmp_path_factory.mktemp("hf-job")
    hyperparameters = {"max_steps": 100000, "save_steps": 10, "logging_steps": 5}
    out = folder / "killed.out"
    with open(out, "w") as stdout:
        job = subprocess.Popen(
            _train_command(folder, hyperparameters),
            cwd=EXAMPLE,
            env=_env(),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 150
        # A complete checkpoint, and the launcher has turned at least one loss line into a metric.
        while not (_complete_steps(folder) and '"loss"' in out.read_text()):
            assert job.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() < deadline, "no complete checkpoint in time"
            time.sleep(0.05)
    finally:
        _kill_everything(job)
    assert job.returncode == -signal.SIGKILL
    saved = max(_complete_steps(folder))  # what the killed attempt left complete (a newer one may be half-written)
    hyperparameters["max_steps"] = saved + 10
    resumed = _train(folder, hyperparameters)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return Attempts(folder, out.read_text(), saved, resumed)


# Trained for real on 2 processes: the Trainer's logged loss becomes metrics through the declared regex (one EMF
# line per log line, on the main node), and falls over the two attempts.
def test_the_hf_example_trains_on_two_processes_and_its_loss_becomes_metrics(attempts):
    def metrics(output: str) -> tuple[list[dict], list[float], list[float]]:
        records = parse_emf_lines(output.splitlines())
        printed = [float(v) for v in re.findall(r"^step=\d+ loss=([0-9.]+)", output, re.MULTILINE)]
        return records, [record["loss"] for record in records], printed

    killed, killed_losses, killed_printed = metrics(attempts.killed)
    resumed, resumed_losses, resumed_printed = metrics(attempts.resumed.stdout)
    assert len(resumed_losses) == 2 and resumed_losses == pytest.approx(resumed_printed)
    # The SIGKILL may have cut the launcher between a line and its metric: each metric is its line's, in order.
    assert killed_losses and killed_losses == pytest.approx(killed_printed[: len(killed_losses)])
    records, losses = killed + resumed, killed_losses + resumed_losses
    assert {record["RunId"] for record in records} == {"demo"} and all("learning_rate" in r for r in records)
    assert losses[-1] < losses[0] - 1.0, losses  # from ~ln(256) = 5.5 down
    last = attempts.folder / "c" / f"checkpoint-{attempts.saved + 10}"
    # Both ranks took part: each wrote its own RNG state into the Trainer's checkpoint.
    assert sorted(p.name for p in last.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]


# SIGKILL of the whole job mid-run: the next attempt, the same command, resumes with the Trainer's own resume from
# the newest complete checkpoint (its state, optimizer and step) and finishes at max_steps.
def test_the_hf_example_resumes_from_its_own_checkpoint_after_sigkill(attempts):
    saved, again = attempts.saved, attempts.resumed
    assert saved >= 10 and saved % 10 == 0
    assert "resumed from step" not in attempts.killed
    assert f"resumed from step={saved}" in again.stdout  # the Trainer's state, restored from checkpoint-<saved>
    steps = [int(s) for s in re.findall(r"^step=(\d+) loss=", again.stdout, re.MULTILINE)]
    assert steps == [saved + 5, saved + 10], again.stdout[-2000:]  # it went on from there, not from 0
    final = _state(attempts.folder / "c" / f"checkpoint-{saved + 10}")
    assert final["global_step"] == final["max_steps"] == saved + 10
    # The log history the Trainer carried over from the checkpoint: the killed attempt's steps, then this one's.
    logged = [entry["step"] for entry in final["log_history"] if "loss" in entry]
    assert logged == list(range(5, saved + 11, 5))


# A bad hyperparameter ends the job with the script's own 2 (not retried), through torchrun and the relay, before
# transformers is even imported.
def test_the_hf_example_refuses_a_bad_hyperparameter_with_2(tmp_path):
    done = _train(tmp_path, {"lr": 5, "per_device_batch_size": 0})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "train.py: bad hyperparameters: per_device_batch_size=0" in done.stderr and "lr=5" in done.stderr


# The image installs what the tests ran: the Dockerfile's pins are requirements-dev.txt's.
def test_the_hf_example_image_pins_the_packages_the_tests_use():
    dockerfile = (EXAMPLE / "Dockerfile").read_text()
    installed = dict(re.findall(r"\b([a-z][a-z0-9_-]*)==([0-9][^\s]*)", dockerfile))
    pins = dict(line.split("==") for line in (ROOT / "requirements-dev.txt").read_text().splitlines() if "==" in line)
    assert set(installed) == {"transformers", "accelerate"}
    assert installed == {name: pins[name] for name in installed}


# Validated through the gate: evaluate.py's eval_loss on held-out sequences, finite, and accepted as its own
# baseline (an environment's first run); the model is saved beside metrics.json.
def test_the_hf_example_is_validated_through_the_gate(attempts):
    folder = attempts.folder
    verdict = folder / "verdict.json"
    command = _launch(folder, "validate", "--baseline", "none", "--verdict", str(verdict))
    done = subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(verdict.read_text())
    assert result["metric"] == "eval_loss" and result["passed"] is True
    assert 0 < result["value"] < 5.0  # finite and below an untrained model's ~ln(256) = 5.5
    model = folder / "run" / "model"
    assert json.loads((model / "metrics.json").read_text()) == {"eval_loss": result["value"]}
    assert (model / "config.json").is_file() and (model / "model.safetensors").is_file()
