"""NetworkStack alone: the environment's EfaNetwork (tests/network/) and the exports other stacks and tools read."""

import pytest

from tests.alone import StacksAlone


@pytest.fixture(scope="module")
def dev():
    environment = StacksAlone()
    return environment.template(environment.network())


@pytest.mark.parametrize("name", ["VpcId", "TrainingSubnetId", "EfaSecurityGroupId"])
def test_network_ids_are_exported_by_name(dev, name):
    # Compute stacks and operators' own tools read these across stacks, deliberately, through named exports.
    dev.has_output(name, {"Export": {"Name": f"EfaTraining-dev-{name}"}})


def test_the_environment_pins_the_training_subnets_zone():
    # prod's availability_zone and vpc_cidr from cdk.json reach the training subnet.
    environment = StacksAlone(env="prod")
    environment.template(environment.network()).has_resource_properties(
        "AWS::EC2::Subnet", {"AvailabilityZone": "us-west-2b", "CidrBlock": "10.1.224.0/19"}
    )
