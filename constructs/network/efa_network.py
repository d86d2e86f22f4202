"""A VPC built for EFA: one training subnet in one AZ, NAT for egress, endpoints, flow logs, EFA and Lustre SGs."""

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_logs as logs

from constructs import Construct
from constructs.escape_hatch import cfn
from constructs.nag import acknowledge_cdk_provider, acknowledge_log_group_encryption

# FSx for Lustre: LNET on 988, and 1018-1023 (FSx user guide, "File system access control with Amazon VPC").
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
INTERFACE_ENDPOINTS = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
}


class EfaNetwork(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cidr: str,
        availability_zone: str | None,
        log_retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id_)
        nat = ec2.NatProvider.gateway()
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            max_azs=2,  # EKS control planes need two AZs; training itself uses one subnet
            nat_gateways=1,
            nat_gateway_provider=nat,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24, map_public_ip_on_launch=False
                ),
                ec2.SubnetConfiguration(name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
            ],
        )
        # CDK's handler that empties the VPC's default security group (@aws-cdk/aws-ec2:restrictDefaultSecurityGroup).
        acknowledge_cdk_provider(self, "VpcRestrictDefaultSG", "CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117")
        # EFA traffic and FSx for Lustre both stay inside one AZ: a single subnet for every training node.
        second_octet = cidr.split(".")[1]
        self.training_subnet = ec2.PrivateSubnet(
            self,
            "TrainingSubnet",
            vpc_id=self.vpc.vpc_id,
            availability_zone=availability_zone or self.vpc.availability_zones[0],
            cidr_block=f"10.{second_octet}.224.0/19",  # the top /19, clear of CDK's allocations from the bottom
            map_public_ip_on_launch=False,
        )
        self.training_subnet.add_default_nat_route(nat.configured_gateways[0].gateway_id)
        cdk.Tags.of(self.training_subnet).add("Name", f"{cdk.Stack.of(self).stack_name}/TrainingSubnet")

        self.vpc.add_gateway_endpoint(
            "S3",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[
                ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
                ec2.SubnetSelection(subnets=[self.training_subnet]),
            ],
        )
        # One group for all interface endpoints, open to the literal VPC range (a token here hides it from cdk-nag).
        endpoints_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="Interface endpoints: HTTPS from inside the VPC",
        )
        endpoints_group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
        for name, service in INTERFACE_ENDPOINTS.items():
            self.vpc.add_interface_endpoint(
                name, service=service, private_dns_enabled=True, open=False, security_groups=[endpoints_group]
            )

        flow_logs = logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=removal_policy)
        acknowledge_log_group_encryption(flow_logs)
        flow_log = self.vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs))
        _guard_flow_log_trust(flow_log)

        self.efa_security_group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="EFA: all traffic to and from itself; HTTPS out for AWS APIs and images",
        )
        # The EFA user guide requires all traffic in AND out to the group itself; a missing egress
        # rule is one way EFA silently degrades to TCP.
        self.efa_security_group.add_ingress_rule(self.efa_security_group, ec2.Port.all_traffic(), "EFA from peers")
        self.efa_security_group.add_egress_rule(self.efa_security_group, ec2.Port.all_traffic(), "EFA to peers")
        self.efa_security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs, ECR, S3")

        self.lustre_security_group = ec2.SecurityGroup(
            self,
            "LustreSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=True,
            description="FSx for Lustre servers: LNET from training nodes and from each other",
        )
        for port in LUSTRE_PORTS:
            self.lustre_security_group.add_ingress_rule(self.lustre_security_group, port, "Lustre between servers")
            self.lustre_security_group.add_ingress_rule(self.efa_security_group, port, "Lustre from training nodes")
            self.efa_security_group.add_egress_rule(self.lustre_security_group, port, "Lustre client to FSx")
            # FSx for Lustre user guide, "File system access control with Amazon VPC" (Lustre clients' rules):
            # clients also admit 988 and 1018-1023 from the file system's group (servers call back to clients).
            self.efa_security_group.add_ingress_rule(self.lustre_security_group, port, "Lustre servers to client")


def _guard_flow_log_trust(flow_log: ec2.FlowLog) -> None:
    """The confused-deputy guard the VPC user guide recommends in the flow-log role's trust policy ("IAM role for
    publishing flow logs to CloudWatch Logs": aws:SourceAccount, and aws:SourceArn on the account's flow logs). Set
    on the role CDK makes for the flow log, in place: a role of our own would replace the flow log
    (DeliverLogsPermissionArn is create-only)."""
    stack = cdk.Stack.of(flow_log)
    flow_logs = stack.format_arn(service="ec2", resource="vpc-flow-log", resource_name="*")
    role = flow_log.node.find_child("IAMRole")
    cfn(role).add_property_override(
        "AssumeRolePolicyDocument.Statement.0.Condition",
        {"StringEquals": {"aws:SourceAccount": stack.account}, "ArnLike": {"aws:SourceArn": flow_logs}},
    )
