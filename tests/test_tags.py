"""app.tag: every resource carries Project and Environment and the user's `tags`, except the Batch types whose Tags
are create-only (their CloudFormation resource schemas): those carry only the two tags that never change."""

import aws_cdk as cdk
import aws_cdk.aws_batch as batch
import aws_cdk.aws_sns as sns
import pytest
from aws_cdk.assertions import Template

from app import CREATE_ONLY_TAGS, tag
from config import load_config
from tests.change_matrix import create_only
from tests.synthesis import context


@pytest.mark.parametrize("backend", ["batch", "eks", "sagemaker"])
def test_the_excluded_types_are_the_ones_whose_tags_replace_them(synth, backend):
    # The list is the schemas' own (Tags among createOnlyProperties, cfn-lint's bundled copies), both ways: every
    # listed type has create-only Tags, and every type of the app that has them is listed.
    for kind in CREATE_ONLY_TAGS:
        assert ("Tags",) in create_only("us-east-1", kind), kind
    kinds = {r["Type"] for t in synth(compute=backend).templates.values() for r in t.get("Resources", {}).values()}
    tagged_on_create = {kind for kind in kinds if ("Tags",) in create_only("us-east-1", kind)}
    assert tagged_on_create <= set(CREATE_ONLY_TAGS)


@pytest.fixture(scope="module")
def tagged() -> Template:
    app = cdk.App()
    stack = cdk.Stack(app, "Tagged")
    sns.Topic(stack, "Topic")
    batch.CfnJobQueue(
        stack,
        "Queue",
        priority=1,
        compute_environment_order=[
            batch.CfnJobQueue.ComputeEnvironmentOrderProperty(compute_environment="ce", order=1)
        ],
    )
    tag(app, load_config(context(tags="CostCenter=ml-42")))
    return Template.from_stack(stack)


def test_users_tags_go_on_resources_that_take_them_in_place(tagged):
    (topic,) = tagged.find_resources("AWS::SNS::Topic").values()
    tags = {t["Key"]: t["Value"] for t in topic["Properties"]["Tags"]}
    assert tags == {"CostCenter": "ml-42", "Environment": "dev", "Project": "efa-training"}


def test_a_batch_queue_carries_only_the_tags_that_never_change(tagged):
    (queue,) = tagged.find_resources("AWS::Batch::JobQueue").values()
    assert queue["Properties"]["Tags"] == {"Environment": "dev", "Project": "efa-training"}
