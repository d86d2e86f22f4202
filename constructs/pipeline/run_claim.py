"""A run id names one run: the execution claims `runs/<run_id>/run.json` with an S3 conditional write.

A new run writes the record with `If-None-Match: *`: S3 lets exactly one writer create an object, and answers
412 Precondition Failed to every other one, concurrent or later ("Add preconditions to S3 operations with
conditional requests", https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-requests.html). Runs
from before the record existed are found by their checkpoints, verdict or approved model.

A resume (`"resume": true`) reads the record, refuses while the execution holding it is RUNNING, and takes the
record over with `If-Match: <ETag>`, so of two resumes at once only one wins (the same document). The record
holds the run input, the execution that holds it, and when.
"""

import aws_cdk.aws_s3 as s3
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import CHECKPOINTS_PREFIX, MODELS_PREFIX, RUN_RECORD, RUNS_PREFIX
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.input_checks import INVALID

C = sfn.Condition
J = sfn.JsonPath
RECORD = RUN_RECORD
PRECONDITION_FAILED = "*Status Code: 412*"  # the cause of S3.S3Exception when a condition did not hold
RUN_ID = J.string_at("$.run.run_id")


def record_key() -> str:
    return J.format(f"{RUNS_PREFIX}{{}}/{RECORD}", RUN_ID)


