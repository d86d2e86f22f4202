"""Taking a bad EC2 host out of a run's next attempt: terminate it, so that what launched it launches a fresh one.

Batch hosts (its compute environment replaces the instance) and EKS nodes (the managed node group's Auto Scaling
group replaces it) both carry the environment's tags: Batch's from the compute environments' computeResources.tags
("Tags for the resources are specified in the tags member of the computeResources object": Batch user guide, "Tag
your resources"), EKS nodes' from the launch template's instance tags (EfaLaunchTemplate; CDK's LaunchTemplate
copies its tags into the instance TagSpecifications). The grant is held to those tags.
"""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_stepfunctions as sfn

from config.layout import PROJECT
from constructs import Construct
from constructs.nag import acknowledge, shown_arn


def terminate_instance(scope: Construct, id_: str, instance_id: str) -> sfn.CustomState:
    """TerminateInstances of the instance id at the JSONPath `instance_id`. It "is idempotent; if you terminate an
    instance more than once, each call succeeds" (EC2 API reference, TerminateInstances); throttling and timeouts
    are retried."""
    return sfn.CustomState(
        scope,
        id_,
        state_json={
            "Type": "Task",
            "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::aws-sdk:ec2:terminateInstances",
            "Parameters": {"InstanceIds.$": f"States.Array({instance_id})"},
            "ResultPath": None,
            "TimeoutSeconds": 120,
            "Retry": [
                {
                    "ErrorEquals": ["Ec2.Ec2Exception", "States.Timeout"],
                    "IntervalSeconds": 2,
                    "MaxAttempts": 3,
                    "BackoffRate": 2,
                    "JitterStrategy": "FULL",
                }  # fmt: skip
            ],
        },
    )


def grant_terminate(principal: iam.IGrantable, environment: str) -> None:
    """ec2:TerminateInstances on this environment's tagged instances only (ec2:ResourceTag on the instance: EC2
    service authorization reference)."""
    scope = cdk.Stack.of(principal) if isinstance(principal, Construct) else None
    instances = scope.format_arn(service="ec2", resource="instance", resource_name="*") if scope else "*"
    principal.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(
            actions=["ec2:TerminateInstances"],
            resources=[instances],
            conditions={
                "StringEquals": {"ec2:ResourceTag/Project": PROJECT, "ec2:ResourceTag/Environment": environment}
            },
        )
    )


def acknowledge_terminate(role: Construct) -> None:
    """cdk-nag: the instance wildcard of grant_terminate on `role`."""
    acknowledge(
        role,
        f"AwsSolutions-IAM5[Resource::{shown_arn(cdk.Stack.of(role), 'ec2', 'instance/*')}]",
        "ec2:TerminateInstances of a host a failed attempt named bad: instance ids exist only once the hosts are "
        "launched, and the statement's conditions hold it to this environment's tagged hosts",
    )
