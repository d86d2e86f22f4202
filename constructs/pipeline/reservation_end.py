"""When a run's training must have stopped: the moment its reservation's capacity is taken away, read as it starts.

A Capacity Block or training plan ends at a fixed time, and the provider takes its instances away before that: EC2
starts terminating a Capacity Block's instances 30 minutes before its end, EKS scales a Capacity Block managed node
group to 0 at 40 minutes, SageMaker starts terminating a training plan's instances at 30 minutes; an On-Demand
reservation is released at its end (config/capacity.py TAKEN_AWAY, with the documents). Before the run claims its
id, the pipeline reads the end (EC2 DescribeCapacityReservations' EndDate; SageMaker DescribeTrainingPlan's EndTime)
and puts end - lead into `$.run.stop_by`, which the train job receives as `--stop-by` (runtime/launch/stop_by.py
stops and saves before it, with its save margin on top: the launcher knows one time, not the provider). A
reservation with no end (an On-Demand reservation without an end date) gives `none`. A run with less than
WINDOW_MINIMUM_SECONDS before that moment could not reach one checkpoint (the sanity check, start-up, one save and
the stop's margin) and is refused at its start, before any claim or instance, with one line. So is a reservation
that is over (its State or Status, from the same call), and one the pipeline cannot read (after the transient
retries): training into an end it does not know would lose the work since the last checkpoint. So is a training plan
none of whose reserved capacity is in the training subnet's zone (`_in_zone`): its jobs could not use it.
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
OVER = "ReservationOver"
ZONE_MISMATCH = "ReservationZoneMismatch"
# EC2 API reference, CapacityReservation State: expired and cancelled, "The reserved capacity is no longer available
# for your use"; failed, "The Capacity Reservation request has failed"; payment-failed, "Your Capacity Block was
# released".
EC2_OVER = ("expired", "cancelled", "failed", "payment-failed")
# SageMaker developer guide, "View training plan details": "If the plan purchase fails, the status is set to Failed";
# "After the plan's end date, the status becomes Expired".
PLAN_OVER = ("Expired", "Failed")
# The read's throttling and 5xx, retried like the pipeline's other calls (aws_calls.retry_transient). Neither service
# models them, so Step Functions names them after the service's base exception ("Learning to use AWS service SDK
# integrations in Step Functions": ServiceName.ErrorName). EC2 API reference, "Error codes for the Amazon EC2 API":
# RequestLimitExceeded, InternalError, ServiceUnavailable and Unavailable, unmodeled, are `Ec2.Ec2Exception` (which
# also names EC2's client errors: a reservation id EC2 does not know is retried too, a minute, before the refusal).
EC2_TRANSIENT = ("Ec2.Ec2Exception", "States.Timeout")
# SageMaker's throttling is unmodeled too: `SageMaker.SageMakerException` from the aws-sdk integration (as the model
# registry's calls retry it, model_registry.py SAGEMAKER_TRANSIENT), `SageMaker.AmazonSageMakerException` where Step
# Functions names it after the Java SDK's class (its optimized integration does: job_runner.py API_ERROR); both, since
# the aws-sdk integration's name for an unmodeled SageMaker error is not documented beyond the pattern.
SAGEMAKER_TRANSIENT = ("SageMaker.SageMakerException", "SageMaker.AmazonSageMakerException", "States.Timeout")


@dataclass(frozen=True)
class Reservation:
    """The environment's reservation with an end: an EC2 reservation's id, or a SageMaker training plan's ARN; and
    when the backend's provider takes its capacity away: `lead_seconds` before the end, by `taken_by`. `subnet_zone`:
    the training subnet's zone (a deploy-time token where the VPC picks it), which a training plan's capacity must be
    in; an EC2 reservation's zone is held to it by the configuration (config/capacity.py)."""

    capacity_reservation_id: str | None = None
    training_plan_arn: str | None = None
    lead_seconds: int = 0
    taken_by: str = ""
    subnet_zone: str | None = None


@dataclass(frozen=True)
class _Read:
    """The call that reads the reservation into `$.reservation`: where its end is then (if it has one), where its
    state is, and the states that say it is over."""

    task: tasks.CallAwsService
    end: str
    state: str
    over: tuple[str, ...]
    name: str  # the reservation, as the refusal names it
    field: str  # its state's field in the answer
    transient: tuple[str, ...]  # the call's errors that another try may not meet


