"""The pieces an EKS construct is built on in a bare stack (a VPC with private subnets, and a cluster that can apply
manifests and charts, as EksTrainingCluster makes it, without its add-ons and charts), and a reader of the
Kubernetes objects a template applies."""

import json

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_eks_v2 as eks
from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer

import constructs.compute.eks.versions as versions


def vpc(stack: cdk.Stack) -> ec2.Vpc:
    return ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)


def cluster(stack: cdk.Stack, network: ec2.Vpc) -> eks.Cluster:
    kubectl = eks.KubectlProviderOptions(kubectl_layer=KubectlV36Layer(stack, "Kubectl"))
    return eks.Cluster(
        stack,
        "Cluster",
        version=eks.KubernetesVersion.of(versions.KUBERNETES_VERSION),
        default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
        default_capacity=0,
        vpc=network,
        kubectl_provider_options=kubectl,
    )


def manifests(raw: dict) -> list[dict]:
    """Every Kubernetes object a template applies (token parts of the manifests replaced by "TOKEN")."""
    objects = []
    for resource in raw["Resources"].values():
        if resource["Type"] != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        manifest = resource["Properties"]["Manifest"]
        if isinstance(manifest, dict):
            manifest = "".join(p if isinstance(p, str) else "TOKEN" for p in manifest["Fn::Join"][1])
        objects += json.loads(manifest)
    return objects
