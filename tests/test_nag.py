"""constructs/nag.py alone: one acknowledgement id form, on the narrowest construct that carries the finding; checkov's
on the CloudFormation resource it is raised on."""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import pytest
from aws_cdk.assertions import Template

from constructs import Construct
from constructs.nag import acknowledge, managed_policy_finding


def _acknowledged(construct) -> dict[str, str]:
    return {
        rule: reason
        for entry in construct.node.metadata
        if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        for rule, reason in entry.data.items()
    }


def test_a_wildcard_finding_goes_on_the_roles_default_policy():
    # cdk-nag reports IAM5 on the policy holding the statement, so that is where the acknowledgement belongs.
    stack = cdk.Stack()
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("states.amazonaws.com"))
    role.add_to_principal_policy(iam.PolicyStatement(actions=["xray:PutTraceSegments"], resources=["*"]))
    acknowledge(role, "AwsSolutions-IAM5[Resource::*]", "X-Ray allows no resource-level permissions at all")
    assert _acknowledged(role.node.find_child("DefaultPolicy")) == {
        "AwsSolutions::AwsSolutions-IAM5[Resource::*]": "X-Ray allows no resource-level permissions at all"
    }
    assert _acknowledged(role) == {}


def test_other_findings_go_on_the_construct_itself():
    stack = cdk.Stack()
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    finding = managed_policy_finding("CloudWatchAgentServerPolicy")
    assert finding == "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/CloudWatchAgentServerPolicy]"
    acknowledge(role, finding, "The CloudWatch agent publishes the hosts' metrics with this policy")
    assert list(_acknowledged(role)) == [f"AwsSolutions::{finding}"]


def test_a_checkov_finding_is_skipped_in_its_resources_metadata():
    # checkov reads Metadata.checkov.skip: [{id, comment}] on the resource (checkov docs, "Suppressing and Skipping
    # Policies"); a second acknowledgement on the same resource adds to the first.
    stack = cdk.Stack()
    group = logs.LogGroup(stack, "Logs", retention=logs.RetentionDays.ONE_WEEK)
    acknowledge(group, "CKV_AWS_158", "CloudWatch Logs encrypts every log group at rest with its own keys")
    acknowledge(group, "CKV_AWS_66", "a second finding on the same resource keeps the first one")
    (resource,) = Template.from_stack(stack).find_resources("AWS::Logs::LogGroup").values()
    assert resource["Metadata"]["checkov"]["skip"] == [
        {"id": "CKV_AWS_158", "comment": "CloudWatch Logs encrypts every log group at rest with its own keys"},
        {"id": "CKV_AWS_66", "comment": "a second finding on the same resource keeps the first one"},
    ]


def test_a_checkov_finding_needs_a_resource():
    # A construct without a CloudFormation resource of its own cannot carry the skip: say so rather than drop it.
    group = Construct(cdk.Stack(), "Group")
    with pytest.raises(ValueError, match="no CloudFormation resource"):
        acknowledge(group, "CKV_AWS_158", "a plain construct holds no resource of its own to skip it on")
