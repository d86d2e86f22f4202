"""The pipeline's failure path: every Task's Catch names its stage, releases the nodes the run held (where the
pipeline sizes nodes itself: EKS), notifies the alerts topic, then fails the run.

A failed release or notification must not hide the run's own error: their Catches go on to the next step.
"""

import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, NOTIFICATION_ERRORS, retry_transient

J = sfn.JsonPath
Catchable = sfn.TaskStateBase | sfn.CustomState | sfn.Parallel


class FailurePath:
    """`catch(task, state, error)` sends a failed task to an "On<state>Failure" Pass, then `notify` (the release, if
    any, then the notification) and `failed`. `release`: the chain that brings the run's nodes to 0, and its state
    to catch on (PipelineNodes.release)."""

    def __init__(
        self,
        scope: Construct,
        *,
        environment: str,
        topic: sns.ITopic,
        release: tuple[sfn.Chain, sfn.Map] | None = None,
    ) -> None:
        self._scope = scope
        self.failed = sfn.Fail(scope, "RunFailed", error_path="$.failure.error", cause_path="$.failure.cause")
        publish = tasks.SnsPublish(
            scope,
            "NotifyFailure",
            topic=topic,
            result_path=J.DISCARD,
            subject=J.format(f"EFA training {environment}: {{}}", J.string_at("$.failure.error")),
            message=sfn.TaskInput.from_object(
                {
                    "environment": environment,
                    "outcome": "FAILED",
                    "run_id": J.string_at("$.run.run_id"),
                    "error": J.string_at("$.failure.error"),
                    "state": J.string_at("$.failure.state"),
                    "detail": J.string_at("$.failure.detail"),
                    "cause": J.string_at("$.failure.cause"),
                    "execution": J.execution_id,
                }
            ),
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(publish, NOTIFICATION_ERRORS)
        publish.add_catch(self.failed, result_path="$.notification_error")
        publish.next(self.failed)
        self.notify: sfn.IChainable = publish
        if release is not None:
            chain, state = release
            state.add_catch(publish, result_path="$.release_error")
            chain.next(publish)
            self.notify = chain

    def record(self, state: str, error: str, record_id: str | None = None) -> sfn.Pass:
        """The Pass that names the failure of `state` (from `$.caught`); `.next(self.notify)` is up to the caller."""
        return sfn.Pass(
            self._scope,
            f"On{record_id or state}Failure",
            parameters={
                "run.$": "$.run",
                "failure": {"state": state, "error": error, "detail.$": "$.caught.Error", "cause.$": "$.caught.Cause"},
            },
        )

    def catch(
        self, task: Catchable, state: str, error: str, errors: list[str] | None = None, record_id: str | None = None
    ) -> None:
        """`errors` (default: all) of `task` end the run as `error`; a Catch for some errors goes before the one
        for all (ASL: the first Catcher that matches is used; States.ALL must be the last)."""
        record = self.record(state, error, record_id)
        task.add_catch(record.next(self.notify), errors=errors or ["States.ALL"], result_path="$.caught")
