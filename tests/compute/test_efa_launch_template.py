"""EfaLaunchTemplate alone, in a bare stack (no app synth): interface layout, IMDSv2, root volume, user data."""

import dataclasses
import json

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest
from aws_cdk.assertions import Match, Template

from config import CATALOGUE, efa_instance_types
from constructs.compute.shared.efa_launch_template import (
    EfaLaunchTemplate,
    EfaLayout,
    check_card_limits,
    efa_network_interfaces,
)

# Batch user guide, "Compute environment considerations for MNP": "Each multi-node parallel job container gets its own
# elastic network interface"; EC2 API reference, AttachNetworkInterface: "The default is network card index 0".
BATCH_TASK_INTERFACES_ON_CARD0 = 1


def _template(instance: str = "p4d.24xlarge", **kwargs) -> tuple[EfaLaunchTemplate, Template]:
    stack = cdk.Stack()
    sg = ec2.SecurityGroup.from_security_group_id(stack, "Efa", "sg-0123456789abcdef0")
    user_data = kwargs.pop("user_data", ec2.UserData.for_linux())
    kwargs.setdefault("layout", EfaLayout.EKS)
    construct = EfaLaunchTemplate(
        stack, "Lt", instance=CATALOGUE[instance], security_groups=[sg], user_data=user_data, **kwargs
    )
    return construct, Template.from_stack(stack)


def _data(template: Template) -> dict:
    (resource,) = template.find_resources("AWS::EC2::LaunchTemplate").values()
    return resource["Properties"]["LaunchTemplateData"]


def _layout(interfaces: list[dict]) -> list[tuple[int, int, str]]:
    return [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces]


def _per_card(interfaces: list[dict]) -> dict[int, int]:
    cards: dict[int, int] = {}
    for i in interfaces:
        cards[i["NetworkCardIndex"]] = cards.get(i["NetworkCardIndex"], 0) + 1
    return cards


@pytest.mark.parametrize("name", efa_instance_types())
def test_eks_gets_the_eks_user_guides_layout(name):
    # EKS user guide, "Manage EFA devices on Amazon EKS" (launch template example) and EC2 user guide, "Maximize
    # network bandwidth on Amazon EC2 instances with multiple network cards": the primary ENA interface at card 0 /
    # device 0, card 0's EFA efa-only at device 1, every other card one efa-only at device 0.
    count = CATALOGUE[name].efa_interfaces
    interfaces = efa_network_interfaces(count, ["sg-1"], EfaLayout.EKS)
    expected = [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, count)]
    assert _layout(interfaces) == expected
    assert all(i["Groups"] == ["sg-1"] for i in interfaces)


@pytest.mark.parametrize("name", efa_instance_types())
def test_batch_gets_one_interface_per_card_with_an_efa_primary(name):
    # AWS's Batch p5/p6 templates (awsome-distributed-training 1.architectures/3.aws-batch) and eksctl: one
    # interface per card, the primary EFA with ENA (`efa`) at card 0 / device 0; EC2 user guide: efa-only at
    # device 0 of every other card. As many EFA devices as the catalogue's count.
    count = CATALOGUE[name].efa_interfaces
    interfaces = efa_network_interfaces(count, ["sg-1"], EfaLayout.BATCH)
    assert _layout(interfaces) == [(0, 0, "efa")] + [(card, 0, "efa-only") for card in range(1, count)]
    assert all(i["Groups"] == ["sg-1"] for i in interfaces)


@pytest.mark.parametrize("name", efa_instance_types())
def test_no_batch_card_over_its_limit_with_the_task_interface(name):
    # The awsvpc task interface of a multi-node job lands on card 0 (BATCH_TASK_INTERFACES_ON_CARD0's documents);
    # with it, no card holds more than the type's NetworkCardInfo.MaximumNetworkInterfaces (p5: 2).
    it = CATALOGUE[name]
    cards = _per_card(efa_network_interfaces(it.efa_interfaces, ["sg-1"], EfaLayout.BATCH))
    cards[0] += BATCH_TASK_INTERFACES_ON_CARD0
    assert max(cards.values()) <= it.max_interfaces_per_network_card


@pytest.mark.parametrize("name", efa_instance_types())
def test_no_eks_card_over_its_limit(name):
    # EKS attaches nothing at launch beyond the template (pods take secondary IPs of the primary interface).
    it = CATALOGUE[name]
    cards = _per_card(efa_network_interfaces(it.efa_interfaces, ["sg-1"], EfaLayout.EKS))
    assert max(cards.values()) <= it.max_interfaces_per_network_card


def test_the_eks_layout_is_refused_on_a_batch_p5():
    # The old Batch layout (two interfaces on card 0) plus the task interface is 3 on a card that takes 2 (EC2:
    # "The maximum devices for this network card is 2", eksctl-io/eksctl#7520): refused at synth, in one line.
    interfaces = efa_network_interfaces(32, ["sg-1"], EfaLayout.EKS)
    with pytest.raises(ValueError, match=r"network card 0 would hold 3 interfaces .*max_interfaces_per_network_card=2"):
        check_card_limits(CATALOGUE["p5.48xlarge"], interfaces, EfaLayout.BATCH)


