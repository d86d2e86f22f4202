"""Cost report: arithmetic from the catalogue and pricing inputs, Spot rules, and the live-price paths (Stubber)."""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from config import CATALOGUE, load_config
from config.pricing import HOURS_PER_MONTH, fsx_usd_per_gb_month
from contracts.quote import COMPILE_MINUTES
from tests.synthesis import CAPACITY_BLOCK, CDK_JSON_CONTEXT
from tests.test_standing_cost import shared_templates
from tools import cost_report


def _config(**overrides):
    return load_config({**CDK_JSON_CONTEXT, **{k: str(v) for k, v in overrides.items()}})


class _Session:
    """A boto3-like session with fake credentials whose clients are stubbed."""

    def __init__(self, clients):
        self.clients = clients

    def get_credentials(self):
        return object()

    def client(self, name, region_name=None):
        return self.clients[name]


def _stubbed(service, region):
    client = boto3.client(service, region_name=region, aws_access_key_id="x", aws_secret_access_key="y")
    return client, Stubber(client)


def test_cluster_hourly_cost_is_nodes_times_catalogue_price():
    # Cluster cost per hour = nodes x the instance type's on-demand price from the catalogue.
    config = _config(env="prod")
    e = cost_report.estimate(config, hours=10)
    node = CATALOGUE[config.instance_type].on_demand_usd_per_hour
    assert e.cluster_usd_per_hour == pytest.approx(config.nodes * node)


@pytest.mark.parametrize("env", list(CDK_JSON_CONTEXT["environments"]))
def test_fsx_monthly_cost_is_capacity_times_tier_price(env):
    # FSx per month = provisioned GB x the price of its deployment type and throughput tier.
    config = _config(env=env)
    e = cost_report.estimate(config, hours=1)
    price = fsx_usd_per_gb_month(config.fsx_deployment_type, config.fsx_throughput_per_tib)
    assert e.fsx_usd_per_month == pytest.approx(config.fsx_storage_gib * price)


def test_run_cost_is_hours_times_cluster_plus_fsx_share():
    # A run of N hours = N x (cluster per hour + FSx monthly cost / hours in a month).
    config = _config(env="dev", nodes=3)
    hours = 17.5
    e = cost_report.estimate(config, hours=hours)
    node = CATALOGUE[config.instance_type].on_demand_usd_per_hour
    fsx_hour = (
        config.fsx_storage_gib
        * fsx_usd_per_gb_month(config.fsx_deployment_type, config.fsx_throughput_per_tib)
        / HOURS_PER_MONTH
    )
    assert e.run_usd(e.on_demand.usd_per_hour) == pytest.approx(hours * (3 * node + fsx_hour))


def test_scratch_price_ignores_the_throughput_setting():
    # SCRATCH_2 has one price whatever fsx_throughput_per_tib says (the field only applies to PERSISTENT_2).
    assert fsx_usd_per_gb_month("SCRATCH_2", 125) == fsx_usd_per_gb_month("SCRATCH_2", 1000)


def test_batch_multi_node_never_offers_spot():
    # Batch multi-node parallel jobs cannot run on Spot: the report says so even with credentials.
    pricing, stub = _stubbed("pricing", "us-east-1")
    stub.add_response("get_products", {"PriceList": []})
    with stub:  # the session has no ec2 client: asking it for Spot prices would raise KeyError
        e = cost_report.estimate(
            _config(env="dev", compute="batch", nodes=2), hours=1, session=_Session({"pricing": pricing})
        )
    assert e.spot.usd_per_hour is None and "multi-node" in e.spot.source


def test_eks_spot_without_credentials_is_a_range_not_a_price():
    # Without the price history no Spot price is invented: the run between AWS's largest saving (90%) and the
    # on-demand price, the default ceiling (Batch API reference, ComputeResource bidPercentage: 100% of On-Demand).
    e = cost_report.estimate(_config(env="dev", compute="eks"), hours=2, session=None)
    assert (e.spot.usd_per_hour, e.spot.source) == (None, cost_report.NEEDS_CREDENTIALS)
    node = e.on_demand.usd_per_hour
    assert node is not None
    assert e.spot_run_range_usd == pytest.approx((e.run_usd(node * 0.1), e.run_usd(node)))
    (line,) = [line for line in cost_report.render(e).splitlines() if "Spot between ~$" in line]
    assert "to the on-demand price, the default ceiling" in line
    batch = cost_report.estimate(_config(env="dev", compute="batch"), hours=2, session=None)
    assert batch.spot_run_range_usd is None  # multi-node jobs cannot run on Spot at all


