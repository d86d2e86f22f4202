"""What each environment costs: its cluster per hour, its FSx per month, and one training run of N hours.

    .venv/bin/python -m tools.cost_report                    # every environment in cdk.json, 24-hour run
    .venv/bin/python -m tools.cost_report --hours 72 --env prod -c nodes=8
    .venv/bin/python -m tools.cost_report --offline          # never look for AWS credentials
    .venv/bin/python -m tools.cost_report --model 6.7b --mfu 35   # the price of a billion tokens (tools/token_cost.py)

EC2 prices come from config/catalogue.py and FSx prices from config/pricing.py (source and date printed).
With AWS credentials, the EC2 on-demand price comes from the AWS Price List API (`pricing` in us-east-1) for
the environment's own region, and Spot from EC2 DescribeSpotPriceHistory; without them Spot is "n/a", never
a guessed discount. Batch multi-node parallel jobs cannot run on Spot, so Spot is shown only where it applies.
SageMaker (compute=sagemaker) is priced at SageMaker's ml.* training price, its managed Spot at EC2's current Spot
discount for the same type where credentials allow, else at AWS's stated best case ("up to 90%"), labelled as that.
The recorded prices are us-east-1's: an environment elsewhere shows them as "us-east-1 list price" unless the live
Price List API priced its own Region. Then the standing cost: what each environment bills every month while nothing
trains, on each backend, counted from the synthesized templates and priced per Region (tools/standing_cost.py).
With credentials it also says whether the `Environment` cost-allocation tag, which the budget filters on, is
active (Cost Explorer ListCostAllocationTags): until it is, the budget reads $0.
"""

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from config import ConfigError, EnvironmentConfig, load_config
from config.catalogue import (
    PRICE_DATE,
    PRICE_SOURCE,
    SAGEMAKER_ESTIMATE_RATIO,
    SAGEMAKER_PRICE_DATE,
    SAGEMAKER_PRICE_SOURCE,
    SAGEMAKER_SPOT_MAX_SAVING,
    SAGEMAKER_SPOT_SOURCE,
    Accelerator,
)
from config.pricing import FSX_PRICE_DATE, FSX_PRICE_SOURCE, HOURS_PER_MONTH, fsx_usd_per_gb_month
from contracts.quote import COMPILE_MINUTES, SANITY_MINUTES, VALIDATION_MINUTES, about_usd
from tools import standing_cost

ROOT = Path(__file__).resolve().parent.parent
PRICING_REGION = "us-east-1"  # the Price List API answers from us-east-1 (and a few others) for every region
CATALOGUE_REGION = "us-east-1"  # the Region of every recorded price (PRICE_SOURCE, SAGEMAKER_PRICE_SOURCE, FSx)
COST_EXPLORER_REGION = "us-east-1"  # Cost Explorer's one endpoint (ce.us-east-1.amazonaws.com)
NEEDS_CREDENTIALS = "n/a (needs credentials)"
# What the offline SageMaker Spot figure is: AWS's "up to 90%" is its largest saving, not what a job usually gets.
SPOT_BEST_CASE = f"best case, up to {SAGEMAKER_SPOT_MAX_SAVING:.0%} off: AWS's maximum saving, not a typical price"


@dataclass(frozen=True)
class Price:
    usd_per_hour: float | None
    source: str  # where the number came from, or why there is none

    @property
    def estimated(self) -> bool:
        """Derived, not read from a price list or the market: printed rounded, with a ~, never to the cent."""
        return "estimate:" in self.source or SPOT_BEST_CASE in self.source or "an estimate" in self.source


