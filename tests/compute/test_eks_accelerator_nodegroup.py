"""EksAcceleratorNodegroup alone, on a cluster in a bare stack, for every catalogue EFA type (NVIDIA and Neuron):
whole EFA nodes in one subnet and one placement group, tainted for training, scaling from 0; and
EksValidationNodegroup alone, for what the two share (node auto repair)."""

import copy
import functools
import json
import re

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest

from config import CATALOGUE, efa_instance_types
from config.capacity import CapacityReservation
from constructs.compute.eks.accelerator_nodegroup import EksAcceleratorNodegroup, EksValidationNodegroup
from contracts.eks.job_spec import ACCELERATOR_TAINT_KEY, HUGEPAGES_2MI_PAGES
from tests.alone import bare_stack, template_of
from tests.change_matrix import redeploy
from tests.compute.eks_parts import cluster, vpc

INSTANCE_TYPES = efa_instance_types()
NODES = 4
RESERVATION = "cr-0123456789abcdef0"
BLOCK = CapacityReservation(kind="capacity_block", instances=NODES, id=RESERVATION, zone="us-east-1a")
GROUP_ARN = "arn:aws:resource-groups:us-east-1:123456789012:group/p5-reservations"
ON_DEMAND_GROUP = CapacityReservation(kind="on_demand", instances=NODES, resource_group=GROUP_ARN, zone="us-east-1a")


def _group_stack() -> tuple[cdk.Stack, dict]:
    """A bare stack with a cluster, a training subnet and the EFA security group: what a node group takes."""
    stack = bare_stack()
    network = vpc(stack)
    subnet = ec2.PrivateSubnet(
        stack, "TrainingSubnet", vpc_id=network.vpc_id, availability_zone="us-east-1a", cidr_block="10.0.224.0/19"
    )
    common = {
        "cluster": cluster(stack, network),
        "subnet": subnet,
        "efa_security_group": ec2.SecurityGroup(stack, "Efa", vpc=network),
    }
    return stack, common


@functools.cache
def _nodegroup(
    instance_type: str, capacity_type: str = "on_demand", reservation: CapacityReservation | None = None
) -> dict:
    stack, common = _group_stack()
    EksAcceleratorNodegroup(
        stack,
        "Accelerators",
        instance=CATALOGUE[instance_type],
        nodes=NODES,
        capacity_type=capacity_type,
        reservation=reservation,
        **common,
    )
    return template_of(stack)


@functools.cache
def _validation_group(instance_type: str) -> dict:
    stack, common = _group_stack()
    EksValidationNodegroup(stack, "Validation", instance=CATALOGUE[instance_type], **common)
    return template_of(stack)


def _resources(raw: dict, kind: str) -> list[dict]:
    return [r["Properties"] for r in raw["Resources"].values() if r["Type"] == kind]


def _group(raw: dict) -> dict:
    (group,) = _resources(raw, "AWS::EKS::Nodegroup")
    return group


def _launch_template(raw: dict) -> dict:
    (template,) = _resources(raw, "AWS::EC2::LaunchTemplate")
    return template["LaunchTemplateData"]


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_launch_template_has_every_efa_interface_no_subnet_and_the_placement_group(instance_type):
    # Every EFA interface of the catalogue type, no subnet (EKS managed node groups pick it), one placement group.
    data = _launch_template(_nodegroup(instance_type))
    interfaces = data["NetworkInterfaces"]
    assert (
        sum(1 for i in interfaces if i.get("InterfaceType") in ("efa", "efa-only"))
        == CATALOGUE[instance_type].efa_interfaces
    )
    assert all("SubnetId" not in i for i in interfaces)
    assert "GroupName" in data["Placement"]


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_launch_template_is_the_eks_user_guides_layout_within_the_card_limit(instance_type):
    # EKS user guide, "Manage EFA devices on Amazon EKS" (launch template example): the primary ENA `interface`,
    # efa-only at card 0 / device 1 and at device 0 of every other card; no card over NetworkCardInfo's
    # MaximumNetworkInterfaces (p5: 2; the VPC CNI gives pods secondary IPs of the primary interface).
    interfaces = _launch_template(_nodegroup(instance_type))["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces[:2]] == [
        (0, 0, "interface"),
        (0, 1, "efa-only"),
    ]
    cards = [i["NetworkCardIndex"] for i in interfaces]
    assert max(cards.count(card) for card in set(cards)) <= CATALOGUE[instance_type].max_interfaces_per_network_card


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_node_group_runs_exactly_the_catalogue_type_from_its_launch_template(instance_type):
    # In the launch template, not the node group's create-only InstanceTypes (AWS::EKS::Nodegroup resource schema):
    # a new type is then a new template version, which updates the group in place (EKS user guide, "Customize
    # managed nodes with launch templates"), instead of replacing it.
    raw = _nodegroup(instance_type)
    assert _launch_template(raw)["InstanceType"] == instance_type
    assert "InstanceTypes" not in _group(raw)


