"""EksTrainingCluster alone, in a bare stack, for each accelerator family: the pinned cluster, its small system node
group, the pinned add-ons and the charts (EFA and the accelerator's device plugin, Kubeflow Trainer)."""

import copy
import functools
import json

import aws_cdk.aws_logs as logs
import pytest
from aws_cdk.assertions import Match, Template

import constructs.compute.eks.versions as versions
from config import CATALOGUE
from constructs.compute.eks.cluster import EksTrainingCluster
from constructs.compute.eks.cluster_logs import CONTAINER_INSIGHTS
from contracts.eks.job_spec import ACCELERATOR_TAINT_KEY, toleration
from tests.alone import bare_stack
from tests.change_matrix import redeploy
from tests.compute.eks_parts import vpc

NVIDIA, NEURON = "p5.48xlarge", "trn1.32xlarge"
ADMIN = "arn:aws:iam::123456789012:role/Admin"


@functools.cache
def _cluster(
    instance_type: str,
    admin_role_arns: tuple[str, ...] = (),
    kubeflow_trainer: bool = False,
    public_access_cidrs: tuple[str, ...] = (),
    log_retention: logs.RetentionDays | None = None,
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
        log_retention=log_retention,
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


def test_the_node_monitoring_agent_is_installed():
    # The agent reports AcceleratedHardwareReady, KernelReady, NetworkingReady, ... as node conditions, which node
    # auto repair on the accelerator node groups acts on (EKS user guide, "Detect node health issues with the EKS
    # node monitoring agent", node-health-nma.html; "Automatically repair nodes in EKS clusters", node-repair.html).
    addons = {a["AddonName"]: a for a in _resources(_cluster(NVIDIA), "AWS::EKS::Addon")}
    assert "eks-node-monitoring-agent" in addons


def test_the_node_monitoring_agents_dcgm_server_tolerates_the_training_taint():
    # The agent's dcgm-server DaemonSet tolerates no taint by default (the chart's dcgmAgent.tolerations), and
    # without it on a GPU node the agent reports DCGMError; the add-on takes dcgmAgent.tolerations (EKS user guide,
    # "Detect node health issues with the EKS node monitoring agent", Configure the node monitoring agent).
    (addon,) = [
        a for a in _resources(_cluster(NVIDIA), "AWS::EKS::Addon") if a["AddonName"] == "eks-node-monitoring-agent"
    ]
    assert json.loads(addon["ConfigurationValues"])["dcgmAgent"]["tolerations"] == [toleration()]


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


def _logical_id(template: Template, kind: str) -> str:
    (logical,) = template.find_resources(kind)
    return logical


def test_secrets_are_envelope_encrypted_with_a_rotated_key_of_the_cluster():
    # EncryptionConfig names the stack's own key for "secrets" (the only resource EKS encrypts); the key rotates.
    template = _cluster(NVIDIA)
    key = _logical_id(template, "AWS::KMS::Key")
    (cluster,) = _resources(template, "AWS::EKS::Cluster")
    assert cluster["EncryptionConfig"] == [
        {"Provider": {"KeyArn": {"Fn::GetAtt": [key, "Arn"]}}, "Resources": ["secrets"]}
    ]
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_a_cluster_created_without_the_key_is_replaced_by_the_next_deploy():
    # Day two: EncryptionConfig and Name are create-only (AWS::EKS::Cluster's resource schema, bundled with cfn-lint;
    # CloudFormation docs: "Update requires: Replacement"), so a cluster deployed before them is replaced, not updated.
    after = {"Eks": dict(_cluster(NVIDIA).to_json())}
    before = copy.deepcopy(after)
    cluster = _logical_id(_cluster(NVIDIA), "AWS::EKS::Cluster")
    for created_since in ("EncryptionConfig", "Name"):
        del before["Eks"]["Resources"][cluster]["Properties"][created_since]
    assert ("Eks", cluster) in redeploy(before, after, "us-east-1").replaced


def test_the_cluster_stays_in_standard_support_and_gets_there_in_place():
    # STANDARD: upgraded at the end of standard support instead of billed for extended support per cluster hour (EKS
    # user guide, "View current cluster upgrade policy"; the CloudFormation default is EXTENDED). UpgradePolicy is not
    # create-only (AWS::EKS::Cluster's resource schema, bundled with cfn-lint; "Update requires: No interruption"):
    # a cluster deployed without it is updated in place, not replaced with its node groups and access entries.
    _cluster(NVIDIA).has_resource_properties("AWS::EKS::Cluster", {"UpgradePolicy": {"SupportType": "STANDARD"}})
    after = {"Eks": dict(_cluster(NVIDIA).to_json())}
    before = copy.deepcopy(after)
    cluster = _logical_id(_cluster(NVIDIA), "AWS::EKS::Cluster")
    del before["Eks"]["Resources"][cluster]["Properties"]["UpgradePolicy"]
    assert ("Eks", cluster) not in redeploy(before, after, "us-east-1").replaced


def test_the_cluster_name_is_the_stacks_and_its_own():
    # Fixed by the stack, not generated: the stack's name, the construct's id and the first group of the stack's
    # UUID (a group a destroyed stack kept never collides with the next stack's cluster).
    (cluster,) = _resources(_cluster(NVIDIA), "AWS::EKS::Cluster")
    separator, (stack_and_construct, uuid_group) = cluster["Name"]["Fn::Join"]
    assert (separator, stack_and_construct) == ("-", "Stack-Training")
    assert uuid_group["Fn::Select"][0] == 0 and "AWS::StackId" in json.dumps(uuid_group)


def test_run_time_log_groups_are_created_first_with_retention():
    # The groups EKS (control plane) and the observability add-on (Container Insights) would create without
    # retention exist first, with the environment's retention; the cluster and the add-on wait for them.
    template = _cluster(NVIDIA, log_retention=logs.RetentionDays.TWO_WEEKS)
    (cluster_props,) = _resources(template, "AWS::EKS::Cluster")
    name = cluster_props["Name"]
    control_plane = json.dumps({"Fn::Join": ["", ["/aws/eks/", name, "/cluster"]]})
    insights = {
        json.dumps({"Fn::Join": ["", ["/aws/containerinsights/", name, f"/{kind}"]]}) for kind in CONTAINER_INSIGHTS
    }
    groups = template.find_resources("AWS::Logs::LogGroup", {"Properties": {"RetentionInDays": 14}})
    named = {json.dumps(resource["Properties"]["LogGroupName"]): logical for logical, resource in groups.items()}
    assert {control_plane} | insights <= set(named)
    resources = template.to_json()["Resources"]
    cluster = resources[_logical_id(template, "AWS::EKS::Cluster")]
    (addon,) = [r for r in resources.values() if r["Properties"].get("AddonName") == "amazon-cloudwatch-observability"]
    assert named[control_plane] in cluster["DependsOn"]
    assert {named[group] for group in insights} <= set(addon["DependsOn"])


def test_without_a_retention_the_services_keep_their_log_groups():
    # No log_retention: nothing is created under the services' names (they create their groups as before).
    names = {g.get("LogGroupName", "") for g in _resources(_cluster(NVIDIA), "AWS::Logs::LogGroup")}
    assert not any(name.startswith(("/aws/eks/", "/aws/containerinsights/")) for name in names)


def _trust(template: Template, service: str) -> dict:
    (statement,) = [
        s
        for role in _resources(template, "AWS::IAM::Role")
        for s in role["AssumeRolePolicyDocument"]["Statement"]
        if s["Principal"].get("Service") == service
    ]
    return statement


def test_the_cluster_role_serves_this_cluster_only():
    # Confused-deputy guard (EKS user guide, "Cross-service confused deputy prevention in Amazon EKS"): aws:SourceArn
    # is this cluster's ARN (its fixed name), aws:SourceAccount this account.
    template = _cluster(NVIDIA)
    (cluster,) = _resources(template, "AWS::EKS::Cluster")
    condition = _trust(template, "eks.amazonaws.com")["Condition"]
    assert condition["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert condition["ArnLike"]["aws:SourceArn"]["Fn::Join"][1][-2:] == [":cluster/", cluster["Name"]]


def test_the_cloudwatch_agent_role_serves_the_agents_service_account_only():
    # EKS Pod Identity's documented trust conditions are its session tags (EKS user guide, "Create IAM role with
    # trust policy required by EKS Pod Identity"): this cluster, the add-on's namespace and service account.
    template = _cluster(NVIDIA)
    (cluster,) = _resources(template, "AWS::EKS::Cluster")
    assert _trust(template, "pods.eks.amazonaws.com")["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-name": cluster["Name"],
        "aws:RequestTag/kubernetes-namespace": "amazon-cloudwatch",
        "aws:RequestTag/kubernetes-service-account": "cloudwatch-agent",
    }
