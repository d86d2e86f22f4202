"""Incremental training in the emulated pipeline (dev, Batch): a run that starts from an approved model.

The initial model is resolved before the run id is claimed (constructs/pipeline/initial_model.py): the newest
approved version of the run's workload in the SageMaker Model Registry (moto's, every request checked by botocore's
model), or a named run's approval record in the runs table; the train job gets its run id as `init_from`, and the
validation baseline defaults to its verdict value.
"""

import json

import boto3
import pytest

from tests.pipeline.runs import ACCEPTED, RUN, messages, record_approved, states
from tests.sfn_emulator import REGION

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

PREVIOUS: dict = {
    "run_id": "gpt-tiny-000",
    "model": "s3://bucket/models/gpt-tiny-000/",
    "checkpoints": "s3://bucket/checkpoints/gpt-tiny-000/",
    "verdict": {**ACCEPTED, "value": 3.05},
    "execution": "arn:aws:states:us-east-1:123456789012:execution:pipeline:previous",
    "approved_at": "2026-11-01T00:00:00Z",
}
INCREMENTAL = {key: value for key, value in RUN.items() if key != "baseline"}


def _approve_previous(emulator, *, published: bool = True, workload: str = "gpt") -> None:
    """PREVIOUS approved: its record in its runs-table item (and the copy in S3) and, `published`, a version in its
    workload's registry group, as the pipeline's RecordApproval and RegisterApprovedModel leave them."""
    record_approved(emulator, PREVIOUS)
    if published:
        registry = boto3.client("sagemaker", region_name=REGION)
        group = f"efa-training-dev-{workload}"
        registry.create_model_package_group(ModelPackageGroupName=group)
        for run_id in ("gpt-tiny-older", PREVIOUS["run_id"]):  # the newest approved version is the one taken
            registry.create_model_package(
                ModelPackageGroupName=group,
                ModelApprovalStatus="Approved",
                SourceUri=f"s3://{emulator.bucket}/models/{run_id}/",
                CustomerMetadataProperties={"run_id": run_id},
            )


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
    assert alert["error"] == "NoApprovedModel" and alert["detail"] == "NoApprovedVersion"
    assert "efa-training-dev-gpt" in alert["cause"]


def test_an_approved_model_of_another_workload_is_not_taken(emulator):
    # The registry keeps a group per workload: a click-through run never starts from a GPT model.
    _approve_previous(emulator)
    run = {**INCREMENTAL, "run_id": "incr-ctr", "workload": "ctr-ps", "init_from": "approved", "hyperparameters": {}}
    result = emulator.run(run)
    assert result["status"] == "FAILED" and result.get("error") == "NoApprovedModel", result
    assert "efa-training-dev-ctr-ps" in messages(emulator)[0]["cause"] and emulator.submitted == []


def test_a_registry_that_cannot_be_read_fails_the_run_before_anything_starts(emulator):
    _approve_previous(emulator)
    emulator.faults["sagemaker.list_model_packages"] = ["ThrottlingException"] * 10  # past the retries
    result = emulator.run({**INCREMENTAL, "run_id": "incr-9", "init_from": "approved"})
    assert result["status"] == "FAILED" and result.get("error") == "NoApprovedModel", result
    assert emulator.submitted == [] and not _claimed(emulator, "incr-9")


def test_a_run_that_was_never_approved_cannot_be_started_from(emulator):
    result = emulator.run({**RUN, "run_id": "incr-5", "init_from": "gpt-tiny-999"})
    assert result["status"] == "FAILED" and result.get("error") == "ModelNotApproved", result
    assert emulator.submitted == [] and not _claimed(emulator, "incr-5")


def test_a_run_cannot_start_from_itself(emulator):
    result = emulator.run({**RUN, "run_id": "incr-6", "init_from": "incr-6"})
    assert result["status"] == "FAILED" and result.get("error") == "InvalidInput", result
    assert "init_from" in result.get("cause", "")


def test_a_first_run_without_a_baseline_makes_its_own_metric_the_baseline(emulator):
    # No model of its workload was ever approved here (none in the registry): validation gets `none`, so its own metric
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


def test_an_approved_version_that_names_no_run_fails_the_run_before_any_job(emulator):
    # A version registered by other means (no run_id in its metadata): refused and notified, never a runtime error
    # that no Catch takes.
    registry = boto3.client("sagemaker", region_name=REGION)
    registry.create_model_package_group(ModelPackageGroupName="efa-training-dev-gpt")
    registry.create_model_package(
        ModelPackageGroupName="efa-training-dev-gpt", ModelApprovalStatus="Approved", SourceUri="s3://elsewhere/m/"
    )
    result = emulator.run({**INCREMENTAL, "run_id": "incr-10", "init_from": "approved"})
    assert result["status"] == "FAILED" and result.get("error") == "ModelNotApproved", result
    (alert,) = messages(emulator)
    assert alert["detail"] == "ApprovedVersionUnnamed" and emulator.submitted == []


def test_an_approval_file_a_job_wrote_in_s3_does_not_make_a_run_approved(emulator):
    # A job can write models/<run_id>/approval.json through /fsx (the data repository association exports it): the
    # record a run starts from is the runs table's, which only the pipeline writes (approval_record.py).
    emulator.s3.put_object(
        Bucket=emulator.bucket, Key=f"models/{PREVIOUS['run_id']}/approval.json", Body=json.dumps(PREVIOUS).encode()
    )
    result = emulator.run({**RUN, "run_id": "incr-forged", "init_from": PREVIOUS["run_id"]})
    assert result["status"] == "FAILED" and result.get("error") == "ModelNotApproved", result
    assert "records no approval" in result["cause"] and emulator.submitted == []
