"""A run inside a Capacity Block on Batch, executed in moto (tests/sfn_emulator.py): the pipeline reads the block's end
as the run starts, hands the moment EC2 takes the instances away (end - 30 min) to the train job as `stop_by`,
refuses a run the window before that moment is too short for or whose block is over, and ends a training that
stopped for the window as ReservationEnded without a retry (constructs/pipeline/reservation_end.py)."""

from datetime import UTC, datetime, timedelta

import pytest

from tests import sfn_emulator
from tests.pipeline.runs import ACCEPTED, RUN, cleared, emulated_account, messages
from tests.synthesis import CAPACITY_BLOCK

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

BLOCK = "cr-0123456789abcdef0"
# EC2 user guide, "Work with Capacity Blocks": "Thirty minutes before the reservation expires, we begin to terminate
# any instances that are still running in the Capacity Block."
EC2_LEAD = timedelta(minutes=30)


@pytest.fixture(scope="module")
def world(synth):
    with emulated_account(synth(compute="batch", **CAPACITY_BLOCK)) as emulator:
        yield emulator


@pytest.fixture
def emulator(world):
    return cleared(world)


def _block(ends: datetime | None, state: str = "active") -> dict:
    """DescribeCapacityReservations' answer for the block (EC2 API reference, CapacityReservation)."""
    found = {"CapacityReservationId": BLOCK, "InstanceType": "g5.12xlarge", "AvailabilityZone": "us-east-1a",
             "TotalInstanceCount": 64, "State": state, "ReservationType": "capacity-block"}  # fmt: skip
    return {"CapacityReservations": [{**found, **({"EndDate": ends} if ends else {})}]}


def test_the_train_job_stops_by_the_moment_ec2_takes_the_blocks_instances(emulator):
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
    emulator.answers["ec2.describe_capacity_reservations"] = _block(ends)
    emulator.outcomes = {"train": [7]}  # the training stopped by then, saved: the run ends there, resumable
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded", result
    train = emulator.submitted[1]
    assert datetime.fromisoformat(train["parameters"]["stop_by"]) == ends - EC2_LEAD
    assert emulator.refused_requests == []  # the DescribeCapacityReservations request, by botocore's model


def test_a_reservation_without_an_end_gives_the_job_none(emulator):
    emulator.answers["ec2.describe_capacity_reservations"] = _block(None)
    emulator.verdict = ACCEPTED
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert emulator.submitted[1]["parameters"]["stop_by"] == "none"


def test_a_window_too_short_for_one_checkpoint_is_refused_before_any_claim_or_job(emulator):
    emulator.answers["ec2.describe_capacity_reservations"] = _block(datetime.now(UTC) + timedelta(minutes=10))
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEndsTooSoon"
    assert emulator.submitted == []
    (alert,) = messages(emulator)
    assert "too soon for one checkpoint (at least 30 minutes" in alert["cause"]
    assert emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="runs/").get("KeyCount", 0) == 0


def test_the_window_is_counted_to_the_moment_ec2_takes_the_instances_not_to_the_end(emulator):
    # 50 minutes to the end is 20 before EC2 starts terminating (end - 30 min): under the 30 a checkpoint needs.
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=50)
    emulator.answers["ec2.describe_capacity_reservations"] = _block(ends)
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEndsTooSoon", result
    assert emulator.submitted == []
    (alert,) = messages(emulator)
    assert f"ends at {ends.strftime('%Y-%m-%dT%H:%M:%S')}" in alert["cause"]
    assert "EC2 starts terminating its instances 30 minutes before it" in alert["cause"]
    assert "(at least 30 minutes before then" in alert["cause"]


def test_a_training_stopped_for_the_windows_end_is_resumable_and_not_retried(emulator):
    # Exit 7 (runtime/launch/stop_by.py): saved, stopped; booting the nodes again would only meet the same end.
    emulator.answers["ec2.describe_capacity_reservations"] = _block(datetime.now(UTC) + timedelta(days=1))
    emulator.outcomes = {"train": [7]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded"
    assert emulator.submitted_kinds() == ["sanity", "train"] and emulator.retry_sleeps == []
    (alert,) = messages(emulator)
    assert alert["detail"] == "TrainingWindowEnded" and alert["state"] == "Train"


# EC2 API reference, "Error codes for the Amazon EC2 API": throttling (RequestLimitExceeded) and the server errors are
# not modeled, so the aws-sdk integration names them after EC2's base exception, `Ec2.Ec2Exception` ("Learning to use
# AWS service SDK integrations in Step Functions"); the emulator's moto would say "ec2.ec2Exception".
@pytest.mark.parametrize("code", ["RequestLimitExceeded", "Unavailable"])
def test_a_throttled_read_of_the_reservation_is_tried_again(emulator, monkeypatch, code):
    monkeypatch.setitem(sfn_emulator.ERROR_SERVICE_NAMES, "ec2", "Ec2")
    emulator.answers["ec2.describe_capacity_reservations"] = _block(datetime.now(UTC) + timedelta(days=1))
    emulator.faults["ec2.describe_capacity_reservations"] = [code]
    emulator.outcomes = {"train": [7]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded", result
    assert emulator.faulted == [f"ec2.describe_capacity_reservations:{code}"]
    assert emulator.submitted_kinds() == ["sanity", "train"]


def test_a_reservation_the_pipeline_cannot_read_refuses_the_run(emulator):
    emulator.faults["ec2.describe_capacity_reservations"] = ["InvalidCapacityReservationId.NotFound"]
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationUnreadable"
    assert emulator.submitted == []


# EC2 API reference, CapacityReservation State: "expired - ... The reserved capacity is no longer available for your
# use"; "cancelled - ... The reserved capacity is no longer available for your use".
@pytest.mark.parametrize(("state", "ends"), [("expired", datetime.now(UTC) - timedelta(hours=1)), ("cancelled", None)])
def test_a_reservation_that_is_over_is_named_at_the_start(emulator, state, ends):
    emulator.answers["ec2.describe_capacity_reservations"] = _block(ends, state=state)
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationOver", result
    assert emulator.submitted == []
    (alert,) = messages(emulator)
    assert alert["cause"].startswith(f"capacity_reservation {BLOCK} has State {state}, which is over")