@pytest.mark.parametrize("layout", list(EfaLayout))
@pytest.mark.parametrize("name", efa_instance_types())
def test_rendered_template_has_an_efa_device_on_every_card(name, layout):
    # The launch template itself: one EFA device (efa or efa-only) per card of the catalogue type, each interface
    # with the EFA group, no subnet.
    _, template = _template(name, layout=layout)
    interfaces = _data(template)["NetworkInterfaces"]
    efa = [i for i in interfaces if i["InterfaceType"] in ("efa", "efa-only")]
    assert [i["NetworkCardIndex"] for i in efa] == list(range(CATALOGUE[name].efa_interfaces))
    assert all(i["Groups"] == ["sg-0123456789abcdef0"] and "SubnetId" not in i for i in interfaces)


def test_the_launch_template_checks_the_card_limit_at_synth():
    # A type whose cards took one interface each leaves Batch no place for the task interface: the construct refuses.
    stack = cdk.Stack()
    sg = ec2.SecurityGroup.from_security_group_id(stack, "Efa", "sg-0123456789abcdef0")
    one_per_card = dataclasses.replace(CATALOGUE["p5.48xlarge"], max_interfaces_per_network_card=1)
    with pytest.raises(ValueError, match="network card 0 would hold 2 interfaces on batch"):
        EfaLaunchTemplate(
            stack,
            "Lt",
            instance=one_per_card,
            security_groups=[sg],
            user_data=ec2.UserData.for_linux(),
            layout=EfaLayout.BATCH,
        )


def test_interfaces_without_a_layout_are_refused():
    # Each backend names its layout; none is guessed.
    with pytest.raises(ValueError, match="layout=None"):
        _template(layout=None)


def test_rendered_interfaces_carry_the_group_and_no_subnet_or_public_ip():
    # The template's interfaces: the security group on each, no SubnetId (Batch/EKS pick it), no public IP.
    construct, template = _template("p4d.24xlarge")
    interfaces = _data(template)["NetworkInterfaces"]
    assert len(interfaces) == 5 == len(construct.network_interfaces)  # the primary ENA and 4 EFA
    assert all(i["Groups"] == ["sg-0123456789abcdef0"] for i in interfaces)
    assert all("SubnetId" not in i for i in interfaces)
    assert interfaces[0]["AssociatePublicIpAddress"] is False
    assert all(not i.get("AssociatePublicIpAddress") for i in interfaces)
    assert "SecurityGroupIds" not in _data(template)  # EC2 rejects them next to network interfaces


def test_imdsv2_required_with_one_hop():
    # IMDSv2 only, hop limit 1: containers are one hop further and cannot reach the node's role (EC2 user
    # guide, "Instance metadata access considerations"; EKS best practices on restricting the instance profile).
    _, template = _template()
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": {
                "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"}
            }
        },
    )


def test_root_volume_is_encrypted_gp3():
    # Root volume: gp3, encrypted, the requested size, deleted with the instance.
    _, template = _template(root_volume_gib=300)
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": {
                "BlockDeviceMappings": [
                    {
                        "DeviceName": "/dev/xvda",
                        "Ebs": {"VolumeSize": 300, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True},
                    }
                ]
            }
        },
    )


def test_plain_user_data_is_wrapped_as_mime_multipart():
    # Batch/ECS accept only MIME multipart user data in a launch template.
    _, template = _template()
    rendered = json.dumps(_data(template)["UserData"])
    assert "multipart/mixed" in rendered and "MIME-Version: 1.0" in rendered


def test_without_interfaces_the_group_goes_on_the_template():
    # Single-node hosts: no EFA interfaces, the security group as SecurityGroupIds instead.
    construct, template = _template(include_network_interfaces=False)
    data = _data(template)
    assert "NetworkInterfaces" not in data and construct.network_interfaces == []
    assert data["SecurityGroupIds"] == ["sg-0123456789abcdef0"]


def test_failed_host_terminates():
    # A host whose preparation fails shuts down; that must terminate it so the scheduler replaces it.
    _, template = _template()
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {"LaunchTemplateData": Match.object_like({"InstanceInitiatedShutdownBehavior": "terminate"})},
    )


def test_eks_options_drop_shutdown_behaviour_and_set_placement():
    # For EKS node groups: no shutdown behaviour (EKS refuses it), the placement group in the template.
    stack = cdk.Stack()
    sg = ec2.SecurityGroup.from_security_group_id(stack, "Efa", "sg-0123456789abcdef0")
    group = ec2.PlacementGroup(stack, "Pg", strategy=ec2.PlacementGroupStrategy.CLUSTER)
    EfaLaunchTemplate(
        stack,
        "Lt",
        instance=CATALOGUE["trn1.32xlarge"],
        security_groups=[sg],
        user_data=ec2.UserData.for_linux(),
        layout=EfaLayout.EKS,
        terminate_on_shutdown=False,
        placement_group=group,
    )
    data = _data(Template.from_stack(stack))
    assert "InstanceInitiatedShutdownBehavior" not in data
    assert "Pg" in json.dumps(data["Placement"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"root_volume_gib": 8}, "root_volume_gib"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    # Arguments that would build a useless template fail with the field's name.
    with pytest.raises(ValueError, match=message):
        _template(**kwargs)


def test_non_efa_instance_is_refused():
    # An instance type without EFA cannot get EFA interfaces.
    with pytest.raises(ValueError, match="efa_interfaces=0"):
        _template("g5.xlarge")
