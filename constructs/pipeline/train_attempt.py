"""The Train state: one training submission, retried on infrastructure failures only.

A Retry cannot see why a task failed: a Batch `.sync` task fails with `States.TaskFailed` whatever the job's
exit code, and the Cause (the job's DescribeJobs entry, as JSON) is not matchable by Retry or Catch. So the
submission runs inside a one-branch Parallel state: the branch reads the exit code of the job's last attempt
(for a multi-node job Batch fills the exit information from the main node: Batch user guide, "Multi-node
parallel jobs") and ends in a Fail state named after what happened. The Parallel fails with that error
(Step Functions developer guide, "Parallel workflow state": a branch's failure fails the Parallel state), so
its Retry names only `TrainingAttemptFailed` and a refusal of the run itself (contracts.run.REFUSED_EXIT_CODES:
bad input, divergence, a locked checkpoint folder) goes straight to the failure path as `TrainingRefused`.
A Batch job that its queue cancelled while it waited for instances, or a SageMaker job that got none, fails as
`TrainingCapacityUnavailable`: waited for, never counted as a failed attempt.
A SageMaker training job has no exit code in its description: its FailureReason carries the first characters of
/opt/ml/output/failure (SageMaker developer guide, "How Amazon SageMaker AI Provides Training Information"), where
launch.py writes `contracts.run.FAILURE_REASON_MARKER` and the code. An EKS Job's pods have theirs in the Job's Failed
condition, where its pod failure policy puts a run-ending code (contracts/eks/job_templates.py POD_FAILURE_POLICY);
the Cause is matched for that message (EKS_EXIT_CODE).
"""

import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.pipeline.quarantine import Quarantine
from contracts.run import FAILURE_REASON_MARKER, REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE

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