@dataclass(frozen=True)
class Estimate:
    config: EnvironmentConfig
    hours: float
    on_demand: Price  # per node; None for a type AWS lists no on-demand price for (Capacity Blocks only)
    spot: Price  # per node
    fsx_usd_per_gb_month: float

    @property
    def cluster_usd_per_hour(self) -> float | None:
        node = self.on_demand.usd_per_hour
        return None if node is None else self.config.nodes * node

    @property
    def fsx_usd_per_month(self) -> float:
        # FSx bills provisioned capacity per GB-month; AWS's own examples price 1,200 GiB as 1,200 GB.
        return self.config.fsx_storage_gib * self.fsx_usd_per_gb_month

    @property
    def fsx_usd_per_hour(self) -> float:
        return self.fsx_usd_per_month / HOURS_PER_MONTH

    def other_jobs_usd(self) -> dict[str, float]:
        """The run's sanity, compile (Trainium) and validation jobs at the assumed durations (each left out where it
        has no price)."""
        c, jobs = self.config, {}
        node = self.on_demand.usd_per_hour
        if c.compute != "sagemaker" and node is not None:
            jobs["sanity"] = SANITY_MINUTES / 60 * c.nodes * node
        if c.instance.accelerator is Accelerator.NEURON and node is not None:
            jobs["compile"] = COMPILE_MINUTES / 60 * c.nodes * node
        single = c.single_node_instance
        price = single.sagemaker_usd_per_hour if c.compute == "sagemaker" else single.on_demand_usd_per_hour
        if price is not None:
            jobs["validation"] = VALIDATION_MINUTES / 60 * price
        return jobs

    def run_usd(self, node_usd_per_hour: float | None) -> float | None:
        """Compute for the run's hours plus the file system's share of those hours (None without a node price)."""
        if node_usd_per_hour is None:
            return None
        return self.hours * (self.config.nodes * node_usd_per_hour + self.fsx_usd_per_hour)

    @property
    def spot_run_usd(self) -> float | None:
        return self.run_usd(self.spot.usd_per_hour)

    @property
    def spot_run_range_usd(self) -> tuple[float, float] | None:
        """Without the region's Spot price history (no credentials), where Spot may run: the run between AWS's largest
        Spot saving (up to 90%) and the on-demand price, the default ceiling (Batch API reference, ComputeResource
        bidPercentage: "the default value is 100% of the On-Demand price"; EC2 Spot bills the current Spot price
        under it). None where the price is known or Spot cannot run."""
        node = self.on_demand.usd_per_hour
        if self.spot.source != NEEDS_CREDENTIALS or node is None:
            return None
        low, high = self.run_usd(node * (1 - SAGEMAKER_SPOT_MAX_SAVING)), self.run_usd(node)
        return None if low is None or high is None else (low, high)


def spot_allowed(config: EnvironmentConfig) -> tuple[bool, str]:
    """Whether this backend and shape can run on Spot at all, and why not."""
    if config.compute == "batch" and config.nodes > 1:
        return False, "n/a (Batch multi-node parallel jobs cannot run on Spot)"
    return True, ""


def has_credentials(session) -> bool:
    return session is not None and session.get_credentials() is not None


