"""cdk-nag acknowledgements for the EKS backend: one finding, one construct, one specific reason."""

import aws_cdk as cdk
from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """`finding` as cdk-nag names it: a rule (AwsSolutions-L1) or one finding (AwsSolutions-IAM4[Policy::...])."""
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"AwsSolutions::{finding}", reason=reason))


def managed_policy_finding(name: str) -> str:
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly")


def acknowledge_node_role(role: IConstruct) -> None:
    for policy in NODE_ROLE_POLICIES:
        acknowledge(role, managed_policy_finding(policy),
                    f"{policy} is one of the policies EKS documents for managed node group roles")
