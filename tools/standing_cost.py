"""What each environment bills every month while nothing trains, on each compute backend ("standing cost").

Quantities come from the backend's synthesized templates, since a template is what deploys: NAT gateways and their
public IPv4 addresses, interface endpoints times the subnets (one per AZ) each has a network interface in, the FSx
file system's capacity and deployment type, EKS clusters and each node group's desired size, Batch's minimum vCPUs,
KMS keys, dashboards, alarm metrics, composite alarms, budgets and the state transitions of state machines run on a
schedule (EKS's node-group reconciler). Prices come from config/standing_prices.py for the environment's Region;
where none is recorded the item reads "unpriced in <region>", never us-east-1's figure.
"""

import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from config import ConfigError, load_config
from config.environment import COMPUTE_BACKENDS
from config.pricing import HOURS_PER_MONTH, fsx_usd_per_gb_month
from config.standing_prices import (
    BUDGET,
    BUDGET_BEYOND_TWO_USD_PER_DAY,
    CLOUDWATCH_ALARM_METRIC,
    CLOUDWATCH_COMPOSITE_ALARM,
    CLOUDWATCH_DASHBOARD,
    EC2_USD_PER_HOUR,
    EKS_CLUSTER,
    EKS_EXTENDED_SUPPORT_USD_PER_HOUR,
    FSX_PRICED_REGIONS,
    FSX_SOURCE,
    INTERFACE_ENDPOINT_AZ,
    KMS_KEY,
    NAT_GATEWAY,
    PUBLIC_IPV4,
    SFN_STATE_TRANSITION,
    TRACKING_SERVER_PRICE_NOTE,
    StandingPrice,
)

# cx-api's DISABLE_ASSET_STAGING_CONTEXT: assets stay where they are (the EKS kubectl layer alone is 60 MB); the
# templates, which are all this reads, do not change.
_NO_ASSET_STAGING = {"aws:cdk:disable-asset-staging": True}
Templates = list[dict]


@dataclass(frozen=True)
class Line:
    item: str  # what bills, e.g. "NAT gateways"
    quantity: float
    unit: str  # what one of `quantity` is, e.g. "endpoint-AZ", "GB"
    price: StandingPrice | None  # per one unit; None where the Region has no recorded price
    unpriced: str = ""  # why there is no price

    @property
    def usd_per_month(self) -> float | None:
        if self.price is None:
            return None
        return self.quantity * self.price.usd * (HOURS_PER_MONTH if self.price.unit == "hour" else 1)


def _properties(templates: Iterable[dict], resource_type: str) -> list[dict]:
    return [
        resource.get("Properties", {})
        for template in templates
        for resource in template.get("Resources", {}).values()
        if resource.get("Type") == resource_type
    ]


def _priced(item: str, quantity: float, unit: str, prices: Mapping[str, StandingPrice], region: str) -> Line:
    price = prices.get(region)
    return Line(item, quantity, unit, price, "" if price else f"unpriced in {region}")


def _fsx_lines(templates: Templates, region: str) -> list[Line]:
    """One line per file system: provisioned GB (AWS bills 1,200 GiB as 1,200 GB) x its deployment type's price."""
    lines = []
    for props in _properties(templates, "AWS::FSx::FileSystem"):
        lustre = props.get("LustreConfiguration", {})
        deployment, tier = lustre.get("DeploymentType", "?"), lustre.get("PerUnitStorageThroughput")
        item = f"FSx {deployment}" + (f" {tier} MB/s/TiB" if tier else "")
        price = None
        if region in FSX_PRICED_REGIONS:
            price = StandingPrice(fsx_usd_per_gb_month(deployment, tier or 0), "month", FSX_SOURCE, "")
        lines.append(Line(item, props["StorageCapacity"], "GB", price, "" if price else f"unpriced in {region}"))
    return lines


