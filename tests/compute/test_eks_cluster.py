"""EksTrainingCluster alone, in a bare stack, for each accelerator family: the pinned cluster, its small system node
group, the pinned add-ons and the charts (EFA and the accelerator's device plugin, Kubeflow Trainer)."""

import functools
import json

import pytest
from aws_cdk.assertions import Match, Template

import constructs.compute.eks.versions as versions
from config import CATALOGUE
from constructs.compute.eks.cluster import EksTrainingCluster
from contracts.eks.job_spec import ACCELERATOR_TAINT_KEY
from tests.alone import bare_stack
from tests.compute.eks_parts import vpc

NVIDIA, NEURON = "p5.48xlarge", "trn1.32xlarge"
ADMIN = "arn:aws:iam::123456789012:role/Admin"


@functools.cache
def _cluster(
    instance_type: str,
    admin_role_arns: tuple[str, ...] = (),
    kubeflow_trainer: bool = False,
    public_access_cidrs: tuple[str, ...] = (),
) -> Template:
    stack = bare_stack()
    EksTrainingCluster(
        stack,
        "Training",
        vpc=vpc(stack),
        instance=CATALOGUE[instance_type],
        admin_role_arns=admin_role_arns,
        kubeflow_trainer=kubeflow_trainer,
        public_access_cidrs=public_access_cidrs,
    )
    return Template.from_stack(stack)


def _resources(template: Template, kind: str) -> list[dict]:
    return [r["Properties"] for r in template.find_resources(kind).values()]


def test_cluster_version_logging_and_no_auto_mode():
    # The pinned Kubernetes version with managed node groups (not Auto Mode), every control plane log, and both
    # endpoints (Step Functions' eks:runJob reaches the API server over the public one).
    _cluster(NVIDIA).has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Version": versions.KUBERNETES_VERSION,
            "ComputeConfig": {"Enabled": False},
            "Logging": {
                "ClusterLogging": {
                    "EnabledTypes": Match.array_with(
                        [{"Type": t} for t in ("api", "audit", "authenticator", "controllerManager", "scheduler")]
                    )
                }
            },
            "ResourcesVpcConfig": Match.object_like({"EndpointPublicAccess": True, "EndpointPrivateAccess": True}),
        },
    )


def test_system_nodegroup_is_small_on_demand_and_untainted():
    # A small on-demand system node group runs the add-ons and controllers, untainted.
    _cluster(NVIDIA).has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "AmiType": "AL2023_x86_64_STANDARD",
            "CapacityType": "ON_DEMAND",
            "ScalingConfig": {"MinSize": 2, "DesiredSize": 2, "MaxSize": 3},
            "Taints": Match.absent(),
            "LaunchTemplate": Match.any_value(),
        },
    )


def test_system_nodes_allow_one_imds_hop():
    # IMDSv2 with one hop (EKS best practices, "Restrict access to the instance profile assigned to the worker
    # node"): pods cannot use the node's role. The system node group's template is the cluster's only one.
    (template,) = _resources(_cluster(NVIDIA), "AWS::EC2::LaunchTemplate")
    options = template["LaunchTemplateData"]["MetadataOptions"]
    assert (options["HttpEndpoint"], options["HttpPutResponseHopLimit"], options["HttpTokens"]) == (
        "enabled",
        1,
        "required",
    )
    assert all("LaunchTemplate" in group for group in _resources(_cluster(NVIDIA), "AWS::EKS::Nodegroup"))


def test_addons_are_pinned():
    # Every add-on is installed, at the version versions.py names (None: EKS's default for the cluster version).
    installed = {p["AddonName"]: p.get("AddonVersion") for p in _resources(_cluster(NVIDIA), "AWS::EKS::Addon")}
    assert installed == versions.ADDONS


def test_cloudwatch_agent_uses_pod_identity():
    # The CloudWatch agent gets its permissions through a pod identity association, not the node role.
    _cluster(NVIDIA).has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "amazon-cloudwatch-observability",
            "PodIdentityAssociations": [Match.object_like({"ServiceAccount": "cloudwatch-agent"})],
        },
    )


