"""Standing cost (tools/standing_cost.py): what each environment bills while nothing trains, counted from the
synthesized templates, priced per Region, and docs/operators-guide.md's table of it."""

import re
from pathlib import Path

import pytest

from config.pricing import HOURS_PER_MONTH, fsx_usd_per_gb_month
from config.standing_prices import CLOUDWATCH_DASHBOARD, EC2_USD_PER_HOUR, NAT_GATEWAY
from tests.synthesis import CDK_JSON_CONTEXT, ENVIRONMENTS, context, synthesize
from tools import standing_cost

ROOT = Path(__file__).resolve().parent.parent


def shared_templates(app_context: dict) -> list[dict]:
    """The tool's `templates_for`, answered from the test run's shared synthesis (each app synthesized once)."""
    overrides = {key: value for key, value in app_context.items() if CDK_JSON_CONTEXT.get(key) != value}
    return list(synthesize(**overrides).templates.values())


def _standing(env: str, backend: str) -> standing_cost.Standing:
    found = standing_cost.standing(CDK_JSON_CONTEXT, [env], shared_templates)
    return next(s for s in found if s.backend == backend)


def _line(standing: standing_cost.Standing, item: str) -> standing_cost.Line:
    return next(line for line in standing.lines if line.item.startswith(item))


# At least one environment per backend, and both Regions.
@pytest.mark.parametrize(("env", "backend"), [("dev", "batch"), ("prod", "eks"), ("dev", "sagemaker")])
def test_network_and_storage_quantities_are_the_templates(env, backend):
    app = synthesize(env=env, compute=backend)
    network, storage = app.template("network"), app.template("storage")
    endpoints = network.find_resources("AWS::EC2::VPCEndpoint", {"Properties": {"VpcEndpointType": "Interface"}})
    (fsx,) = storage.find_resources("AWS::FSx::FileSystem").values()
    standing = _standing(env, backend)
    assert _line(standing, "NAT gateways").quantity == len(network.find_resources("AWS::EC2::NatGateway")) == 1
    assert _line(standing, "public IPv4").quantity == len(network.find_resources("AWS::EC2::EIP"))
    # Billed per endpoint per AZ: 4 endpoints x the 2 private subnets each sits in.
    azs = sum(len(e["Properties"]["SubnetIds"]) for e in endpoints.values())
    assert _line(standing, "interface endpoints").quantity == azs == 2 * len(endpoints) == 8
    lustre = fsx["Properties"]["LustreConfiguration"]
    fsx_line = _line(standing, "FSx")
    assert fsx_line.quantity == fsx["Properties"]["StorageCapacity"] == app.config.fsx_storage_gib
    assert fsx_line.item.startswith(f"FSx {lustre['DeploymentType']}")


def test_eks_control_plane_and_system_nodes_are_the_templates():
    app = synthesize(env="dev", compute="eks")
    compute = app.template("compute")
    groups = [g["Properties"] for g in compute.find_resources("AWS::EKS::Nodegroup").values()]
    running = [g for g in groups if g["ScalingConfig"]["DesiredSize"]]  # the training and validation groups' are 0
    assert len(groups) == 3 and len(running) == 1
    nodes = _line(_standing("dev", "eks"), "EKS nodes")
    assert nodes.quantity == running[0]["ScalingConfig"]["DesiredSize"] == 2
    assert nodes.item == f"EKS nodes ({running[0]['InstanceTypes'][0]})"
    assert nodes.usd_per_month == pytest.approx(2 * 0.192 * HOURS_PER_MONTH)
    clusters = _line(_standing("dev", "eks"), "EKS clusters")
    assert clusters.quantity == len(compute.find_resources("AWS::EKS::Cluster")) == 1
    assert not any(line.item.startswith("EKS") for line in _standing("dev", "batch").lines)


def test_observability_quantities_are_the_templates():
    app = synthesize(env="dev", compute="batch")
    observability = app.template("observability")
    standing = _standing("dev", "batch")
    assert _line(standing, "CloudWatch dashboards").quantity == len(
        observability.find_resources("AWS::CloudWatch::Dashboard")
    )
    assert _line(standing, "budgets").quantity == len(observability.find_resources("AWS::Budgets::Budget"))
    assert _line(standing, "KMS keys").quantity == len(app.template("alerts").find_resources("AWS::KMS::Key"))


def test_alarm_metrics_count_what_each_alarm_reads():
    # A metric alarm reads one metric, a metric-math alarm each metric it names; a query alarm is counted apart.
    stat = {"MetricStat": {"Metric": {"MetricName": "M"}, "Period": 60, "Stat": "Sum"}}
    properties = {
        "Direct": {"MetricName": "M", "Namespace": "N"},
        "Math": {"Metrics": [{"Expression": "a+b+c"}, stat, stat, stat]},
        "Query": {"Metrics": [{"Expression": " select MAX(x) FROM y"}]},
    }
    alarms = {name: {"Type": "AWS::CloudWatch::Alarm", "Properties": props} for name, props in properties.items()}
    assert standing_cost.alarm_metrics([{"Resources": alarms}]) == (4, 1)


def test_gateway_endpoints_are_free_and_not_counted():
    endpoint = "AWS::EC2::VPCEndpoint"
    resources = {
        "S3": {"Type": endpoint, "Properties": {"VpcEndpointType": "Gateway", "SubnetIds": ["a"]}},
        "Ecr": {"Type": endpoint, "Properties": {"VpcEndpointType": "Interface", "SubnetIds": ["a", "b"]}},
    }
    assert standing_cost.endpoint_azs([{"Resources": resources}]) == 2


