"""Incremental training in the emulated pipeline (dev, Batch): a run that starts from an approved model.

The initial model is resolved before the run id is claimed (constructs/pipeline/initial_model.py): the environment's
last approved model from its SSM parameter, or a named run's approval record in S3; the train job gets its run id
as `init_from`, and the validation baseline defaults to its verdict value.
"""

import json

from tests.pipeline.runs import ACCEPTED, APPROVED_MODEL_PARAMETER, RUN, messages, states

PREVIOUS: dict = {
    "run_id": "gpt-tiny-000",
    "model": "s3://bucket/models/gpt-tiny-000/",
    "checkpoints": "s3://bucket/checkpoints/gpt-tiny-000/",
    "verdict": {**ACCEPTED, "value": 3.05},
    "execution": "arn:aws:states:us-east-1:123456789012:execution:pipeline:previous",
    "approved_at": "2026-11-01T00:00:00Z",
}
INCREMENTAL = {key: value for key, value in RUN.items() if key != "baseline"}


def _approve_previous(emulator, *, published: bool = True) -> None:
    emulator.s3.put_object(
        Bucket=emulator.bucket, Key=f"models/{PREVIOUS['run_id']}/approval.json", Body=json.dumps(PREVIOUS).encode()
    )
    if published:
        emulator.ssm.put_parameter(Name=APPROVED_MODEL_PARAMETER, Value=json.dumps(PREVIOUS), Type="String")


def _claimed(emulator, run_id: str) -> bool:
    listed = emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix=f"runs/{run_id}/run.json")
    return listed.get("KeyCount", 0) > 0


def test_a_run_from_the_last_approved_model_trains_from_it_against_its_verdict(emulator):
    _approve_previous(emulator)
    emulator.verdict = ACCEPTED
    result = emulator.run({**INCREMENTAL, "run_id": "incr-1", "init_from": "approved"})
    assert result["status"] == "SUCCEEDED", result
    train, validate = emulator.submitted[1], emulator.submitted[2]
    assert train["parameters"]["init_from"] == PREVIOUS["run_id"]
    assert float(validate["parameters"]["baseline"]) == PREVIOUS["verdict"]["value"]  # the default baseline


def test_a_run_from_a_named_approved_run_keeps_its_own_baseline(emulator):
    _approve_previous(emulator, published=False)
    emulator.verdict = ACCEPTED
    result = emulator.run({**RUN, "run_id": "incr-2", "init_from": PREVIOUS["run_id"]})
    assert result["status"] == "SUCCEEDED", result
    train, validate = emulator.submitted[1], emulator.submitted[2]
    assert train["parameters"]["init_from"] == PREVIOUS["run_id"]
    assert float(validate["parameters"]["baseline"]) == RUN["baseline"]


def test_a_run_from_scratch_tells_the_job_so(emulator):
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "incr-3"})["status"] == "SUCCEEDED"
    assert emulator.submitted[1]["parameters"]["init_from"] == "none"


def test_no_approved_model_fails_before_the_run_is_claimed_or_any_job_starts(emulator):
    result = emulator.run({**INCREMENTAL, "run_id": "incr-4", "init_from": "approved"})
    assert result["status"] == "FAILED" and result.get("error") == "NoApprovedModel", result
    assert emulator.submitted == [] and not _claimed(emulator, "incr-4")
    (alert,) = messages(emulator)
    assert alert["error"] == "NoApprovedModel" and alert["detail"] == "Ssm.ParameterNotFoundException"


def test_a_run_that_was_never_approved_cannot_be_started_from(emulator):
    result = emulator.run({**RUN, "run_id": "incr-5", "init_from": "gpt-tiny-999"})
    assert result["status"] == "FAILED" and result.get("error") == "ModelNotApproved", result
    assert emulator.submitted == [] and not _claimed(emulator, "incr-5")


def test_a_run_cannot_start_from_itself(emulator):
    result = emulator.run({**RUN, "run_id": "incr-6", "init_from": "incr-6"})
    assert result["status"] == "FAILED" and result.get("error") == "InvalidInput", result
    assert "init_from" in result.get("cause", "")


def test_a_first_run_without_a_baseline_makes_its_own_metric_the_baseline(emulator):
    # No model was ever approved here (the SSM parameter is absent): validation gets `none`, so the run's own metric
    # becomes the baseline (validate.py writes runs/<id>/baseline.json; a diverged run is never approved).
    emulator.verdict = ACCEPTED
    result = emulator.run({**INCREMENTAL, "run_id": "first-1"})
    assert result["status"] == "SUCCEEDED", result
    train, validate = emulator.submitted[1], emulator.submitted[2]
    assert train["parameters"]["init_from"] == "none" and validate["parameters"]["baseline"] == "none"


def test_once_a_model_is_approved_a_run_from_scratch_must_give_a_baseline(emulator):
    # Never a first model twice, and never another dataset's metric as the bar: refused before any claim or job.
    _approve_previous(emulator)
    result = emulator.run({**INCREMENTAL, "run_id": "scratch-1"})
    assert result["status"] == "FAILED" and result.get("error") == "InvalidInput", result
    assert "only its first run may leave the baseline out" in result["cause"]
    assert emulator.submitted == [] and not _claimed(emulator, "scratch-1")


def test_an_unreadable_approval_fails_the_run_before_any_job(emulator):
    emulator.s3.put_object(Bucket=emulator.bucket, Key="models/broken/approval.json", Body=b'{"run_id": "broken"}')
    result = emulator.run({**INCREMENTAL, "run_id": "incr-8", "init_from": "broken"})
    assert result["status"] == "FAILED" and result.get("error") == "ModelNotApproved", result
    assert emulator.submitted == []


def test_sagemaker_reading_datasets_from_s3_refuses_initial_models(synth):
    # Its jobs mount no file system, where other runs' checkpoints are: the first states refuse init_from.
    definition = states(synth(compute="sagemaker", sagemaker_data_source="s3").raw("pipeline"))
    assert definition["InitialModelUnsupported"]["Error"] == "InvalidInput"
