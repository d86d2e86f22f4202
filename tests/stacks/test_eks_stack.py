"""EksStack alone (with the network, storage and registry it takes): the cluster, the accelerator node group and the
training workspace wired to the environment's config, and the node scaling it adds to the pipeline's stack.
Its constructs alone: tests/compute/test_eks_*.py."""

import functools
import json
import re

import pytest
from aws_cdk.assertions import Match

from tests.alone import StacksAlone
from tests.compute.eks_parts import manifests
from tests.synthesis import CAPACITY_BLOCK

# The module's stacks are built once, on one xdist worker.
pytestmark = pytest.mark.xdist_group("eks-stack")
ADMIN = "arn:aws:iam::123456789012:role/Admin"


@functools.cache
def _environment(**overrides: object) -> StacksAlone:
    return StacksAlone(compute="eks", **overrides)


@functools.cache
def _compute(**overrides: object) -> dict:
    environment = _environment(**overrides)
    return environment.raw(environment.compute())


def _resources(raw: dict, kind: str) -> list[dict]:
    return [r["Properties"] for r in raw["Resources"].values() if r["Type"] == kind]


def _accelerator_group(raw: dict) -> dict:
    return next(p for p in _resources(raw, "AWS::EKS::Nodegroup") if "Taints" in p)


def test_every_nodes_root_volume_is_encrypted_whatever_the_accounts_default():
    # Training, validation and system nodes: an encrypted gp3 root on /dev/xvda (AL2023's root device) in each
    # launch template, not left to the account's EBS encryption default.
    raw = _compute(instance_type="p4d.24xlarge")
    for props in _resources(raw, "AWS::EC2::LaunchTemplate"):
        (root,) = [d for d in props["LaunchTemplateData"]["BlockDeviceMappings"] if d["DeviceName"] == "/dev/xvda"]
        assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["VolumeType"] == "gp3"


def test_every_node_launch_template_allows_one_imds_hop():
    # IMDSv2 with one hop on every node (training, validation and system): pods cannot use the node's role.
    raw = _compute(instance_type="p4d.24xlarge")
    templates = _resources(raw, "AWS::EC2::LaunchTemplate")
    assert len(templates) == 3  # training, validation and system node groups
    for props in templates:
        options = props["LaunchTemplateData"]["MetadataOptions"]
        assert (options["HttpEndpoint"], options["HttpPutResponseHopLimit"], options["HttpTokens"]) == (
            "enabled",
            1,
            "required",
        )
    nodegroups = _resources(raw, "AWS::EKS::Nodegroup")
    assert len(nodegroups) == 3 and all("LaunchTemplate" in n for n in nodegroups)


