"""The approved model registered in the SageMaker Model Registry, executed in moto (tests/sfn_emulator.py; moto's
SageMaker holds the groups and versions, every request checked by botocore's model): a version per approved run in
the environment's group for its workload, none for a rejected one, and an approval that a registry down or
throttled past its retries never undoes (constructs/pipeline/model_registry.py)."""

import boto3

from tests.pipeline.runs import ACCEPTED, REJECTED, RUN, approval, messages
from tests.sfn_emulator import REGION

GROUP = "efa-training-dev-gpt"  # the dev environment's group for the platform's default workload


def _versions(run_id: str) -> list[dict]:
    """The group's versions registered for `run_id` (DescribeModelPackage of each listed one)."""
    sagemaker = boto3.client("sagemaker", region_name=REGION)
    try:
        listed = sagemaker.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"]
    except sagemaker.exceptions.ClientError:
        return []
    described = [sagemaker.describe_model_package(ModelPackageName=s["ModelPackageArn"]) for s in listed]
    return [d for d in described if d.get("CustomerMetadataProperties", {}).get("run_id") == run_id]


def test_an_approved_model_is_a_version_in_the_environments_group_with_its_verdict(emulator):
    emulator.verdict = ACCEPTED
    run = {**RUN, "run_id": "registry-001"}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    (version,) = _versions("registry-001")
    assert version["ModelApprovalStatus"] == "Approved" and version["ModelPackageGroupName"] == GROUP
    metadata = version["CustomerMetadataProperties"]
    assert (metadata["metric"], float(metadata["value"]), float(metadata["baseline"])) == ("val_loss", 3.18, 3.2)
    assert metadata["checkpoints"].endswith("/checkpoints/registry-001/")
    (approved,) = [m for m in messages(emulator) if m["outcome"] == "APPROVED"]
    assert approved["registry"] == {"group": GROUP, "model_package": version["ModelPackageArn"], "status": "Approved"}
    assert approval(emulator)["run_id"] == "registry-001" and emulator.refused_requests == []


def test_each_approved_run_is_a_new_version_of_the_same_group(emulator):
    emulator.verdict = ACCEPTED
    for run_id in ("registry-002", "registry-003"):
        assert emulator.run({**RUN, "run_id": run_id})["status"] == "SUCCEEDED"
    (first,), (second,) = _versions("registry-002"), _versions("registry-003")
    assert second["ModelPackageVersion"] == first["ModelPackageVersion"] + 1


def test_a_rejected_model_is_not_registered(emulator):
    emulator.verdict = REJECTED
    assert emulator.run({**RUN, "run_id": "registry-rejected"})["error"] == "ValidationFailed"
    assert _versions("registry-rejected") == []


def test_a_registry_down_past_its_retries_never_undoes_the_approval(emulator):
    # SageMaker's throttling past the six tries: the approval stays recorded and published; the notification says
    # why the version is missing.
    emulator.faults["sagemaker.create_model_package"] = ["ThrottlingException"] * 6
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "registry-down"})["status"] == "SUCCEEDED"
    assert emulator.faulted.count("sagemaker.create_model_package:ThrottlingException") == 6
    assert approval(emulator)["run_id"] == "registry-down" and _versions("registry-down") == []
    (approved,) = [m for m in messages(emulator) if m["outcome"] == "APPROVED"]
    assert approved["registry"]["group"] == GROUP and "ThrottlingException" in approved["registry"]["cause"]
