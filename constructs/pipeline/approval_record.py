"""A run's approval, recorded once where only the pipeline writes: the run's item in the runs table.

A training or validation job can write `models/<run_id>/approval.json` itself: on Batch and EKS `/fsx` is mounted
read-write and the file system's data repository association exports what is written there to the bucket. So the
record the pipeline acts on (and a later run's `init_from` reads: initial_model.py) is the attribute RUN_APPROVAL of the
run's item, which no job's role may write (the table is granted to the state machine and the operator CLI only). The
write is conditional (the run's item exists, no approval yet: "Condition expressions", DynamoDB developer guide), so
a retried step or a resumed run that finds an approval publishes the one recorded, and the SSM parameter never names
another. `models/<run_id>/approval.json` is then written over, whatever a job left there, as a copy for people.
"""

import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import MODELS_PREFIX, RUN_APPROVAL, RUNS_TABLE_KEY
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, DYNAMODB_TRANSIENT, retry_transient
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.run_claim import CONDITION_FAILED

A = tasks.DynamoAttributeValue
J = sfn.JsonPath
RECORDED = f"$.recorded.Item.{RUN_APPROVAL}.S"
NOT_RECORDED = "ApprovalNotRecorded"


def _key() -> dict[str, tasks.DynamoAttributeValue]:
    return {RUNS_TABLE_KEY: A.from_string(J.string_at("$.run.run_id"))}


def record_approval(
    scope: Construct, *, table: dynamodb.ITable, bucket: s3.IBucket, failures: FailurePath, then: sfn.IChainable
) -> sfn.State:
    """From `$.approval`: recorded (or the recorded one taken instead), its copy written to S3, then `then`."""
    record = tasks.DynamoUpdateItem(
        scope,
        "RecordApproval",
        table=table,
        key=_key(),
        update_expression="SET #approval = :approval",
        condition_expression=f"attribute_exists({RUNS_TABLE_KEY}) AND attribute_not_exists(#approval)",
        expression_attribute_names={"#approval": RUN_APPROVAL},
        expression_attribute_values={":approval": A.from_string(J.json_to_string(J.object_at("$.approval")))},
        result_path=J.DISCARD,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(record, DYNAMODB_TRANSIENT)
    copy = _copy(scope, bucket)
    failures.catch(copy, "WriteApprovalCopy", NOT_RECORDED)
    copy.next(then)
    record.add_catch(_recorded(scope, table, failures, copy), errors=[CONDITION_FAILED], result_path="$.caught")
    failures.catch(record, "RecordApproval", NOT_RECORDED)
    record.next(copy)
    return record


def _recorded(scope: Construct, table: dynamodb.ITable, failures: FailurePath, copy: sfn.IChainable) -> sfn.State:
    """The approval already recorded for the run (a strongly consistent read), in `$.approval`; none at all (the
    run's item is gone) ends the run ApprovalNotRecorded."""
    read = tasks.DynamoGetItem(
        scope,
        "ReadRecordedApproval",
        table=table,
        key=_key(),
        consistent_read=True,
        result_path="$.recorded",
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(read, DYNAMODB_TRANSIENT)
    failures.catch(read, "ReadRecordedApproval", NOT_RECORDED)
    use = sfn.Pass(
        scope,
        "UseRecordedApproval",
        parameters={
            "run.$": "$.run",
            "paths.$": "$.paths",
            "verdict.$": "$.verdict",
            "approval.$": f"States.StringToJson({RECORDED})",
        },
    )
    missing = sfn.Pass(
        scope,
        "OnRecordedApprovalMissing",
        parameters={
            "run.$": "$.run",
            "failure": {
                "state": "RecordApproval",
                "error": NOT_RECORDED,
                "detail": "RunRecordMissing",
                "cause.$": f"States.Format('run {{}} has no item in the runs table {table.table_name}: its approval "
                "cannot be recorded where only the pipeline writes', $.run.run_id)",
            },
        },
    )
    found = sfn.Choice(scope, "IsApprovalRecorded")
    found.when(sfn.Condition.is_present(RECORDED), use.next(copy)).otherwise(missing.next(failures.notify))
    read.next(found)
    return read


def _copy(scope: Construct, bucket: s3.IBucket) -> tasks.CallAwsService:
    """`models/<run_id>/approval.json`: the recorded approval, written over anything there."""
    copy = tasks.CallAwsService(
        scope,
        "WriteApprovalCopy",
        service="s3",
        action="putObject",
        parameters={
            "Bucket": bucket.bucket_name,
            "Key": J.string_at("$.paths.approval_key"),
            "Body": J.json_to_string(J.object_at("$.approval")),
            "ContentType": "application/json",
        },
        iam_resources=[bucket.arn_for_objects(f"{MODELS_PREFIX}*/approval.json")],
        iam_action="s3:PutObject",
        result_path=J.DISCARD,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(copy)
    return copy
