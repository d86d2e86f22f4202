"""A SageMaker run in a training plan, executed in moto (tests/pipeline/test_sagemaker_pipeline.py's emulator): the
plan's end reaches the job as `stop_by`, the job names the plan, and a training stopped for the end is not retried.
Its own module: one emulated account at a time."""

from datetime import UTC, datetime, timedelta

import pytest

from tests.pipeline.runs import RUN, cleared, emulated_account

PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"


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
    emulator.answers["sagemaker.describe_training_plan"] = {
        "TrainingPlanArn": PLAN, "TrainingPlanName": "p5-week", "Status": "Active", "EndTime": ends,
    }  # fmt: skip
    emulator.outcomes = {"train": [7]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "ReservationEnded", result
    (train,) = emulator.jobs
    assert train["ResourceConfig"]["TrainingPlanArn"] == PLAN
    assert datetime.fromisoformat(train["HyperParameters"]["stop_by"]) == ends
    assert emulator.refused_requests == []
