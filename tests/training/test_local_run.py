"""`make local-run` end to end, for both demos as the Makefile runs them (training_image/local_run.py --out --model):
every stage through launch.py with real processes, the gate's verdict in one line and the exit code, what MLflow's
registry holds after it. Issue 48: the sparse demo judged its final model against its own step-100 checkpoint at 0.1%
and asynchronous training missed that about one run in two; it is judged against the base rate now."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import local_run
from efa_training.workloads.ctr_ps.criteo import CtrRecords

pytestmark = pytest.mark.slow


def run(tmp_path: Path, capsys, *flags: str) -> tuple[int, str, dict]:
    out = tmp_path / "local-run"
    out.mkdir()
    (out / "train.log").write_text("an earlier run's log")  # a fresh run leaves nothing of the last one
    (out / "baseline.json").write_text('{"metric": "val_loss", "value": 0.001}')  # nor judges by its baseline
    (out / "notes.json").write_text("the user's own")  # and removes only what it writes
    code = local_run.main(["--out", str(out), *flags])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "earlier" not in (out / "train.log").read_text() and (out / "notes.json").read_text() == "the user's own"
    return code, lines[-1], json.loads((out / "report.json").read_text())


def registered_steps(out: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=local_run.tracking_uri(out))
    return [v.tags["verdict_step"] for v in client.search_model_versions("")]


def test_the_gpt_demo_approves_its_final_model_in_one_line(tmp_path, capsys):
    code, last, report = run(tmp_path, capsys, "--model", "tiny")
    assert code == 0 and report["validate"]["passed"]
    assert last.startswith("[local_run] approved: val_loss ") and "+ 0.1% (the same run's checkpoint" in last
    assert report["validate"]["value"] < report["validate"]["baseline"]
    assert registered_steps(tmp_path / "local-run") == ["300"]  # the model approved, not the baseline's checkpoint


def base_rate(data: Path) -> float:
    # The training split's click rate, predicted for every holdout record, scored by binary cross-entropy.
    train, val = CtrRecords(data, "train"), CtrRecords(data, "val")
    rate = train.take(np.arange(train.n))["label"].mean()
    y = val.take(np.arange(val.n))["label"].astype(np.float64)
    return float(-np.mean(y * math.log(rate) + (1 - y) * math.log(1 - rate)))


def test_the_sparse_demo_beats_the_base_rate_and_says_so_in_one_line(tmp_path, capsys):
    code, last, report = run(tmp_path, capsys, "--model", "ctr-tiny")
    verdict = report["validate"]
    assert code == 0 and verdict["passed"] and verdict["tolerance"] == 0.001
    assert verdict["baseline"] == pytest.approx(base_rate(tmp_path / "local-run" / "data"), rel=1e-9)
    assert last.startswith("[local_run] approved: val_logloss ") and "(the base rate" in last and "AUC 0." in last
    assert registered_steps(tmp_path / "local-run") == ["300"]


def test_an_undertrained_sparse_model_is_rejected_in_one_line_with_exit_1(tmp_path, capsys):
    # Two steps of 128 records: worse than predicting the click rate (log-loss near ln 2 against about 0.59).
    code, last, report = run(tmp_path, capsys, "--model", "ctr-tiny", "--steps", "2")
    assert code == 1 and not report["validate"]["passed"]
    assert last.startswith("[local_run] rejected: val_logloss ") and last.endswith("; exit 1")
    assert registered_steps(tmp_path / "local-run") == []  # a rejected model is not registered