def test_live_prices_come_from_price_list_and_spot_history():
    # With credentials: on-demand from pricing:GetProducts, Spot from the newest DescribeSpotPriceHistory entry.
    config = _config(env="prod", compute="eks")
    pricing, pricing_stub = _stubbed("pricing", "us-east-1")
    ec2, ec2_stub = _stubbed("ec2", config.region)
    product = {
        "product": {"attributes": {"instanceType": config.instance_type}},
        "terms": {
            "OnDemand": {"T": {"priceDimensions": {"D": {"unit": "Hrs", "pricePerUnit": {"USD": "50.0000000000"}}}}}
        },
    }
    pricing_stub.add_response(
        "get_products",
        {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"},
        {"ServiceCode": "AmazonEC2", "Filters": ANY, "MaxResults": 10},
    )
    now = datetime.now(UTC)
    ec2_stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                {
                    "AvailabilityZone": config.availability_zone,
                    "InstanceType": config.instance_type,
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": "20.000000",
                    "Timestamp": now,
                },
                {
                    "AvailabilityZone": config.availability_zone,
                    "InstanceType": config.instance_type,
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": "99.000000",
                    "Timestamp": now,
                },
            ]
        },
        {
            "InstanceTypes": [config.instance_type],
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": ANY,
            "MaxResults": 100,
            "AvailabilityZone": config.availability_zone,
        },
    )
    with pricing_stub, ec2_stub:
        e = cost_report.estimate(config, hours=2, session=_Session({"pricing": pricing, "ec2": ec2}))
    assert (e.on_demand.usd_per_hour, e.spot.usd_per_hour) == (50.0, 20.0)
    assert e.spot_run_usd == pytest.approx(2 * (config.nodes * 20.0 + e.fsx_usd_per_hour))
    pricing_stub.assert_no_pending_responses()


def test_price_list_filters_name_the_instance_and_region():
    # GetProducts asks for the environment's instance type in its region, Linux, shared tenancy, on demand (not the
    # same type's Capacity Block or Spot product, which share every other attribute).
    config = _config(env="prod")
    pricing, stub = _stubbed("pricing", "us-east-1")
    stub.add_response(
        "get_products",
        {"PriceList": []},
        {
            "ServiceCode": "AmazonEC2",
            "MaxResults": 10,
            "Filters": [
                {"Type": "TERM_MATCH", "Field": field, "Value": value}
                for field, value in (
                    ("instanceType", config.instance_type),
                    ("regionCode", config.region),
                    ("operatingSystem", "Linux"),
                    ("tenancy", "Shared"),
                    ("preInstalledSw", "NA"),
                    ("capacitystatus", "Used"),
                    ("marketoption", "OnDemand"),
                )
            ],
        },
    )
    with stub:
        assert cost_report.live_on_demand(pricing, config) is None


def test_cli_prints_every_environment_with_price_sources(capsys):
    # The command lists each cdk.json environment and names where its prices came from.
    assert cost_report.main(["--offline", "--hours", "5"], templates=shared_templates) == 0
    out = capsys.readouterr().out
    for env in CDK_JSON_CONTEXT["environments"]:
        assert out.count(f"{env} (") == 3  # its block, its standing-cost table, and its run's share of it
    assert "catalogue:" in out and "run of 5 h" in out and "Standing cost:" in out


def test_a_runs_sanity_and_validation_jobs_are_priced_as_estimates():
    # Batch: a sanity job on the run's nodes and a validation job on one small node, at assumed durations, printed
    # as estimates; SageMaker: the sanity check is inside the training job (its hours), validation its own job.
    config = _config(env="prod")
    e = cost_report.estimate(config, 1, None)
    jobs = e.other_jobs_usd()
    node, single = config.instance.on_demand_usd_per_hour, config.single_node_instance.on_demand_usd_per_hour
    assert jobs["sanity"] == pytest.approx(cost_report.SANITY_MINUTES / 60 * config.nodes * node)
    assert jobs["validation"] == pytest.approx(cost_report.VALIDATION_MINUTES / 60 * single)
    assert "10 min on the run's nodes), validation ~$" in cost_report.render(e)
    sagemaker = cost_report.estimate(_config(env="prod", compute="sagemaker"), 1, None)
    assert set(sagemaker.other_jobs_usd()) == {"validation"}
    assert "the sanity check runs inside the training job" in cost_report.render(sagemaker)


def test_a_trainium_run_also_pays_for_its_compile_job():
    # The Compile state (contracts/run.py stages): a job of its own on the run's nodes, before training.
    config = _config(env="prod", instance_type="trn1.32xlarge")
    e = cost_report.estimate(config, 1, None)
    node = config.instance.on_demand_usd_per_hour
    assert node and e.other_jobs_usd()["compile"] == pytest.approx(COMPILE_MINUTES / 60 * config.nodes * node)
    assert "60 min on the run's nodes, a shape's first run)" in cost_report.render(e)
    assert "compile" not in cost_report.estimate(_config(env="prod"), 1, None).other_jobs_usd()


