"""The example workloads in examples/ run through the contract on CPU with real processes: declared (the declaration
synth checks), trained by the platform's launcher on 2 processes, resumed from their own checkpoint, and validated
through the gate. (A SIGTERM through launch.py, torchrun and the relay was tested here too and failed 2 runs in
about 10 under CI load, the stop line never arriving: not claimed until understood.) examples/torch_ddp: a plain
PyTorch DDP script that imports nothing of the platform."""

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from efa_training.runtime.metrics import parse_emf_lines
from tests.training import example_runs
from tests.training import training_helpers as th

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_ddp"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example-ddp")]


def _launch(folder: Path, mode: str, *args: str) -> list[str]:
    return example_runs.launch(folder, mode, *args)


def _env() -> dict:
    return example_runs.job_env("torch-ddp", 2)


def _train(tmp_path: Path, hyperparameters: dict) -> subprocess.CompletedProcess:
    command = _launch(tmp_path, "train", "--hyperparameters", json.dumps(hyperparameters))
    return subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=180)


def _saved_step(tmp_path: Path) -> int:
    return torch.load(tmp_path / "c" / "latest.pt")["step"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """One training of the module, in two attempts: 60 steps, then resumed to 200 (the gate's tests read it)."""
    folder = tmp_path_factory.mktemp("ddp")
    first = _train(folder, {"max_steps": 60})
    assert first.returncode == 0, first.stderr[-3000:]
    assert _saved_step(folder) == 60
    return folder, first, _train(folder, {"max_steps": 200})


# Trained for real on 2 processes: its printed loss becomes metrics; a second attempt resumes from its checkpoint.
def test_the_ddp_example_trains_and_resumes_from_its_own_checkpoint(trained):
    folder, first, second = trained
    losses = [record["loss"] for record in parse_emf_lines(first.stdout.splitlines())]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step=60" in second.stdout and _saved_step(folder) == 200


# A bad hyperparameter ends the job with the script's own 2 (not retried), through torchrun and the relay.
def test_the_ddp_example_refuses_a_bad_hyperparameter_with_2(tmp_path):
    done = _train(tmp_path, {"lr": 5})
    assert done.returncode == 2, done.stderr[-3000:]


# Validated through the gate: the example's eval_loss against a baseline, in the declared direction.
def test_the_ddp_example_is_validated_through_the_gate(trained, tmp_path):
    shutil.copytree(trained[0], tmp_path, dirs_exist_ok=True)  # the module's run, trained to 200 steps

    def validate(baseline: str) -> dict:
        verdict = tmp_path / f"verdict-{baseline}.json"
        command = _launch(tmp_path, "validate", "--baseline", baseline, "--verdict", str(verdict))
        done = subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(verdict.read_text())

    first = validate("none")  # an environment's first run: its own value is the baseline
    assert first["passed"] and first["value"] < 0.1 and (tmp_path / "run" / "model" / "model.pt").is_file()
    assert not validate(str(first["value"] / 2))["passed"]  # twice as good a baseline: rejected


# `make local-run WORKLOAD=torch-ddp`: the stages the pipeline runs, here through the launcher: the platform's sanity
# check, the example's training on 2 processes, its validation through the gate, and the approval the verdict decides.
def test_make_local_run_takes_a_declared_workload_through_every_stage(tmp_path):
    from tools import local_workload

    command = [th.PYTHON, "-m", "tools.local_workload", "torch-ddp", "--out", str(tmp_path), "--hyperparameters"]
    done = subprocess.run([*command, '{"max_steps": 20}'], cwd=ROOT, env=th.env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["sanity"]["passed"] and report["train"]["loss"]["count"] == 2
    assert report["validate"]["metric"] == "eval_loss" and report["approved"] is True
    assert json.loads((tmp_path / "approval.json").read_text())["run_id"] == local_workload.RUN_ID
    # ... and the run in a local MLflow store beside them: its loss by step, its parameters, the verdict.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("local")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == local_workload.RUN_ID and run.data.params["workload"] == "torch-ddp"
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 2 and run.data.params["max_steps"] == "20"
    assert run.data.metrics["verdict_passed"] == 1.0


def test_make_local_run_refuses_a_hyperparameter_outside_the_schema_in_one_line(tmp_path, capsys):
    from tools import local_workload

    assert local_workload.main(["torch-ddp", "--out", str(tmp_path), "--hyperparameters", '{"lr": 5}']) == 2
    err = capsys.readouterr().err.strip()
    assert err == "local_workload: error: hyperparameters.lr=5 is not valid; expected a number from 0 to 1"
    assert not (tmp_path / "sanity.json").exists()


# `make local-run WORKLOAD=gpt` (or ctr-ps): a built-in trainer's stages (training_image/local_run.py) at the checked
# hyperparameters' model size; a hyperparameter outside its declaration is refused before anything runs.
def test_make_local_run_takes_a_built_in_workload_to_its_own_local_run(tmp_path, monkeypatch, capsys):
    from tools import local_workload

    calls: list[list[str]] = []

    def local_run(argv: list[str]) -> int:
        calls.append(argv)
        return 0

    monkeypatch.setattr(local_workload.local_run, "main", local_run)
    assert local_workload.main(["ctr-ps", "--out", str(tmp_path), "--hyperparameters", '{"max_steps": 40}']) == 0
    assert calls == [["--out", str(tmp_path), "--nproc", "2", "--model", "ctr-tiny", "--steps", "40"]]
    assert local_workload.main(["gpt", "--out", str(tmp_path), "--hyperparameters", '{"strategy": "ps"}']) == 2
    assert "hyperparameters.strategy='ps' is not valid" in capsys.readouterr().err and len(calls) == 1
    # The GPT's layout reaches its local run: `make local-run WORKLOAD=gpt HYPERPARAMETERS='{"strategy": "fsdp",
    # "tensor_parallel": 2}'` trains with tensor parallelism over the 2 processes, "pipeline_parallel": 2 in 2 stages.
    layout = '{"strategy": "fsdp", "tensor_parallel": 2}'
    assert local_workload.main(["gpt", "--out", str(tmp_path), "--hyperparameters", layout]) == 0
    assert calls[-1][-3:] == ["--strategy=fsdp", "--tensor-parallel=2", "--pipeline-parallel=1"]
    layout = '{"strategy": "fsdp", "pipeline_parallel": 2}'
    assert local_workload.main(["gpt", "--out", str(tmp_path), "--hyperparameters", layout]) == 0
    assert calls[-1][-3:] == ["--strategy=fsdp", "--tensor-parallel=1", "--pipeline-parallel=2"]
    # 4 stages do not fit the local run's 2 processes: refused in one line before anything runs.
    layout = '{"strategy": "fsdp", "model": "mini", "pipeline_parallel": 4}'
    assert local_workload.main(["gpt", "--out", str(tmp_path), "--hyperparameters", layout]) == 2
    assert "expected a divisor of the run's 2 workers (1 nodes x 2)" in capsys.readouterr().err


def test_a_built_in_local_run_does_not_take_makes_workload_name_for_a_declaration(monkeypatch):
    # `make local-run WORKLOAD=gpt` exports WORKLOAD=gpt to the recipe; the launcher reads WORKLOAD as a declared
    # workload's JSON and refused the built-in run's every stage ("not a workload declaration") until it was dropped.
    from tools import local_workload

    monkeypatch.setenv("WORKLOAD", "gpt")
    monkeypatch.setenv("AWS_BATCH_JOB_ID", "x")
    env = local_workload.local_run.local_env(2)
    assert "WORKLOAD" not in env and "AWS_BATCH_JOB_ID" not in env and env["ACCELERATORS_PER_NODE"] == "2"


# Stopped on SIGTERM (Batch and EKS send it before the kill, SageMaker on StopTrainingJob): the launcher passes it on,
# every rank stops at the same step, rank 0 saves, and the job ends as stopped (143: an attempt failure, retried and
# resumed), though the script itself exits 0. Signalled once a step line shows the script's handler is in place.
def test_the_ddp_example_saves_and_the_job_ends_as_stopped_on_sigterm(tmp_path):
    command = _launch(tmp_path, "train", "--hyperparameters", json.dumps({"max_steps": 1_000_000}))
    proc = subprocess.Popen(command, cwd=EXAMPLE, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step="):
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    stopped = [line for line in [*lines, *out.splitlines()] if line.startswith("stopped at step=")]
    assert proc.returncode == 143 and stopped, err[-3000:]
    assert _saved_step(tmp_path) == int(stopped[0].split("=")[1].split(":")[0])
