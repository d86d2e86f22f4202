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


def zones(region: str) -> tuple[str, ...]:
    return tuple(region + letter for letter in REGION_ZONES.get(region, ""))