def classified_training(
    scope: Construct,
    id_: str,
    submission: sfn.CustomState | sfn.Parallel,
    result_path: str,
    rejected_errors: tuple[str, ...] = (),
    job: str = "training",
    quarantine: Quarantine | None = None,
    before: tuple[sfn.State, sfn.INextable] | None = None,
    kept: tuple[str, ...] = JOB_RESULT,
) -> sfn.Parallel:
    """`submission` (the backend's job state, result at `$`) wrapped so its failures carry their kind.

    `rejected_errors`: the backend's errors for a request it refuses outright (JobRunner.rejected_errors); they
    leave the block under their own names. The exit code is read from a Batch DescribeJobs entry or a SageMaker
    DescribeTrainingJob FailureReason; a Cause of another shape is an attempt failure. `quarantine`: first, hosts
    the attempt named bad are taken out and the block fails as HostsQuarantined (constructs/pipeline/quarantine.py).
    `before`: (first, ready) states run in the block before the submission (PipelineNodes.wait_for_training), whose
    Fail states end the block under their own errors (NO_CAPACITY, ATTEMPT_FAILED). `kept`: the fields of the
    submission's result the block's result keeps.
    """
    attempt_failed = sfn.Fail(scope, f"{id_}AttemptFailed", error=ATTEMPT_FAILED, cause_path="$.caught.Cause")
    refused = sfn.Fail(
        scope,
        f"{id_}Refused",
        error=REFUSED,
        cause_path=sfn.JsonPath.format(
            f"The {job} job exited with {{}}: the run itself failed, so it is not retried on other hosts. {{}}",
            sfn.JsonPath.string_at("$.exit.code_text"),
            sfn.JsonPath.string_at("$.caught.Cause"),
        ),
    )
    parse = sfn.Pass(
        scope, f"{id_}ReadExit", parameters={"caught.$": "$.caught", "job.$": "States.StringToJson($.caught.Cause)"}
    )
    last_attempt = sfn.Pass(
        scope,
        f"{id_}LastAttempt",
        parameters={
            "caught.$": "$.caught",
            "last.$": "States.ArrayGetItem($.job.Attempts, States.MathAdd(States.ArrayLength($.job.Attempts), -1))",
        },
    )
    code = "$.last.Container.ExitCode"
    text = sfn.Pass(
        scope,
        f"{id_}ExitText",
        parameters={"caught.$": "$.caught", "exit": {"code_text.$": f"States.Format('{{}}', {code})"}},
    )

    def exited_with(exit_code: int) -> sfn.Condition:
        return sfn.Condition.and_(
            sfn.Condition.is_present(code), sfn.Condition.is_numeric(code), sfn.Condition.number_equals(code, exit_code)
        )

    by_exit_code = sfn.Choice(scope, f"{id_}IsRunRefused")
    for exit_code in sorted(REFUSED_EXIT_CODES):
        by_exit_code.when(exited_with(exit_code), text)
    window_ended = sfn.Fail(scope, f"{id_}WindowEnded", error=WINDOW_ENDED, cause_path="$.caught.Cause")
    by_exit_code.when(exited_with(WINDOW_ENDED_EXIT_CODE), window_ended)
    by_exit_code.otherwise(attempt_failed)
    text.next(refused)
    reason = "$.job.FailureReason"
    by_reason = sfn.Choice(scope, f"{id_}IsRunRefusedByReason")
    for exit_code in sorted(REFUSED_EXIT_CODES):
        named = sfn.Pass(
            scope,
            f"{id_}ExitText{exit_code}",
            parameters={"caught.$": "$.caught", "exit": {"code_text": str(exit_code)}},
        )
        by_reason.when(
            sfn.Condition.string_matches(reason, f"*{FAILURE_REASON_MARKER}{exit_code}:*"), named.next(refused)
        )
    no_capacity = sfn.Fail(scope, f"{id_}NoCapacity", error=NO_CAPACITY, cause_path="$.caught.Cause")
    by_reason.when(sfn.Condition.string_matches(reason, CAPACITY_REASON), no_capacity)
    by_reason.when(
        sfn.Condition.string_matches(reason, f"*{FAILURE_REASON_MARKER}{WINDOW_ENDED_EXIT_CODE}:*"), window_ended
    )
    by_reason.otherwise(attempt_failed)
    # A job cancelled while it waited for capacity ended for want of instances, whatever an earlier attempt did.
    status_reason = "$.job.StatusReason"
    has_attempts = (
        sfn.Choice(scope, f"{id_}HasAttempts")
        .when(
            sfn.Condition.and_(
                sfn.Condition.is_present(status_reason),
                sfn.Condition.is_string(status_reason),
                sfn.Condition.string_matches(status_reason, BATCH_CAPACITY_REASON),
            ),
            no_capacity,
        )
        .when(sfn.Condition.is_present("$.job.Attempts[0]"), last_attempt.next(by_exit_code))
        .when(sfn.Condition.and_(sfn.Condition.is_present(reason), sfn.Condition.is_string(reason)), by_reason)
        .otherwise(attempt_failed)
    )
    # The Catch's States.TaskFailed also matches every other task error but States.Timeout (ASL "Error names"):
    # a rejected request (Batch.ClientException: bad parameters, an inactive definition) leaves the block under
    # its own name, which the Parallel's Retry does not retry.
    is_json = sfn.Choice(scope, f"{id_}IsJobDescription")
    for index, error in enumerate(rejected_errors):
        rejected = sfn.Fail(scope, f"{id_}RequestRejected{index or ''}", error=error, cause_path="$.caught.Cause")
        is_json.when(sfn.Condition.string_equals("$.caught.Error", error), rejected)
    # An EKS Job ended by a run-ending exit code (its Cause is matched before it is read as a Batch or SageMaker job).
    for exit_code in sorted(REFUSED_EXIT_CODES):
        named = sfn.Pass(
            scope,
            f"{id_}PodExitText{exit_code}",
            parameters={"caught.$": "$.caught", "exit": {"code_text": str(exit_code)}},
        )
        is_json.when(sfn.Condition.string_matches("$.caught.Cause", EKS_EXIT_CODE % exit_code), named.next(refused))
    is_json.when(sfn.Condition.string_matches("$.caught.Cause", EKS_EXIT_CODE % WINDOW_ENDED_EXIT_CODE), window_ended)
    # A Cause that is not a job description (another backend's failure) is an attempt failure, not a refusal.
    is_json = is_json.when(
        sfn.Condition.and_(
            sfn.Condition.is_string("$.caught.Cause"), sfn.Condition.string_matches("$.caught.Cause", "{*}")
        ),
        parse.next(has_attempts),
    ).otherwise(attempt_failed)
    classify = is_json if quarantine is None else quarantine.check(scope, id_, is_json)
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
