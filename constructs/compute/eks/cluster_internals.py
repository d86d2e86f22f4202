"""The findings on roles and functions the EKS constructs create and do not let us shape, acknowledged
(constructs/nag.py): cdk-nag's on the cluster role, the system node role and CDK's kubectl provider; checkov's on the
provider's functions and their log groups.
"""

from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks

from constructs import IConstruct
from constructs.compute.eks.accelerator_nodegroup import acknowledge_node_role
from constructs.escape_hatch import cfn
from constructs.nag import (
    acknowledge,
    acknowledge_cdk_handler,
    acknowledge_log_group_encryption,
    managed_policy_finding,
)


def acknowledge_cdk_internals(cluster: eks.Cluster, system_nodegroup: eks.Nodegroup) -> None:
    """Findings on roles and functions the EKS constructs create and do not let us shape."""
    acknowledge(
        cluster.role,
        managed_policy_finding("AmazonEKSClusterPolicy"),
        "AmazonEKSClusterPolicy is the policy EKS requires on the cluster service role",
    )
    acknowledge_node_role(system_nodegroup.role)
    provider = cluster.kubectl_provider
    assert provider is not None  # the cluster is built with a kubectl layer, so it has a provider
    for policy in (
        "service-role/AWSLambdaBasicExecutionRole",
        "service-role/AWSLambdaVPCAccessExecutionRole",
        "AmazonEC2ContainerRegistryReadOnly",
    ):
        acknowledge(
            provider,
            managed_policy_finding(policy),
            "CDK's kubectl provider functions: Lambda logging/VPC access and ECR read for OCI charts",
        )
    has_ecr_public = _logical(provider.node.find_child("Handler"), "HasEcrPublic", default_child=False)
    ecr_public = (
        f'{{"Fn::If":["{has_ecr_public}",{{"Fn::Join":["",["arn:",{{"Ref":"AWS::Partition"}},":iam::aws:policy/'
        'AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}'
    )
    acknowledge(
        provider,
        f"AwsSolutions-IAM4[Policy::{ecr_public}]",
        "CDK's kubectl handler may pull OCI charts from public ECR (the Neuron chart lives there)",
    )
    acknowledge(
        provider,
        f"AwsSolutions-IAM5[Resource::<{_logical(provider, 'Handler')}.Arn>:*]",
        "CDK's provider framework may invoke only its own kubectl handler function (its versions: ARN:*)",
    )
    acknowledge(
        provider,
        "AwsSolutions-L1",
        "CDK pins the kubectl handler's Python runtime to match the kubectl/helm layer it ships with",
    )
    _acknowledge_provider_functions(provider)


def _acknowledge_provider_functions(provider: IConstruct) -> None:
    """checkov's findings on the kubectl handler and the provider framework's onEvent function."""
    for function in (
        provider.node.find_child("Handler"),
        provider.node.find_child("Provider").node.find_child("framework-onEvent"),
    ):
        acknowledge_cdk_handler(function, "CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_173")
        # The function's own log group, with @aws-cdk/aws-lambda:useCdkManagedLogGroup (cdk.json) only.
        if log_group := function.node.try_find_child("LogGroup"):
            acknowledge_log_group_encryption(log_group)


def _logical(parent: IConstruct, child: str, default_child: bool = True) -> str:
    """The logical ID cdk-nag prints for a child of a CDK-made construct."""
    element = parent.node.find_child(child)
    resource = cast(cdk.CfnElement, cfn(element) if default_child else element)
    return cdk.Stack.of(parent).resolve(cdk.Stack.of(parent).get_logical_id(resource))
