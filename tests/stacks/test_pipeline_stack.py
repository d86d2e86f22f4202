"""PipelineStack alone (with the stacks it takes): the TrainingPipeline (tests/pipeline/) on the environment's
backend, its logs kept as the config says, and the outputs the operator CLI reads."""

import pytest
from aws_cdk.assertions import Match, Template

from tests.alone import StacksAlone


@pytest.fixture(scope="module")
def dev() -> Template:
    environment = StacksAlone()
    return environment.template(environment.pipeline())


def test_execution_logs_keep_the_configured_retention(dev):
    # dev's log_retention_days (14) for the pipeline's execution logs.
    dev.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 14})


@pytest.mark.parametrize(
    ("output", "value"),
    [
        ("StateMachineArn", Match.any_value()),
        ("ExecutionLogGroup", Match.any_value()),
        ("ApprovedModelParameter", "/efa-training/dev/approved-model"),
        ("MaxNodes", "2"),
        # Batch's multi-node job definitions fix the node count: a run takes exactly the environment's nodes.
        ("MinNodes", "2"),
        ("TrainingRetries", "3"),
    ],
)
def test_the_cli_finds_the_pipeline_in_the_outputs(dev, output, value):
    # tools/pipeline_cli.py reads these outputs (its nodes check, its links to the logs and the approved model).
    dev.has_output(output, {"Value": value})


def test_on_eks_a_run_may_use_fewer_nodes():
    environment = StacksAlone(compute="eks")
    environment.template(environment.pipeline()).has_output("MinNodes", {"Value": "1"})
