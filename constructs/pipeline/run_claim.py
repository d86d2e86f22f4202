"""A run id names one run: the execution claims the run's item in the runs table with a DynamoDB conditional write.

Step Functions' optimized DynamoDB integration (`arn:aws:states:::dynamodb:putItem`, `getItem`, `updateItem`) takes a
`ConditionExpression` ("Call DynamoDB APIs with Step Functions",
https://docs.aws.amazon.com/step-functions/latest/dg/connect-ddb.html). A new run puts the item only if
`attribute_not_exists(run_id)`, which keeps a put from replacing an existing item; every other writer, concurrent or
later, fails with ConditionalCheckFailedException (DynamoDB API reference, PutItem:
https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_PutItem.html). Runs from before the table are found
by their checkpoints, verdict or approved model. A resume (`"resume": true`) reads the item, refuses while its holder
is RUNNING, and takes it over only if it still names the holder read: of two resumes at once, one wins. Once the
claim holds, a readable copy goes to `runs/<run_id>/run.json` (the run input, the execution that holds it, and when).
Where the pipeline sizes nodes itself (EKS), the run first takes the nodes' lease (constructs/compute/eks/
node_lease.py), and every refusal here gives it back before the run ends.
"""

import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import (
    CHECKPOINTS_PREFIX,
    MODELS_PREFIX,
    RUN_HOLDER,
    RUN_INPUT,
    RUN_RECORD,
    RUN_SINCE,
    RUNS_PREFIX,
    RUNS_TABLE_KEY,
)
from constructs import Construct
from constructs.compute.backend import PipelineNodes
from constructs.pipeline.aws_calls import CALL_TIMEOUT, DYNAMODB_TRANSIENT, describe_holder, retry_transient
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.hyperparameter_check import INVALID

C = sfn.Condition
J = sfn.JsonPath
A = tasks.DynamoAttributeValue
PRECONDITION_FAILED = "*Status Code: 412*"  # the cause of S3.S3Exception when a condition did not hold (verdict.py)
# A failed condition through the optimized integration: the prefix is `DynamoDB` (upper-case DB), unlike the AWS SDK
# integration's `DynamoDb` ("Call DynamoDB APIs with Step Functions", "Exception prefix differences").
CONDITION_FAILED = "DynamoDB.ConditionalCheckFailedException"
RUN_ID = J.string_at("$.run.run_id")
HOLDER = f"$.claim.Item.{RUN_HOLDER}.S"  # the execution holding the run, as ReadRunRecord read it


def _key() -> dict[str, tasks.DynamoAttributeValue]:
    return {RUNS_TABLE_KEY: A.from_string(RUN_ID)}