def _node_group_lines(templates: Templates, region: str) -> list[Line]:
    """Nodes a node group keeps running: its desired size (the accelerator group's is 0 until a run scales it)."""
    lines = []
    for props in _properties(templates, "AWS::EKS::Nodegroup"):
        desired, types = props.get("ScalingConfig", {}).get("DesiredSize", 0), props.get("InstanceTypes") or []
        if not desired:
            continue
        if len(types) != 1:
            lines.append(Line("EKS nodes", desired, "node", None, "unpriced: type set in the launch template"))
            continue
        lines.append(_priced(f"EKS nodes ({types[0]})", desired, "node", _ec2(types[0]), region))
    return lines


def scheduled_transitions(templates: Templates) -> int:
    """State transitions a month of the state machines EventBridge starts on a `rate(N minutes)` schedule, at most:
    each run counted as every state of its definition once (a run takes fewer on its idle path)."""
    transitions = 0
    for template in templates:
        resources = template.get("Resources", {})
        for rule in resources.values():
            props = rule.get("Properties", {}) if rule.get("Type") == "AWS::Events::Rule" else {}
            minutes = re.fullmatch(r"rate\((\d+) minutes?\)", props.get("ScheduleExpression", ""))
            for target in props.get("Targets", []) if minutes else []:
                machine = resources.get(target.get("Arn", {}).get("Ref", ""), {})
                if minutes and machine.get("Type") == "AWS::StepFunctions::StateMachine":
                    definition = machine["Properties"]["DefinitionString"]
                    text = "".join(p for p in definition["Fn::Join"][1] if isinstance(p, str))
                    runs = HOURS_PER_MONTH * 60 // int(minutes.group(1))
                    transitions += int(runs) * text.count('"Type":')
    return transitions


def _ec2(instance_type: str) -> dict[str, StandingPrice]:
    return {region: price for (region, name), price in EC2_USD_PER_HOUR.items() if name == instance_type}


def endpoint_azs(templates: Templates) -> int:
    """Interface endpoints bill per endpoint per AZ: one network interface in each subnet the endpoint lists."""
    return sum(
        len(props.get("SubnetIds", []))
        for props in _properties(templates, "AWS::EC2::VPCEndpoint")
        if props.get("VpcEndpointType") == "Interface"
    )


def alarm_metrics(templates: Templates) -> tuple[int, int]:
    """(metrics the alarms watch, Metrics Insights query alarms): a metric-math alarm bills each metric it reads; a
    query alarm bills per metric its query analyses, which no template says."""
    metrics = queries = 0
    for props in _properties(templates, "AWS::CloudWatch::Alarm"):
        entries = props.get("Metrics") or []
        metrics += 1 if "MetricName" in props else sum("MetricStat" in entry for entry in entries)
        queries += any(str(entry.get("Expression", "")).lstrip().upper().startswith("SELECT") for entry in entries)
    return metrics, queries


def standing_lines(templates: Templates, region: str) -> list[Line]:
    """Everything in the templates that bills by the hour or the month whether or not anything runs."""

    def count(resource_type: str) -> int:
        return len(_properties(templates, resource_type))

    min_vcpus = sum(
        props.get("ComputeResources", {}).get("MinvCpus", 0)
        for props in _properties(templates, "AWS::Batch::ComputeEnvironment")
    )
    lines = [
        _priced("NAT gateways", count("AWS::EC2::NatGateway"), "gateway", NAT_GATEWAY, region),
        _priced("public IPv4 addresses", count("AWS::EC2::EIP"), "address", PUBLIC_IPV4, region),
        _priced("interface endpoints", endpoint_azs(templates), "endpoint-AZ", INTERFACE_ENDPOINT_AZ, region),
        *_fsx_lines(templates, region),
        _priced("EKS clusters", count("AWS::EKS::Cluster"), "cluster", EKS_CLUSTER, region),
        *_node_group_lines(templates, region),
        Line("Batch minimum vCPUs", min_vcpus, "vCPU", None, "unpriced: instances Batch keeps running"),
        # Config tracking_server (constructs/storage/tracking.py): billed by the hour while it exists, by size.
        Line(
            "MLflow tracking servers",
            count("AWS::SageMaker::MlflowTrackingServer"),
            "server",
            None,
            f"unpriced: {TRACKING_SERVER_PRICE_NOTE}",
        ),
        _priced("KMS keys", count("AWS::KMS::Key"), "key", KMS_KEY, region),
        _priced(
            "CloudWatch dashboards", count("AWS::CloudWatch::Dashboard"), "dashboard", CLOUDWATCH_DASHBOARD, region
        ),
        _priced("CloudWatch alarm metrics", alarm_metrics(templates)[0], "metric", CLOUDWATCH_ALARM_METRIC, region),
        _priced(
            "CloudWatch composite alarms",
            count("AWS::CloudWatch::CompositeAlarm"),
            "alarm",
            CLOUDWATCH_COMPOSITE_ALARM,
            region,
        ),
        _priced("budgets", count("AWS::Budgets::Budget"), "budget", BUDGET, region),
        _priced(
            "scheduled state transitions (at most)",
            scheduled_transitions(templates),
            "transition",
            SFN_STATE_TRANSITION,
            region,
        ),
    ]
    return [line for line in lines if line.quantity]


