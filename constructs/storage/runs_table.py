"""The runs table: one item per claimed run id (constructs/pipeline/run_claim.py writes it), kept like the data.

An item holds the run id (the partition key), the execution holding the run, when it claimed it, and the run's
input as JSON text. The pipeline claims an id with a DynamoDB conditional write, which Step Functions' optimized
DynamoDB integration documents ("Call DynamoDB APIs with Step Functions",
https://docs.aws.amazon.com/step-functions/latest/dg/connect-ddb.html).
"""

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb

from config.layout import RUNS_TABLE_KEY
from constructs import Construct
from constructs.nag import acknowledge


class RunsTable(Construct):
    """`table`: partition key `run_id` (string), on demand, point-in-time recovery, removed or kept with the data."""

    def __init__(self, scope: Construct, id_: str, *, removal_policy: cdk.RemovalPolicy) -> None:
        super().__init__(scope, id_)
        keep = removal_policy != cdk.RemovalPolicy.DESTROY
        self.table = dynamodb.Table(
            self,
            "Table",
            # No table_name: TableName is create-only, a new one replaces the table and its items
            # (AWS::DynamoDB::Table, CloudFormation template reference: TableName "Update requires: Replacement";
            # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-dynamodb-table.html).
            partition_key=dynamodb.Attribute(name=RUNS_TABLE_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,  # a few writes per run: no capacity to size
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Like the data bucket (SSE-S3): encrypted with a key the service owns, no KMS key to manage or grant. It
            # renders SSEEnabled false: "server-side encryption is set to AWS owned key" (AWS::DynamoDB::Table
            # SSESpecification, https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-properties-dynamodb-table-ssespecification.html).
            encryption=dynamodb.TableEncryption.DEFAULT,
            removal_policy=removal_policy,
            deletion_protection=keep,  # a kept table cannot be deleted by accident either (retain_data)
        )
        acknowledge(
            self.table,
            "CKV_AWS_119",
            "Encrypted at rest with DynamoDB's own key, like the data bucket's SSE-S3: a customer key would need "
            "grants and adds cost",
        )
