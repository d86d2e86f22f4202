"""Reserved capacity for the training nodes: an EC2 Capacity Block for ML or On-Demand Capacity Reservation (Batch,
EKS), or a SageMaker training plan (SageMaker), declared once per environment as `capacity_reservation`.

    "capacity_reservation": {"kind": "capacity_block", "id": "cr-0123456789abcdef0", "zone": "us-east-1a",
                             "instances": 4}

What each backend takes, and the documents that say so (README, "Reserved capacity"):
- Batch: a launch template that targets the reservation (and, for a Capacity Block, the market type
  `capacity-block`) on the multi-node compute environment (AWS HPC blog, "How to use Capacity Blocks for ML with
  AWS Batch"; aws-samples/sample-aws-batch-capacity-block-reservations; EC2 user guide, "Launch instances into an
  existing Capacity Reservation").
- EKS: the same on the accelerator node group's launch template, with capacity type CAPACITY_BLOCK for a block
  (EKS user guide, "Create a managed node group with Capacity Blocks for ML"; "Use Capacity Reservations").
- SageMaker: a training plan's ARN in the training job's ResourceConfig.TrainingPlanArn (SageMaker API reference,
  CreateTrainingPlan: "The plan can be used to: Queue training jobs"; API_ResourceConfig, TrainingPlanArn).
  SageMaker training jobs take no EC2 reservation.

Checked here without AWS (the kind fits the backend, the ids' shapes, the zone holds the training subnet, the
reservation holds the run's nodes); `make deploy` checks the reservation itself (tools/preflight.py).
"""

import json
import re
from dataclasses import dataclass

KINDS = {
    "batch": ("capacity_block", "on_demand"),
    "eks": ("capacity_block", "on_demand"),
    "sagemaker": ("training_plan",),
}

# When the provider takes a reservation's capacity away, in seconds before its end, and who does (words for a refusal:
# no apostrophe, they go into States.Format): a run must have stopped and saved by then
# (constructs/pipeline/reservation_end.py passes end - lead as the train job's stop-by).
TAKEN_AWAY = {
    # EC2 user guide, "Work with Capacity Blocks": "Thirty minutes before the reservation expires, we begin to
    # terminate any instances that are still running in the Capacity Block."
    ("batch", "capacity_block"): (30 * 60, "EC2 starts terminating its instances"),
    # EKS user guide, "Manage compute for AI/ML workloads on Amazon EKS with node groups": EKS's scheduled action
    # scales a Capacity Block managed node group "down to 0 40 minutes before the reservation ends".
    ("eks", "capacity_block"): (40 * 60, "EKS scales the node group to 0"),
    # SageMaker developer guide, "Training plans utilization for SageMaker training jobs": "When there are 30 minutes
    # remaining in your Reserved Capacity, SageMaker training plans begin the process of terminating any running
    # instances within that Reserved Capacity."
    ("sagemaker", "training_plan"): (30 * 60, "SageMaker starts terminating its instances"),
    # EC2 API reference, CapacityReservation EndDate: "When a Capacity Reservation expires, the reserved capacity is
    # released and you can no longer launch instances into it" (no early termination; "within an hour from the
    # specified time", never before it, ModifyCapacityReservation).
    ("batch", "on_demand"): (0, "EC2 releases it"),
    ("eks", "on_demand"): (0, "EC2 releases it"),
}
FIELDS = ("kind", "id", "resource_group", "training_plan", "zone", "instances")
RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
# EC2 user guide, "Capacity Reservation groups": an AWS Resource Groups group that holds On-Demand reservations.
RESOURCE_GROUP_ARN = r"arn:aws[a-z-]*:resource-groups:{region}:[0-9]{{12}}:group/[A-Za-z0-9_.-]{{1,300}}"
# botocore's SageMaker model, TrainingPlanArn: arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.*
TRAINING_PLAN_ARN = r"arn:aws[a-z-]*:sagemaker:{region}:[0-9]{{12}}:training-plan/[A-Za-z0-9-]{{1,64}}"


class ReservationError(ValueError):
    """One line: `capacity_reservation.<field>=<value> is not valid; expected <what is allowed>`."""


