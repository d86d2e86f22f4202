"""training_image/local_run.py's stages alone (no process run): which stage may reach MLflow's model registry.

MLflow's registry takes one version per run (runtime/registered_model.py): the baseline stage, which validates an
early checkpoint against nothing and passes by definition, must not register, or it stands for the run in place of the
model the final validation approves (and for a run whose final validation rejects its model)."""

import json
import subprocess

import pytest

import local_run


@pytest.fixture
def stages(monkeypatch, tmp_path):
    seen: dict[str, dict] = {}

    def run_stage(name, args, out, env, cwd=None):
        seen[name] = env
        return subprocess.CompletedProcess(args, 0, "", ""), 0.0

    monkeypatch.setattr(local_run, "run_stage", run_stage)
    monkeypatch.setattr(local_run, "write_corpus", lambda *a, **k: None)
    monkeypatch.setattr(local_run, "generate", lambda *a, **k: None)
    return seen, local_run.local_env(2, tmp_path), tmp_path


def test_only_the_final_validation_may_register_the_model(stages):
    seen, env, out = stages
    local_run.run_stages(out, env, steps=30)
    assert "MLFLOW_TRACKING_URI" not in seen["baseline"]
    assert seen["validate"]["MLFLOW_TRACKING_URI"] == local_run.tracking_uri(out)
    assert seen["train"]["MLFLOW_TRACKING_URI"] == local_run.tracking_uri(out)


def test_the_sparse_demo_validates_once_against_the_base_rate(stages, monkeypatch):
    # Its baseline is computed, not a validation of an early checkpoint: the final validation is the only one.
    seen, env, out = stages
    monkeypatch.setattr(local_run, "base_rate_log_loss", lambda data: 0.59)
    local_run.run_sparse_stages(out, env, steps=30, model="ctr-tiny")
    assert list(seen) == ["prepare_data", "sanity", "train", "validate"]
    assert json.loads((out / "baseline.json").read_text())["value"] == 0.59
    assert seen["validate"]["MLFLOW_TRACKING_URI"] == local_run.tracking_uri(out)


def test_the_store_is_made_whole_before_the_first_stage(tmp_path):
    # One schema creation, waited for: stages that each created it raced ("table ... already exists").
    import sqlite3

    uri = local_run.tracking_uri(tmp_path)
    assert local_run.prepare_store(uri) == f"tracked to {uri}"
    tables = {row[0] for row in sqlite3.connect(tmp_path / "mlflow.db").execute("SELECT name FROM sqlite_master")}
    assert {"experiments", "runs", "metrics", "alembic_version"} <= tables


def test_a_store_that_cannot_be_made_is_a_line_not_a_failed_run(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")  # where the store's folder would have to be
    line = local_run.prepare_store(f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}")
    assert line.startswith("not tracked: the store sqlite:///") and "could not be created" in line