def test_a_region_without_a_price_is_unpriced_not_us_east_1s():
    # prod is in us-west-2, where no FSx price is recorded: the item and the total say so, no us-east-1 figure.
    prod = _standing("prod", "batch")
    fsx = _line(prod, "FSx")
    assert fsx.price is None and fsx.usd_per_month is None and fsx.unpriced == "unpriced in us-west-2"
    assert prod.total.endswith("+ unpriced")
    us_east_1_figure = 4800 * fsx_usd_per_gb_month("PERSISTENT_2", 500)
    text = standing_cost.report([prod])
    assert "FSx PERSISTENT_2 500 MB/s/TiB: 4800 GB (unpriced in us-west-2)" in text
    assert f"${us_east_1_figure:,.2f}" not in text
    # A Region with no NAT price at all: the NAT line is unpriced rather than priced at us-east-1's $0.045.
    (line,) = [
        line
        for line in standing_cost.standing_lines(shared_templates(context(env="dev")), "ap-southeast-2")
        if line.item == "NAT gateways"
    ]
    assert "ap-southeast-2" not in NAT_GATEWAY and line.usd_per_month is None


def test_prods_system_nodes_and_dashboard_are_priced_by_us_west_2s_own_records():
    # us-west-2's readings in config/standing_prices.py (SkyPilot's Price List catalogue for m6i.xlarge; the dashboard's
    # one price for every Region), not us-east-1's records; what has no us-west-2 reading stays unpriced.
    prod = _standing("prod", "eks")
    nodes, dashboard = _line(prod, "EKS nodes"), _line(prod, "CloudWatch dashboards")
    assert nodes.price is EC2_USD_PER_HOUR[("us-west-2", "m6i.xlarge")] and "us-west-2" in nodes.price.source
    assert nodes.usd_per_month == pytest.approx(2 * 0.192 * HOURS_PER_MONTH)
    assert dashboard.price is CLOUDWATCH_DASHBOARD["us-west-2"] and dashboard.usd_per_month == 3.0
    assert _line(prod, "CloudWatch alarm metrics").unpriced == "unpriced in us-west-2"


def test_the_tools_own_synthesis_gives_the_same_resources():
    # `make cost-report` synthesizes with asset staging off; the resources are those of a normal synthesis.
    app_context = context(env="dev", compute="sagemaker")
    mine = standing_cost.synthesized_templates(app_context)
    theirs = shared_templates(app_context)

    def types(templates):
        return sorted(r["Type"] for t in templates for r in t.get("Resources", {}).values())

    assert types(mine) == types(theirs)


def test_readme_standing_table_is_the_tools():
    # docs/operators-guide.md's table (moved from the README) is the tool's, for every shipped environment and backend:
    # a change not pasted fails here.
    readme = (ROOT / "docs" / "operators-guide.md").read_text()
    block = re.search(r"<!-- standing-cost:start -->\n(.*?)\n<!-- standing-cost:end -->", readme, re.S)
    assert block is not None
    assert block.group(1) == standing_cost.readme_tables(
        standing_cost.standing(CDK_JSON_CONTEXT, ENVIRONMENTS, shared_templates)
    )


# A state machine EventBridge starts every 5 minutes bills its transitions whether or not anything trains: at most
# every state of its definition once per run (EKS's node-group reconciler is one).
def test_scheduled_state_machines_bill_their_transitions():
    machine = {
        "Type": "AWS::StepFunctions::StateMachine",
        "Properties": {
            "DefinitionString": {"Fn::Join": ["", ['{"States":{"A":{"Type":"Pass"},', '"B":{"Type":"Succeed"}}}']]}
        },
    }
    rule = {
        "Type": "AWS::Events::Rule",
        "Properties": {"ScheduleExpression": "rate(5 minutes)", "Targets": [{"Arn": {"Ref": "Machine"}, "Id": "T"}]},
    }
    templates = [{"Resources": {"Machine": machine, "Rule": rule}}]
    assert standing_cost.scheduled_transitions(templates) == HOURS_PER_MONTH * 60 // 5 * 2
    (line,) = [x for x in standing_cost.standing_lines(templates, "us-east-1") if x.item.startswith("scheduled")]
    assert line.usd_per_month == pytest.approx(HOURS_PER_MONTH * 12 * 2 * 0.025 / 1000)


# On EKS the reconciler is the one scheduled state machine: its transitions are in the standing cost.
def test_the_eks_reconciler_is_in_the_standing_cost():
    assert _line(_standing("dev", "eks"), "scheduled state transitions").quantity > 0
    assert not any(line.item.startswith("scheduled") for line in _standing("dev", "batch").lines)


def test_a_managed_tracking_server_is_a_standing_line_unpriced_where_no_price_is_recorded():
    # config tracking_server: a SageMaker managed MLflow server bills by the hour while it exists (off by default).
    app = synthesize(env="dev", compute="batch", tracking_server="small")
    lines = standing_cost.standing_lines(list(app.templates.values()), "us-east-1")
    (line,) = [ln for ln in lines if ln.item == "MLflow tracking servers"]
    assert line.quantity == len(app.template("storage").find_resources("AWS::SageMaker::MlflowTrackingServer")) == 1
    assert line.price is None and line.unpriced.startswith("unpriced: SageMaker pricing, MLflow")
    shipped = standing_cost.standing_lines(list(synthesize(env="dev", compute="batch").templates.values()), "us-east-1")
    assert "MLflow tracking servers" not in [ln.item for ln in shipped]
