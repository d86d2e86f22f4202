"""A run inside a Capacity Block on EKS, executed in moto (tests/pipeline/test_eks_pipeline.py's emulator): the
moment EKS scales the block's managed node group to 0 (its end - 40 min) reaches the train Job as `--stop-by`, and
a run that cannot reach one checkpoint before that moment is refused at its start, before any node is sized
(constructs/pipeline/reservation_end.py). Its own module: one emulated account at a time."""

from datetime import UTC, datetime, timedelta

import pytest

from tests.pipeline.runs import RUN, cleared, emulated_account, messages
from tests.synthesis import CAPACITY_BLOCK

BLOCK = "cr-0123456789abcdef0"
# EKS user guide, "Manage compute for AI/ML workloads on Amazon EKS with node groups": EKS's scheduled action scales a
# Capacity Block managed node group "down to 0 40 minutes before the reservation ends".
EKS_LEAD = timedelta(minutes=40)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eks-reservation-pipeline")]


@pytest.fixture(scope="module")
def world(synth):
    from tests.pipeline.test_eks_pipeline import EKS_VARIANT, EksEmulator

    with emulated_account(synth(**EKS_VARIANT, **CAPACITY_BLOCK), EksEmulator) as emulator:
        yield emulator


@pytest.fixture
def emulator(world):
    return cleared(world)


def _block(ends: datetime) -> dict:
    """DescribeCapacityReservations' answer for the block (EC2 API reference, CapacityReservation)."""
    return {"CapacityReservations": [{
        "CapacityReservationId": BLOCK, "InstanceType": "p4d.24xlarge", "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 64, "State": "active", "ReservationType": "capacity-block", "EndDate": ends,
    }]}  # fmt: skip


def _stop_by(job: dict) -> datetime:
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return datetime.fromisoformat(args[args.index("--stop-by") + 1])


def test_the_train_job_stops_by_the_moment_eks_scales_the_node_group_to_0(emulator):
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
    emulator.answers["ec2.describe_capacity_reservations"] = _block(ends)
    emulator.outcomes = {"train": [7]}  # the training stopped by then, saved: the run ends there, resumable
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded", result
    sanity, train = emulator.jobs
    assert train["spec"]["template"]["spec"]["containers"][0]["args"][0] == "train"
    assert _stop_by(train) == ends - EKS_LEAD


def test_a_run_that_cannot_checkpoint_before_eks_scales_the_group_down_is_refused_at_its_start(emulator):
    # 65 minutes to the end is 25 before the scale-down (end - 40 min): under the 30 a checkpoint needs.
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=65)
    emulator.answers["ec2.describe_capacity_reservations"] = _block(ends)
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEndsTooSoon", result
    assert emulator.jobs == [] and emulator.resizes == []  # no node sized, no Job
    (alert,) = messages(emulator)
    assert "EKS scales the node group to 0 40 minutes before it" in alert["cause"]
    assert "(at least 30 minutes before then" in alert["cause"]
