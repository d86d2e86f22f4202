"""The L1 resource under an L2 construct, for the properties the L2 cannot express (each use says why)."""

from typing import cast

import aws_cdk as cdk

from constructs import IConstruct


def cfn(construct: IConstruct) -> cdk.CfnResource:
    """`construct.node.default_child` as the CloudFormation resource it is (CDK types it as an optional IConstruct)."""
    return cast(cdk.CfnResource, construct.node.default_child)
