"""A SageMaker run in a training plan, executed in moto (tests/pipeline/test_sagemaker_pipeline.py's emulator): the
moment SageMaker takes the plan's instances away (its end - 30 min) reaches the job as `stop_by`, the job names the
plan, a training stopped for it is not retried, and a plan that is over is named at the start. Its own module: one
emulated account at a time."""

from datetime import UTC, datetime, timedelta

import pytest

from tests.pipeline.runs import RUN, cleared, emulated_account, messages

PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"
# SageMaker developer guide, "Training plans utilization for SageMaker training jobs": "When there are 30 minutes
# remaining in your Reserved Capacity, SageMaker training plans begin the process of terminating any running instances".
SAGEMAKER_LEAD = timedelta(minutes=30)


def _plan(ends: datetime, status: str = "Active") -> dict:
    """DescribeTrainingPlan's answer (SageMaker API reference, DescribeTrainingPlan)."""
    return {"TrainingPlanArn": PLAN, "TrainingPlanName": "p5-week", "Status": status, "EndTime": ends}


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
