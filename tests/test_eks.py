"""EKS backend (-c compute=eks): each catalogue family synthesized once (p4d, p5: NVIDIA; trn1: Neuron)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk.assertions import Match

from config import CATALOGUE
import constructs.compute.eks.versions as versions
from contracts.eks.job_spec import ACCELERATOR_TAINT_KEY, EFA_RESOURCE
from contracts.job_environment import STOP_GRACE_SECONDS, shared_memory_gib

ROOT = Path(__file__).resolve().parent.parent
INSTANCE_TYPES = ("p4d.24xlarge", "p5.48xlarge", "trn1.32xlarge")


@pytest.fixture(scope="module", params=INSTANCE_TYPES)
def variant(request, synth):
    synthesized = synth(compute="eks", instance_type=request.param)
    return CATALOGUE[request.param], synthesized, synthesized.template("compute"), synthesized.raw("compute")


def resources(raw: dict, kind: str) -> list[dict]:
    return [r["Properties"] for r in raw["Resources"].values() if r["Type"] == kind]


def manifests(raw: dict) -> list[dict]:
    """Every Kubernetes object the stack applies (token parts of the manifests replaced by a placeholder)."""
    objects = []
    for props in resources(raw, "Custom::AWSCDK-EKS-KubernetesResource"):
        manifest = props["Manifest"]
        if isinstance(manifest, dict):
            manifest = "".join(p if isinstance(p, str) else "TOKEN" for p in manifest["Fn::Join"][1])
        objects += json.loads(manifest)
    return objects


def accelerator_nodegroup(raw: dict) -> dict:
    return next(p for p in resources(raw, "AWS::EKS::Nodegroup") if "Taints" in p)


# cdk-nag AwsSolutions passes: build_app's synth raises ValidationFailed on any unacknowledged finding.
def test_synthesizes_with_cdk_nag(variant):
    _, synthesized, _, _ = variant
    assert synthesized.stacks["compute"].stack_name in synthesized.templates


# The cluster runs the pinned Kubernetes version with managed node groups (not Auto Mode) and every control plane log.
def test_cluster_version_logging_and_no_auto_mode(variant):
    _, _, template, _ = variant
    template.has_resource_properties("AWS::EKS::Cluster", {
        "Version": versions.KUBERNETES_VERSION,
        "ComputeConfig": {"Enabled": False},
        "Logging": {"ClusterLogging": {"EnabledTypes": Match.array_with([
            {"Type": t} for t in ("api", "audit", "authenticator", "controllerManager", "scheduler")])}},
        "ResourcesVpcConfig": Match.object_like({"EndpointPublicAccess": True, "EndpointPrivateAccess": True}),
    })


# A small on-demand system node group runs the add-ons and controllers, untainted.
def test_system_nodegroup_is_small_and_on_demand(variant):
    _, _, template, _ = variant
    template.has_resource_properties("AWS::EKS::Nodegroup", {
        "AmiType": "AL2023_x86_64_STANDARD", "CapacityType": "ON_DEMAND",
        "ScalingConfig": {"MinSize": 2, "DesiredSize": 2, "MaxSize": 3}, "Taints": Match.absent()})


# Every add-on is installed, at the version eks_versions names (None: EKS's default for the cluster version).
def test_addons_are_pinned(variant):
    _, _, _, raw = variant
    installed = {p["AddonName"]: p.get("AddonVersion") for p in resources(raw, "AWS::EKS::Addon")}
    assert installed == versions.ADDONS


# The CloudWatch agent gets its permissions through a pod identity association, not the node role.
def test_cloudwatch_agent_uses_pod_identity(variant):
    _, _, template, _ = variant
    template.has_resource_properties("AWS::EKS::Addon", {
        "AddonName": "amazon-cloudwatch-observability",
        "PodIdentityAssociations": [Match.object_like({"ServiceAccount": "cloudwatch-agent"})]})


# EFA plugin, the accelerator's device plugin and Kubeflow Trainer are Helm charts at pinned versions.
def test_charts_are_pinned_and_match_the_accelerator(variant):
    instance, _, _, raw = variant
    charts = {p["Chart"]: (p["Repository"], p["Version"]) for p in resources(raw, "Custom::AWSCDK-EKS-HelmChart")}
    device_plugin = versions.NVIDIA_DEVICE_PLUGIN if instance.accelerator.value == "nvidia" else versions.NEURON
    expected = (versions.EFA_DEVICE_PLUGIN, device_plugin, versions.KUBEFLOW_TRAINER)
    assert charts == {c.chart: (c.repository, c.version) for c in expected}


# The EFA device plugin tolerates the accelerator taint, or EFA would never be advertised on training nodes.
def test_efa_device_plugin_runs_on_tainted_nodes(variant):
    _, _, _, raw = variant
    efa = next(p for p in resources(raw, "Custom::AWSCDK-EKS-HelmChart") if p["Chart"] == versions.EFA_DEVICE_PLUGIN.chart)
    assert json.loads(efa["Values"])["tolerations"][0]["key"] == ACCELERATOR_TAINT_KEY


# Each phase's job template requests every EFA interface and every accelerator of a node, and tolerates the taint.
def test_job_templates_take_whole_nodes(variant):
    instance, _, _, raw = variant
    config_map = next(o for o in manifests(raw) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "job-templates")
    for phase in ("sanity", "train", "validate"):
        job = json.loads(config_map["data"][f"{phase}.json"])
        limits = job["spec"]["trainer"]["resourcesPerNode"]["limits"]
        assert limits[EFA_RESOURCE] == str(instance.efa_interfaces), phase
        assert limits[instance.kubernetes_resource] == str(instance.accelerators), phase
        assert job["spec"]["trainer"]["args"][0] == phase


# The training runtime mounts FSx at /fsx and a memory-backed /dev/shm, and tolerates the accelerator taint.
def test_runtime_pod_has_fsx_shm_and_toleration(variant):
    instance, _, _, raw = variant
    runtime = next(o for o in manifests(raw) if o["kind"] == "ClusterTrainingRuntime")
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (claim,) = [o["metadata"]["name"] for o in manifests(raw) if o["kind"] == "PersistentVolumeClaim"]
    assert claim.startswith("fsx-training-")  # named by the file system's revision (see test_storage)
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shared_memory_gib(instance)}Gi"}} \
        in pod["volumes"]
    assert {"name": "fsx", "mountPath": "/fsx"} in pod["containers"][0]["volumeMounts"]
    assert pod["tolerations"][0]["key"] == ACCELERATOR_TAINT_KEY


# Nodes reserve exactly the huge pages each training pod requests; fewer and the pod would never schedule.
def test_nodes_reserve_the_huge_pages_pods_request(variant):
    _, _, _, raw = variant
    user_data = json.dumps(resources(raw, "AWS::EC2::LaunchTemplate"))
    reserved_pages = int(re.search(r"vm\.nr_hugepages = (\d+)", user_data).group(1))
    config_map = next(o for o in manifests(raw) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "job-templates")
    requested = json.loads(config_map["data"]["train.json"])["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert requested["hugepages-2Mi"] == f"{reserved_pages * 2}Mi"


# Evicted or stopped training pods keep the stop grace for their final checkpoint (Kubernetes' default is 30 s).
def test_runtime_pod_keeps_the_stop_grace_for_a_final_checkpoint(variant):
    _, _, _, raw = variant
    runtime = next(o for o in manifests(raw) if o["kind"] == "ClusterTrainingRuntime")
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == STOP_GRACE_SECONDS


# The storage stack's file system is a static PersistentVolume bound to the training namespace's claim.
def test_fsx_static_volume_and_claim(variant):
    _, _, _, raw = variant
    objects = {o["kind"]: o for o in manifests(raw)}
    assert objects["PersistentVolume"]["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert objects["PersistentVolumeClaim"]["spec"]["volumeName"] == objects["PersistentVolume"]["metadata"]["name"]


# Training pods may read datasets/ and write checkpoints/, models/ and runs/ only.
def test_pod_identity_role_is_limited_to_project_prefixes(variant):
    _, _, _, raw = variant
    statements = [s for p in resources(raw, "AWS::IAM::Policy") for s in p["PolicyDocument"]["Statement"]
                  if "s3:PutObject" in s["Action"]]
    assert len(statements) == 1
    written = {r["Fn::Join"][1][-1] for r in statements[0]["Resource"]}
    assert written == {"/checkpoints/*", "/models/*", "/runs/*"}


# The accelerator node group's launch template has the catalogue's EFA interfaces and no subnet.
def test_launch_template_has_every_efa_and_no_subnet(variant):
    instance, _, _, raw = variant
    data = next(p["LaunchTemplateData"] for p in resources(raw, "AWS::EC2::LaunchTemplate")
                if "NetworkInterfaces" in p.get("LaunchTemplateData", {}))
    interfaces = data["NetworkInterfaces"]
    assert sum(1 for i in interfaces if i.get("InterfaceType") in ("efa", "efa-only")) == instance.efa_interfaces
    assert all("SubnetId" not in i for i in interfaces)
    assert "GroupName" in data["Placement"]


# The cluster security group is on every one of p5's 32 interfaces (EKS adds none to a template with interfaces).
def test_launch_template_puts_cluster_security_group_on_every_interface(synth):
    raw = synth(compute="eks", instance_type="p5.48xlarge").raw("compute")
    (cluster_id,) = [k for k, v in raw["Resources"].items() if v["Type"] == "AWS::EKS::Cluster"]
    interfaces = next(p["LaunchTemplateData"]["NetworkInterfaces"] for p in resources(raw, "AWS::EC2::LaunchTemplate")
                      if "NetworkInterfaces" in p.get("LaunchTemplateData", {}))
    assert len(interfaces) == 32
    cluster_group = {"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}
    assert all(cluster_group in i["Groups"] for i in interfaces)


# NVIDIA nodes carry nvidia.com/gpu.present=true, which the device plugin chart's default node affinity requires.
def test_nvidia_nodes_are_labelled_for_the_device_plugin(variant):
    instance, _, _, raw = variant
    labels = accelerator_nodegroup(raw)["Labels"]
    expected = "true" if instance.accelerator.value == "nvidia" else None
    assert labels.get("nvidia.com/gpu.present") == expected


# The accelerator node group: explicit AMI type, training labels and taint, 0..nodes, one subnet.
def test_accelerator_nodegroup_ami_labels_taint_scaling(variant):
    instance, synthesized, _, raw = variant
    group = accelerator_nodegroup(raw)
    assert group["AmiType"] == {"AL2023_X86_64_NVIDIA": "AL2023_x86_64_NVIDIA",
                                "AL2023_X86_64_NEURON": "AL2023_x86_64_NEURON"}[instance.eks_ami_type]
    assert group["Labels"][ACCELERATOR_TAINT_KEY] == "true"
    assert group["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": ACCELERATOR_TAINT_KEY, "Value": "true"}]
    assert group["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": synthesized.stacks["compute"].nodes}
    assert len(group["Subnets"]) == 1 and group["CapacityType"] == "ON_DEMAND"


# Capacity type and admin access come from the config (one extra variant).
def test_spot_capacity_and_admin_access_entries(synth):
    raw = synth(compute="eks", instance_type="p4d.24xlarge", eks_capacity_type="spot",
                eks_admin_role_arns="arn:aws:iam::123456789012:role/Admin").raw("compute")
    entries = resources(raw, "AWS::EKS::AccessEntry")
    assert any(e["PrincipalArn"] == "arn:aws:iam::123456789012:role/Admin" and
               "AmazonEKSClusterAdminPolicy" in json.dumps(e["AccessPolicies"]) for e in entries)
    assert accelerator_nodegroup(raw)["CapacityType"] == "SPOT"


# capacity_block targets the configured Capacity Block reservation in the accelerator launch template.
def test_capacity_block_targets_the_reservation(synth):
    raw = synth(compute="eks", instance_type="p5.48xlarge", eks_capacity_type="capacity_block",
                eks_capacity_reservation_id="cr-0123456789abcdef0").raw("compute")
    data = next(p["LaunchTemplateData"] for p in resources(raw, "AWS::EC2::LaunchTemplate")
                if "NetworkInterfaces" in p.get("LaunchTemplateData", {}))
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}
    assert accelerator_nodegroup(raw)["CapacityType"] == "CAPACITY_BLOCK"
    # EKS user guide, "Create a managed node group with Capacity Blocks for ML": InstanceType must be in the
    # launch template, or the create request is rejected (15-25 minutes into a deploy); not on the node group too.
    assert data["InstanceType"] == "p5.48xlarge"
    assert "InstanceTypes" not in accelerator_nodegroup(raw)


# IMDSv2 with one hop on every node (accelerator and system): pods cannot use the node's role.
def test_every_node_launch_template_allows_one_imds_hop(variant):
    _, _, _, raw = variant
    templates = resources(raw, "AWS::EC2::LaunchTemplate")
    assert len(templates) == 2  # accelerator and system node groups
    for props in templates:
        options = props["LaunchTemplateData"]["MetadataOptions"]
        assert (options["HttpEndpoint"], options["HttpPutResponseHopLimit"], options["HttpTokens"]) == \
            ("enabled", 1, "required")
    nodegroups = resources(raw, "AWS::EKS::Nodegroup")
    assert all("LaunchTemplate" in n for n in nodegroups)


# The pipeline's executions size the accelerator node group: run's nodes when one starts, 0 whenever it ends.
def test_pipeline_executions_drive_node_group_size(variant):
    _, synthesized, _, _ = variant
    pipeline = synthesized.template("pipeline")
    pipeline.has_resource_properties("AWS::Events::Rule", {"EventPattern": {
        "source": ["aws.states"], "detail-type": ["Step Functions Execution Status Change"],
        "detail": Match.object_like({"status": ["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"]})}})
    definitions = [json.dumps(r["Properties"]["DefinitionString"]) for r in
                   synthesized.raw("pipeline")["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    scaling = next(d for d in definitions if "ScaleToZero" in d)
    assert "ScaleToRunNodes" in scaling and "ScaleToMaxNodes" in scaling
