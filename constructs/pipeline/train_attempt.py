"""The Train state: one training submission, retried on infrastructure failures only.

A Retry cannot see why a task failed: a Batch `.sync` task fails with `States.TaskFailed` whatever the job's
exit code, and the Cause (the job's DescribeJobs entry, as JSON) is not matchable by Retry or Catch. So the
submission runs inside a one-branch Parallel state: the branch reads why the job failed and ends in a Fail state
named after what happened. The Parallel fails with that error
(Step Functions developer guide, "Parallel workflow state": a branch's failure fails the Parallel state), so
its Retry names only `TrainingAttemptFailed` and a refusal of the run itself (contracts.run.REFUSED_EXIT_CODES:
bad input, divergence, a locked checkpoint folder) goes straight to the failure path as `TrainingRefused`.
A job that got no instances (a Batch job its queue cancelled while it waited, a SageMaker job that got none) fails as
`TrainingCapacityUnavailable`: waited for, never counted as a failed attempt.
Each backend's JobRunner reads its own failed jobs (`read_failed_job`: a Batch DescribeJobs entry's exit code, a
SageMaker FailureReason, where launch.py writes `contracts.run.FAILURE_REASON_MARKER` and the code, an EKS Job's Failed
condition, where its pod failure policy puts a run-ending code) into the block's `FailureEnds`: a variant holds its own
backend's reading only.
"""

from dataclasses import dataclass
from typing import Protocol

import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.pipeline.quarantine import Quarantine
from contracts.run import REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE

ATTEMPT_FAILED = "TrainingAttemptFailed"
REFUSED = "TrainingRefused"
# No instances to start the job on: waited for like a job waiting in a queue, not counted as a failed attempt.
NO_CAPACITY = "TrainingCapacityUnavailable"
# The training stopped itself, after a checkpoint, before its reservation ends (exit 7): resumable, not retried.
WINDOW_ENDED = "TrainingWindowEnded"
# SageMaker's FailureReason when it could not provision the instances (the SageMaker Python SDK raises its
# CapacityError when a failed job's reason contains "CapacityError"; SageMaker Pipelines' retry policies name the
# failure type SageMaker.CAPACITY_ERROR: "Configuring retry policies").
CAPACITY_REASON = "*CapacityError*"
# A Batch job its queue cancelled after waiting in RUNNABLE for instances EC2 could not supply: its StatusReason is
# "Canceled by JobStateTimeLimit action due to reason: CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY" (Batch user guide,
# "Jobs stuck in RUNNABLE due to capacity"), with no attempt or one from before the wait.
BATCH_CAPACITY_REASON = "*JobStateTimeLimit*CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY*"
# An EKS Job failed by its pod failure policy's FailJob rule: the Job's Failed condition message, in the failed
# eks:runJob.sync task's Cause (the Job as the API server returns it). Step Functions does not document the Cause of a
# failed Job: where it lacks the Job's status, the failure stays an attempt failure, retried as before.
EKS_EXIT_CODE = "*failed with exit code %d matching FailJob rule*"
# What a job state's result holds (JobRunner.submit); a runner's `train_result` may keep more of a training job.
JOB_RESULT = ("JobId", "JobName", "Status")


def train_result(runner: object) -> tuple[str, ...]:
    """The fields the Train state keeps of its job: JOB_RESULT, or the runner's `train_result` where it names more
    (SageMaker: the model artifact its validation reads)."""
    return tuple(getattr(runner, "train_result", JOB_RESULT))


@dataclass
class FailureEnds:
    """Where a failed job's reading ends (JobRunner.read_failed_job builds the reading): the block's Fail states,
    and the states that name a run-ending exit code. The state entered holds `$.caught` (Error, Cause)."""

    scope: Construct
    id_: str
    attempt_failed: sfn.Fail
    no_capacity: sfn.Fail
    window_ended: sfn.Fail
    refused: sfn.Fail

    def refused_with(self, exit_code: int, kind: str = "") -> sfn.Pass:
        """A Pass naming `exit_code` for the refusal's cause, then the refusal."""
        named = sfn.Pass(
            self.scope,
            f"{self.id_}{kind}ExitText{exit_code}",
            parameters={"caught.$": "$.caught", "exit": {"code_text": str(exit_code)}},
        )
        named.next(self.refused)
        return named

    def parsed(self, then: sfn.IChainable) -> sfn.Choice:
        """The Cause read as the job's description (JSON) at `$.job`, then `then`; another Cause is an attempt
        failure, not a refusal."""
        parse = sfn.Pass(
            self.scope,
            f"{self.id_}ReadExit",
            parameters={"caught.$": "$.caught", "job.$": "States.StringToJson($.caught.Cause)"},
        )
        is_json = sfn.Condition.and_(
            sfn.Condition.is_string("$.caught.Cause"), sfn.Condition.string_matches("$.caught.Cause", "{*}")
        )
        return (
            sfn.Choice(self.scope, f"{self.id_}IsJobDescription")
            .when(is_json, parse.next(then))
            .otherwise(self.attempt_failed)
        )

    def by_exit_code(self, code: str) -> sfn.Choice:
        """The exit code at JSONPath `code` (a number): a run-ending one refuses, 7 ends the window, else an attempt
        failure."""
        text = sfn.Pass(
            self.scope,
            f"{self.id_}ExitText",
            parameters={"caught.$": "$.caught", "exit": {"code_text.$": f"States.Format('{{}}', {code})"}},
        )
        text.next(self.refused)

        def exited_with(exit_code: int) -> sfn.Condition:
            return sfn.Condition.and_(
                sfn.Condition.is_present(code),
                sfn.Condition.is_numeric(code),
                sfn.Condition.number_equals(code, exit_code),
            )

        choice = sfn.Choice(self.scope, f"{self.id_}IsRunRefused")
        for exit_code in sorted(REFUSED_EXIT_CODES):
            choice.when(exited_with(exit_code), text)
        return choice.when(exited_with(WINDOW_ENDED_EXIT_CODE), self.window_ended).otherwise(self.attempt_failed)


