"""EfaNetwork alone, in a bare stack: one training subnet in one AZ, NAT egress, endpoints, flow logs, and the EFA and
Lustre security groups."""

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
import pytest
from aws_cdk.assertions import Match, Template

from constructs.network.efa_network import EfaNetwork


def _network(
    cidr: str = "10.0.0.0/16",
    availability_zone: str | None = None,
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
) -> Template:
    stack = cdk.Stack(env=cdk.Environment(region="us-west-2"))
    EfaNetwork(
        stack,
        "Network",
        cidr=cidr,
        availability_zone=availability_zone,
        log_retention=logs.RetentionDays.TWO_WEEKS,
        removal_policy=removal_policy,
    )
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def network() -> Template:
    return _network()


def _resources(template: Template, kind: str) -> Mapping[str, Any]:
    return template.find_resources(kind)


def _group_id(template: Template, prefix: str) -> str:
    return next(k for k in _resources(template, "AWS::EC2::SecurityGroup") if k.startswith(prefix))


def test_exactly_one_training_subnet_without_public_ips(network):
    # The one subnet all EFA nodes and FSx share; nothing in it gets a public address.
    training = {k: v for k, v in _resources(network, "AWS::EC2::Subnet").items() if "TrainingSubnet" in k}
    assert len(training) == 1
    assert next(iter(training.values()))["Properties"]["MapPublicIpOnLaunch"] is False


def test_training_subnet_is_in_the_configured_zone():
    # A pinned availability zone (prod's us-west-2b) is where the training subnet lands, in the top /19 of the VPC.
    _network(cidr="10.1.0.0/16", availability_zone="us-west-2b").has_resource_properties(
        "AWS::EC2::Subnet", {"AvailabilityZone": "us-west-2b", "CidrBlock": "10.1.224.0/19"}
    )


def test_no_subnet_maps_public_ips_on_launch(network):
    # Compute never gets a public IP, not even in the NAT's public subnets.
    subnets = _resources(network, "AWS::EC2::Subnet").values()
    assert len(subnets) == 5  # public and private in two zones, and the training subnet
    assert all(subnet["Properties"]["MapPublicIpOnLaunch"] is False for subnet in subnets)


def test_training_subnet_egresses_through_nat(network):
    # Images and packages come through the NAT gateway when no endpoint serves them.
    network.has_resource_properties(
        "AWS::EC2::Route",
        {
            "RouteTableId": {"Ref": Match.string_like_regexp("TrainingSubnetRouteTable")},
            "DestinationCidrBlock": "0.0.0.0/0",
            "NatGatewayId": Match.any_value(),
        },
    )


def test_s3_gateway_endpoint_serves_the_training_subnet(network):
    # Dataset and checkpoint traffic to S3 stays off the NAT.
    endpoint = next(
        v
        for v in _resources(network, "AWS::EC2::VPCEndpoint").values()
        if v["Properties"].get("VpcEndpointType") == "Gateway"
    )
    route_tables = [ref["Ref"] for ref in endpoint["Properties"]["RouteTableIds"]]
    assert any("TrainingSubnetRouteTable" in table for table in route_tables)


@pytest.mark.parametrize("service", ["ecr.api", "ecr.dkr", "logs", "sts"])
def test_interface_endpoint_exists(network, service):
    # Nodes pull images, write logs and get credentials without NAT traffic.
    names = [str(v["Properties"]["ServiceName"]) for v in _resources(network, "AWS::EC2::VPCEndpoint").values()]
    assert any(f".{service}" in name for name in names), names


def test_vpc_flow_logs_go_to_cloudwatch(network):
    # Flow logs for every VPC (cdk-nag VPC7, and operators debugging EFA reachability).
    network.has_resource_properties("AWS::EC2::FlowLog", {"ResourceType": "VPC", "TrafficType": "ALL"})


def test_the_flow_log_role_serves_this_accounts_flow_logs_only(network):
    # Confused-deputy guard in the role's trust (VPC user guide, "IAM role for publishing flow logs to CloudWatch
    # Logs": aws:SourceAccount, and aws:SourceArn on the account's flow logs).
    (role,) = [
        r["Properties"]
        for r in _resources(network, "AWS::IAM::Role").values()
        if "vpc-flow-logs" in str(r["Properties"]["AssumeRolePolicyDocument"])
    ]
    (statement,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert statement["Condition"]["ArnLike"]["aws:SourceArn"] == {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":ec2:us-west-2:", {"Ref": "AWS::AccountId"}, ":vpc-flow-log/*"],
        ]
    }


@pytest.mark.parametrize(
    ("removal_policy", "expected"), [(cdk.RemovalPolicy.DESTROY, "Delete"), (cdk.RemovalPolicy.RETAIN, "Retain")]
)
def test_flow_logs_follow_the_removal_policy(removal_policy, expected):
    # dev's flow logs go with `cdk destroy`; prod's stay.
    (group,) = _network(removal_policy=removal_policy).find_resources("AWS::Logs::LogGroup").values()
    assert (group["DeletionPolicy"], group["UpdateReplacePolicy"]) == (expected, expected)
    assert group["Properties"]["RetentionInDays"] == 14


def test_efa_group_allows_all_traffic_in_from_itself(network):
    # EFA user guide: all inbound traffic from the same security group.
    group = _group_id(network, "NetworkEfaSecurityGroup")
    network.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "-1",
            "GroupId": {"Fn::GetAtt": [group, "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [group, "GroupId"]},
        },
    )


def test_efa_group_allows_all_traffic_out_to_itself(network):
    # EFA user guide: all outbound traffic to the same security group (the rule peers most often forget).
    group = _group_id(network, "NetworkEfaSecurityGroup")
    network.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress",
        {
            "IpProtocol": "-1",
            "GroupId": {"Fn::GetAtt": [group, "GroupId"]},
            "DestinationSecurityGroupId": {"Fn::GetAtt": [group, "GroupId"]},
        },
    )


@pytest.mark.parametrize("port", [(988, 988), (1018, 1023)])
def test_lustre_group_admits_training_nodes_on_lustre_ports(network, port):
    # FSx for Lustre needs TCP 988 and 1018-1023 from its clients.
    network.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "tcp",
            "FromPort": port[0],
            "ToPort": port[1],
            "GroupId": {"Fn::GetAtt": [_group_id(network, "NetworkLustre"), "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [_group_id(network, "NetworkEfaSecurityGroup"), "GroupId"]},
        },
    )


@pytest.mark.parametrize("port", [(988, 988), (1018, 1023)])
def test_training_nodes_admit_lustre_servers_on_lustre_ports(network, port):
    # FSx for Lustre user guide (Lustre clients' rules): clients admit 988 and 1018-1023 from the file system's group.
    network.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "tcp",
            "FromPort": port[0],
            "ToPort": port[1],
            "GroupId": {"Fn::GetAtt": [_group_id(network, "NetworkEfaSecurityGroup"), "GroupId"]},
            "SourceSecurityGroupId": {"Fn::GetAtt": [_group_id(network, "NetworkLustre"), "GroupId"]},
        },
    )