class RunClaim:
    """`start` (reached with `$.run` validated) leads to `claimed` or to a Fail `InvalidInput`. Tasks that fail
    otherwise go to the pipeline's failure path."""

    def __init__(self, scope: Construct, *, bucket: s3.IBucket, execution_arns: str, failures: FailurePath) -> None:
        self.bucket, self.on_failure, self.notify_failure = bucket, failures.catch, failures.notify
        self.claimed = sfn.Pass(scope, "RunClaimed", parameters={"run.$": "$.run"})
        describe = sfn.Pass(
            scope,
            "DescribeRun",
            result_path="$.record",
            parameters={"run.$": "$.run", "execution.$": "$$.Execution.Id", "since.$": "$$.State.EnteredTime"},
        )
        self.start = describe
        describe.next(
            sfn.Choice(scope, "IsResume")
            .when(C.boolean_equals("$.run.resume", True), self._resume(scope, execution_arns))
            .otherwise(self._claim_new(scope))
        )

    # ---- a new run ------------------------------------------------------------------------------------
    def _claim_new(self, scope: Construct) -> sfn.IChainable:
        claim = self._put_record(scope, "ClaimRun", {"IfNoneMatch": "*"})
        taken = sfn.Fail(
            scope,
            "RunIdTaken",
            error=INVALID,
            cause_path=J.format(
                "run_id {} already names a run (s3://"
                + self.bucket.bucket_name
                + "/"
                + RUNS_PREFIX
                + "{}/"
                + RECORD
                + '); give "resume": true to resume it from its checkpoints, or choose a new run_id',
                RUN_ID,
                RUN_ID,
            ),
        )
        finds = [
            self._find(scope, f"Find{name}", prefix, name.lower())
            for name, prefix in (
                ("Checkpoints", f"{CHECKPOINTS_PREFIX}{{}}/"),
                ("Verdict", f"{RUNS_PREFIX}{{}}/verdict"),
                ("Model", f"{MODELS_PREFIX}{{}}/"),
            )
        ]
        self._refuse_on_precondition(scope, claim, "ClaimRun", taken, ours=finds[0])
        earlier = sfn.Fail(
            scope,
            "RunIdUsedBefore",
            error=INVALID,
            cause_path=J.format(
                "run_id {} already has checkpoints, a verdict or an approved model from an earlier run; give "
                '"resume": true to resume it, or choose a new run_id',
                RUN_ID,
            ),
        )
        fresh = (
            sfn.Choice(scope, "IsRunIdUnused")
            .when(
                C.or_(
                    *(C.number_greater_than(f"$.found.{name}.count", 0) for name in ("checkpoints", "verdict", "model"))
                ),
                earlier,
            )
            .otherwise(self.claimed)
        )
        chain = sfn.Chain.start(claim)
        for find in finds:
            chain = chain.next(find)
        chain.next(fresh)
        return claim

    def _find(self, scope: Construct, id_: str, prefix: str, name: str) -> tasks.CallAwsService:
        task = tasks.CallAwsService(
            scope,
            id_,
            service="s3",
            action="listObjectsV2",
            parameters={"Bucket": self.bucket.bucket_name, "Prefix": J.format(prefix, RUN_ID), "MaxKeys": 1},
            iam_resources=[self.bucket.bucket_arn],
            iam_action="s3:ListBucket",
            result_selector={"count.$": "$.KeyCount"},
            result_path=f"$.found.{name}",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(task)
        self.on_failure(task, id_, "RunNotClaimed")
        return task

    # ---- a resume -------------------------------------------------------------------------------------
    def _resume(self, scope: Construct, execution_arns: str) -> sfn.IChainable:
        read = tasks.CallAwsService(
            scope,
            "ReadRunRecord",
            service="s3",
            action="getObject",
            parameters={"Bucket": self.bucket.bucket_name, "Key": record_key()},
            iam_resources=[self.bucket.arn_for_objects(f"{RUNS_PREFIX}*/{RECORD}")],
            iam_action="s3:GetObject",
            result_selector={"etag.$": "$.ETag", "record.$": "States.StringToJson($.Body)"},
            result_path="$.claim",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(read)
        read.add_catch(
            sfn.Fail(
                scope,
                "NothingToResume",
                error=INVALID,
                cause_path=J.format(
                    'run_id {} names no earlier run: nothing to resume (leave out "resume" to start it)', RUN_ID
                ),
            ),
            errors=["S3.NoSuchKeyException"],
            result_path="$.caught",
        )
        self.on_failure(read, "ReadRunRecord", "RunNotClaimed")
        holder = tasks.CallAwsService(
            scope,
            "DescribeRunHolder",
            service="sfn",
            action="describeExecution",
            parameters={"ExecutionArn": J.string_at("$.claim.record.execution")},
            iam_resources=[execution_arns],
            iam_action="states:DescribeExecution",
            result_selector={"status.$": "$.Status"},
            result_path="$.holder",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(holder)
        take_over = self._put_record(scope, "TakeOverRun", {"IfMatch": J.string_at("$.claim.etag")})
        # An execution past Step Functions' retention is gone: it is not running either.
        holder.add_catch(take_over, errors=["Sfn.ExecutionDoesNotExistException"], result_path="$.holder_gone")
        self.on_failure(holder, "DescribeRunHolder", "RunNotClaimed")
        running = sfn.Fail(
            scope,
            "RunIsRunning",
            error=INVALID,
            cause_path=J.format(
                "run_id {} is running in execution {}: wait for it to end, or stop it, before resuming",
                RUN_ID,
                J.string_at("$.claim.record.execution"),
            ),
        )
        raced = sfn.Fail(
            scope,
            "RunResumedElsewhere",
            error=INVALID,
            cause_path=J.format("run_id {} was resumed by another execution at the same time", RUN_ID),
        )
        self._refuse_on_precondition(scope, take_over, "TakeOverRun", raced, ours=self.claimed)
        take_over.next(self.claimed)
        read.next(holder).next(
            sfn.Choice(scope, "IsHolderRunning")
            .when(C.string_equals("$.holder.status", "RUNNING"), running)
            .otherwise(take_over)
        )
        return read

    # ---- shared ---------------------------------------------------------------------------------------
    def _put_record(self, scope: Construct, id_: str, condition: dict) -> tasks.CallAwsService:
        task = tasks.CallAwsService(
            scope,
            id_,
            service="s3",
            action="putObject",
            parameters={
                "Bucket": self.bucket.bucket_name,
                "Key": record_key(),
                "ContentType": "application/json",
                "Body": J.json_to_string(J.object_at("$.record")),
                **condition,
            },
            iam_resources=[self.bucket.arn_for_objects(f"{RUNS_PREFIX}*/{RECORD}")],
            iam_action="s3:PutObject",
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(task)
        return task

    def _refuse_on_precondition(
        self, scope: Construct, task: tasks.CallAwsService, state: str, refused: sfn.Fail, ours: sfn.IChainable
    ) -> None:
        """412 means the condition did not hold (the record exists, or changed): refuse the run, unless the record
        is this execution's own (a retried write whose first try succeeded but whose answer was lost): then go on
        to `ours`. Anything else left after the retries goes to the failure path."""
        other = sfn.Pass(
            scope,
            f"{state}Failed",
            parameters={
                "run.$": "$.run",
                "failure": {
                    "state": state,
                    "error": "RunNotClaimed",
                    "detail.$": "$.caught.Error",
                    "cause.$": "$.caught.Cause",
                },
            },
        )
        other.next(self.notify_failure)
        reread = tasks.CallAwsService(
            scope,
            f"{state}ReadBack",
            service="s3",
            action="getObject",
            parameters={"Bucket": self.bucket.bucket_name, "Key": record_key()},
            iam_resources=[self.bucket.arn_for_objects(f"{RUNS_PREFIX}*/{RECORD}")],
            iam_action="s3:GetObject",
            result_selector={"record.$": "States.StringToJson($.Body)"},
            result_path="$.stored",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(reread)
        reread.add_catch(refused, errors=["States.ALL"], result_path="$.reread_error")
        reread.next(
            sfn.Choice(scope, f"Is{state}Ours")
            .when(
                C.and_(
                    C.is_present("$.stored.record.execution"),
                    C.string_equals_json_path("$.stored.record.execution", "$.record.execution"),
                ),
                ours,
            )
            .otherwise(refused)
        )
        task.add_catch(
            sfn.Choice(scope, f"Is{state}Refused")
            .when(C.string_matches("$.caught.Cause", PRECONDITION_FAILED), reread)
            .otherwise(other),
            errors=["S3.S3Exception"],
            result_path="$.caught",
        )
        self.on_failure(task, state, "RunNotClaimed")
