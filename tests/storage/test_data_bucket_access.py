"""DataBucketAccess alone: the bucket's one named export, and the one grant training roles get on its prefixes."""

import json

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import pytest
from aws_cdk.assertions import Template

from constructs.storage.data_bucket_access import DataBucketAccess


@pytest.fixture(scope="module")
def stacks() -> tuple[Template, Template]:
    """(the storage stack that owns the bucket, a consumer stack whose role got the training grant)."""
    app = cdk.App()
    storage = cdk.Stack(app, "Storage")
    access = DataBucketAccess(storage, s3.Bucket(storage, "Data"))
    consumer = cdk.Stack(app, "Consumer")
    role = iam.Role(consumer, "JobRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    access.grant_training(role, "Training jobs")
    return Template.from_stack(storage), Template.from_stack(consumer)


def _statements(consumer: Template) -> list[dict]:
    (policy,) = consumer.find_resources("AWS::IAM::Policy").values()
    return policy["Properties"]["PolicyDocument"]["Statement"]


def _prefixes(statement: dict) -> list[str]:
    """The object prefixes a statement names (its resources are `<imported bucket ARN>/<prefix>*`)."""
    return sorted(resource["Fn::Join"][1][-1].strip("/*") for resource in statement["Resource"])


def test_the_bucket_arn_is_exported_under_the_storage_stacks_name(stacks):
    # A named export: cdk-nag findings on the consumers' statements get stable names to acknowledge.
    storage, _ = stacks
    exports = [output["Export"]["Name"] for output in storage.to_json()["Outputs"].values()]
    assert exports == ["Storage-DataBucketArn"]


def test_consumers_import_the_bucket_arn(stacks):
    _, consumer = stacks
    assert '{"Fn::ImportValue": "Storage-DataBucketArn"}' in json.dumps(_statements(consumer))


def test_training_reads_datasets_and_models_and_writes_only_checkpoints_and_runs(stacks):
    # Read datasets/ and models/ (the pipeline's: an approval's records); read-write checkpoints/ and runs/; nothing
    # else in the bucket, no wildcard actions.
    _, consumer = stacks
    statements = _statements(consumer)
    actions = [a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert all("*" not in action for action in actions)
    (reads,) = [s for s in statements if s["Action"] == "s3:GetObject"]
    assert _prefixes(reads) == ["checkpoints", "datasets", "models", "runs"]
    (writes,) = [s for s in statements if "s3:PutObject" in s["Action"]]
    assert _prefixes(writes) == ["checkpoints", "runs"]
    assert set(writes["Action"]) == {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}


def test_listing_is_limited_to_the_same_prefixes(stacks):
    _, consumer = stacks
    (listing,) = [s for s in _statements(consumer) if s["Action"] == "s3:ListBucket"]
    assert sorted(listing["Condition"]["StringLike"]["s3:prefix"]) == [
        "checkpoints/*",
        "datasets/*",
        "models/*",
        "runs/*",
    ]
