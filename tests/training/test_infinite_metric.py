"""Infinity never passes validation: neither as the measured metric (a declared workload's gate,
runtime/user_workload.py; the built-in validate.py, whose diverged checkpoint is rejected with a verdict and never
becomes the baseline) nor as the baseline, which is refused in one line (validate.py, runtime/user_validate.py).
Each case is one where an infinity taken as a number would pass, so a check that only refuses NaN fails here."""

import json
import math
from pathlib import Path

import pytest

from contracts.workload import parse_workload
from efa_training import validate
from efa_training.runtime import user_validate
from efa_training.runtime.user_workload import UserWorkload, gate

DECLARATION = {
    "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v1"},
    "train": ["python", "train.py"],
    "validate": ["python", "evaluate.py"],
}


def _declared(direction: str) -> dict:
    return parse_workload(
        "my-llm", {**DECLARATION, "metric": {"name": "eval_loss", "direction": direction}}, Path(".")
    ).as_json()


def _workload(direction: str) -> UserWorkload:
    return UserWorkload.from_json(json.dumps(_declared(direction)))


def _metrics(folder: Path, value: float) -> Path:
    # json.dumps writes Infinity/-Infinity, which json.loads (and so a user's own evaluate script) reads back.
    (folder / "metrics.json").write_text(json.dumps({"eval_loss": value}))
    return folder


# Each infinity is on the side its direction calls better (or, with no baseline, would become the baseline itself).
@pytest.mark.parametrize(
    ("direction", "value", "baseline"),
    [("higher", math.inf, 3.2), ("lower", -math.inf, 3.2), ("lower", math.inf, None)],
)
def test_a_declared_workloads_infinite_metric_never_passes(tmp_path, direction, value, baseline):
    verdict = gate(_workload(direction), _metrics(tmp_path, value), baseline=baseline, tolerance=0.001)
    assert (verdict["passed"], verdict["value"], verdict["baseline"]) == (False, None, baseline)
    assert "no finite 'eval_loss'" in verdict["reason"]


def _evaluated(monkeypatch, measured: float) -> None:
    """validate.py without a model: the checkpoint's evaluation gives `measured`."""
    step = {"step": 30, "config": {"train": {"model": "tiny"}}}
    monkeypatch.setattr(
        validate.workloads, "evaluate", lambda root, args, device: ("val_loss", (measured, root, step, {}))
    )


@pytest.mark.parametrize("measured", [math.inf, -math.inf])
def test_a_checkpoint_with_an_infinite_loss_is_rejected_and_never_becomes_the_baseline(
    tmp_path, monkeypatch, capsys, measured
):
    # No baseline yet: a diverged loss taken as a number would be written as the environment's baseline and pass.
    _evaluated(monkeypatch, measured)
    verdict_at = tmp_path / "runs" / "run-7" / "verdict.json"
    argv = ["--checkpoint", str(tmp_path), "--data", str(tmp_path), "--device", "cpu", "--baseline", "none"]
    assert validate.main([*argv, "--verdict", str(verdict_at)]) == 0  # a rejection, not a runtime error (exit 1)
    written = json.loads(verdict_at.read_text())
    assert (written["passed"], written["value"], written["baseline_created"]) == (False, None, False)
    assert not (verdict_at.parent / "baseline.json").exists()
    assert "the model diverged" in capsys.readouterr().err


# An infinite baseline would accept any model (value <= inf): given as a number, or read from a baseline JSON.
@pytest.mark.parametrize("baseline", ["inf", "Infinity", '{"value": Infinity}', '{"val_loss": Infinity}'])
def test_an_infinite_baseline_is_refused_in_one_line(tmp_path, monkeypatch, capsys, baseline):
    _evaluated(monkeypatch, 3.0)
    if baseline.startswith("{"):
        (tmp_path / "baseline.json").write_text(baseline)
        baseline = str(tmp_path / "baseline.json")
    with pytest.raises(SystemExit) as exit_info:
        validate.main(
            ["--checkpoint", str(tmp_path), "--data", str(tmp_path), "--device", "cpu", "--baseline", baseline]
        )
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and line.startswith(f"validate.py: error: --baseline={baseline!r}")


def test_a_declared_workloads_infinite_baseline_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORKLOAD", json.dumps(_declared("lower")))
    with pytest.raises(SystemExit) as exit_info:  # before the validate command runs
        user_validate.main(["--run-id", "run-7", "--run-dir", str(tmp_path), "--baseline", "inf"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        exit_info.value.code == 2
        and line == "validate: error: --baseline='inf': not a finite number; allowed: a number, or none"
    )
