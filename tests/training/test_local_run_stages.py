"""training_image/local_run.py's stages alone (no process run): which stage may reach MLflow's model registry.

MLflow's registry takes one version per run (runtime/registered_model.py): the baseline stage, which validates an
early checkpoint against nothing and passes by definition, must not register, or it stands for the run in place of the
model the final validation approves (and for a run whose final validation rejects its model)."""

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


@pytest.mark.parametrize("sparse", [False, True], ids=["gpt", "ctr-ps"])
def test_only_the_final_validation_may_register_the_model(stages, sparse):
    seen, env, out = stages
    if sparse:
        local_run.run_sparse_stages(out, env, steps=30, model="ctr-tiny")
    else:
        local_run.run_stages(out, env, steps=30)
    assert "MLFLOW_TRACKING_URI" not in seen["baseline"]
    assert seen["validate"]["MLFLOW_TRACKING_URI"] == local_run.tracking_uri(out)
    assert seen["train"]["MLFLOW_TRACKING_URI"] == local_run.tracking_uri(out)
