"""Network: the EFA-ready VPC every compute backend and the file system live in."""

import aws_cdk as cdk

from config import EnvironmentConfig
from constructs import Construct
from constructs.network.efa_network import EfaNetwork
from stacks.policies import data_removal_policy, log_retention


class NetworkStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        network = EfaNetwork(
            self,
            "Network",
            cidr=config.vpc_cidr,
            availability_zone=config.availability_zone,
            log_retention=log_retention(config),
            removal_policy=data_removal_policy(config),
        )
        self.vpc = network.vpc
        self.training_subnet = network.training_subnet
        self.efa_security_group = network.efa_security_group
        self.lustre_security_group = network.lustre_security_group
        # Deliberate exports: the compute stacks and operators' own tools read these by name.
        for name, value in (
            ("VpcId", self.vpc.vpc_id),
            ("TrainingSubnetId", self.training_subnet.subnet_id),
            ("EfaSecurityGroupId", self.efa_security_group.security_group_id),
        ):
            cdk.CfnOutput(self, name, value=value, export_name=f"{config.stack_prefix}-{name}")
