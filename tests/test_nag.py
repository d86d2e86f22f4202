"""constructs/nag.py alone: one acknowledgement id form, on the narrowest construct that carries the finding."""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam

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