def test_nodes_reserve_the_huge_pages_pods_request():
    # The node group's user data and the job templates of one stack agree: fewer pages and pods never schedule.
    raw = _compute(instance_type="p4d.24xlarge")
    reserved = re.search(r"vm\.nr_hugepages = (\d+)", json.dumps(_resources(raw, "AWS::EC2::LaunchTemplate")))
    config_map = next(
        o for o in manifests(raw) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "job-templates"
    )
    requested = json.loads(config_map["data"]["train.json"])["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert reserved and requested["hugepages-2Mi"] == f"{int(reserved.group(1)) * 2}Mi"


def test_accelerator_nodes_scale_to_the_environments_nodes_in_the_training_subnet():
    group = _accelerator_group(_compute(instance_type="p4d.24xlarge"))
    assert group["ScalingConfig"] == {
        "MinSize": 0,
        "DesiredSize": 0,
        "MaxSize": _environment(instance_type="p4d.24xlarge").config.nodes,
    }
    (subnet,) = group["Subnets"]
    assert "TrainingSubnet" in json.dumps(subnet)


def test_capacity_type_and_admin_access_come_from_the_config():
    raw = _compute(instance_type="p4d.24xlarge", eks_capacity_type="spot", eks_admin_role_arns=ADMIN)
    entries = _resources(raw, "AWS::EKS::AccessEntry")
    assert any(
        e["PrincipalArn"] == ADMIN and "AmazonEKSClusterAdminPolicy" in json.dumps(e["AccessPolicies"]) for e in entries
    )
    assert _accelerator_group(raw)["CapacityType"] == "SPOT"


def test_capacity_block_reservation_comes_from_the_config():
    raw = _compute(instance_type="p5.48xlarge", **CAPACITY_BLOCK)
    data = next(
        p["LaunchTemplateData"]
        for p in _resources(raw, "AWS::EC2::LaunchTemplate")
        if "NetworkInterfaces" in p.get("LaunchTemplateData", {})
    )
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert _accelerator_group(raw)["CapacityType"] == "CAPACITY_BLOCK"


# A replaced file system (new DNS and mount name) must reach every consumer in the same deploy: consumers read the
# names through Fn::GetStackOutput, which CloudFormation resolves only when the consumer itself is updated
# (CloudFormation template reference, "Fn::GetStackOutput"). The revision in the volume's name forces that update.
def test_replacing_the_file_system_renames_the_volume_and_claim():
    def claim(**overrides: object) -> tuple[str, str]:
        raw = _compute(instance_type="g5.12xlarge", **overrides)
        (output,) = [o["Value"] for k, o in raw["Outputs"].items() if k.startswith("WorkspaceFsxClaimName")]
        (claim,) = [o for o in manifests(raw) if o["kind"] == "PersistentVolumeClaim"]
        return output, claim["metadata"]["name"]

    (before, _), (after, claim_after) = claim(), claim(fsx_deployment_type="PERSISTENT_2", fsx_storage_gib="2400")
    assert before != after and before.startswith("fsx-training-") and after.startswith("fsx-training-")
    assert claim_after == after  # the claim the pipeline's job pods name (EksJobRunner's site) is the new one


def test_the_volume_is_the_storage_stacks_file_system():
    volume = next(o for o in manifests(_compute(instance_type="p4d.24xlarge")) if o["kind"] == "PersistentVolume")
    assert volume["spec"]["csi"]["volumeHandle"] == "TOKEN"  # a reference: the storage stack's output
    assert "GetStackOutput" in json.dumps(_compute(instance_type="p4d.24xlarge"))


@pytest.mark.parametrize("output", ["ClusterName", "KubeconfigCommand"])
def test_operators_find_the_cluster_in_the_outputs(output):
    environment = _environment(instance_type="p4d.24xlarge")
    environment.template(environment.compute()).has_output(output, {"Value": Match.any_value()})


def _kubeconfig_command(raw: dict) -> tuple[str, str]:
    """The KubeconfigCommand output as text (its tokens as <token>), and its description."""
    output = raw["Outputs"]["KubeconfigCommand"]
    parts = output["Value"]["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else "<token>" for p in parts), output["Description"]


# The command authenticates as the role that has cluster access, the first role of eks_admin_role_arns (AWS CLI
# reference, `aws eks update-kubeconfig`: --role-arn, "Otherwise, the IAM entity in your default AWS CLI or SDK
# credential chain is used"), whose access entry holds AmazonEKSClusterAdminPolicy.
def test_the_kubeconfig_command_names_the_admin_role():
    command, description = _kubeconfig_command(_compute(instance_type="p4d.24xlarge", eks_admin_role_arns=ADMIN))
    assert command.startswith("aws eks update-kubeconfig --region ") and command.endswith(
        f" --name <token> --role-arn {ADMIN}"
    )
    assert "eks_admin_role_arns" in description


# Without a role there (an IAM user only, or a synth outside `make deploy`), the output says what role to pass.
def test_without_an_admin_role_the_kubeconfig_command_says_which_role_to_pass():
    user = "arn:aws:iam::123456789012:user/operator"
    for raw in (
        _compute(instance_type="p4d.24xlarge"),
        _compute(instance_type="p4d.24xlarge", eks_admin_role_arns=user),
    ):
        command, description = _kubeconfig_command(raw)
        assert "--role-arn" not in command and "--role-arn <a role with an access entry" in description


def test_the_reconciler_sits_beside_the_pipeline_and_watches_its_executions():
    # attach_pipeline: the reconciler's rule sits in the pipeline's stack and listens to its state machine's endings
    # (tests/compute/test_eks_node_scaling.py has its states; tests/pipeline/test_eks_pipeline.py runs them).
    environment = StacksAlone(compute="eks", instance_type="p4d.24xlarge")  # built through the pipeline's stack
    pipeline = environment.template(environment.pipeline())
    (machine_id,) = [
        k
        for k, r in pipeline.find_resources("AWS::StepFunctions::StateMachine").items()
        if k.startswith("TrainingPipeline")
    ]
    pipeline.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.states"],
                "detail-type": ["Step Functions Execution Status Change"],
                "detail": {
                    "stateMachineArn": [{"Ref": machine_id}],
                    "status": ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"],
                },
            },
            "Targets": [Match.object_like({"Arn": {"Ref": Match.string_like_regexp("^EksNodeReconciler")}})],
        },
    )


def test_the_validation_node_group_is_one_small_node_without_efa():
    # Validation on the catalogue's small type (p4d -> p5.4xlarge), 0 to 1 node, no EFA interfaces, no huge pages.
    raw = _compute(instance_type="p4d.24xlarge")
    (group,) = [g for g in _resources(raw, "AWS::EKS::Nodegroup") if g["ScalingConfig"]["MaxSize"] == 1]
    assert group["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": 1}
    assert group["CapacityType"] == "ON_DEMAND" and group["AmiType"] == "AL2023_x86_64_NVIDIA"
    (data,) = [
        t["LaunchTemplateData"]
        for t in _resources(raw, "AWS::EC2::LaunchTemplate")
        if t["LaunchTemplateData"].get("InstanceType") == "p5.4xlarge"
    ]
    assert "NetworkInterfaces" not in data and "nr_hugepages" not in json.dumps(data)
