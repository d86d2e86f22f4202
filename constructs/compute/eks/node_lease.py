"""The EKS node groups' lease: one item of the runs table naming the execution that holds the node groups.

The node groups serve one run at a time. ListExecutions cannot tell: "This operation is eventually consistent. The
results are best effort and may not reflect very recent updates and changes" (Step Functions API reference,
ListExecutions), so two runs started back to back could each miss the other. A conditional write decides instead:
"If the condition expression evaluates to true, the operation succeeds; otherwise, the operation fails" (DynamoDB
developer guide, "Condition expressions"; PutItem and DeleteItem take a ConditionExpression, and Step Functions'
optimized DynamoDB integration passes it: "Call DynamoDB APIs with Step Functions").
- `take`: PutItem of the lease only if `attribute_not_exists(run_id)`. Where another execution holds it, that one is
  described: RUNNING refuses the run in one line naming it; ended (or gone from Step Functions) lets this one take the
  lease over with a PutItem conditioned on the holder read, so of two takers one wins.
- `released`: DeleteItem only while this execution holds it ("Conditional deletes are useful for deleting items only
  if specific conditions are met. If those conditions are met, DynamoDB performs the delete. Otherwise, the item is
  not deleted": DynamoDB API reference, DeleteItem); a release that fails leaves the lease to the reconciler.
- `release_stale`: the reconciler's: a lease whose holder is no longer RUNNING is deleted, conditioned on that holder.
DescribeExecution is documented eventually consistent too (Step Functions API reference, DescribeExecution, the same
sentence): a holder that has just ended may still read RUNNING, which refuses a run that could have started (start it
again); the lease is taken over only from a holder read as ended or missing, and a holder writes the lease after
several states of its own. The key `lease#<environment>` holds a '#', which no run id may (contracts/run.py
RUN_ID_CHARACTERS): it never names a run.
"""

import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import NODE_LEASE_PREFIX, RUN_HOLDER, RUN_SINCE, RUNS_TABLE_KEY
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, describe_holder, retry_transient
from constructs.pipeline.run_claim import CONDITION_FAILED, DYNAMODB_TRANSIENT

C = sfn.Condition
J = sfn.JsonPath
A = tasks.DynamoAttributeValue
LEASE_PREFIX = NODE_LEASE_PREFIX
HOLDER = f"$.lease.Item.{RUN_HOLDER}.S"  # the holder as the last read of the lease found it
SINCE = f"$.lease.Item.{RUN_SINCE}.S"
GONE = "Sfn.ExecutionDoesNotExistException"  # past Step Functions' retention: not running either


