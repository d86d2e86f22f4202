"""EfaLaunchTemplate alone, in a bare stack (no app synth): interface layout, IMDSv2, root volume, user data."""

import json

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest
from aws_cdk.assertions import Match, Template

from config import CATALOGUE, efa_instance_types
from constructs.compute.shared.efa_launch_template import EfaLaunchTemplate, efa_network_interfaces


def _template(instance: str = "p4d.24xlarge", **kwargs) -> tuple[EfaLaunchTemplate, Template]:
    stack = cdk.Stack()
    sg = ec2.SecurityGroup.from_security_group_id(stack, "Efa", "sg-0123456789abcdef0")
    user_data = kwargs.pop("user_data", ec2.UserData.for_linux())
    construct = EfaLaunchTemplate(
        stack, "Lt", instance=CATALOGUE[instance], security_groups=[sg], user_data=user_data, **kwargs
    )
    return construct, Template.from_stack(stack)


def _data(template: Template) -> dict:
    (resource,) = template.find_resources("AWS::EC2::LaunchTemplate").values()
    return resource["Properties"]["LaunchTemplateData"]


@pytest.mark.parametrize("name", efa_instance_types())
def test_the_documented_layout_with_one_efa_per_network_card(name):
    # EC2 user guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network cards": the primary
    # interface (card 0, device 0) is ENA, card 0's EFA is efa-only at device 1, every other card one efa-only at
    # device 0. As many EFA interfaces as the catalogue's count.
    count = CATALOGUE[name].efa_interfaces
    interfaces = efa_network_interfaces(count, ["sg-1"])
    layout = [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces]
    assert layout == [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, count)]
    assert all(i["Groups"] == ["sg-1"] for i in interfaces)


@pytest.mark.parametrize("name", efa_instance_types())
def test_rendered_template_has_an_interface_on_every_efa_card(name):
    # The launch template itself: one interface per card of the catalogue type, each with the EFA group, no subnet.
    _, template = _template(name)
    interfaces = _data(template)["NetworkInterfaces"]
    count = CATALOGUE[name].efa_interfaces
    efa = [i for i in interfaces if i["InterfaceType"] == "efa-only"]
    assert [i["NetworkCardIndex"] for i in efa] == list(range(count))
    assert [i["InterfaceType"] for i in interfaces] == ["interface"] + ["efa-only"] * count
    assert all(i["Groups"] == ["sg-0123456789abcdef0"] and "SubnetId" not in i for i in interfaces)


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
