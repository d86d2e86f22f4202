"""When a run's training must have stopped: the end of the environment's reservation, read as the run starts.

A Capacity Block or training plan ends at a fixed time, and its instances go with it (AWS HPC blog, "How to use
Capacity Blocks for ML with AWS Batch": jobs still running are FAILED). Before the run claims its id, the pipeline
reads the end (EC2 DescribeCapacityReservations' EndDate; SageMaker DescribeTrainingPlan's EndTime) into
`$.run.stop_by`, which the train job receives as `--stop-by` (runtime/launch/stop_by.py stops and saves before it).
A reservation with no end (an On-Demand reservation without an end date) gives `none`. A run with less than
WINDOW_MINIMUM_SECONDS left could not reach one checkpoint (the sanity check, start-up, one save and the stop's
margin) and is refused at its start, before any claim or instance, with one line. A reservation the pipeline cannot
read (after the transient retries) refuses the run too: training into an end it does not know would lose the work
since the last checkpoint.
"""

from dataclasses import dataclass

import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient
from constructs.pipeline.failure_path import FailurePath
from contracts.run import STOP_BY_NONE

J = sfn.JsonPath
WINDOW_MINIMUM_SECONDS = 30 * 60  # a sanity check, start-up, one checkpoint and the stop's 300 s margin
ENDS_TOO_SOON = "ReservationEndsTooSoon"
UNREADABLE = "ReservationUnreadable"


@dataclass(frozen=True)
class Reservation:
    """The environment's reservation with an end: an EC2 reservation's id, or a SageMaker training plan's ARN."""

    capacity_reservation_id: str | None = None
    training_plan_arn: str | None = None


def reservation_end(scope: Construct, reservation: Reservation, failures: FailurePath) -> tuple[sfn.State, sfn.Pass]:
    """(start, read): `start` takes {"run"}; a run that fits the window goes on at `read` with `$.run.stop_by`."""
    read, end = _describe(scope, reservation)
    retry_transient(read)
    unreadable = failures.record("ReadReservationEnd", UNREADABLE)
    read.add_catch(unreadable.next(failures.notify), errors=["States.ALL"], result_path="$.caught")
    found = sfn.Pass(scope, "ReservationEndFound", parameters={"run.$": "$.run", "end.$": end})
    left = sfn.Pass.jsonata(
        scope,
        "ReservationWindowLeft",
        outputs={
            "run": "{% $merge([$states.input.run, {'stop_by': $states.input.end}]) %}",
            # The state's own entry time from the Context object (Step Functions developer guide, "Accessing
            # execution data from the Context object"), not $now(): Step Functions' JSONata leaves out some functions.
            "seconds_left": "{% ($toMillis($states.input.end) - $toMillis($states.context.State.EnteredTime))"
            " / 1000 %}",
        },
    )
    too_soon = sfn.Pass(
        scope,
        "OnReservationEndsTooSoon",
        parameters={
            "run.$": "$.run",
            "failure": {
                "state": "ReadReservationEnd",
                "error": ENDS_TOO_SOON,
                "detail": ENDS_TOO_SOON,
                "cause": J.format(
                    f"the reservation ends at {{}}, too soon for one checkpoint (at least "
                    f"{WINDOW_MINIMUM_SECONDS // 60} minutes: the sanity check, start-up, a save and the margin before "
                    "the end); start the run in its next window (resume: true continues an earlier run)",
                    J.string_at("$.run.stop_by"),
                ),
            },
        },
    )
    fits = sfn.Choice(scope, "IsReservationWindowLongEnough")
    fits.when(sfn.Condition.number_less_than("$.seconds_left", WINDOW_MINIMUM_SECONDS), too_soon.next(failures.notify))
    done = sfn.Pass(scope, "ReservationEndRead", parameters={"run.$": "$.run"})
    fits.otherwise(done)
    endless = sfn.Pass.jsonata(
        scope,
        "ReservationWithoutEnd",
        outputs={"run": f"{{% $merge([$states.input.run, {{'stop_by': '{STOP_BY_NONE}'}}]) %}}"},
    )
    has_end = sfn.Choice(scope, "HasReservationEnd")
    has_end.when(sfn.Condition.is_present(end), found.next(left).next(fits)).otherwise(endless.next(done))
    read.next(has_end)
    return read, done


def _describe(scope: Construct, reservation: Reservation) -> tuple[tasks.CallAwsService, str]:
    """The call that reads the reservation into `$.reservation`, and where its end is then (if it has one)."""
    if reservation.training_plan_arn:
        name = reservation.training_plan_arn.rsplit("/", 1)[-1]
        plan = tasks.CallAwsService(
            scope,
            "ReadReservationEnd",
            service="sagemaker",
            action="describeTrainingPlan",
            iam_resources=[reservation.training_plan_arn],
            parameters={"TrainingPlanName": name},
            result_path="$.reservation",  # whole (a few fields): a path to a missing EndTime would be States.Runtime
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        return plan, "$.reservation.EndTime"
    ec2 = tasks.CallAwsService(
        scope,
        "ReadReservationEnd",
        service="ec2",
        action="describeCapacityReservations",
        # Service Authorization Reference, Amazon EC2: DescribeCapacityReservations has no resource-level permissions.
        iam_resources=["*"],
        parameters={"CapacityReservationIds": [reservation.capacity_reservation_id]},
        # A list of none or one: an On-Demand reservation may have no end date.
        result_selector={"end.$": "$.CapacityReservations[*].EndDate"},
        result_path="$.reservation",
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    return ec2, "$.reservation.end[0]"
