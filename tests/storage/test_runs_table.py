"""RunsTable alone, in a bare stack: the table the pipeline claims run ids in (constructs/pipeline/run_claim.py),
kept or deleted with the data; and the storage stack's output that names it to the CLI."""

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from config.layout import RUNS_TABLE_KEY, RUNS_TABLE_OUTPUT
from constructs.storage.runs_table import RunsTable
from tests.alone import StacksAlone, bare_stack


def _table(removal_policy: cdk.RemovalPolicy) -> Mapping[str, Any]:
    stack = bare_stack()
    RunsTable(stack, "Runs", removal_policy=removal_policy)
    (table,) = Template.from_stack(stack).find_resources("AWS::DynamoDB::Table").values()
    return table


@pytest.fixture(scope="module")
def destroyed() -> Mapping[str, Any]:
    return _table(cdk.RemovalPolicy.DESTROY)


@pytest.fixture(scope="module")
def kept() -> Mapping[str, Any]:
    return _table(cdk.RemovalPolicy.RETAIN)


def test_the_run_id_is_the_only_key(destroyed):
    # One item per run id: the claim's attribute_not_exists(run_id) is a condition on the partition key.
    properties = destroyed["Properties"]
    assert properties["KeySchema"] == [{"AttributeName": RUNS_TABLE_KEY, "KeyType": "HASH"}]
    assert properties["AttributeDefinitions"] == [{"AttributeName": RUNS_TABLE_KEY, "AttributeType": "S"}]


def test_the_table_has_no_fixed_name(destroyed):
    # TableName is create-only: changing it replaces the table and its items (AWS::DynamoDB::Table, CloudFormation
    # template reference: https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-dynamodb-table.html).
    assert "TableName" not in destroyed["Properties"]


def test_the_table_is_billed_per_request(destroyed):
    # A few writes per run: on-demand, no provisioned capacity to size.
    assert destroyed["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
    assert "ProvisionedThroughput" not in destroyed["Properties"]


def test_point_in_time_recovery_is_on(destroyed):
    # The claims can be restored to any second of the recovery window (cdk-nag AwsSolutions-DDB3).
    assert destroyed["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}


def test_the_table_is_encrypted_with_a_key_dynamodb_owns(destroyed):
    # Like the data bucket's SSE-S3: SSEEnabled false is "an AWS owned key" (AWS::DynamoDB::Table SSESpecification,
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-properties-dynamodb-table-ssespecification.html).
    assert destroyed["Properties"]["SSESpecification"] == {"SSEEnabled": False}


def test_a_destroyed_environment_deletes_the_table(destroyed):
    # dev (retain_data=false): `cdk destroy` removes it, and deletion protection does not stand in the way.
    assert (destroyed["DeletionPolicy"], destroyed["UpdateReplacePolicy"]) == ("Delete", "Delete")
    assert destroyed["Properties"]["DeletionProtectionEnabled"] is False


def test_a_kept_environment_keeps_the_table_and_protects_it(kept):
    # prod (retain_data): retained on `cdk destroy` and on replacement, and DynamoDB refuses to delete it.
    assert (kept["DeletionPolicy"], kept["UpdateReplacePolicy"]) == ("Retain", "Retain")
    assert kept["Properties"]["DeletionProtectionEnabled"] is True


def test_the_storage_stack_names_the_table_in_its_output():
    # The CLI (tools/pipeline_cli.py `list`) finds the table by this output of EfaTraining-<env>-Storage; prod keeps it.
    environment = StacksAlone(env="prod")
    template = environment.template(environment.storage())
    ((logical, table),) = template.find_resources("AWS::DynamoDB::Table").items()
    assert template.to_json()["Outputs"][RUNS_TABLE_OUTPUT]["Value"] == {"Ref": logical}
    assert table["DeletionPolicy"] == "Retain"
