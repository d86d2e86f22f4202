"""Find reserved capacity for a run: the Capacity Block offerings (Batch, EKS) or SageMaker training-plan offerings
(SageMaker) that hold an environment's nodes for a run of N hours, cheapest for the run first (a longer reservation
may cost less per instance-hour and more in all: both are shown).

    make capacity ENV=prod HOURS=72
    .venv/bin/python -m tools.capacity --env prod --hours 72 --after 2026-12-01 --before 2026-12-31 -c nodes=8

Both APIs search one duration at a time (EC2 DescribeCapacityBlockOfferings' CapacityDurationHours, required: 1-day
steps up to 14 days, then 7-day steps up to 182 days; SageMaker SearchTrainingPlanOfferings' DurationHours) and
match it exactly (awslabs/awsome-distributed-ai#1134), so the finder sweeps the shortest durations that hold the
run: a 60-hour run asks for 3-, 4- and 5-day reservations. It buys nothing: each line says how to buy it, and the
README ("Reserved capacity") what to declare once bought. Needs AWS credentials; every refusal is one line.
"""

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from botocore.exceptions import BotoCoreError, ClientError

from config import ConfigError, EnvironmentConfig, load_config
from tools.cost_report import _context

# EC2 API reference, DescribeCapacityBlockOfferings CapacityDurationHours.
BLOCK_DAYS = tuple(range(1, 15)) + tuple(range(21, 183, 7))
DURATIONS_SWEPT = 3  # how many durations from the shortest that holds the run


@dataclass(frozen=True)
class Offer:
    source: str  # "Capacity Block" or "training plan"
    offering_id: str
    instance_type: str
    zone: str
    instances: int
    start: datetime
    end: datetime
    hours: int
    upfront_usd: float

    @property
    def per_instance_hour(self) -> float:
        return self.upfront_usd / (self.instances * self.hours)

    def buy(self) -> str:
        if self.source == "Capacity Block":
            return (
                f"aws ec2 purchase-capacity-block --capacity-block-offering-id {self.offering_id} "
                "--instance-platform Linux/UNIX"
            )
        return (
            "aws sagemaker create-training-plan --training-plan-name <name> "
            f"--training-plan-offering-id {self.offering_id}"
        )


def block_durations(hours: int) -> list[int]:
    """The Capacity Block durations (hours) that hold a run of `hours`, shortest first."""
    return [days * 24 for days in BLOCK_DAYS if days * 24 >= hours][:DURATIONS_SWEPT]


def plan_durations(hours: int) -> list[int]:
    """Training-plan durations swept the same way, in whole days from the first that holds the run."""
    first = -(-hours // 24) * 24
    return [first + 24 * step for step in range(DURATIONS_SWEPT)]


def capacity_blocks(ec2, config: EnvironmentConfig, hours: int, window: dict) -> Iterable[Offer]:
    for duration in block_durations(hours):
        found = ec2.describe_capacity_block_offerings(
            InstanceType=config.instance_type, InstanceCount=config.nodes, CapacityDurationHours=duration, **window
        )
        for o in found.get("CapacityBlockOfferings", []):
            yield Offer("Capacity Block", o["CapacityBlockOfferingId"], o["InstanceType"], o["AvailabilityZone"],
                        o["InstanceCount"], o["StartDate"], o["EndDate"], o["CapacityBlockDurationHours"],
                        float(o["UpfrontFee"]))  # fmt: skip


def training_plans(sagemaker, config: EnvironmentConfig, hours: int, window: dict) -> Iterable[Offer]:
    for duration in plan_durations(hours):
        found = sagemaker.search_training_plan_offerings(
            InstanceType=config.instance.sagemaker_instance_type,
            InstanceCount=config.nodes,
            DurationHours=duration,
            TargetResources=["training-job"],
            **window,
        )
        for o in found.get("TrainingPlanOfferings", []):
            capacities = o.get("ReservedCapacityOfferings", [])
            if len(capacities) != 1:  # a plan of several reservations in turn: not one window for one run
                continue
            (c,) = capacities
            yield Offer("training plan", o["TrainingPlanOfferingId"], c["InstanceType"], c.get("AvailabilityZone", "-"),
                        c["InstanceCount"], c["StartTime"], c["EndTime"], o["DurationHours"],
                        float(o["UpfrontFee"]))  # fmt: skip


def find(
    config: EnvironmentConfig, hours: int, after: datetime | None, before: datetime | None, session
) -> list[Offer]:
    """Every offering that holds the environment's nodes for `hours`: the cheapest for the run (its upfront fee: all
    hold the same nodes), then the soonest."""
    if config.compute == "sagemaker":
        window = {"StartTimeAfter": after, "EndTimeBefore": before}
        offers = training_plans(session.client("sagemaker", region_name=config.region), config, hours, _given(window))
    else:
        window = {"StartDateRange": after, "EndDateRange": before}
        offers = capacity_blocks(session.client("ec2", region_name=config.region), config, hours, _given(window))
    return sorted(offers, key=lambda o: (o.upfront_usd, o.start))


def _given(window: dict) -> dict:
    return {key: value for key, value in window.items() if value is not None}


def table(offers: list[Offer]) -> list[str]:
    """One line per offer: an estimate-free table (the upfront fee is AWS's price for the whole reservation)."""
    head = (
        f"{'source':15} {'instances':20} {'zone':11} {'start (UTC)':16}  hours  {'upfront USD':>11}  USD/instance-hour"
    )
    lines = [head]
    for o in offers:
        held = f"{o.instances} x {o.instance_type}"
        lines.append(
            f"{o.source:15} {held:20} {o.zone:11} {o.start:%Y-%m-%d %H:%M}  {o.hours:>5}  {o.upfront_usd:>11,.2f}  "
            f"{o.per_instance_hour:>17.2f}"
        )
        lines.append(f"    buy: {o.buy()}")
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.capacity", description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="dev")
    parser.add_argument("--hours", type=int, required=True, help="how long the run needs the nodes")
    parser.add_argument("--after", type=_day, help="earliest start, YYYY-MM-DD (UTC)")
    parser.add_argument("--before", type=_day, help="latest end, YYYY-MM-DD (UTC)")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="FIELD=VALUE")
    return parser


def _day(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)


def main(argv: list[str] | None = None, session=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if not 1 <= args.hours <= 182 * 24:
            raise ConfigError(
                f"--hours={args.hours} is not valid; expected 1 to {182 * 24} (a Capacity Block's longest)"
            )
        config = load_config({**_context(args.context), "env": args.env})
        if session is None:
            import boto3

            session = boto3.Session()
        offers = find(config, args.hours, args.after, args.before, session)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as error:
        print(f"error: AWS refused the search ({type(error).__name__}: {str(error).splitlines()[0]})", file=sys.stderr)
        return 2
    where = f"{config.nodes} x {config.instance_type} in {config.region} ({config.compute})"
    if not offers:
        print(f"no offering holds {where} for {args.hours} hours in that window: widen --after/--before")
        return 1
    print(f"{len(offers)} offerings for {where}, {args.hours} hours; cheapest for the run first:")
    print("\n".join(table(offers)))
    best = offers[0]
    declared = (
        {"kind": "training_plan", "training_plan": "<the plan's ARN>", "instances": best.instances}
        if best.source == "training plan"
        else {"kind": "capacity_block", "id": "<cr-... once bought>", "zone": best.zone, "instances": best.instances}
    )
    print(f"once bought, declare it (README, 'Reserved capacity'): \"capacity_reservation\": {json.dumps(declared)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
