"""Every run an MLflow run (runtime/tracking.py): the training's metric lines and the verdict land in the run named by
the run id, in the environment's experiment, in a real MLflow store (SQLite, MLflow's default backend: "Backend
Stores", mlflow.org); a tracking server that is down never blocks the training and is reported once."""

import json
import socket
from pathlib import Path

import pytest

from efa_training.runtime import tracking
from efa_training.runtime.launch import command, rendezvous, tracked
from efa_training.runtime.metrics import emf_record
from tests.training import test_launch_hyperparameters

mlflow_tracking = pytest.importorskip("mlflow.tracking")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module: MLflow migrates a new database's schema once, which takes seconds (under load
    more than the tracker's CLOSE_SECONDS: done here, not inside the first test's bounded close)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    mlflow_tracking.MlflowClient(tracking_uri=uri).search_experiments()
    return uri


# The tests wait for the tracker's queue to be sent (close joins its thread, which ends once it is): the launcher's
# own bounded wait (CLOSE_SECONDS) is tested with a server that is down.
FLUSH_SECONDS = 300.0


# A Batch node's environment (runtime/launch/cli.py lists what it becomes), with a p5's 8 GPUs.
BATCH = {**test_launch_hyperparameters.BATCH, "ACCELERATORS_PER_NODE": "8"}


def _line(step: int, **values: float) -> str:
    return json.dumps(emf_record("r", step, values, environment="dev"))


def _run(store: str, experiment: str, name: str):
    client = mlflow_tracking.MlflowClient(tracking_uri=store)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (run,) = client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{name}'")
    return client, run


def test_a_metric_line_is_its_step_and_finite_values():
    assert tracking.metrics_of(_line(7, Loss=2.5, MFU=31.0)) == (7, {"Loss": 2.5, "MFU": 31.0})
    assert tracking.metrics_of(_line(8, Loss=float("nan"))) == (8, {})  # left out of the line, as for CloudWatch
    assert tracking.metrics_of("step 9 loss=2.1") is None and tracking.metrics_of('{"_aws": 1') is None