def live_on_demand(pricing_client, config: EnvironmentConfig) -> float | None:
    """Linux, shared-tenancy on-demand price of the instance type in the environment's region. `marketoption`
    OnDemand: the same type's Capacity Block and Spot products share every other attribute, and a Capacity Block's
    hourly rate is not the on-demand price."""
    filters = {
        "instanceType": config.instance_type,
        "regionCode": config.region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
    }
    response = pricing_client.get_products(
        ServiceCode="AmazonEC2",
        MaxResults=10,
        Filters=[{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in filters.items()],
    )
    products = [json.loads(item) if isinstance(item, str) else item for item in response.get("PriceList", [])]
    dimensions = [
        dimension
        for product in products
        for term in product.get("terms", {}).get("OnDemand", {}).values()
        for dimension in term.get("priceDimensions", {}).values()
    ]
    prices = [float(dimension.get("pricePerUnit", {}).get("USD", "0")) for dimension in dimensions]
    return next((usd for usd in prices if usd > 0), None)


def live_spot(ec2_client, config: EnvironmentConfig) -> tuple[float, str] | None:
    """The latest Spot price in the environment's AZ, or the highest across AZs when none is pinned."""
    kwargs = {
        "InstanceTypes": [config.instance_type],
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": datetime.now(UTC),
        "MaxResults": 100,
    }
    if config.availability_zone:
        kwargs["AvailabilityZone"] = config.availability_zone
    latest: dict[str, float] = {}
    for entry in ec2_client.describe_spot_price_history(**kwargs).get("SpotPriceHistory", []):
        latest.setdefault(entry["AvailabilityZone"], float(entry["SpotPrice"]))  # newest first per AZ
    if not latest:
        return None
    zone = max(latest, key=lambda z: latest[z])
    return latest[zone], zone


def sagemaker_prices(config: EnvironmentConfig, session=None) -> tuple[Price, Price]:
    """SageMaker training: the catalogue's ml.* on-demand price; managed Spot as EC2's current Spot discount for
    the same type (with credentials), else AWS's stated best case, never a guessed typical discount."""
    instance = config.instance
    if instance.sagemaker_usd_per_hour is None:  # offered, but EC2 lists no price to estimate SageMaker's from
        unknown = f"n/a (no known price for {instance.sagemaker_instance_type}: {instance.price_note})"
        return Price(None, unknown), Price(None, unknown)
    source = (
        f"estimate: EC2's catalogue price x {SAGEMAKER_ESTIMATE_RATIO} (config/catalogue.py)"
        if instance.sagemaker_price_estimated
        else f"catalogue: {SAGEMAKER_PRICE_SOURCE}, {SAGEMAKER_PRICE_DATE}"
    )
    on_demand = Price(instance.sagemaker_usd_per_hour, listed_in(config, source))
    best = instance.sagemaker_usd_per_hour * (1 - SAGEMAKER_SPOT_MAX_SAVING)
    spot = Price(best, listed_in(config, f"{SPOT_BEST_CASE} ({SAGEMAKER_SPOT_SOURCE})"))
    if has_credentials(session):
        try:
            ec2_spot = live_spot(session.client("ec2", region_name=config.region), config)
        except (BotoCoreError, ClientError):
            ec2_spot = None
        if ec2_spot and instance.on_demand_usd_per_hour:
            share = ec2_spot[0] / instance.on_demand_usd_per_hour
            spot = Price(
                instance.sagemaker_usd_per_hour * share,
                listed_in(
                    config,
                    f"EC2's Spot discount for {instance.name} in {ec2_spot[1]} now ({1 - share:.0%}), applied to "
                    "SageMaker's price: an estimate, SageMaker bills managed Spot itself",
                ),
            )
    return on_demand, spot


def listed_in(config: EnvironmentConfig, source: str) -> str:
    """A recorded price's source, marked as us-east-1's where the environment deploys elsewhere."""
    if config.region == CATALOGUE_REGION:
        return source
    return f"{CATALOGUE_REGION} list price, not {config.region}'s: {source}"


def estimate(config: EnvironmentConfig, hours: float, session=None) -> Estimate:
    """Prices for one environment: live where credentials allow, the catalogue otherwise."""
    prices = sagemaker_prices if config.compute == "sagemaker" else ec2_prices
    on_demand, spot = prices(config, session)
    return Estimate(
        config=config,
        hours=hours,
        on_demand=on_demand,
        spot=spot,
        fsx_usd_per_gb_month=fsx_usd_per_gb_month(config.fsx_deployment_type, config.fsx_throughput_per_tib),
    )


def ec2_prices(config: EnvironmentConfig, session=None) -> tuple[Price, Price]:
    """EC2's on-demand and Spot prices of the environment's type (Batch and EKS)."""
    instance = config.instance
    catalogue = Price(
        instance.on_demand_usd_per_hour,
        listed_in(config, f"catalogue: {PRICE_SOURCE}, {PRICE_DATE}")
        if instance.on_demand_usd_per_hour is not None
        else f"n/a ({instance.price_note})",
    )
    allowed, reason = spot_allowed(config)
    on_demand, spot = catalogue, Price(None, reason or NEEDS_CREDENTIALS)
    if has_credentials(session):
        try:
            live = live_on_demand(session.client("pricing", region_name=PRICING_REGION), config)
        except (BotoCoreError, ClientError) as error:
            live, catalogue = (
                None,
                Price(catalogue.usd_per_hour, f"{catalogue.source}; Price List API failed: {error}"),
            )
            on_demand = catalogue
        if live is not None:
            on_demand = Price(live, f"AWS Price List API, {config.region}, {datetime.now(UTC):%Y-%m-%d}")
        if allowed:
            try:
                found = live_spot(session.client("ec2", region_name=config.region), config)
                spot = (
                    Price(found[0], f"EC2 Spot price history, {found[1]}, now")
                    if found
                    else Price(None, f"n/a (no Spot price for {config.instance_type} in {config.region})")
                )
            except (BotoCoreError, ClientError) as error:
                spot = Price(None, f"n/a (Spot price history failed: {error})")
    return on_demand, spot


def cost_tag_status(session, tag_key: str) -> str:
    """One line on whether the user-defined cost-allocation tag `tag_key` is active for the payer account.

    Cost Explorer API, ListCostAllocationTags (Status Active/Inactive); a budget filtered on a tag counts only
    costs incurred after the tag was activated (AWS Billing user guide, activating-tags.html)."""
    try:
        response = session.client("ce", region_name=COST_EXPLORER_REGION).list_cost_allocation_tags(
            TagKeys=[tag_key], Type="UserDefined"
        )
    except (BotoCoreError, ClientError) as error:
        return f"Cost-allocation tag {tag_key!r}: not checked ({error}); see README, Cost."
    statuses = {tag["TagKey"]: tag["Status"] for tag in response.get("CostAllocationTags", [])}
    if statuses.get(tag_key) == "Active":
        return f"Cost-allocation tag {tag_key!r}: active; the budgets count costs from its activation on."
    seen = "inactive" if tag_key in statuses else "not seen yet by Billing (no tagged cost so far)"
    return (
        f"WARNING: cost-allocation tag {tag_key!r} is {seen}: every budget filtered on it reads $0 until it "
        "is activated in the payer account (Billing console > Cost allocation tags)."
    )


def render(e: Estimate) -> str:
    c = e.config
    fsx_tier = "" if c.fsx_deployment_type.startswith("SCRATCH") else f" {c.fsx_throughput_per_tib} MB/s/TiB"
    lines = [
        f"{c.name} ({c.region}): {c.compute}, {c.nodes} x "
        f"{c.instance.sagemaker_instance_type if c.compute == 'sagemaker' else c.instance_type}, "
        f"FSx {c.fsx_deployment_type}{fsx_tier} {c.fsx_storage_gib} GiB, budget ${c.budget_monthly_usd:,.2f}/month",
        f"  cluster on-demand : {c.nodes} x {_per_hour(e.on_demand)}/h = "
        f"{_money(e.cluster_usd_per_hour, e.on_demand.estimated)}/h   [{e.on_demand.source}]"
        if e.on_demand.usd_per_hour is not None and e.cluster_usd_per_hour is not None
        else f"  cluster on-demand : {e.on_demand.source}",
        f"  FSx               : {c.fsx_storage_gib} GB x ${e.fsx_usd_per_gb_month:.3f}/GB-month = "
        f"${e.fsx_usd_per_month:,.2f}/month (${e.fsx_usd_per_hour:,.4f}/h)"
        + ("" if c.region == CATALOGUE_REGION else f"   [{listed_in(c, 'config/pricing.py')}]"),
        f"  {f'run of {e.hours:g} h':<18}: on-demand "
        + _usd(
            e.run_usd(e.on_demand.usd_per_hour),
            f"n/a; the file system alone ${e.hours * e.fsx_usd_per_hour:,.2f}",
            e.on_demand.estimated,
        ),
    ]
    lines.append(_other_jobs_line(e))
    spot_run, spot_range = e.spot_run_usd, e.spot_run_range_usd
    if spot_range is not None:
        lines.append(
            f"                      Spot between {_money(spot_range[0], True)} and {_money(spot_range[1], True)} "
            f"(AWS's largest saving, up to {SAGEMAKER_SPOT_MAX_SAVING:.0%}, to the on-demand price, the default "
            "ceiling; the region's price history needs credentials)"
        )
    elif e.spot.usd_per_hour is None or spot_run is None:
        lines.append(f"                      Spot {e.spot.source}")
    else:
        bound = "at least " if SPOT_BEST_CASE in e.spot.source else ""
        lines.append(
            f"                      Spot {bound}{_money(spot_run, e.spot.estimated)} ({c.nodes} x "
            f"{_per_hour(e.spot)}/h)   [{e.spot.source}]"
        )
    return "\n".join(lines)


def _other_jobs_line(e: Estimate) -> str:
    """The run's sanity, compile and validation jobs: estimates (assumed durations), on demand."""
    jobs = e.other_jobs_usd()
    single = e.config.single_node_instance.name
    parts = [
        f"sanity {_money(jobs['sanity'], True)} ({SANITY_MINUTES} min on the run's nodes)" if "sanity" in jobs else "",
        f"compile {_money(jobs['compile'], True)} ({COMPILE_MINUTES} min on the run's nodes, a shape's first run)"
        if "compile" in jobs
        else "",
        f"validation {_money(jobs['validation'], True)} ({VALIDATION_MINUTES} min on 1 x {single})"
        if "validation" in jobs
        else "",
    ]
    inside = "; the sanity check runs inside the training job" if e.config.compute == "sagemaker" else ""
    shown = ", ".join(p for p in parts if p) or "n/a (no price for their types)"
    return f"  the run's jobs    : {shown}, on demand, at assumed durations{inside}"


def run_shares(configs: list[EnvironmentConfig], standings: list, hours: float) -> list[str]:
    """Each environment's run's share of what its backend keeps running (the EKS control plane and system nodes, NAT,
    endpoints, alarms...): the standing cost's hours, less the file system, which the run's block counts already."""
    lines = [f"A {hours:g} h run's share of what stands (besides its file system):"]
    for config in configs:
        found = next((s for s in standings if (s.env, s.backend) == (config.name, config.compute)), None)
        if found is None or found.refused:
            continue
        monthly = sum(line.usd_per_month or 0.0 for line in found.lines if not line.item.startswith("FSx"))
        unpriced = " + unpriced" if found.unpriced else ""
        lines.append(f"  {config.name} ({config.compute}): ${monthly * hours / HOURS_PER_MONTH:,.2f}{unpriced}")
    return lines


def _usd(value: float | None, otherwise: str, estimated: bool = False) -> str:
    return otherwise if value is None else _money(value, estimated)


def _money(value: float, estimated: bool) -> str:
    """A price as read to the cent; an estimate to two significant figures, marked ~."""
    return about_usd(value) if estimated else f"${value:,.2f}"


def _per_hour(price: Price) -> str:
    assert price.usd_per_hour is not None
    return _money(price.usd_per_hour, True) if price.estimated else f"${price.usd_per_hour:,.4f}"


def _context(overrides: list[str]) -> dict:
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"-c {item}: expected FIELD=VALUE, like -c nodes=4")
        context[key.strip()] = value
    return context


