"""The approved model registered in the SageMaker Model Registry, executed in moto (tests/sfn_emulator.py; moto's
SageMaker holds the groups and versions, every request checked by botocore's model): a version per approved run in
the environment's group for its workload, none for a rejected one, and an approval that a registry down or
throttled past its retries never undoes, and a registration whose answer is lost and is retried that still adds one
version (constructs/pipeline/model_registry.py)."""

import boto3
import pytest
from moto.sagemaker.models import SageMakerModelBackend

from tests.pipeline.runs import ACCEPTED, REJECTED, RUN, approval, messages
from tests.sfn_emulator import REGION

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

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


def test_the_version_names_the_models_folder_in_its_metadata_and_no_source_uri(emulator, monkeypatch):
    # API_CreateModelPackage SourceUri: "If you want to clone a model package, set it to the model package Amazon
    # Resource Name (ARN). If you want to register a model, set it to the model ARN." The platform makes no SageMaker
    # model, so the folder goes in CustomerMetadataProperties (moto ignores SourceUri: the request is what counts).
    requests, check = [], emulator.check_request

    def recorded(service: str, operation: str, request: dict) -> None:
        requests.append((service, operation, request))
        check(service, operation, request)

    monkeypatch.setattr(emulator, "check_request", recorded)
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "registry-source"})["status"] == "SUCCEEDED"
    (created,) = [r for s, o, r in requests if (s, o) == ("sagemaker", "CreateModelPackage")]
    assert "SourceUri" not in created
    (version,) = _versions("registry-source")
    assert version["CustomerMetadataProperties"]["model"].endswith("/models/registry-source/")


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


@pytest.fixture
def idempotent_registry(monkeypatch):
    """SageMaker's ClientToken honoured: moto 5.2.1 stores it but creates a version per call. A create with a token
    seen before returns the version that token made (API_CreateModelPackage ClientToken: "A unique token that
    guarantees that the call to this API is idempotent."); without a token every call is a new version."""
    create, made = SageMakerModelBackend.create_model_package, {}

    def create_once(self, *args, **kwargs):
        token = kwargs.get("client_token")
        if token is None:
            return create(self, *args, **kwargs)
        if token not in made:
            made[token] = create(self, *args, **kwargs)
        return made[token]

    monkeypatch.setattr(SageMakerModelBackend, "create_model_package", create_once)


def test_a_registration_retried_after_its_answer_was_lost_is_one_version(emulator, idempotent_registry):
    # The version is made, then SageMaker's answer is lost (throttled on the way back): the Retry sends the run's
    # token again. Without a token of its own, the SDK fills in a fresh one per call (the member is an
    # idempotencyToken in SageMaker's API model), so the retry would add a second version of the same run.
    emulator.faults["sagemaker.create_model_package"] = ["after:ThrottlingException"]
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "registry-retried"})["status"] == "SUCCEEDED"
    assert emulator.faulted == ["sagemaker.create_model_package:after:ThrottlingException"]
    (version,) = _versions("registry-retried")
    (approved,) = [m for m in messages(emulator) if m["outcome"] == "APPROVED"]
    assert approved["registry"]["model_package"] == version["ModelPackageArn"]
