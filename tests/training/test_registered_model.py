"""A model that passed validation in MLflow's registry (runtime/registered_model.py), against a real MLflow store
(SQLite): a version of `<environment>-<workload>` linked to the run's MLflow run, its source where the pipeline records
the approved model, once per run; a rejected model not registered; a registry that is down one line, bounded."""

import socket

import pytest

from efa_training.runtime import registered_model, tracking

mlflow_tracking = pytest.importorskip("mlflow.tracking")

PASSED = {"metric": "val_loss", "value": 2.5, "baseline": 2.501, "relative_delta": -0.0004, "tolerance": 0.001,
          "step": 40, "passed": True, "checkpoint": "/fsx/checkpoints/r/step_000040"}  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('registry') / 'mlflow.db'}"


def _trained(store: str, run_id: str, workload: str = "gpt") -> dict:
    """A run whose training was tracked (the launcher logs the workload as a parameter)."""
    env = {"MLFLOW_TRACKING_URI": store, "TRAINING_ENVIRONMENT": "dev", "MODELS_PREFIX": "s3://data-bucket/models/"}
    tracker = tracking.Tracker.from_env(env, run_id, {"workload": workload, "model": "tiny"})
    assert tracker is not None
    tracker.add(1, {"Loss": 3.0})
    tracker.close()
    return env


def _versions(store: str, name: str) -> list:
    return mlflow_tracking.MlflowClient(tracking_uri=store).search_model_versions(f"name = '{name}'")


def test_a_passing_model_is_a_version_of_its_workloads_model_at_the_approved_location(store, capsys):
    env = _trained(store, "pass-001")
    tracking.record_verdict(env, "pass-001", PASSED)  # what validate.py and user_validate.py call
    (version,) = [v for v in _versions(store, "dev-gpt") if v.tags["efa_training.run_id"] == "pass-001"]
    # The place the pipeline records the approval and registers in SageMaker's registry (docs/pipeline.md).
    assert version.source == "s3://data-bucket/models/pass-001/"
    assert version.tags["verdict_value"] == "2.5" and version.tags["verdict_baseline"] == "2.501"
    client = mlflow_tracking.MlflowClient(tracking_uri=store)
    run = client.get_run(version.run_id)
    assert run.info.run_name == "pass-001" and run.info.status == "FINISHED"  # linked to its run, left finished
    assert "registered model dev-gpt version" in capsys.readouterr().err


def test_a_second_validation_of_the_run_adds_no_version(store):
    env = _trained(store, "twice-001", workload="ctr-ps")
    for _ in range(2):  # a resumed run validates again
        registered_model.register(env, "twice-001", PASSED)
    assert len(_versions(store, "dev-ctr-ps")) == 1


def test_a_rejected_model_is_not_registered(store):
    env = _trained(store, "rejected-001", workload="torch-ddp")
    tracking.record_verdict(env, "rejected-001", {**PASSED, "passed": False, "value": 2.6})
    assert _versions(store, "dev-torch-ddp") == []


def test_a_run_whose_training_was_not_tracked_is_not_registered_and_says_why(store, capsys):
    env = {"MLFLOW_TRACKING_URI": store, "TRAINING_ENVIRONMENT": "dev"}
    registered_model.register(env, "untracked-001", PASSED)
    assert "logged no workload parameter" in capsys.readouterr().err


def test_a_registry_that_is_down_costs_one_line(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registered_model.register({"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}, "down-001", PASSED)
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "MLflow" in ln]
    assert "not registered in MLflow" in line


def test_a_registry_that_never_answers_is_waited_for_only_its_bound(monkeypatch, capsys):
    # A server that accepts and never answers: register returns while its request still hangs (no clock compared,
    # so a loaded machine cannot fail it), and says how long it waited.
    import threading

    monkeypatch.setattr(registered_model, "close_seconds", lambda uri: 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        registered_model.register(
            {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{silent.getsockname()[1]}"}, "hung", PASSED
        )
        assert any(t.name == "mlflow-registry" and t.is_alive() for t in threading.enumerate())
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "MLflow" in ln]
    assert "not registered in MLflow within 0.5 s" in line


def test_a_local_store_is_waited_for_longer_than_a_server():
    # A local SQLite store is only slow under load, never down: a short run's metrics are not dropped at 10 s.
    from efa_training.runtime import tracking

    assert tracking.close_seconds("sqlite:////tmp/x/mlflow.db") == tracking.LOCAL_CLOSE_SECONDS
    assert tracking.close_seconds("./mlruns") == tracking.LOCAL_CLOSE_SECONDS
    assert tracking.close_seconds("https://mlflow.example") == tracking.CLOSE_SECONDS < tracking.LOCAL_CLOSE_SECONDS
    assert tracking.close_seconds("arn:aws:sagemaker:us-east-1:1:mlflow-tracking-server/x") == tracking.CLOSE_SECONDS