def test_cluster_security_group_is_on_every_interface():
    # On all 33 of p5's interfaces (the primary ENA one and 32 EFA-only: EC2 user guide, "EFA configuration for
    # P5 and P5e instances") next to the EFA group: with interfaces in the template, EKS adds no group itself.
    raw = _nodegroup("p5.48xlarge")
    (cluster_id,) = [k for k, v in raw["Resources"].items() if v["Type"] == "AWS::EKS::Cluster"]
    interfaces = _launch_template(raw)["NetworkInterfaces"]
    assert len(interfaces) == 33
    cluster_group = {"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}
    assert all(cluster_group in i["Groups"] and len(i["Groups"]) == 2 for i in interfaces)


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_nodes_allow_one_imds_hop_and_never_terminate_themselves(instance_type):
    # IMDSv2 with one hop (pods cannot use the node's role); no shutdown behaviour (EKS refuses "terminate").
    data = _launch_template(_nodegroup(instance_type))
    options = data["MetadataOptions"]
    assert (options["HttpEndpoint"], options["HttpPutResponseHopLimit"], options["HttpTokens"]) == (
        "enabled",
        1,
        "required",
    )
    assert "InstanceInitiatedShutdownBehavior" not in data
    assert "LaunchTemplate" in _group(_nodegroup(instance_type))


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_nvidia_nodes_are_labelled_for_the_device_plugin(instance_type):
    # NVIDIA nodes carry nvidia.com/gpu.present=true, which the device plugin chart's default node affinity requires.
    expected = "true" if CATALOGUE[instance_type].accelerator.value == "nvidia" else None
    assert _group(_nodegroup(instance_type))["Labels"].get("nvidia.com/gpu.present") == expected


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_accelerator_nodegroup_ami_labels_taint_scaling(instance_type):
    # Explicit AMI type, training labels and taint, 0..nodes, one subnet, on-demand by default.
    group = _group(_nodegroup(instance_type))
    assert (
        group["AmiType"]
        == {"AL2023_X86_64_NVIDIA": "AL2023_x86_64_NVIDIA", "AL2023_X86_64_NEURON": "AL2023_x86_64_NEURON"}[
            CATALOGUE[instance_type].eks_ami_type
        ]
    )
    assert group["Labels"][ACCELERATOR_TAINT_KEY] == "true"
    assert group["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": ACCELERATOR_TAINT_KEY, "Value": "true"}]
    assert group["ScalingConfig"] == {"MinSize": 0, "DesiredSize": 0, "MaxSize": NODES}
    assert len(group["Subnets"]) == 1 and group["CapacityType"] == "ON_DEMAND"


def test_nodes_reserve_the_huge_pages_training_pods_request():
    # Nodes reserve exactly the huge pages each training pod requests (contracts/eks/job_spec.py); fewer and the
    # pod would never schedule.
    user_data = json.dumps(_launch_template(_nodegroup("p4d.24xlarge"))["UserData"])
    reserved = re.search(r"vm\.nr_hugepages = (\d+)", user_data)
    assert reserved and int(reserved.group(1)) == HUGEPAGES_2MI_PAGES


def test_spot_capacity():
    assert _group(_nodegroup("p4d.24xlarge", "spot"))["CapacityType"] == "SPOT"


