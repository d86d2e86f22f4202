"""The AWS Regions and the Availability Zone names each offers, shipped with the project (checked 2026-11).

Sources: "AWS Region billing codes" (every commercial Region code, including ca-west-1, mx-central-1,
ap-east-2, ap-southeast-5/6/7: https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-region-billing-codes.html)
and "Regions and Availability Zones" (https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html).
Zone letters are mapped per account, so each Region lists every letter an account may be given there. A
Region launched later is added here (with the date above updated); until then the configuration refuses it
with one line rather than a deploy failing on an unknown name.
"""

CHECKED = "2026-11"
_ABC = "abc"
REGION_ZONES: dict[str, str] = {
    "us-east-1": "abcdef",
    "us-east-2": _ABC,
    "us-west-1": _ABC,
    "us-west-2": "abcd",
    "ca-central-1": "abd",
    "ca-west-1": _ABC,
    "mx-central-1": _ABC,
    "af-south-1": _ABC,
    "ap-east-1": _ABC,
    "ap-east-2": _ABC,
    "ap-northeast-1": "abcd",
    "ap-northeast-2": "abcd",
    "ap-northeast-3": _ABC,
    "ap-south-1": _ABC,
    "ap-south-2": _ABC,
    "ap-southeast-1": _ABC,
    "ap-southeast-2": _ABC,
    "ap-southeast-3": _ABC,
    "ap-southeast-4": _ABC,
    "ap-southeast-5": _ABC,
    "ap-southeast-6": _ABC,
    "ap-southeast-7": _ABC,
    "eu-central-1": _ABC,
    "eu-central-2": _ABC,
    "eu-north-1": _ABC,
    "eu-south-1": _ABC,
    "eu-south-2": _ABC,
    "eu-west-1": _ABC,
    "eu-west-2": _ABC,
    "eu-west-3": _ABC,
    "il-central-1": _ABC,
    "me-central-1": _ABC,
    "me-south-1": _ABC,
    "sa-east-1": _ABC,
    "us-gov-east-1": _ABC,
    "us-gov-west-1": _ABC,
    "cn-north-1": "abd",
    "cn-northwest-1": _ABC,
}

# CloudFormation resource types the app uses that a shipped Region lacks. Availability varies by Region and the
# Region's resource provider schemas say what it has (CloudFormation template reference, "CloudFormation resource
# provider schemas"); two bundled copies of them check every template: aws-cdk-lib 2.275.0's CloudFormation Validate
# at synth (@aws/cloudformation-validate 1.12.1, rule F3006) and cfn-lint 1.51.0 in the lint gate (E3006). A Region
# is listed where either copy lacks the type (me-south-1 lacks a budget in cfn-lint's only); tests/test_regions.py
# holds both lists to both copies.
# AWS::Budgets::Budget, optional: the Observability stack leaves the budget out there and warns at synth.
NO_BUDGETS: frozenset[str] = frozenset(
    {
        "af-south-1",
        "ap-east-1",
        "ap-east-2",
        "ap-northeast-3",
        "ap-south-2",
        "ap-southeast-3",
        "ap-southeast-4",
        "ap-southeast-5",
        "ap-southeast-6",
        "ap-southeast-7",
        "ca-west-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "il-central-1",
        "me-central-1",
        "me-south-1",
        "mx-central-1",
        "us-gov-east-1",
        "us-gov-west-1",
    }
)
# AWS::FSx::FileSystem (and AWS::FSx::DataRepositoryAssociation), required: the configuration refuses the Region.
NO_FSX: frozenset[str] = frozenset({"ap-southeast-6"})
# Which EC2 instance types a Region offers has no reliable offline source, so instance_type is not checked per
# Region: botocore carries none, and cfn-lint 1.51.0's per-Region instance type lists (aws_ec2_instance extension)
# are one list of 1338 types copied to every Region. EC2's DescribeInstanceTypeOfferings ("Lists the instance types
# that are offered for the specified location", EC2 API reference) answers it, with credentials.


def omitted_types(region: str) -> frozenset[str]:
    """The optional resource types the app leaves out in `region` because the Region lacks them."""
    return frozenset({"AWS::Budgets::Budget"}) if region in NO_BUDGETS else frozenset()


def zones(region: str) -> tuple[str, ...]:
    return tuple(region + letter for letter in REGION_ZONES.get(region, ""))