def test_observability_addon_runs_the_agents_emf_listener():
    # The add-on's agent config keeps enhanced Container Insights and adds logs.metrics_collected.emf (TCP/UDP
    # 25888): the training pods' EMF lines go there, since Fluent Bit's wrapped stdout lines are not extracted.
    (addon,) = [
        a
        for a in _resources(_cluster(NVIDIA), "AWS::EKS::Addon")
        if a["AddonName"] == "amazon-cloudwatch-observability"
    ]
    collected = json.loads(addon["ConfigurationValues"])["agent"]["config"]["logs"]["metrics_collected"]
    assert collected["emf"] == {} and collected["kubernetes"]["enhanced_container_insights"] is True


@pytest.mark.parametrize("instance_type", [NVIDIA, NEURON])
def test_charts_are_pinned_and_match_the_accelerator(instance_type):
    # EFA plugin and the accelerator's device plugin are Helm charts at pinned versions; Kubeflow Trainer is not
    # installed unless asked for (the pipeline runs plain Indexed Jobs).
    charts = {
        p["Chart"]: (p["Repository"], p["Version"])
        for p in _resources(_cluster(instance_type), "Custom::AWSCDK-EKS-HelmChart")
    }
    nvidia = CATALOGUE[instance_type].accelerator.value == "nvidia"
    device_plugin = versions.NVIDIA_DEVICE_PLUGIN if nvidia else versions.NEURON
    expected = (versions.EFA_DEVICE_PLUGIN, device_plugin)
    assert charts == {c.chart: (c.repository, c.version) for c in expected}


def test_kubeflow_trainer_is_optional_and_never_waited_for():
    # Helm's wait makes the chart's custom resource, and with it the stack, fail until the chart is ready: a chart
    # tested upstream on Kubernetes 1.31-1.34 only must not be able to roll the cluster back.
    charts = _resources(_cluster(NVIDIA, kubeflow_trainer=True), "Custom::AWSCDK-EKS-HelmChart")
    (trainer,) = [c for c in charts if c["Chart"] == versions.KUBEFLOW_TRAINER.chart]
    assert trainer["Version"] == versions.KUBEFLOW_TRAINER.version
    assert all(not chart.get("Wait") for chart in charts)


@pytest.mark.parametrize("instance_type", [NVIDIA, NEURON])
def test_efa_device_plugin_runs_on_tainted_nodes(instance_type):
    # The EFA device plugin tolerates the accelerator taint, or EFA would never be advertised on training nodes.
    efa = next(
        p
        for p in _resources(_cluster(instance_type), "Custom::AWSCDK-EKS-HelmChart")
        if p["Chart"] == versions.EFA_DEVICE_PLUGIN.chart
    )
    assert json.loads(efa["Values"])["tolerations"][0]["key"] == ACCELERATOR_TAINT_KEY


def test_admin_roles_get_cluster_admin_access_entries():
    # eks_admin_role_arns: one access entry per role with the cluster admin policy.
    entries = _resources(_cluster(NVIDIA, (ADMIN,)), "AWS::EKS::AccessEntry")
    assert any(
        e["PrincipalArn"] == ADMIN and "AmazonEKSClusterAdminPolicy" in json.dumps(e["AccessPolicies"]) for e in entries
    )


def test_the_public_endpoint_admits_only_the_configured_blocks():
    # eks_public_access_cidrs: the API server's public endpoint (which eks:runJob needs) only from these blocks.
    (cluster,) = _resources(_cluster(NVIDIA, public_access_cidrs=("203.0.113.0/24",)), "AWS::EKS::Cluster")
    assert cluster["ResourcesVpcConfig"]["PublicAccessCidrs"] == ["203.0.113.0/24"]
    (open_cluster,) = _resources(_cluster(NVIDIA), "AWS::EKS::Cluster")
    assert "PublicAccessCidrs" not in open_cluster["ResourcesVpcConfig"]