def test_the_training_lines_become_the_runs_metrics_with_its_parameters(store):
    env = {"MLFLOW_TRACKING_URI": store, "TRAINING_ENVIRONMENT": "dev", **BATCH}
    plan = rendezvous.plan_launch("train", env)
    tracker = tracked.tracker(env, plan, "gpt-001", "gpt", {"model": "1.3b", "lr": 0.0003})
    assert tracker is not None
    for step in (1, 2, 3):
        tracker.feed(_line(step, Loss=4.0 - step, TokensPerSecond=1000.0 * step))
    tracker.feed("a line that is not a metric")
    tracker.close(timeout=FLUSH_SECONDS)
    client, run = _run(store, "dev", "gpt-001")
    history = client.get_metric_history(run.info.run_id, "Loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    params = run.data.params
    assert (params["model"], params["lr"], params["workload"], params["scheduler"]) == (
        "1.3b",
        "0.0003",
        "gpt",
        "aws-batch",
    )
    assert (params["nodes"], params["accelerators_per_node"]) == ("2", "8")
    assert run.info.status == "FINISHED"
    assert (
        run.data.tags["efa_training.train.batch_job"] == "0f1e2d#0"
    )  # the job whose log stream holds the training's logs


def test_a_retried_attempt_and_the_validation_add_to_the_same_run(store):
    env = {"MLFLOW_TRACKING_URI": store, "TRAINING_ENVIRONMENT": "dev"}
    for attempt, status in ((1, "FAILED"), (2, "FINISHED")):
        tracker = tracking.Tracker.from_env(env, "retried-001", {"seed": 1})
        assert tracker is not None
        tracker.feed(_line(attempt, Loss=1.0 / attempt))
        tracker.close(status, timeout=FLUSH_SECONDS)
    sanity_job = {**env, "TRAINING_JOB_NAME": "retried-001-sanity-x"}  # the job whose logs hold the check's
    report = {"passed": True, "measured_busbw_gbps": 310.5, "threshold_busbw_gbps": 80}
    tracking.record_sanity(sanity_job, "retried-001", report)
    tracking.record_verdict(env, "retried-001", {"value": 0.5, "baseline": 0.51, "passed": True, "step": 2})
    client, run = _run(store, "dev", "retried-001")  # one run, not one per attempt or stage
    assert [m.value for m in client.get_metric_history(run.info.run_id, "Loss")] == [1.0, 0.5]
    assert run.data.metrics["verdict_value"] == 0.5 and run.data.metrics["verdict_passed"] == 1.0
    assert (run.data.metrics["sanity_passed"], run.data.metrics["sanity_measured_busbw_gbps"]) == (1.0, 310.5)
    assert run.data.tags["efa_training.sanity.sagemaker_job"] == "retried-001-sanity-x"


def test_no_uri_no_tracking():
    assert tracked.tracker({}, rendezvous.plan_launch("train", BATCH), "r", "gpt", {}) is None
    tracking.record_verdict({}, "r", {"passed": True})  # nothing to do, nothing raised


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_is_down_drops_what_does_not_fit_and_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(tracking, "QUEUE_LINES", 5)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the client's own retries, not the tracker's
    tracker = tracking.Tracker(f"http://127.0.0.1:{_closed_port()}", "dev", "down-001", {})
    for step in range(50):  # never waits for the server: what does not fit in the queue is dropped and counted
        tracker.feed(_line(step, Loss=1.0))
    tracker.close(timeout=3.0)  # bounded, whatever the server does
    assert 0 < tracker.dropped <= 50 - 5
    err = capsys.readouterr().err
    assert err.count("failed (") == 1 and "training goes on" in err


def test_local_runs_track_to_a_store_beside_their_output(tmp_path):
    from tools import local_workload

    env = local_workload.stage_env(None, 1, tmp_path)
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:///{Path(tmp_path) / 'mlflow.db'}"


def test_the_ui_is_the_same_mlflow_release_as_the_client():
    root = Path(__file__).resolve().parents[2]
    pins = (root / "training_image" / "requirements.txt").read_text().splitlines()
    (client,) = [ln for ln in pins if ln.startswith("mlflow-skinny==")]
    (server,) = [ln for ln in (root / "requirements-tracking.txt").read_text().splitlines() if ln.startswith("mlflow")]
    assert client.split("==")[1] == server.split("==")[1]


@pytest.mark.parametrize("dockerfile", ["Dockerfile.gpu", "Dockerfile.neuron"])
def test_the_images_install_the_mlflow_client_the_tests_run(dockerfile):
    image = Path(__file__).resolve().parents[2] / "training_image"
    # The client and its plugin for a SageMaker managed server's ARN (constructs/storage/tracking.py), at the same pins.
    pins = [
        ln for ln in (image / "requirements.txt").read_text().splitlines() if ln.startswith(("mlflow", "sagemaker-"))
    ]
    assert len(pins) == 2 and f"pip install --no-cache-dir {' '.join(pins)}\n" in (image / dockerfile).read_text()


def test_the_built_in_trainers_launch_feeds_its_metric_lines_to_the_tracker(monkeypatch):
    # launch.py train for a built-in workload: its EMF lines (what rank 0 prints) reach the tracker, which has the
    # run's hyperparameters as given; other lines do not.
    fed: list[tuple[int, dict]] = []
    monkeypatch.setattr(tracking.Tracker, "add", lambda self, step, values: fed.append((step, values)))
    env = {**BATCH, "MLFLOW_TRACKING_URI": "http://127.0.0.1:1"}
    given = json.dumps({"model": "mini", "strategy": "fsdp"})
    prepared = command.prepare("train", ["--run-id", "r7", "--hyperparameters", given], env)
    assert prepared.tracker is not None and prepared.tracker.params["model"] == "mini"
    assert prepared.on_line is not None
    prepared.on_line(_line(4, Loss=2.0))
    prepared.on_line("step 5 of something else")
    assert fed == [(4, {"Loss": 2.0})]
    assert prepared.tracker.params["workload"] == "gpt" and prepared.tracker.run_name == "r7"


EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:efa-training-dev-pipeline:rec-001-20261127T170000Z"


def _recorded_run(store: str, tmp_path: Path, record: str, experiment: str = "rec"):
    """A tracked training whose REPORT_PREFIX holds the pipeline's run.json (WriteRunRecord) as `record`."""
    (tmp_path / "rec-001").mkdir(exist_ok=True)
    (tmp_path / "rec-001" / "run.json").write_text(record)
    env = {"MLFLOW_TRACKING_URI": store, "TRAINING_ENVIRONMENT": experiment, "REPORT_PREFIX": f"{tmp_path}/"}
    track = tracked.tracker(env, rendezvous.plan_launch("train", BATCH), "rec-001", "gpt", {})
    assert track is not None
    track.feed(_line(1, Loss=2.0))
    track.close(timeout=FLUSH_SECONDS)
    return _run(store, experiment, "rec-001")[1]


def test_the_run_is_tagged_with_its_execution_and_its_quote_from_the_pipelines_record(store, tmp_path):
    # docs/pipeline.md: runs/<run_id>/run.json is {"run", "execution", "since"}, the run holding its quote.
    record = {"run": {"run_id": "rec-001", "quote": {"usd": 412.5, "hours": 3.75, "basis": "MFU 40% assumed"}},
              "execution": EXECUTION, "since": "2026-11-27T17:00:00Z"}  # fmt: skip
    run = _recorded_run(store, tmp_path, json.dumps(record))
    assert run.data.tags["efa_training.execution"] == EXECUTION
    console = run.data.tags["efa_training.execution_console"]
    assert console.startswith("https://us-east-1.console.aws.amazon.com/states/home?region=us-east-1#/v2/executions/")
    assert run.data.tags["efa_training.cost"] == f"{tmp_path}/rec-001/cost.json"  # the actual, after validation
    assert (run.data.metrics["quote_usd"], run.data.metrics["quote_hours"]) == (412.5, 3.75)


def test_an_unreadable_record_costs_one_line_and_the_run_is_still_tracked(store, tmp_path, capsys):
    run = _recorded_run(store, tmp_path, "{not json", experiment="unreadable")
    assert run.data.metrics["Loss"] == 2.0 and "efa_training.execution" not in run.data.tags
    assert capsys.readouterr().err.count("the run's context not tracked (JSONDecodeError") == 1