def test_a_run_carries_its_share_of_what_its_backend_keeps_running():
    # EKS: the control plane and the rest of the standing lines, by the run's hours; the file system is not counted
    # twice (the environment's block prices the run's FSx hours already).
    from tools import standing_cost

    config = _config(env="dev", compute="eks")
    fsx = standing_cost.Line("FSx SCRATCH_2", 1200, "GB", standing_cost.StandingPrice(0.14, "month", "t", ""))
    cluster = standing_cost.Line("EKS clusters", 1, "cluster", standing_cost.StandingPrice(0.10, "hour", "t", ""))
    standings = [standing_cost.Standing("dev", "eks", "us-east-1", (fsx, cluster))]
    (head, line) = cost_report.run_shares([config], standings, 24)
    assert head.startswith("A 24 h run's share") and line == "  dev (eks): $2.40"


def test_cli_rejects_an_unknown_override(capsys):
    # A bad -c field exits 2 with the config's one-line message, not a traceback.
    assert cost_report.main(["--offline", "-c", "colour=blue"], templates=shared_templates) == 2
    assert "unknown field 'colour'" in capsys.readouterr().err


def test_unreachable_price_list_falls_back_to_the_catalogue():
    # An API error (no network, no pricing:GetProducts permission) keeps the catalogue price and says why.
    config = _config(env="dev", compute="eks")
    pricing, pricing_stub = _stubbed("pricing", "us-east-1")
    ec2, ec2_stub = _stubbed("ec2", config.region)
    pricing_stub.add_client_error("get_products", service_error_code="AccessDeniedException")
    ec2_stub.add_client_error("describe_spot_price_history", service_error_code="UnauthorizedOperation")
    with pricing_stub, ec2_stub:
        e = cost_report.estimate(config, hours=1, session=_Session({"pricing": pricing, "ec2": ec2}))
    assert e.on_demand.usd_per_hour == CATALOGUE[config.instance_type].on_demand_usd_per_hour
    assert e.spot.usd_per_hour is None and "UnauthorizedOperation" in e.spot.source


def _tag_status(response=None, error_code=None) -> str:
    ce, stub = _stubbed("ce", "us-east-1")
    expected = {"TagKeys": ["Environment"], "Type": "UserDefined"}
    if error_code:
        stub.add_client_error("list_cost_allocation_tags", service_error_code=error_code, expected_params=expected)
    else:
        stub.add_response("list_cost_allocation_tags", response, expected)
    with stub:
        return cost_report.cost_tag_status(_Session({"ce": ce}), "Environment")


def test_inactive_cost_tag_is_reported_with_what_the_budget_does():
    # Cost Explorer ListCostAllocationTags says Inactive: the report warns that budgets read $0 until activation.
    line = _tag_status({"CostAllocationTags": [{"TagKey": "Environment", "Type": "UserDefined", "Status": "Inactive"}]})
    assert line.startswith("WARNING") and "inactive" in line and "$0" in line


def test_unseen_cost_tag_is_reported_as_not_active():
    # A tag Billing has never seen is absent from the answer: not active either.
    line = _tag_status({"CostAllocationTags": []})
    assert line.startswith("WARNING") and "not seen yet" in line


def test_active_cost_tag_is_confirmed():
    line = _tag_status({"CostAllocationTags": [{"TagKey": "Environment", "Type": "UserDefined", "Status": "Active"}]})
    assert "active" in line and "WARNING" not in line


def test_cost_tag_check_without_billing_access_says_why():
    # A member account may not call Cost Explorer: the report says the check was not made, and why.
    assert "not checked" in _tag_status(error_code="AccessDeniedException")


def test_sagemaker_runs_are_priced_at_sagemakers_training_price():
    # compute=sagemaker: the catalogue's ml.* training price, not EC2's, for every node of the run.
    config = _config(env="dev", compute="sagemaker")
    e = cost_report.estimate(config, hours=10, session=None)
    assert e.on_demand.usd_per_hour == CATALOGUE[config.instance_type].sagemaker_usd_per_hour
    assert e.run_usd(e.on_demand.usd_per_hour) == pytest.approx(
        10 * (config.nodes * e.on_demand.usd_per_hour + e.fsx_usd_per_hour)
    )
    assert f"ml.{config.instance_type}" in cost_report.render(e)