def _parser() -> argparse.ArgumentParser:
    from tools import token_cost  # the model sizes come from the training image's modules

    parser = argparse.ArgumentParser(prog="python -m tools.cost_report", description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="length of the training run to price (default 24)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--env", help="one environment from cdk.json")
    which.add_argument("--all", action="store_true", help="every environment in cdk.json (the default)")
    parser.add_argument(
        "-c",
        "--context",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, as with cdk synth -c (repeatable)",
    )
    parser.add_argument("--offline", action="store_true", help="catalogue prices only; do not look for credentials")
    parser.add_argument(
        "--model",
        default=token_cost.DEFAULT_MODEL,
        choices=list(token_cost.MODEL_SIZES),
        help=f"model size to price a billion training tokens for (default {token_cost.DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--mfu",
        type=float,
        default=token_cost.DEFAULT_MFU_PERCENT,
        help=f"assumed model FLOPs utilisation, percent (default {token_cost.DEFAULT_MFU_PERCENT:g})",
    )
    return parser


def main(argv: list[str] | None = None, session=None, templates=None) -> int:
    """`templates`: how the standing section gets an app's templates (tests pass their shared synthesis)."""
    from tools import token_cost

    parser = _parser()
    args = parser.parse_args(argv)
    if args.hours <= 0:
        parser.error(f"--hours={args.hours:g} is not valid; expected a positive number of hours")
    if not 0 < args.mfu <= 100:
        parser.error(f"--mfu={args.mfu:g} is not valid; expected a percentage above 0, at most 100")
    try:
        context = _context(args.context)
        names = [args.env] if args.env else list(context["environments"])
        configs = [load_config({**context, "env": name}) for name in names]
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if session is None and not args.offline:
        import boto3  # only when live prices may be used

        session = boto3.Session()
    blocks = [render(estimate(config, args.hours, session)) for config in configs]
    print("\n\n".join(blocks))
    standings = standing_cost.standing(context, names, templates or standing_cost.synthesized_templates)
    print("\n" + standing_cost.report(standings))
    print("\n" + "\n".join(run_shares(configs, standings, args.hours)))
    print("\n" + token_cost.report(configs, args.model, args.mfu, session, has_credentials(session)))
    if has_credentials(session):
        from stacks.observability_stack import COST_TAG_KEY  # the tag the budgets filter on (imports the CDK)

        print("\n" + cost_tag_status(session, COST_TAG_KEY))
    print(
        f"\nPrices: EC2 on-demand from the catalogue ({PRICE_SOURCE}, {PRICE_DATE}) unless marked live; "
        f"FSx from {FSX_PRICE_SOURCE}, {FSX_PRICE_DATE}; a month is {HOURS_PER_MONTH} h. "
        "Excludes EBS, data transfer, logs and S3 (the standing section names what else it leaves out)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