class FailedJobReader(Protocol):
    def read_failed_job(self, ends: FailureEnds) -> sfn.State:
        """The states that read `$.caught` (the failed job's Cause, in this backend's shape) into one of `ends`."""
        ...


def classified_training(
    scope: Construct,
    id_: str,
    submission: sfn.CustomState | sfn.Parallel,
    result_path: str,
    reader: FailedJobReader,
    rejected_errors: tuple[str, ...] = (),
    job: str = "training",
    quarantine: Quarantine | None = None,
    before: tuple[sfn.State, sfn.INextable] | None = None,
    kept: tuple[str, ...] = JOB_RESULT,
) -> sfn.Parallel:
    """`submission` (the backend's job state, result at `$`) wrapped so its failures carry their kind.

    `reader`: the backend's JobRunner, which reads its own failed jobs (read_failed_job: a Batch DescribeJobs entry's
    exit code, a SageMaker FailureReason, an EKS Job's failure message), so the block holds no other backend's states.
    `rejected_errors`: the backend's errors for a request it refuses outright (JobRunner.rejected_errors); they
    leave the block under their own names. `quarantine`: first, hosts the attempt named bad are taken out and the
    block fails as HostsQuarantined (constructs/pipeline/quarantine.py). `before`: (first, ready) states run in the
    block before the submission (PipelineNodes.wait_for_training), whose Fail states end the block under their own
    errors (NO_CAPACITY, ATTEMPT_FAILED). `kept`: the fields of the submission's result the block's result keeps.
    """
    ends = FailureEnds(
        scope,
        id_,
        attempt_failed=sfn.Fail(scope, f"{id_}AttemptFailed", error=ATTEMPT_FAILED, cause_path="$.caught.Cause"),
        no_capacity=sfn.Fail(scope, f"{id_}NoCapacity", error=NO_CAPACITY, cause_path="$.caught.Cause"),
        window_ended=sfn.Fail(scope, f"{id_}WindowEnded", error=WINDOW_ENDED, cause_path="$.caught.Cause"),
        refused=sfn.Fail(
            scope,
            f"{id_}Refused",
            error=REFUSED,
            cause_path=sfn.JsonPath.format(
                f"The {job} job exited with {{}}: the run itself failed, so it is not retried on other hosts. {{}}",
                sfn.JsonPath.string_at("$.exit.code_text"),
                sfn.JsonPath.string_at("$.caught.Cause"),
            ),
        ),
    )
    read: sfn.State = reader.read_failed_job(ends)
    # The Catch's States.TaskFailed also matches every other task error but States.Timeout (ASL "Error names"):
    # a rejected request (Batch.ClientException: bad parameters, an inactive definition) leaves the block under
    # its own name, which the Parallel's Retry does not retry.
    if rejected_errors:
        is_rejected = sfn.Choice(scope, f"{id_}IsRequestRejected")
        for index, error in enumerate(rejected_errors):
            rejected = sfn.Fail(scope, f"{id_}RequestRejected{index or ''}", error=error, cause_path="$.caught.Cause")
            is_rejected.when(sfn.Condition.string_equals("$.caught.Error", error), rejected)
        read = is_rejected.otherwise(read)
    classify = read if quarantine is None else quarantine.check(scope, id_, read)
    submission.add_catch(classify, errors=["States.TaskFailed"], result_path="$.caught")
    parallel = sfn.Parallel(
        scope,
        id_,
        result_path=result_path,
        result_selector={f"{key}.$": f"$[0].{key}" for key in kept},
        comment=f"one {job} submission; its failure is named by the job's exit code",
    )
    if before is None:
        parallel.branch(submission)
    else:
        first, ready = before
        ready.next(submission)
        parallel.branch(first)
    return parallel