@dataclass(frozen=True)
class CapacityReservation:
    kind: str  # capacity_block, on_demand or training_plan
    instances: int  # how many instances it holds
    id: str | None = None  # cr-... (a Capacity Block, or one On-Demand reservation)
    resource_group: str | None = None  # an On-Demand reservation group's ARN
    training_plan: str | None = None  # a SageMaker training plan's ARN
    zone: str | None = None  # where an EC2 reservation's instances launch

    @property
    def capacity_block(self) -> bool:
        return self.kind == "capacity_block"

    def taken_away(self, compute: str) -> tuple[int, str]:
        """(seconds before the end, who): when `compute`'s provider takes this reservation's capacity away."""
        return TAKEN_AWAY[(compute, self.kind)]

    @property
    def target(self) -> dict[str, str]:
        """The launch template's CapacityReservationTarget (CloudFormation casing)."""
        if self.id:
            return {"CapacityReservationId": self.id}
        if self.resource_group:
            return {"CapacityReservationResourceGroupArn": self.resource_group}
        raise ValueError(f"a {self.kind} reservation is not an EC2 reservation a launch template can target")


def parse_reservation(
    text: str, *, compute: str, region: str, nodes: int, availability_zone: str | None
) -> CapacityReservation | None:
    """The environment's reservation (None for `{}`), or ReservationError naming the first problem."""
    raw = json.loads(text)
    if not raw:
        return None
    unknown = next((key for key in raw if key not in FIELDS), None)
    if unknown is not None:  # named by repr: a key may hold any character (one line, whatever it is)
        raise ReservationError(f"capacity_reservation has no field {unknown!r}; expected only {', '.join(FIELDS)}")
    kinds = KINDS[compute]
    if raw.get("kind") not in kinds:
        raise _bad("kind", raw.get("kind"), f"{' or '.join(kinds)} with compute={compute}")
    reservation = CapacityReservation(
        kind=raw["kind"],
        instances=_instances(raw.get("instances"), nodes),
        id=raw.get("id"),
        resource_group=raw.get("resource_group"),
        training_plan=raw.get("training_plan"),
        zone=raw.get("zone"),
    )
    _check_target(reservation, region)
    if reservation.kind != "training_plan":
        _check_zone(reservation.zone, availability_zone)
    elif reservation.zone is not None:
        # A plan's zone is SageMaker's record (DescribeTrainingPlan ReservedCapacitySummaries[].AvailabilityZone),
        # unknowable here without credentials: the pipeline compares it with the training subnet's as a run starts
        # (constructs/pipeline/reservation_end.py ReservationZoneMismatch), so a zone written here could only go stale.
        raise _bad(
            "zone",
            reservation.zone,
            "no zone for a training plan (SageMaker reports the plan's zone, which each run checks against the "
            "training subnet's; to move the subnet into it, set availability_zone)",
        )
    return reservation


def _instances(value: object, nodes: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < nodes:
        raise _bad(
            "instances",
            value,
            f"the number of instances it holds, at least nodes ({nodes}): every node of a run launches in it",
        )
    return value


def _check_target(reservation: CapacityReservation, region: str) -> None:
    """Exactly the identifier its kind takes: a block's id; an On-Demand reservation's id or group; a plan's ARN."""
    given = {name for name in ("id", "resource_group", "training_plan") if getattr(reservation, name) is not None}
    wanted = {"capacity_block": {"id"}, "on_demand": {"id", "resource_group"}, "training_plan": {"training_plan"}}
    allowed = wanted[reservation.kind]
    if len(given) != 1 or not given <= allowed:
        field = min(given - allowed, default=min(allowed))  # sorted: the same field named on every run
        raise _bad(
            field,
            getattr(reservation, field),
            f"exactly one of {' or '.join(sorted(allowed))} for a {reservation.kind}",
        )
    if reservation.id is not None and not RESERVATION_ID.fullmatch(str(reservation.id)):
        raise _bad("id", reservation.id, "a capacity reservation id like cr-0123456789abcdef0")
    shapes = {
        "resource_group": (RESOURCE_GROUP_ARN, "an On-Demand Capacity Reservation group's ARN"),
        "training_plan": (TRAINING_PLAN_ARN, "a SageMaker training plan's ARN"),
    }
    for name, (shape, what) in shapes.items():
        value = getattr(reservation, name)
        if value is not None and not re.fullmatch(shape.format(region=re.escape(region)), str(value)):
            raise _bad(name, value, f"{what} in {region} (this environment's region)")


def _check_zone(zone: object, availability_zone: str | None) -> None:
    """An EC2 reservation's instances launch in its zone, which must hold the training subnet and the file system:
    the environment names that zone itself, so a reservation never moves them (a new zone replaces both)."""
    if zone is None or zone != availability_zone:
        raise _bad(
            "zone",
            zone,
            f"the reservation's Availability Zone, with availability_zone set to the same zone (now "
            f"{availability_zone}): the training subnet and file system must be where its instances launch",
        )


def _bad(field: str, value: object, allowed: str) -> ReservationError:
    return ReservationError(f"capacity_reservation.{field}={value!r} is not valid; expected {allowed}")