def test_sagemaker_spot_offline_is_awss_stated_best_case_and_says_so():
    # Without credentials: AWS's "up to 90%" is a bound, shown as "at least", never as a typical price.
    e = cost_report.estimate(_config(env="dev", compute="sagemaker"), hours=1, session=None)
    assert e.on_demand.usd_per_hour is not None
    assert e.spot.usd_per_hour == pytest.approx(0.1 * e.on_demand.usd_per_hour)
    text = cost_report.render(e)
    assert "Spot at least ~$" in text  # a best case is an estimate: ~, never to the cent
    assert "[best case, up to 90% off: AWS's maximum saving, not a typical price (SageMaker developer guide" in text


def test_recorded_prices_outside_us_east_1_are_labelled_as_us_east_1s():
    # The catalogue and FSx prices are us-east-1's: prod (us-west-2) says so on every recorded figure; dev does not.
    for compute, labelled in (("batch", 2), ("sagemaker", 3)):  # the nodes' price, FSx's and SageMaker's Spot
        prod = cost_report.render(cost_report.estimate(_config(env="prod", compute=compute), 1, None))
        assert prod.count("[us-east-1 list price, not us-west-2's: ") == labelled
    dev = cost_report.render(cost_report.estimate(_config(env="dev", compute="sagemaker"), 1, None))
    assert "list price, not" not in dev


def test_sagemaker_spot_with_credentials_applies_ec2s_current_discount():
    config = _config(env="dev", compute="sagemaker")
    ec2, ec2_stub = _stubbed("ec2", config.region)
    instance = CATALOGUE[config.instance_type]
    ec2_stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                {
                    "AvailabilityZone": "us-east-1a",
                    "InstanceType": config.instance_type,
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": f"{instance.on_demand_usd_per_hour * 0.4:.6f}",
                    "Timestamp": datetime.now(UTC),
                }
            ]
        },
    )
    with ec2_stub:
        e = cost_report.estimate(config, hours=1, session=_Session({"ec2": ec2}))
    assert e.spot.usd_per_hour == pytest.approx(0.4 * instance.sagemaker_usd_per_hour, rel=1e-4)
    assert "60%" in e.spot.source


def test_an_estimated_sagemaker_price_says_it_is_one():
    # Where no SageMaker list price was recorded, the catalogue estimates it from EC2's and the report says so.
    e = cost_report.estimate(_config(env="dev", compute="sagemaker", instance_type="trn1.32xlarge"), 1, None)
    assert e.on_demand.usd_per_hour == pytest.approx(CATALOGUE["trn1.32xlarge"].on_demand_usd_per_hour * 1.15)
    assert e.on_demand.source.startswith("estimate:")
    # An estimate is never printed to the cent: two significant figures, marked ~ (a recorded price keeps its cents).
    shown = cost_report.render(e)
    assert f"~${float(f'{e.on_demand.usd_per_hour:.2g}'):,.0f}/h" in shown
    assert not re.search(r"\$[0-9,]+\.[0-9]{2}\b.*\[estimate", shown)


def test_a_type_with_no_on_demand_price_is_priced_na_with_the_reason():
    # p5e and trn2 are sold through EC2 Capacity Blocks: no on-demand price, so no cluster or run price is invented.
    config = _config(env="dev", compute="eks", instance_type="trn2.48xlarge", **CAPACITY_BLOCK)
    e = cost_report.estimate(config, 24, None)
    assert e.on_demand.usd_per_hour is None and e.cluster_usd_per_hour is None and e.run_usd(None) is None
    text = cost_report.render(e)
    assert "Capacity Blocks" in text and f"the file system alone ${24 * e.fsx_usd_per_hour:,.2f}" in text


def test_sagemaker_on_a_type_without_any_price_says_so():
    e = cost_report.estimate(_config(env="dev", compute="sagemaker", instance_type="p5e.48xlarge"), 1, None)
    assert (e.on_demand.usd_per_hour, e.spot.usd_per_hour) == (None, None)
    assert "no known price for ml.p5e.48xlarge" in cost_report.render(e)


@pytest.mark.parametrize("block", ["cost-report-tokens", "cost-report-environments"])
def test_readmes_sample_output_is_what_the_offline_report_prints(block, capsys):
    # docs/operators-guide.md (moved from the README) shows the offline report; a price or format change that is not
    # pasted into it fails here.
    readme = (Path(__file__).resolve().parent.parent / "docs" / "operators-guide.md").read_text()
    sample = re.search(rf"<!-- {block}:start -->\n```\n(.*?)\n```\n<!-- {block}:end -->", readme, re.S)
    assert cost_report.main(["--offline"], templates=shared_templates) == 0
    out = capsys.readouterr().out
    assert sample is not None
    for paragraph in sample.group(1).split("\n\n"):
        assert paragraph in out
