"""Retries for the pipeline's own AWS calls (S3, SSM, SNS, Step Functions): throttling and 5xx are absorbed.

Error names of AWS SDK integrations are `ServiceName.ErrorName` in PascalCase with an `Exception` suffix
("Learning to use AWS service SDK integrations in Step Functions",
https://docs.aws.amazon.com/step-functions/latest/dg/supported-services-awssdk.html). Throttling and 5xx
responses have no modeled exception (S3 `SlowDown`/`InternalError`/`ServiceUnavailable`, SSM
`ThrottlingException`), so they surface as the service's base exception (`S3.S3Exception`, `Ssm.SsmException`);
SSM also models `InternalServerError` and `TooManyUpdates`. A call that times out (`States.Timeout`) is retried
too: every call retried here is idempotent (reads, conditional writes, writes of the same value).
"""

from typing import TypeVar

import aws_cdk as cdk
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct

TRANSIENT_ERRORS = (
    "S3.S3Exception",
    "Ssm.SsmException",
    "Ssm.InternalServerErrorException",
    "Ssm.TooManyUpdatesException",
    "Sfn.SfnException",
    "States.Timeout",
)
# SNS publishing: any failure is retried, since a duplicate notification costs less than a lost one.
NOTIFICATION_ERRORS = ("States.TaskFailed", "States.Timeout")
CALL_TIMEOUT = cdk.Duration.minutes(2)
_Retried = TypeVar("_Retried", sfn.TaskStateBase, sfn.CustomState)


def retry_transient(task: _Retried, errors: tuple[str, ...] = TRANSIENT_ERRORS) -> _Retried:
    """Exponential backoff with full jitter ("Handling errors in Step Functions workflows", Retry fields
    `JitterStrategy`, `MaxDelaySeconds`: https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html):
    6 attempts over about a minute."""
    task.add_retry(
        errors=list(errors),
        interval=cdk.Duration.seconds(1),
        backoff_rate=2,
        max_attempts=5,
        max_delay=cdk.Duration.seconds(30),
        jitter_strategy=sfn.JitterType.FULL,
    )
    return task


def describe_holder(
    scope: Construct, id_: str, *, arn_path: str, execution_arns: str, result_path: str
) -> tasks.CallAwsService:
    """DescribeExecution of the execution at `arn_path` (the holder of a run's claim or of a lease), its Status alone
    at `result_path`.`status`, transient errors retried. Eventually consistent (Step Functions API reference,
    DescribeExecution): a holder that ended a moment ago may still read RUNNING."""
    describe = tasks.CallAwsService(
        scope,
        id_,
        service="sfn",
        action="describeExecution",
        parameters={"ExecutionArn": sfn.JsonPath.string_at(arn_path)},
        iam_resources=[execution_arns],
        iam_action="states:DescribeExecution",
        result_selector={"status.$": "$.Status"},
        result_path=result_path,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(describe)
    return describe


# Throttling and 5xx (DynamoDB developer guide, "Error handling with DynamoDB": InternalServerError is a 500, the
# throttling errors 400s). Step Functions documents the prefix, not each name: both spellings of the 500 and the SDK's
# base exception (where unmodeled errors land) are retried. Every write retried is conditional, so a retry whose first
# try took effect fails its condition and is recognised as this execution's own.
DYNAMODB_TRANSIENT = (
    "DynamoDB.InternalServerError",
    "DynamoDB.InternalServerErrorException",
    "DynamoDB.ProvisionedThroughputExceededException",
    "DynamoDB.RequestLimitExceeded",
    "DynamoDB.ThrottlingException",
    "DynamoDB.AmazonDynamoDBException",
    "States.Timeout",
)
