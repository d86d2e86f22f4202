"""validate.py in-process: the 0.1% gate against a baseline, a clearly worse checkpoint is rejected, S3 works."""

import json

import boto3
import pytest
from moto import mock_aws

from efa_training import validate
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # needs the shared 2-process training run


def _verdict(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["verdict"]


@pytest.fixture(scope="module")
def final_ckpt(ddp_reference):
    return ddp_reference.checkpoint_dir


def test_a_missing_baseline_file_is_created_from_this_checkpoint(final_ckpt, dataset, tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    assert validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--baseline", str(baseline)]) == 0
    verdict = _verdict(capsys)
    assert verdict["baseline_created"] and json.loads(baseline.read_text())["value"] == verdict["value"]


@pytest.mark.parametrize(("better_by", "passes"), [(0.0005, True), (0.002, False)])
def test_the_gate_is_a_tenth_of_a_percent_of_another_runs_baseline(
    final_ckpt, dataset, tmp_path, capsys, better_by, passes
):
    # A baseline from another run, a little better than this checkpoint: within 0.1% it passes, beyond it fails.
    measured = tmp_path / "measured.json"
    validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--baseline", str(measured)])
    value = _verdict(capsys)["value"]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"metric": "val_loss", "value": value * (1 - better_by)}))
    assert validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--baseline", str(baseline)]) == 0
    verdict = _verdict(capsys)
    assert verdict["passed"] is passes and verdict["relative_delta"] == pytest.approx(better_by, rel=0.01)


def test_clearly_worse_checkpoint_is_rejected_with_exit_code_zero(final_ckpt, dataset, tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--baseline", str(baseline)])
    earliest = final_ckpt / f"step_{min(th.checkpoint_steps(final_ckpt)):09d}"
    verdict_path = tmp_path / "verdict.json"
    code = validate.main(
        [
            "--checkpoint",
            str(earliest),
            "--data",
            str(dataset),
            "--baseline",
            str(baseline),
            "--verdict",
            str(verdict_path),
        ]
    )
    verdict = json.loads(verdict_path.read_text())
    assert code == 0 and verdict["passed"] is False and verdict["relative_delta"] > 0.01


def test_verdict_has_the_pipeline_fields(final_ckpt, dataset, tmp_path):
    path = tmp_path / "verdict.json"
    validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--verdict", str(path)])
    assert {"metric", "value", "baseline", "delta", "relative_delta", "tolerance", "passed"} <= json.loads(
        path.read_text()
    ).keys()


@mock_aws
def test_s3_baseline_and_verdict(final_ckpt, dataset, monkeypatch, capsys):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="verdicts")
    s3.put_object(Bucket="verdicts", Key="baseline.json", Body=json.dumps({"metric": "val_loss", "value": 0.5}))
    code = validate.main(
        [
            "--checkpoint",
            str(final_ckpt),
            "--data",
            str(dataset),
            "--baseline",
            "s3://verdicts/baseline.json",
            "--verdict",
            "s3://verdicts/run/verdict.json",
        ]
    )
    verdict = json.loads(s3.get_object(Bucket="verdicts", Key="run/verdict.json")["Body"].read())
    assert code == 0 and verdict["baseline"] == 0.5 and verdict["passed"] is False


@mock_aws
def test_missing_s3_baseline_is_created_from_this_run(final_ckpt, dataset, monkeypatch, capsys):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="verdicts")
    validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--baseline", "s3://verdicts/new.json"])
    stored = json.loads(s3.get_object(Bucket="verdicts", Key="new.json")["Body"].read())
    assert stored["value"] == _verdict(capsys)["value"]


@mock_aws
def test_batch_job_definition_flags_write_the_verdict_under_the_run(final_ckpt, dataset, monkeypatch):
    # The validate job's command in constructs/compute/batch/job_definitions.py: roots + names, a numeric baseline.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="data")
    code = validate.main(
        [
            "--checkpoints-root",
            str(final_ckpt.parent),
            "--run-id",
            final_ckpt.name,
            "--datasets-root",
            str(dataset.parent),
            "--dataset",
            dataset.name,
            "--model",
            "tiny",
            "--baseline",
            "0.5",
            "--tolerance",
            "0.001",
            "--verdict-prefix",
            "s3://data/runs/",
        ]
    )
    verdict = json.loads(s3.get_object(Bucket="data", Key=f"runs/{final_ckpt.name}/verdict.json")["Body"].read())
    assert code == 0 and verdict["baseline"] == 0.5 and verdict["passed"] is False


def test_no_baseline_makes_this_run_the_baseline_beside_the_verdict(final_ckpt, dataset, tmp_path):
    validate.main(
        [
            "--checkpoint",
            str(final_ckpt),
            "--data",
            str(dataset),
            "--baseline",
            "none",
            "--run-id",
            "r2",
            "--verdict-prefix",
            f"{tmp_path}/runs/",
        ]
    )
    verdict = json.loads((tmp_path / "runs" / "r2" / "verdict.json").read_text())
    baseline = json.loads((tmp_path / "runs" / "r2" / "baseline.json").read_text())
    assert verdict["passed"] and verdict["baseline_created"] and baseline["value"] == verdict["value"]


def test_wrong_model_name_is_a_usage_error(final_ckpt, dataset, capsys):
    with pytest.raises(SystemExit) as exit_info:
        validate.main(["--checkpoint", str(final_ckpt), "--data", str(dataset), "--model", "13b"])
    assert exit_info.value.code == 2 and "--model='13b'" in capsys.readouterr().err