def test_capacity_block_targets_the_reservation():
    # A Capacity Block reservation: targeted in the accelerator launch template, the group's capacity type a block's.
    raw = _nodegroup("p5.48xlarge", "on_demand", BLOCK)
    data = _launch_template(raw)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": RESERVATION}
    }
    assert _group(raw)["CapacityType"] == "CAPACITY_BLOCK"
    # EKS user guide, "Create a managed node group with Capacity Blocks for ML": InstanceType must be in the
    # launch template, or the create request is rejected (15-25 minutes into a deploy); not on the node group too.
    assert data["InstanceType"] == "p5.48xlarge"
    assert "InstanceTypes" not in _group(raw)
    # No placement group of our own: the reservation decides where its instances are (EC2 user guide, "Launch
    # instances into an existing Capacity Reservation").
    assert "Placement" not in data
    assert not any(r["Type"] == "AWS::EC2::PlacementGroup" for r in raw["Resources"].values())


def test_an_on_demand_reservation_group_is_targeted_with_on_demand_capacity():
    # EC2 user guide, "Capacity Reservation groups": a launch template may target a group's ARN instead of one id.
    raw = _nodegroup("p5.48xlarge", "on_demand", ON_DEMAND_GROUP)
    data = _launch_template(raw)
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationResourceGroupArn": GROUP_ARN}
    }
    assert "InstanceMarketOptions" not in data and _group(raw)["CapacityType"] == "ON_DEMAND"
    assert not any(r["Type"] == "AWS::EC2::PlacementGroup" for r in raw["Resources"].values())


def test_spot_with_a_reservation_is_refused():
    with pytest.raises(ValueError, match="capacity_type='spot' with a reservation"):
        _nodegroup("p5.48xlarge", "spot", BLOCK)


@pytest.mark.parametrize("capacity_type", ["on_demand", "capacity_block"])
def test_the_node_group_is_never_force_updated(capacity_type):
    # A forced update replaces nodes ignoring pod disruption budgets (EKS user guide, "Update a managed node group"):
    # a launch-template change would end a running job. Desired size stays 0 in the template (the pipeline sizes
    # it), which is also what Capacity Blocks ask for before an update.
    reservation = BLOCK if capacity_type == "capacity_block" else None
    group = _group(_nodegroup("p5.48xlarge", "on_demand", reservation))
    assert group["ForceUpdateEnabled"] is False and group["ScalingConfig"]["DesiredSize"] == 0


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_training_nodes_are_auto_repaired(instance_type):
    # EKS node auto repair reboots or replaces a node whose accelerators (AcceleratedHardwareReady, after 10 min) or
    # kernel, network, storage or runtime (after 30 min) the node monitoring agent reports failing (EKS user guide,
    # "Automatically repair nodes in EKS clusters", node-repair.html): the retry starts on a sound host.
    assert _group(_nodegroup(instance_type))["NodeRepairConfig"] == {"Enabled": True}


@pytest.mark.parametrize("instance_type", ["p5.4xlarge", "trn1.2xlarge"])
def test_the_validation_node_is_auto_repaired_too(instance_type):
    # The validation group holds one node at most: unrepaired, a failing node would serve every validation retry
    # (EKS user guide, "Automatically repair nodes in EKS clusters").
    assert _group(_validation_group(instance_type))["NodeRepairConfig"] == {"Enabled": True}


def test_turning_auto_repair_on_updates_a_deployed_node_group_in_place():
    # Day two: NodeRepairConfig is not create-only (AWS::EKS::Nodegroup resource schema, bundled with cfn-lint;
    # CloudFormation docs, AWS::EKS::Nodegroup NodeRepairConfig: "Update requires: No interruption"), so a group
    # deployed without it is updated, not replaced.
    after = {"Eks": _nodegroup("p5.48xlarge")}
    before = copy.deepcopy(after)
    (group,) = [k for k, v in before["Eks"]["Resources"].items() if v["Type"] == "AWS::EKS::Nodegroup"]
    del before["Eks"]["Resources"][group]["Properties"]["NodeRepairConfig"]
    change = redeploy(before, after, "us-east-1")
    assert change.deployed == {"Eks"} and ("Eks", group) not in change.replaced
