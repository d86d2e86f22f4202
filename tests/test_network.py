"""Network stack: one training subnet in one AZ, endpoints, flow logs, and the EFA security group."""

import pytest
from aws_cdk.assertions import Match


@pytest.fixture(scope="module")
def network(synth):
    return synth().template("network")


def _resources(template, kind):
    return template.find_resources(kind)


def test_exactly_one_training_subnet_without_public_ips(network):
    # The one subnet all EFA nodes and FSx share; nothing in it gets a public address.
    training = {k: v for k, v in _resources(network, "AWS::EC2::Subnet").items() if "TrainingSubnet" in k}
    assert len(training) == 1
    assert next(iter(training.values()))["Properties"]["MapPublicIpOnLaunch"] is False


def test_training_subnet_is_in_the_configured_zone(synth):
    # prod pins its availability zone; the training subnet must land there.
    network = synth(env="prod").template("network")
    network.has_resource_properties("AWS::EC2::Subnet", {
        "AvailabilityZone": "us-west-2b", "CidrBlock": "10.1.224.0/19"})


def test_no_subnet_maps_public_ips_on_launch(network):
    # Compute never gets a public IP, not even in the NAT's public subnets.
    for subnet in _resources(network, "AWS::EC2::Subnet").values():
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False


def test_training_subnet_egresses_through_nat(network):
    # Images and packages come through the NAT gateway when no endpoint serves them.
    network.has_resource_properties("AWS::EC2::Route", {
        "RouteTableId": {"Ref": Match.string_like_regexp("TrainingSubnetRouteTable")},
        "DestinationCidrBlock": "0.0.0.0/0",
        "NatGatewayId": Match.any_value(),
    })


def test_s3_gateway_endpoint_serves_the_training_subnet(network):
    # Dataset and checkpoint traffic to S3 stays off the NAT.
    endpoint = next(v for v in _resources(network, "AWS::EC2::VPCEndpoint").values()
                    if v["Properties"].get("VpcEndpointType") == "Gateway")
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


def _efa_group_id(network):
    return next(k for k in _resources(network, "AWS::EC2::SecurityGroup") if k.startswith("NetworkEfaSecurityGroup"))


def test_efa_group_allows_all_traffic_in_from_itself(network):
    # EFA user guide: all inbound traffic from the same security group.
    group = _efa_group_id(network)
    network.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "-1", "GroupId": {"Fn::GetAtt": [group, "GroupId"]},
        "SourceSecurityGroupId": {"Fn::GetAtt": [group, "GroupId"]}})


def test_efa_group_allows_all_traffic_out_to_itself(network):
    # EFA user guide: all outbound traffic to the same security group (the rule peers most often forget).
    group = _efa_group_id(network)
    network.has_resource_properties("AWS::EC2::SecurityGroupEgress", {
        "IpProtocol": "-1", "GroupId": {"Fn::GetAtt": [group, "GroupId"]},
        "DestinationSecurityGroupId": {"Fn::GetAtt": [group, "GroupId"]}})


def test_efa_group_is_exported_for_compute_stacks(synth):
    # Compute stacks reference the EFA group across stacks, deliberately, through an export.
    synth().template("network").has_output("EfaSecurityGroupId", {"Export": {"Name": "EfaTraining-dev-EfaSecurityGroupId"}})


@pytest.mark.parametrize("port", [(988, 988), (1018, 1023)])
def test_lustre_group_admits_training_nodes_on_lustre_ports(network, port):
    # FSx for Lustre needs TCP 988 and 1018-1023 from its clients.
    lustre = next(k for k in _resources(network, "AWS::EC2::SecurityGroup") if k.startswith("NetworkLustre"))
    network.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "tcp", "FromPort": port[0], "ToPort": port[1],
        "GroupId": {"Fn::GetAtt": [lustre, "GroupId"]},
        "SourceSecurityGroupId": {"Fn::GetAtt": [_efa_group_id(network), "GroupId"]}})


@pytest.mark.parametrize("port", [(988, 988), (1018, 1023)])
def test_training_nodes_admit_lustre_servers_on_lustre_ports(network, port):
    # FSx for Lustre user guide (Lustre clients' rules): clients admit 988 and 1018-1023 from the file system's group.
    lustre = next(k for k in _resources(network, "AWS::EC2::SecurityGroup") if k.startswith("NetworkLustre"))
    network.has_resource_properties("AWS::EC2::SecurityGroupIngress", {
        "IpProtocol": "tcp", "FromPort": port[0], "ToPort": port[1],
        "GroupId": {"Fn::GetAtt": [_efa_group_id(network), "GroupId"]},
        "SourceSecurityGroupId": {"Fn::GetAtt": [lustre, "GroupId"]}})
