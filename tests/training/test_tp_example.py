"""examples/torch_tp through the contract on CPU with real processes: a plain PyTorch script on a 2-D device mesh
(tensor parallelism on "tp", FSDP2 on "dp", DCP checkpoints), declared (the declaration synth checks), trained by
the platform's launcher on 4 processes as dp 2 x tp 2, resumed from its own sharded checkpoint, and validated in one
process through the gate. One training run is shared by the module's tests (each works on a copy of its folders)."""

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from efa_training.runtime.metrics import parse_emf_lines
from tests.training import example_runs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_tp"
STEPS = 20  # the shared run's: a loss line every 10 steps, a checkpoint every 10
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example-tp")]


def _launch(folder: Path, mode: str, *args: str) -> list[str]:
    return example_runs.launch(folder, mode, *args)


def _env() -> dict:
    return example_runs.job_env("torch-tp", 4)


def _train(folder: Path, hyperparameters: dict) -> subprocess.CompletedProcess:
    command = _launch(folder, "train", "--hyperparameters", json.dumps(hyperparameters))
    return subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=180)


def _saved_step(folder: Path) -> int:
    return int((folder / "c" / "latest").read_text().strip().removeprefix("step_"))


def _copy(trained: tuple[Path, subprocess.CompletedProcess], tmp_path: Path) -> Path:
    shutil.copytree(trained[0] / "c", tmp_path / "c")
    return tmp_path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    folder = tmp_path_factory.mktemp("torch-tp")
    return folder, _train(folder, {"max_steps": STEPS, "checkpoint_every": 10, "lr": 0.01, "tp": 2})


# Trained for real on 4 processes as dp 2 x tp 2: its printed loss becomes metrics, and falls.
def test_the_tp_example_trains_on_a_2x2_mesh_and_its_loss_lines_become_falling_metrics(trained):
    folder, done = trained
    assert done.returncode == 0, done.stderr[-3000:]
    assert "mesh dp=2 tp=2 on cpu" in done.stdout
    assert _saved_step(folder) == STEPS and len(list((folder / "c" / f"step_{STEPS}").glob("*.distcp"))) == 4
    losses = [record["loss"] for record in parse_emf_lines(done.stdout.splitlines())]
    assert len(losses) == STEPS // 10 and losses[-1] < losses[0]


# A second run with more steps resumes from the first run's sharded checkpoint and ends at its own max_steps.
def test_the_tp_example_resumes_from_its_own_checkpoint(trained, tmp_path):
    folder = _copy(trained, tmp_path)
    done = _train(folder, {"max_steps": STEPS + 10, "checkpoint_every": 10})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from step={STEPS}" in done.stdout and _saved_step(folder) == STEPS + 10
    assert "step=10 " not in done.stdout  # the steps before the checkpoint are not trained again


# Validated in one process: the 2-D checkpoint loads into a plain model (resharded by DCP) and passes the gate.
def test_the_tp_example_validates_its_2d_checkpoint_in_one_process(trained, tmp_path):
    folder = _copy(trained, tmp_path)
    verdict = folder / "verdict.json"
    command = _launch(folder, "validate", "--baseline", "none", "--verdict", str(verdict))
    done = subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(verdict.read_text())
    assert result["metric"] == "eval_loss" and math.isfinite(result["value"]) and result["passed"] is True
    assert (folder / "run" / "model" / "model.pt").is_file()


# A tp that does not divide the world size (4) is the input's fault: the job ends with the script's own 2.
def test_the_tp_example_refuses_a_tp_that_does_not_divide_the_world_with_2(tmp_path):
    done = _train(tmp_path, {"tp": 3})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "tp=3 does not divide WORLD_SIZE=4" in done.stderr
