"""A declared workload's metric lines keep their step (runtime/workload_metrics.py): through the launcher's own wiring
(launch.py's prepare, the declared workload's line handler, the run's tracker) into a real MLflow store (SQLite,
MLflow's default backend), each value lands at the step its line names, not at step 0, for each of the three ways a
line names it: the declared regex's `step` group, the line's `step=N`, and `report_metrics(step=N)`."""

import json
from pathlib import Path

import pytest

from contracts.workload import STEP_GROUP as DECLARED_STEP_GROUP
from contracts.workload import WorkloadError, parse_workload
from efa_training.runtime.launch import command
from efa_training.runtime.report import PREFIX, report_metrics
from efa_training.runtime.user_workload import UserWorkload
from efa_training.runtime.workload_metrics import STEP_GROUP, LogMetrics

mlflow_tracking = pytest.importorskip("mlflow.tracking")

DECLARATION = {
    "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v1"},
    "launch": "one-process",
    "train": ["python", "train.py"],
    "validate": ["python", "evaluate.py"],
    "metric": {"name": "eval_loss", "direction": "lower"},
}
STEPS = (10, 20, 30)
# Waited for as long as it takes: the tracker's close joins its sending thread, which returns once the queue is sent
# (the launcher's own wait is CLOSE_SECONDS; a fresh SQLite store's schema migration alone can take longer under load).
FLUSH_SECONDS = 300.0


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def _tracked_history(store: str, tmp_path: Path, run_id: str, metrics: dict, lines: list[str]) -> list[tuple]:
    """The lines fed to a declared workload's launch on one local node, tracked; the run's `loss` history."""
    declared = parse_workload("steps", {**DECLARATION, "metrics": metrics}, Path("."))
    env = {"WORKLOAD": declared.variable, "MLFLOW_TRACKING_URI": store, "TRAINING_ENVIRONMENT": "steps",
           "ACCELERATORS_PER_NODE": "1", "RUN_ID": run_id}  # fmt: skip
    folders = ["--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "r")]
    launch = command.prepare("train", ["--run-id", run_id, *folders], env)
    assert launch.on_line is not None and launch.tracker is not None
    for line in lines:
        launch.on_line(line)
    launch.tracker.close(timeout=FLUSH_SECONDS)
    assert launch.tracker.lines.empty() and launch.tracker.dropped == 0  # all sent, none dropped
    client = mlflow_tracking.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("steps")
    (run,) = client.search_runs([experiment.experiment_id], filter_string=f"attributes.run_name = '{run_id}'")
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))


def test_a_regex_that_names_its_step_logs_each_value_at_that_step(store, tmp_path):
    metrics = {"loss": r"iter (?P<step>\d+)/\d+ loss=([0-9.]+)"}
    lines = [f"iter {step}/1000 loss={step / 100}" for step in STEPS]
    assert _tracked_history(store, tmp_path, "by-group", metrics, lines) == [(s, s / 100) for s in STEPS]


def test_a_lines_own_step_is_the_step_of_a_regex_without_one(store, tmp_path):
    lines = [f"epoch=0 step={step} loss={step / 100}" for step in STEPS]
    history = _tracked_history(store, tmp_path, "by-line", {"loss": r"loss=([0-9.]+)"}, lines)
    assert history == [(s, s / 100) for s in STEPS]


def test_report_metrics_logs_each_value_at_its_step(store, tmp_path, capsys):
    for step in STEPS:
        report_metrics(step=step, loss=step / 100)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.startswith(PREFIX) for line in lines)
    assert _tracked_history(store, tmp_path, "by-report", {}, lines) == [(s, s / 100) for s in STEPS]


# The step is the line's property, not a CloudWatch metric of its own (as the built-in trainers' Step).
def test_the_reported_step_is_the_lines_step_not_a_metric():
    emitted: list[str] = []
    workload = UserWorkload.from_json(parse_workload("steps", {**DECLARATION, "metrics": {}}, Path(".")).variable)
    assert LogMetrics(workload, "r", "dev", emit=emitted.append).feed(PREFIX + '{"step": 7.0, "loss": 2.0}') == {
        "loss": 2.0
    }
    (record,) = [json.loads(line) for line in emitted]
    names = [m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]]
    assert record["Step"] == 7 and "step" not in names and "step" not in record


# At synth: a regex may name a `step` group beside its one value group; any other second group is refused in one line.
def test_a_declared_regex_may_name_its_step_and_nothing_else():
    assert STEP_GROUP == DECLARED_STEP_GROUP
    named = parse_workload("steps", {**DECLARATION, "metrics": {"loss": r"(?P<step>\d+) loss=([0-9.]+)"}}, Path("."))
    assert named.metrics == {"loss": r"(?P<step>\d+) loss=([0-9.]+)"}
    with pytest.raises(WorkloadError, match=r"^workloads\.steps\.metrics\.loss=.*exactly one group .*\(\?P<step>"):
        parse_workload("steps", {**DECLARATION, "metrics": {"loss": r"(\d+) loss=([0-9.]+)"}}, Path("."))