class RunClaim:
    """`start` (reached with `$.run` validated) leads to `claimed` or to a Fail `InvalidInput`. Tasks that fail
    otherwise go to the pipeline's failure path."""

    def __init__(
        self,
        scope: Construct,
        *,
        bucket: s3.IBucket,
        table: dynamodb.ITable,
        execution_arns: str,
        failures: FailurePath,
        nodes: PipelineNodes | None = None,
    ) -> None:
        self.bucket, self.table, self._nodes = bucket, table, nodes
        self.on_failure = failures.catch
        self.claimed = sfn.Pass(scope, "RunClaimed", parameters={"run.$": "$.run"})
        self.won = self._copy_record(scope)
        describe = sfn.Pass(
            scope,
            "DescribeRun",
            result_path="$.record",
            parameters={"run.$": "$.run", "execution.$": "$$.Execution.Id", "since.$": "$$.State.EnteredTime"},
        )
        self.start: sfn.State = describe
        if nodes is not None:  # the nodes' lease first: a second run is refused before it claims anything
            first, held, calls = nodes.hold(scope, execution_arns=execution_arns, error=INVALID)
            for call in calls:
                self.on_failure(call, call.node.id, "RunNotStarted")
            held.next(describe)
            self.start = first
        describe.next(
            sfn.Choice(scope, "IsResume")
            .when(C.boolean_equals("$.run.resume", True), self._resume(scope, execution_arns))
            .otherwise(self._claim_new(scope))
        )

    # ---- a new run ------------------------------------------------------------------------------------
    def _claim_new(self, scope: Construct) -> sfn.IChainable:
        claim = tasks.DynamoPutItem(
            scope,
            "ClaimRun",
            table=self.table,
            item={
                **_key(),
                RUN_HOLDER: A.from_string(J.string_at("$.record.execution")),
                RUN_SINCE: A.from_string(J.string_at("$.record.since")),
                RUN_INPUT: A.from_string(J.json_to_string(J.object_at("$.run"))),
            },
            condition_expression=f"attribute_not_exists({RUNS_TABLE_KEY})",
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(claim, DYNAMODB_TRANSIENT)
        taken = self._ending(
            scope,
            sfn.Fail(
                scope,
                "RunIdTaken",
                error=INVALID,
                cause_path=J.format(
                    "run_id {} already names a run (runs table "
                    + self.table.table_name
                    + '); give "resume": true to resume it from its checkpoints, or choose a new run_id',
                    RUN_ID,
                ),
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
        self._refuse_on_condition(scope, claim, "ClaimRun", taken, ours=finds[0])
        chain = sfn.Chain.start(claim)
        for find in finds:
            chain = chain.next(find)
        chain.next(self._unused(scope))
        return claim

    def _unused(self, scope: Construct) -> sfn.Choice:
        earlier = self._ending(
            scope,
            sfn.Fail(
                scope,
                "RunIdUsedBefore",
                error=INVALID,
                cause_path=J.format(
                    "run_id {} already has checkpoints, a verdict or an approved model from an earlier run; give "
                    '"resume": true to resume it, or choose a new run_id',
                    RUN_ID,
                ),
            ),
        )
        found = (C.number_greater_than(f"$.found.{name}.count", 0) for name in ("checkpoints", "verdict", "model"))
        return sfn.Choice(scope, "IsRunIdUnused").when(C.or_(*found), earlier).otherwise(self.won)

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
        read = self._read(scope, "ReadRunRecord", "$.claim")
        self.on_failure(read, "ReadRunRecord", "RunNotClaimed")
        nothing = self._ending(
            scope,
            sfn.Fail(
                scope,
                "NothingToResume",
                error=INVALID,
                cause_path=J.format(
                    'run_id {} names no earlier run: nothing to resume (leave out "resume" to start it)', RUN_ID
                ),
            ),
        )
        holder = self._describe_holder(scope, execution_arns)
        read.next(sfn.Choice(scope, "IsRunRecorded").when(C.is_present(HOLDER), holder).otherwise(nothing))
        return read

    def _describe_holder(self, scope: Construct, execution_arns: str) -> tasks.CallAwsService:
        holder = describe_holder(
            scope, "DescribeRunHolder", arn_path=HOLDER, execution_arns=execution_arns, result_path="$.holder"
        )
        take_over = self._take_over(scope)
        # An execution past Step Functions' retention is gone: it is not running either.
        holder.add_catch(take_over, errors=["Sfn.ExecutionDoesNotExistException"], result_path="$.holder_gone")
        self.on_failure(holder, "DescribeRunHolder", "RunNotClaimed")
        running = self._ending(
            scope,
            sfn.Fail(
                scope,
                "RunIsRunning",
                error=INVALID,
                cause_path=J.format(
                    "run_id {} is running in execution {}: wait for it to end, or stop it, before resuming",
                    RUN_ID,
                    J.string_at(HOLDER),
                ),
            ),
        )
        holder.next(
            sfn.Choice(scope, "IsHolderRunning")
            .when(C.string_equals("$.holder.status", "RUNNING"), running)
            .otherwise(take_over)
        )
        return holder

    def _take_over(self, scope: Construct) -> tasks.DynamoUpdateItem:
        """The item moves to this execution only if it still names the holder read: of two resumes, one wins."""
        take_over = tasks.DynamoUpdateItem(
            scope,
            "TakeOverRun",
            table=self.table,
            key=_key(),
            update_expression="SET #holder = :execution, #since = :since, #input = :input",
            condition_expression="#holder = :previous",
            expression_attribute_names={"#holder": RUN_HOLDER, "#since": RUN_SINCE, "#input": RUN_INPUT},
            expression_attribute_values={
                ":execution": A.from_string(J.string_at("$.record.execution")),
                ":since": A.from_string(J.string_at("$.record.since")),
                ":input": A.from_string(J.json_to_string(J.object_at("$.run"))),
                ":previous": A.from_string(J.string_at(HOLDER)),
            },
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(take_over, DYNAMODB_TRANSIENT)
        raced = self._ending(
            scope,
            sfn.Fail(
                scope,
                "RunResumedElsewhere",
                error=INVALID,
                cause_path=J.format("run_id {} was resumed by another execution at the same time", RUN_ID),
            ),
        )
        self._refuse_on_condition(scope, take_over, "TakeOverRun", raced, ours=self.won)
        take_over.next(self.won)
        return take_over

    # ---- shared ---------------------------------------------------------------------------------------
    def _read(self, scope: Construct, id_: str, result_path: str) -> tasks.DynamoGetItem:
        """The run's item, read after every write before it (a strongly consistent read)."""
        read = tasks.DynamoGetItem(
            scope,
            id_,
            table=self.table,
            key=_key(),
            consistent_read=True,
            result_path=result_path,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(read, DYNAMODB_TRANSIENT)
        return read

    def _refuse_on_condition(
        self, scope: Construct, task: sfn.TaskStateBase, state: str, refused: sfn.IChainable, ours: sfn.IChainable
    ) -> None:
        """A failed condition means another execution holds the item, or changed it: refuse the run, unless the item
        is this execution's own (a retried write whose first try succeeded but whose answer was lost): then go on to
        `ours`. Anything else left after the retries goes to the failure path."""
        reread = self._read(scope, f"{state}ReadBack", "$.stored")
        reread.add_catch(refused, errors=["States.ALL"], result_path="$.reread_error")
        stored = f"$.stored.Item.{RUN_HOLDER}.S"
        reread.next(
            sfn.Choice(scope, f"Is{state}Ours")
            .when(C.and_(C.is_present(stored), C.string_equals_json_path(stored, "$.record.execution")), ours)
            .otherwise(refused)
        )
        task.add_catch(reread, errors=[CONDITION_FAILED], result_path="$.caught")
        self.on_failure(task, state, "RunNotClaimed")

    def _ending(self, scope: Construct, refusal: sfn.Fail) -> sfn.IChainable:
        """A refusal, after the nodes' lease is given back where the run took one."""
        if self._nodes is None:
            return refusal
        return self._nodes.release_lease(scope, f"{refusal.node.id}ReleaseLease").next(refusal)

    def _copy_record(self, scope: Construct) -> tasks.CallAwsService:
        """The claim holds: a readable copy of it in `runs/<run_id>/run.json`, then RunClaimed. Only the holder
        writes it, so a plain overwrite (a resume's) is right."""
        copy = tasks.CallAwsService(
            scope,
            "WriteRunRecord",
            service="s3",
            action="putObject",
            parameters={
                "Bucket": self.bucket.bucket_name,
                "Key": J.format(f"{RUNS_PREFIX}{{}}/{RUN_RECORD}", RUN_ID),
                "ContentType": "application/json",
                "Body": J.json_to_string(J.object_at("$.record")),
            },
            iam_resources=[self.bucket.arn_for_objects(f"{RUNS_PREFIX}*/{RUN_RECORD}")],
            iam_action="s3:PutObject",
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(copy)
        self.on_failure(copy, "WriteRunRecord", "RunNotClaimed")
        copy.next(self.claimed)
        return copy