def synthesized_templates(context: dict) -> Templates:
    """Every stack's template of the app `cdk synth` builds from `context`, synthesized into a temporary folder."""
    from app import build_app  # imports the CDK (seconds): only when a standing cost is asked for

    with tempfile.TemporaryDirectory(prefix="standing-cost-") as outdir:
        app, _ = build_app(context={**context, **_NO_ASSET_STAGING}, outdir=outdir)
        return [stack.template for stack in app.synth().stacks]


@dataclass(frozen=True)
class Standing:
    env: str
    backend: str
    region: str
    lines: tuple[Line, ...] = ()
    refused: str = ""  # the configuration's reason where this backend cannot take the environment
    query_alarms: int = 0  # Metrics Insights query alarms, billed by use (not in the lines)

    @property
    def priced_usd(self) -> float:
        return sum(line.usd_per_month or 0.0 for line in self.lines)

    @property
    def unpriced(self) -> int:
        return sum(line.usd_per_month is None for line in self.lines)

    @property
    def total(self) -> str:
        if self.refused:
            return "n/a"
        return f"${self.priced_usd:,.2f}" + (" + unpriced" if self.unpriced else "")


def standing(
    context: dict, envs: Iterable[str], templates_for: Callable[[dict], Templates] = synthesized_templates
) -> list[Standing]:
    """Each environment on each backend: its configuration (as `-c compute=<backend>` makes it) and template lines."""
    result = []
    for env in envs:
        for backend in COMPUTE_BACKENDS:
            app_context = {**context, "env": env, "compute": backend}
            try:
                config = load_config(app_context)
            except ConfigError as error:
                result.append(Standing(env, backend, "", refused=str(error)))
                continue
            templates = templates_for(app_context)
            lines = tuple(standing_lines(templates, config.region))
            result.append(Standing(env, backend, config.region, lines, query_alarms=alarm_metrics(templates)[1]))
    return result


Row = tuple[str, list[str]]  # a label and one cell per backend


def _rate(price: StandingPrice) -> str:
    if 0 < price.usd < 0.001:  # per-use prices (state transitions) read per thousand, as AWS quotes them
        return f"${price.usd * 1000:.3f}/1,000"
    usd = f"{price.usd:.3f}"
    usd = usd[:-1] if usd.endswith("0") else usd  # $0.10, $1.00, but $0.045 and $0.192
    return f"${usd}/{'h' if price.unit == 'hour' else 'month'}"


_SHOWN_UNITS = {"endpoint-AZ": " endpoint-AZs", "GB": " GB", "vCPU": " vCPUs", "transition": " transitions"}


def _label(found: list[Line]) -> str:
    """`item: quantity x rate`, the quantities of every backend that has the item ("1/2" where they differ)."""
    first = found[0]
    quantity = "/".join(dict.fromkeys(f"{line.quantity:g}" for line in found)) + _SHOWN_UNITS.get(first.unit, "")
    return (
        f"{first.item}: {quantity} x {_rate(first.price)}"
        if first.price
        else f"{first.item}: {quantity} ({first.unpriced})"
    )


def _cell(line: Line | None) -> str:
    if line is None:
        return "-"
    usd = line.usd_per_month
    return "unpriced" if usd is None else f"${usd:,.2f}"