def reservation_end(scope: Construct, reservation: Reservation, failures: FailurePath) -> tuple[sfn.State, sfn.Pass]:
    """(start, read): `start` takes {"run"}; a run that fits the window goes on at `read` with `$.run.stop_by`."""
    read = _describe(scope, reservation)
    retry_transient(read.task, read.transient)
    unreadable = failures.record("ReadReservationEnd", UNREADABLE)
    read.task.add_catch(unreadable.next(failures.notify), errors=["States.ALL"], result_path="$.caught")
    done = sfn.Pass(scope, "ReservationEndRead", parameters={"run.$": "$.run"})
    found = sfn.Pass(scope, "ReservationEndFound", parameters={"run.$": "$.run", "end.$": read.end})
    endless = sfn.Pass.jsonata(
        scope,
        "ReservationWithoutEnd",
        outputs={"run": f"{{% $merge([$states.input.run, {{'stop_by': '{STOP_BY_NONE}'}}]) %}}"},
    )
    has_end = sfn.Choice(scope, "HasReservationEnd")
    has_end.when(sfn.Condition.is_present(read.end), found.next(_window(scope, reservation, failures, done)))
    has_end.otherwise(endless.next(done))
    usable = sfn.Choice(scope, "IsReservationUsable")
    over = sfn.Condition.or_(*(sfn.Condition.string_equals(read.state, s) for s in read.over))
    usable.when(over, _over(scope, read).next(failures.notify)).otherwise(
        _in_zone(scope, reservation, failures, has_end)
    )
    read.task.next(usable)
    return read.task, done


def _window(scope: Construct, reservation: Reservation, failures: FailurePath, done: sfn.Pass) -> sfn.IChainable:
    """From {"run", "end"}: `stop_by` = end - lead, then `done`, or the refusal where too little is left before it."""
    lead_ms = reservation.lead_seconds * 1000
    left = sfn.Pass.jsonata(
        scope,
        "ReservationWindowLeft",
        outputs={
            # $fromMillis and $toMillis: Step Functions developer guide, "Transforming data with JSONata in Step
            # Functions": every built-in function of the JSONata 2.0.6 specification "with one exception, $eval".
            "run": "{% $merge([$states.input.run, {'stop_by': $fromMillis($toMillis($states.input.end) - "
            f"{lead_ms})}}]) %}}",
            "end": "{% $states.input.end %}",
            # The state's own entry time from the Context object (Step Functions developer guide, "Accessing
            # execution data from the Context object"), not $now(): Step Functions' JSONata leaves out some functions.
            "seconds_left": f"{{% ($toMillis($states.input.end) - {lead_ms} - "
            "$toMillis($states.context.State.EnteredTime)) / 1000 %}",
        },
    )
    fits = sfn.Choice(scope, "IsReservationWindowLongEnough")
    too_soon = _too_soon(scope, reservation).next(failures.notify)
    fits.when(sfn.Condition.number_less_than("$.seconds_left", WINDOW_MINIMUM_SECONDS), too_soon)
    fits.otherwise(done)
    return left.next(fits)


def _too_soon(scope: Construct, reservation: Reservation) -> sfn.Pass:
    """The one line naming the end, the lead and the minimum (the moment itself where there is a lead)."""
    taken, moments = "", [J.string_at("$.end")]
    if reservation.lead_seconds:
        taken = f", and {reservation.taken_by} {reservation.lead_seconds // 60} minutes before it, at {{}}"
        moments.append(J.string_at("$.run.stop_by"))
    return sfn.Pass(
        scope,
        "OnReservationEndsTooSoon",
        parameters={
            "run.$": "$.run",
            "failure": {
                "state": "ReadReservationEnd",
                "error": ENDS_TOO_SOON,
                "detail": ENDS_TOO_SOON,
                "cause": J.format(
                    f"the reservation ends at {{}}{taken}: too soon for one checkpoint (at least "
                    f"{WINDOW_MINIMUM_SECONDS // 60} minutes before then: the sanity check, start-up, a save and the "
                    "margin); start the run in its next window (resume: true continues an earlier run)",
                    *moments,
                ),
            },
        },
    )


