"""examples/accelerate_ddp on CPU with real processes: a Hugging Face Accelerate script under its own per-node
launcher (`"launch": "per-node"`: `accelerate launch` started once per node with the node's place, 2 workers here),
trained, resumed from Accelerate's own checkpoint (`save_state`/`load_state`), validated through the gate, and taken
through every stage by `make local-run WORKLOAD=accelerate-ddp` (tools/local_workload.py)."""

import json
import subprocess
from pathlib import Path

import pytest

from efa_training.runtime.metrics import parse_emf_lines
from tests.training import example_runs
from tools import local_workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_ddp"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example-accelerate")]


def _train(folder: Path, hyperparameters: dict) -> subprocess.CompletedProcess:
    command = example_runs.launch(folder, "train", "--hyperparameters", json.dumps(hyperparameters))
    env = example_runs.job_env("accelerate-ddp", 2)
    return subprocess.run(command, cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=240)


def test_it_trains_under_accelerate_launch_and_resumes_from_its_own_state(tmp_path):
    first = _train(tmp_path, {"max_steps": 20, "checkpoint_every": 10})
    assert first.returncode == 0, first.stderr[-3000:]
    losses = [record["loss"] for record in parse_emf_lines(first.stdout.splitlines())]
    assert len(losses) == 2  # rank 0's lines at steps 10 and 20, read by the declared regex
    assert (tmp_path / "c" / "latest").read_text() == "20" and not (tmp_path / "c" / "step-10").exists()
    second = _train(tmp_path, {"max_steps": 40, "checkpoint_every": 10})
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step=20" in second.stdout and (tmp_path / "c" / "latest").read_text() == "40"


def test_a_bad_hyperparameter_ends_the_job_with_2_through_accelerate_launch(tmp_path):
    done = _train(tmp_path, {"lr": 5})
    assert done.returncode == 2, done.stderr[-3000:]


def test_make_local_run_takes_it_through_every_stage_to_approval(tmp_path):
    assert (
        local_workload.main(["accelerate-ddp", "--out", str(tmp_path), "--hyperparameters", '{"max_steps": 40}']) == 0
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["validate"]["passed"] and report["approved"]
    assert (tmp_path / "approval.json").is_file() and (tmp_path / "run" / "model" / "metrics.json").is_file()