def matrix(standings: list[Standing]) -> list[tuple[str, list[Row]]]:
    """Per environment, `<env> (<region>)` and its rows: one per billed item, then the total, a cell per backend."""
    result = []
    for env in dict.fromkeys(s.env for s in standings):
        columns = [s for s in standings if s.env == env]
        by_key = [{(line.item, line.unit): line for line in s.lines} for s in columns]
        # The fullest backend's order (the order standing_lines adds items in), then anything only others have.
        keys = list(dict.fromkeys(key for lines in sorted(by_key, key=len, reverse=True) for key in lines))
        rows: list[Row] = []
        for key in keys:
            found = [lines[key] for lines in by_key if key in lines]
            cells = ["n/a" if s.refused else _cell(lines.get(key)) for s, lines in zip(columns, by_key, strict=True)]
            rows.append((_label(found), cells))
        rows.append(("total per month", [s.total for s in columns]))
        region = next((s.region for s in columns if s.region), "?")
        result.append((f"{env} ({region})", rows))
    return result


HEADER = (
    "Standing cost: what each environment bills every month while nothing trains, per compute backend "
    f"(quantities from that backend's synthesized templates; {HOURS_PER_MONTH} h a month):"
)


def report(standings: list[Standing]) -> str:
    """The text section `make cost-report` prints: one matrix per environment, then what it leaves out and why."""
    tables = matrix(standings)
    width = max(len(label) for _, rows in tables for label, _ in rows) + 2
    cell = max(len(text) for _, rows in tables for _, cells in rows for text in cells) + 3
    out = [HEADER]
    for title, rows in tables:
        out.append(f"{title:<{width + 2}}" + "".join(f"{backend:>{cell}}" for backend in COMPUTE_BACKENDS))
        out += [f"  {label:<{width}}" + "".join(f"{text:>{cell}}" for text in cells) for label, cells in rows]
    return "\n".join(out + _notes(standings))


def _notes(standings: list[Standing]) -> list[str]:
    queries = max((s.query_alarms for s in standings), default=0)
    refused = [f"n/a: {s.env} on {s.backend}: {s.refused}" for s in standings if s.refused]
    regions: dict[tuple[str, str], list[str]] = {}  # (item, source and date) -> the Regions priced from it
    for s in standings:
        for line in s.lines:
            if line.price:
                source = line.price.source + (f", {line.price.date}" if line.price.date else "")
                regions.setdefault((line.item, source), [])
                regions[(line.item, source)] += [] if s.region in regions[(line.item, source)] else [s.region]
    return [
        *refused,
        "unpriced: no price recorded for that Region (config/standing_prices.py); never shown at another Region's.",
        "Not counted, billed by use or per account: data through the NAT gateway and endpoints, CloudWatch Logs "
        f"(flow, job and control-plane logs), custom metrics while runs publish them, {queries} Metrics Insights "
        "query alarms (per metric each query analyses), Container Insights on EKS, S3 and ECR storage, FSx backups, "
        "EKS nodes' EBS volumes; the account's free 3 dashboards and 10 alarm metrics; budgets past the account's "
        f"second (${BUDGET_BEYOND_TWO_USD_PER_DAY:.2f}/day each); an EKS cluster whose Kubernetes version is in "
        f"extended support (${EKS_EXTENDED_SUPPORT_USD_PER_HOUR:.2f}/h instead of the standard one).",
        "Standing prices:",
        *(f"  {item} ({', '.join(where)}): {source}" for (item, source), where in regions.items()),
    ]


def readme_tables(standings: list[Standing]) -> str:
    """The same matrices as Markdown tables, for the README's Cost section (a test holds the two equal)."""
    blocks = []
    for title, rows in matrix(standings):
        head = [f"| {title} | " + " | ".join(COMPUTE_BACKENDS) + " |", "|---|" + "---:|" * len(COMPUTE_BACKENDS)]
        body = [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows[:-1]]
        total_label, totals = rows[-1]
        body.append(f"| **{total_label}** | " + " | ".join(f"**{cell}**" for cell in totals) + " |")
        blocks.append("\n".join(head + body))
    return "\n\n".join(blocks)
