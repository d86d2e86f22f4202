"""A SageMaker run in a training plan, executed in moto (tests/pipeline/test_sagemaker_pipeline.py's emulator): the
moment SageMaker takes the plan's instances away (its end - 30 min) reaches the job as `stop_by`, the job names the
plan, a training stopped for it is not retried, and a plan that is over, or whose capacity is in another zone than the
training subnet, is named at the start. Its own module: one emulated account at a time."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.pipeline.runs import RUN, cleared, emulated_account, messages

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"
# SageMaker developer guide, "Training plans utilization for SageMaker training jobs": "When there are 30 minutes
# remaining in your Reserved Capacity, SageMaker training plans begin the process of terminating any running instances".
SAGEMAKER_LEAD = timedelta(minutes=30)
# The training subnet's zone where the environment names none: the VPC's first (constructs/network/efa_network.py),
# in the pipeline's definition as Fn::Select of Fn::GetAZs, which the emulator answers with moto's zones.
SUBNET_ZONE = "us-east-1a"


def _plan(ends: datetime, status: str = "Active", zone: str = SUBNET_ZONE) -> dict:
    """DescribeTrainingPlan's answer (SageMaker API reference, DescribeTrainingPlan): one reserved capacity, in
    `zone` (ReservedCapacitySummaries[].AvailabilityZone)."""
    capacity = {"InstanceType": "ml.p5.48xlarge", "TotalInstanceCount": 4, "Status": status, "AvailabilityZone": zone}
    return {"TrainingPlanArn": PLAN, "TrainingPlanName": "p5-week", "Status": status, "EndTime": ends,
            "ReservedCapacitySummaries": [capacity]}  # fmt: skip


@pytest.fixture(scope="module")
def sagemaker(synth):
    from tests.pipeline.test_sagemaker_pipeline import SAGEMAKER_VARIANT, SageMakerEmulator

    plan = '{"kind": "training_plan", "training_plan": "' + PLAN + '", "instances": 4}'
    variant = {**SAGEMAKER_VARIANT, "sagemaker_spot": "false", "capacity_reservation": plan}  # a plan is not Spot
    with emulated_account(synth(**variant), SageMakerEmulator) as emulator:
        yield emulator


def test_a_sagemaker_run_trains_in_its_training_plan_and_stops_by_its_end(sagemaker):
    # DescribeTrainingPlan's EndTime becomes the job's stop_by; the job names the plan (ResourceConfig.TrainingPlanArn,
    # checked by botocore's model); exit 7 comes back in FailureReason and ends the run ReservationEnded.
    emulator = cleared(sagemaker)
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    emulator.answers["sagemaker.describe_training_plan"] = _plan(ends)
    emulator.outcomes = {"train": [7]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded", result
    (train,) = emulator.jobs
    assert train["ResourceConfig"]["TrainingPlanArn"] == PLAN
    assert datetime.fromisoformat(train["HyperParameters"]["stop_by"]) == ends - SAGEMAKER_LEAD
    assert emulator.refused_requests == []


# SageMaker developer guide, "View training plan details": "After the plan's end date, the status becomes Expired."
def test_a_training_plan_that_is_over_is_named_at_the_start(sagemaker):
    emulator = cleared(sagemaker)
    emulator.answers["sagemaker.describe_training_plan"] = _plan(datetime.now(UTC) - timedelta(hours=1), "Expired")
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationOver", result
    assert emulator.jobs == []
    (alert,) = messages(emulator)
    assert alert["cause"].startswith("capacity_reservation training plan p5-week has Status Expired, which is over")


# SageMaker's throttling has no modeled exception: the aws-sdk integration names it `SageMaker.SageMakerException`
# ("Learning to use AWS service SDK integrations in Step Functions"), retried before the plan counts as unreadable.
def test_a_throttled_read_of_the_training_plan_is_tried_again(sagemaker):
    emulator = cleared(sagemaker)
    emulator.answers["sagemaker.describe_training_plan"] = _plan(datetime.now(UTC) + timedelta(days=3))
    emulator.faults["sagemaker.describe_training_plan"] = ["ThrottlingException"]
    emulator.outcomes = {"train": [7]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded", result
    assert emulator.faulted == ["sagemaker.describe_training_plan:ThrottlingException"]
    assert emulator.kinds() == ["train"]
    # The Java SDK's name for the same error too (Step Functions' optimized SageMaker integration raises it).
    (retry,) = json.loads(emulator.definition)["States"]["ReadReservationEnd"]["Retry"]
    assert {"SageMaker.SageMakerException", "SageMaker.AmazonSageMakerException"} <= set(retry["ErrorEquals"])


# SageMaker developer guide, "Reserve training plans": each Reserved Capacity block has its Availability Zone; the jobs'
# instances join the training subnet (API_VpcConfig), one zone. A plan elsewhere is refused before any claim or job.
def test_a_training_plan_in_another_zone_than_the_training_subnet_is_refused_at_the_start(sagemaker):
    emulator = cleared(sagemaker)
    emulator.answers["sagemaker.describe_training_plan"] = _plan(
        datetime.now(UTC) + timedelta(days=3), zone="us-east-1b"
    )
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationZoneMismatch", result
    assert emulator.jobs == []
    (alert,) = messages(emulator)
    assert alert["cause"].startswith(
        f"training plan p5-week holds its capacity in us-east-1b, not in {SUBNET_ZONE}, the zone of the training subnet"
    )
    assert "set availability_zone to a zone of the plan and deploy" in alert["cause"]
    assert emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="runs/").get("KeyCount", 0) == 0


def test_the_zone_an_environment_names_is_the_one_a_plan_is_held_to(synth):
    # availability_zone set: the training subnet's zone is written in the definition as it is (config validation cannot
    # compare it with the plan's, which only DescribeTrainingPlan knows).
    plan = '{"kind": "training_plan", "training_plan": "' + PLAN + '", "instances": 4}'
    app = synth(compute="sagemaker", availability_zone="us-east-1c", capacity_reservation=plan)
    body = json.dumps(app.raw("pipeline"))
    assert (
        "or 'us-east-1c' in $append([], $states.input.reservation.ReservedCapacitySummaries.AvailabilityZone)" in body
    )
