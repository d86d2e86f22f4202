"""The validation job on SageMaker: tried again on fresh instances only when SageMaker, not the validation, failed.

A Retry cannot read why a `.sync` task failed (the job's description is in the Cause), so the submission runs in a
one-branch Parallel whose Catch reads the FailureReason: no capacity, or SageMaker's own internal error, ends the
branch as VALIDATION_INFRASTRUCTURE, which the Parallel retries; anything else (the validate command exited 1, a bad
request) leaves the block as VALIDATION_FAILED with its Cause, and the pipeline's failure path ends the run.
"""

import aws_cdk as cdk
import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct

VALIDATION_INFRASTRUCTURE = "ValidationInfrastructureFailed"
# Any other failure, its Cause as it came (a Fail state cannot re-raise States.TaskFailed: "States." names are the
# interpreter's own, ASL "Error names").
VALIDATION_FAILED = "ValidationJobFailed"
# Batch user guide, "Jobs stuck in RUNNABLE due to capacity" (SageMaker training jobs): "Training job fails with
# capacity error | FAILED | failedReason begins with CapacityError".
CAPACITY_FAILURE = "CapacityError*"
# API_RetryStrategy: "The retry strategy to use when a training job fails due to an InternalServerError": the one
# failure SageMaker itself deems worth a new attempt (a lost instance, the platform's own fault).
INTERNAL_FAILURE = "InternalServerError*"
VALIDATION_RETRY: dict = {
    "errors": [VALIDATION_INFRASTRUCTURE],
    "interval": cdk.Duration.minutes(5),
    "max_attempts": 3,
    "backoff_rate": 2,
}


def retried_for_capacity(scope: Construct, id_: str, submission: sfn.CustomState, result_path: str) -> sfn.Parallel:
    """`submission` (its result at `$`) in a block retried 5, 10 and 20 minutes later when SageMaker had no instance
    for it or failed it itself; its result `{"JobId", "JobName", "Status"}` at `result_path`."""
    as_it_came = sfn.Fail(scope, f"{id_}Failed", error=VALIDATION_FAILED, cause_path="$.caught.Cause")
    infrastructure = sfn.Fail(scope, f"{id_}NoInstance", error=VALIDATION_INFRASTRUCTURE, cause_path="$.caught.Cause")
    reason = "$.job.FailureReason"
    by_reason = (
        sfn.Choice(scope, f"{id_}IsInfrastructure")
        .when(
            sfn.Condition.and_(
                sfn.Condition.is_present(reason),
                sfn.Condition.is_string(reason),
                sfn.Condition.or_(
                    sfn.Condition.string_matches(reason, CAPACITY_FAILURE),
                    sfn.Condition.string_matches(reason, INTERNAL_FAILURE),
                ),
            ),
            infrastructure,
        )
        .otherwise(as_it_came)
    )
    parse = sfn.Pass(
        scope, f"{id_}ReadJob", parameters={"caught.$": "$.caught", "job.$": "States.StringToJson($.caught.Cause)"}
    )
    # A Cause that is not the job's description (CreateTrainingJob itself refused, after its own retries).
    described = (
        sfn.Choice(scope, f"{id_}IsJobDescription")
        .when(
            sfn.Condition.and_(
                sfn.Condition.is_string("$.caught.Cause"), sfn.Condition.string_matches("$.caught.Cause", "{*}")
            ),
            parse.next(by_reason),
        )
        .otherwise(as_it_came)
    )
    submission.add_catch(described, errors=["States.TaskFailed"], result_path="$.caught")
    block = sfn.Parallel(
        scope,
        id_,
        result_path=result_path,
        result_selector={key: f"$[0].{key[:-2]}" for key in ("JobId.$", "JobName.$", "Status.$")},
        comment="validation: tried again on fresh instances only when SageMaker had none or failed it itself",
    )
    block.branch(submission)
    block.add_retry(**VALIDATION_RETRY)
    return block