class NodeLease:
    """The lease item `lease#<environment>` in the runs table `table`."""

    def __init__(self, *, table: dynamodb.ITable, environment: str) -> None:
        self.table, self.key = table, f"{LEASE_PREFIX}{environment}"

    def _key(self) -> dict[str, tasks.DynamoAttributeValue]:
        return {RUNS_TABLE_KEY: A.from_string(self.key)}

    def take(
        self, scope: Construct, *, execution_arns: str, error: str
    ) -> tuple[sfn.State, sfn.INextable, list[sfn.TaskStateBase]]:
        """(first, held, calls): `held` goes on with the lease this execution's; a RUNNING holder fails the run with
        `error` and one line naming it. `calls`: the AWS calls, for the caller's failure path."""
        request = sfn.Pass(
            scope,
            "DescribeNodeLease",
            result_path="$.lease_request",
            parameters={"execution.$": "$$.Execution.Id", "since.$": "$$.State.EnteredTime"},
        )
        held = sfn.Pass(scope, "NodeLeaseHeld")
        put = self._put(scope, "TakeNodeLease", f"attribute_not_exists({RUNS_TABLE_KEY})", {})
        take_over = self._put(scope, "TakeOverNodeLease", "#holder = :previous", {":previous": HOLDER})
        read = self._read(scope, "ReadNodeLease")
        describe = self._describe(scope, "DescribeNodeLeaseHolder", execution_arns)
        refused = sfn.Fail(
            scope,
            "NodesLeasedToAnotherRun",
            error=error,
            cause_path=J.format(
                "the EKS node groups serve one run at a time and execution {} holds them (lease taken {}): wait for "
                "it to end, or stop it, then start this run again",
                J.string_at(HOLDER),
                J.string_at(SINCE),
            ),
        )
        for write in (put, take_over):  # someone else wrote first, or this execution's own lost answer: read it
            write.add_catch(read, errors=[CONDITION_FAILED], result_path="$.lease_caught")
            write.next(held)
        describe.add_catch(take_over, errors=[GONE], result_path="$.lease_caught")
        request.next(put)
        read.next(
            sfn.Choice(scope, "WhoHoldsNodeLease")
            .when(C.not_(C.is_present(HOLDER)), put)  # released meanwhile: take it
            .when(C.string_equals_json_path(HOLDER, "$.lease_request.execution"), held)
            .otherwise(describe)
        )
        describe.next(
            sfn.Choice(scope, "IsNodeLeaseHolderRunning")
            .when(C.string_equals("$.lease_holder.status", "RUNNING"), refused)
            .otherwise(take_over)
        )
        return request, held, [put, take_over, read, describe]

    def released(self, scope: Construct, id_: str) -> sfn.Chain:
        """The lease given back if this execution holds it; never fails (a lease left behind is the reconciler's)."""
        delete = self._delete(scope, id_, J.execution_id)
        done = sfn.Pass(scope, f"{id_}Done")
        # Not this execution's (never taken, or taken over once it had ended), or a retry whose first try took effect.
        delete.add_catch(done, errors=[CONDITION_FAILED], result_path=J.DISCARD)
        delete.add_catch(done, errors=["States.ALL"], result_path="$.lease_release_error")
        delete.next(done)
        return sfn.Chain.custom(delete, [done], done)

    def release_stale(
        self, scope: Construct, id_: str, *, execution_arns: str
    ) -> tuple[sfn.State, sfn.INextable, sfn.INextable]:
        """(first, free, held): the lease read; absent, or its holder no longer RUNNING (then deleted, conditioned on
        that holder), goes to `free`; a RUNNING holder to `held`."""
        read = self._read(scope, f"{id_}Read")
        describe = self._describe(scope, f"{id_}DescribeHolder", execution_arns)
        delete = self._delete(scope, f"{id_}ReleaseStale", J.string_at(HOLDER))
        free, held = sfn.Pass(scope, f"{id_}Free"), sfn.Pass(scope, f"{id_}HeldByARun")
        describe.add_catch(delete, errors=[GONE], result_path="$.lease_caught")
        delete.add_catch(read, errors=[CONDITION_FAILED], result_path="$.lease_caught")  # it changed: look again
        delete.next(free)
        read.next(sfn.Choice(scope, f"{id_}IsLeased").when(C.is_present(HOLDER), describe).otherwise(free))
        describe.next(
            sfn.Choice(scope, f"{id_}IsHolderRunning")
            .when(C.string_equals("$.lease_holder.status", "RUNNING"), held)
            .otherwise(delete)
        )
        return read, free, held

    def read(self, scope: Construct, id_: str) -> tasks.DynamoGetItem:
        """The lease into `$.lease` (a strongly consistent read: it sees every write before it)."""
        return self._read(scope, id_)

    # ---- the calls ------------------------------------------------------------------------------------
    def _put(self, scope: Construct, id_: str, condition: str, values: dict[str, str]) -> tasks.DynamoPutItem:
        put = tasks.DynamoPutItem(
            scope,
            id_,
            table=self.table,
            item={
                **self._key(),
                RUN_HOLDER: A.from_string(J.string_at("$.lease_request.execution")),
                RUN_SINCE: A.from_string(J.string_at("$.lease_request.since")),
            },
            condition_expression=condition,
            expression_attribute_names={"#holder": RUN_HOLDER} if values else None,
            expression_attribute_values={k: A.from_string(J.string_at(v)) for k, v in values.items()} or None,
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(put, DYNAMODB_TRANSIENT)  # conditional: a retry after a lost answer fails, then reads
        return put

    def _delete(self, scope: Construct, id_: str, holder: str) -> tasks.DynamoDeleteItem:
        delete = tasks.DynamoDeleteItem(
            scope,
            id_,
            table=self.table,
            key=self._key(),
            condition_expression="#holder = :holder",
            expression_attribute_names={"#holder": RUN_HOLDER},
            expression_attribute_values={":holder": A.from_string(holder)},
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(delete, DYNAMODB_TRANSIENT)
        return delete

    def _read(self, scope: Construct, id_: str) -> tasks.DynamoGetItem:
        read = tasks.DynamoGetItem(
            scope,
            id_,
            table=self.table,
            key=self._key(),
            consistent_read=True,
            result_path="$.lease",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(read, DYNAMODB_TRANSIENT)
        return read

    @staticmethod
    def _describe(scope: Construct, id_: str, execution_arns: str) -> tasks.CallAwsService:
        return describe_holder(scope, id_, arn_path=HOLDER, execution_arns=execution_arns, result_path="$.lease_holder")