def _in_zone(scope: Construct, reservation: Reservation, failures: FailurePath, then: sfn.Choice) -> sfn.IChainable:
    """A training plan holds each reserved capacity in one Availability Zone (DescribeTrainingPlan
    ReservedCapacitySummaries[].AvailabilityZone; SageMaker developer guide, "Reserve training plans": a Reserved
    Capacity block is defined by its "Availability Zone"), and its jobs' instances join the training subnet, one zone
    (API_VpcConfig Subnets: the job's network interfaces are created there). A plan with no capacity in that zone is
    refused in one line naming both, before any claim or job; `then` follows otherwise. The plan's zone is not
    known at synth (the configuration takes no zone for a plan: only DescribeTrainingPlan, with credentials, says)."""
    zone = reservation.subnet_zone
    if not (reservation.training_plan_arn and zone):
        return then
    zones = "$append([], $states.input.reservation.ReservedCapacitySummaries.AvailabilityZone)"
    read = sfn.Pass.jsonata(
        scope,
        "ReadReservationZones",
        outputs={
            "run": "{% $states.input.run %}",
            "reservation": "{% $states.input.reservation %}",
            # A plan whose answer names no zone (the field is optional in the API's model) is not refused for it.
            "in_zone": f"{{% $count({zones}) = 0 or '{zone}' in {zones} %}}",
            "zones": f"{{% $join({zones}, ', ') %}}",
        },
    )
    name = reservation.training_plan_arn.rsplit("/", 1)[-1]
    mismatch = sfn.Pass(
        scope,
        "OnReservationZoneMismatch",
        parameters={
            "run.$": "$.run",
            "failure": {
                "state": "ReadReservationEnd",
                "error": ZONE_MISMATCH,
                "detail": ZONE_MISMATCH,
                "cause": J.format(
                    f"training plan {name} holds its capacity in {{}}, not in {zone}, the zone of the training "
                    "subnet, where its jobs run: set availability_zone to a zone of the plan and deploy (the training "
                    f"subnet and file system move there), or point capacity_reservation at a plan in {zone}",
                    J.string_at("$.zones"),
                ),
            },
        },
    )
    fits = sfn.Choice(scope, "IsReservationInTrainingZone")
    fits.when(sfn.Condition.boolean_equals("$.in_zone", False), mismatch.next(failures.notify)).otherwise(then)
    return read.next(fits)


def _over(scope: Construct, read: _Read) -> sfn.Pass:
    """The one line naming a reservation that is over: its id, its state and what a run needs."""
    return sfn.Pass(
        scope,
        "OnReservationOver",
        parameters={
            "run.$": "$.run",
            "failure": {
                "state": "ReadReservationEnd",
                "error": OVER,
                "detail": OVER,
                "cause": J.format(
                    f"capacity_reservation {read.name} has {read.field} {{}}, which is over "
                    f"({', '.join(read.over)}); expected a current reservation: point capacity_reservation at one "
                    "and deploy",
                    J.string_at(read.state),
                ),
            },
        },
    )


def _describe(scope: Construct, reservation: Reservation) -> _Read:
    """The call that reads the reservation (its end and its state, in one answer) into `$.reservation`."""
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
        return _Read(
            plan,
            "$.reservation.EndTime",
            "$.reservation.Status",
            PLAN_OVER,
            f"training plan {name}",
            "Status",
            SAGEMAKER_TRANSIENT,
        )
    ec2 = tasks.CallAwsService(
        scope,
        "ReadReservationEnd",
        service="ec2",
        action="describeCapacityReservations",
        # Service Authorization Reference, Amazon EC2: DescribeCapacityReservations has no resource-level permissions.
        iam_resources=["*"],
        parameters={"CapacityReservationIds": [reservation.capacity_reservation_id]},
        # Lists of none or one: an On-Demand reservation may have no end date (a State it always has).
        result_selector={
            "end.$": "$.CapacityReservations[*].EndDate",
            "state.$": "$.CapacityReservations[*].State",
        },
        result_path="$.reservation",
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    name = str(reservation.capacity_reservation_id)
    return _Read(ec2, "$.reservation.end[0]", "$.reservation.state[0]", EC2_OVER, name, "State", EC2_TRANSIENT)
