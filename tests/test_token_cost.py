"""The price of a billion training tokens (tools/token_cost.py): the formula, the table, the measured-MFU path."""

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import ANY, Stubber

from config import CATALOGUE, load_config
from contracts.quote import about_usd, measured_mfu_query
from contracts.workload import built_in_workloads
from tests.synthesis import CDK_JSON_CONTEXT
from tests.test_cost_report import _Session  # a boto3-like session with fake credentials and stubbed clients
from tests.test_standing_cost import shared_templates
from tools import cost_report, token_cost


def test_tokens_per_second_is_mfu_times_the_nodes_peak_over_the_flops_per_token():
    # p5.48xlarge: 8 H100 at the catalogue's 989 dense bf16 TFLOPS; 1.3b costs the image's own FLOPs per token.
    p5 = CATALOGUE["p5.48xlarge"]
    flops = token_cost.flops_per_token(token_cost.MODEL_SIZES["1.3b"])
    assert token_cost.tokens_per_second(p5, "1.3b", 40.0) == pytest.approx(0.4 * 8 * 989e12 / flops)


def test_a_billion_tokens_cost_the_node_hours_they_take():
    # 1e9 tokens at 100,000 tokens/s take 10,000 s: 2.78 node-hours at $36/h is $100.
    assert token_cost.usd_per_billion_tokens(36.0, 100_000) == pytest.approx(100.0)


def test_halving_the_mfu_doubles_the_price():
    full, half = (token_cost.token_cost(CATALOGUE["trn1.32xlarge"], "6.7b", mfu, None) for mfu in (40.0, 20.0))
    assert full.ec2_usd is not None and half.ec2_usd == pytest.approx(2 * full.ec2_usd)


def test_the_model_sizes_are_the_gpt_workloads_declared_ones():
    # the GPT trainer's declared sizes; the sparse models are priced per sample, not per token
    gpt = next(w for w in built_in_workloads() if w.name == "gpt")
    assert tuple(token_cost.MODEL_SIZES) == next(f.choices for f in gpt.hyperparameters if f.key == "model")


def test_the_table_prices_every_training_type_and_invents_no_spot_price_offline():
    text = token_cost.report([], "1.3b", 40.0)
    for instance in token_cost.training_types():
        (row,) = [line for line in text.splitlines() if line.strip().startswith(instance.name + " ")]
        assert " n/a " in row  # EC2 Spot needs credentials
    assert "MFU 40% (assumed" in text and "needs credentials" in text


def test_an_estimated_sagemaker_price_is_marked_and_never_to_the_cent():
    # p5's SageMaker price is EC2's x 1.15 (config/catalogue.py), g5's a recorded list price.
    text = token_cost.report([], "1.3b", 40.0)
    p5 = token_cost.token_cost(CATALOGUE["p5.48xlarge"], "1.3b", 40.0, None)
    g5 = token_cost.token_cost(CATALOGUE["g5.12xlarge"], "1.3b", 40.0, None)
    assert p5.sagemaker_usd is not None and g5.sagemaker_usd is not None
    (p5_row,) = [line for line in text.splitlines() if line.strip().startswith("p5.48xlarge ")]
    (g5_row,) = [line for line in text.splitlines() if line.strip().startswith("g5.12xlarge ")]
    assert about_usd(p5.sagemaker_usd) in p5_row and f"${p5.sagemaker_usd:,.2f}" not in p5_row
    assert f"${g5.sagemaker_usd:,.2f}" in g5_row
    assert "~: an estimate, SageMaker's price taken as EC2's x 1.15" in text


def test_a_measured_mfu_prices_the_environments_type_at_that_figure():
    config = load_config({**CDK_JSON_CONTEXT, "env": "dev"})
    ec2 = boto3.client("ec2", region_name=config.region, aws_access_key_id="x", aws_secret_access_key="y")
    cloudwatch = boto3.client("cloudwatch", region_name=config.region, aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(ec2) as ec2_stub, Stubber(cloudwatch) as cw_stub:
        ec2_stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    {
                        "AvailabilityZone": "us-east-1a",
                        "InstanceType": config.instance_type,
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": "2.000000",
                        "Timestamp": datetime.now(UTC),
                    }
                ]
            },
            {"InstanceTypes": ANY, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY, "MaxResults": 1000},
        )
        cw_stub.add_response(
            "get_metric_data",
            {"MetricDataResults": [{"Id": "env", "Values": [30.0, 34.0], "StatusCode": "Complete"}]},
            {"MetricDataQueries": ANY, "StartTime": ANY, "EndTime": ANY},
        )
        text = token_cost.report([config], "1.3b", 40.0, _Session({"ec2": ec2, "cloudwatch": cloudwatch}), True)
    spot = token_cost.token_cost(config.instance, "1.3b", 40.0, 2.0).spot_usd
    assert f"${spot:,.2f}" in text and "live, us-east-1, now" in text
    measured = token_cost.token_cost(config.instance, "1.3b", 32.0, None)
    assert f"measured MFU 32.0% on {config.instance_type}" in text and f"EC2 ${measured.ec2_usd:,.2f}" in text


def test_the_cli_refuses_an_mfu_outside_a_percentage(capsys):
    with pytest.raises(SystemExit) as refused:
        cost_report.main(["--offline", "--mfu", "0"])
    assert refused.value.code == 2 and "--mfu=0 is not valid" in capsys.readouterr().err


def test_the_cli_prints_the_table_for_the_model_asked(capsys):
    args = ["--offline", "--env", "dev", "--model", "13b", "--mfu", "35"]
    assert cost_report.main(args, templates=shared_templates) == 0
    assert "model 13b" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([{"Id": "env", "Values": [20.0]}, {"Id": "model", "Values": [30.0, 34.0]}], (32.0, True)),
        ([{"Id": "env", "Values": [20.0, 22.0]}, {"Id": "model", "Values": []}], (21.0, False)),
        ([{"Id": "env", "Values": []}, {"Id": "model", "Values": []}], (None, False)),
    ],
    ids=["the-models-own", "every-run", "none"],
)
def test_a_quote_prefers_the_mfu_of_its_own_model_size(results, expected):
    # One GetMetricData call with both queries (contracts.quote.measured_mfu_query), as the pipeline asks them.
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    queries = [
        {"Id": "env", "Expression": measured_mfu_query("dev"), "ReturnData": True},
        {"Id": "model", "Expression": measured_mfu_query("dev", "1.3b"), "ReturnData": True},
    ]
    with Stubber(cloudwatch) as stub:
        stub.add_response(
            "get_metric_data",
            {"MetricDataResults": [{**r, "StatusCode": "Complete"} for r in results]},
            {"MetricDataQueries": queries, "StartTime": ANY, "EndTime": ANY},
        )
        assert token_cost.measured_mfus(cloudwatch, "dev", "1.3b") == expected
