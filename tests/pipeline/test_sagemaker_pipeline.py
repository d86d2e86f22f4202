"""The pipeline on the SageMaker backend: the synthesized definition run by moto's ASL interpreter (sfn_emulator.py).

moto has no SageMaker service integration, so `sagemaker:createTrainingJob.sync` is emulated here: each request,
a refused one too, is checked against the CreateTrainingJob API model (tests/request_validator.py: botocore's own
validation of unknown and required members, types and minimums, plus enums, full-match patterns and the maximums of
strings, lists and numbers), then goes through boto3's SageMaker client into moto (which refuses a training job name
used before), then completes or fails as `outcomes` plans. A failed job fails the task with States.TaskFailed and
the job's description as the Cause, and a refused request with SageMaker's error, as Step Functions' SageMaker
integration does (https://docs.aws.amazon.com/step-functions/latest/dg/connect-sagemaker.html). A succeeding
validate job writes its verdict, like the real one.
"""

import json
import re
import sys
from dataclasses import dataclass, field
from typing import cast

import boto3
import pytest
from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
    FailureEvent,
    FailureEventException,
)
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_factory
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service import (
    StateTaskService,
)
from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
from moto.stepfunctions.parser.asl.utils import json_path

from contracts.run import FAILURE_REASON_MARKER, QUEUE_WAIT_MINUTES, RUN_ID_MAX_LENGTH, train_state_seconds
from tests import sfn_emulator
from tests.pipeline.runs import (
    ACCEPTED,
    REGISTERED_DDP,
    REJECTED,
    RUN,
    WORKLOAD_IMAGE,
    approval,
    approved_model,
    cleared,
    emulated_account,
    messages,
    register,
)
from tests.sfn_emulator import ACCOUNT, REGION, Emulator

DDP, IMAGE = REGISTERED_DDP, WORKLOAD_IMAGE  # registered after the deploy by the tests that run it
SAGEMAKER_VARIANT = {"compute": "sagemaker", "sagemaker_spot": "true"}
# All tests on one xdist worker: the emulated account (a SageMaker app loaded into moto) is set up once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sagemaker-pipeline")]
# What SageMaker reports for a managed Spot job that ran out of its MaxWaitTimeInSeconds after an interruption: under
# TrainingJobStatus Stopped, SecondaryStatus "MaxWaitTimeExceeded - The job stopped because it exceeded the maximum
# allowed wait time", and no FailureReason, which a failed job has (API_DescribeTrainingJob).
SPOT_GAVE_UP = "spot"
# No instances for the job (the SageMaker Python SDK raises CapacityError on such a FailureReason).
NO_CAPACITY = "capacity"
# SageMaker's own failure (API_RetryStrategy: "The retry strategy to use when a training job fails due to an
# InternalServerError").
INTERNAL = "internal"
# CreateTrainingJob itself failing, with the errors Step Functions' SageMaker integration raises (connect-sagemaker
# training job example): the account's instance quota used up, and SageMaker's generic error (throttling...).
NO_QUOTA, THROTTLED = "no-quota", "throttled"
REQUEST_ERRORS = {
    NO_QUOTA: (
        "SageMaker.ResourceLimitExceededException",
        "The account-level service limit 'ml.g5.12xlarge for training job usage' is 0 Instances "
        "(Service: AmazonSageMaker; Status Code: 400; Error Code: ResourceLimitExceeded)",
    ),
    THROTTLED: (
        "SageMaker.AmazonSageMakerException",
        "Rate exceeded (Service: AmazonSageMaker; Status Code: 400; Error Code: ThrottlingException)",
    ),
}


def _task_failed(env, error: str, cause: str, *, states_error: bool) -> FailureEventException:
    name = StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed) if states_error else CustomErrorName(error)
    return FailureEventException(
        FailureEvent(
            env=env,
            error_name=name,
            event_type=HistoryEventType.TaskFailed,
            event_details=cast(
                EventDetails, {"taskFailedEventDetails": TaskFailedEventDetails(error=error, cause=cause)}
            ),
        )
    )


@dataclass
class SageMakerEmulator(Emulator):
    jobs: list[dict] = field(default_factory=list)  # every CreateTrainingJob request, in order

    def reset(self) -> None:
        super().reset()
        self.jobs.clear()

    def kinds(self) -> list[str]:
        return [job["AlgorithmSpecification"]["ContainerArguments"][0] for job in self.jobs]

    def __enter__(self) -> "SageMakerEmulator":
        emulator, original = self, state_task_factory.state_task_service_for

        class EmulatedTrainingJob(StateTaskService):
            def _validate_service_integration_is_supported(self):
                pass

            def _eval_service_task(self, env, resource_runtime_part, normalised_parameters, state_credentials):
                request = normalised_parameters
                emulator.check_request("sagemaker", "CreateTrainingJob", request)  # refused ones too
                kind = request["AlgorithmSpecification"]["ContainerArguments"][0]
                plan = emulator.outcomes.get(kind, [True])
                outcome = plan[min(emulator.kinds().count(kind), len(plan) - 1)]
                emulator.jobs.append(request)
                if isinstance(outcome, str) and outcome in REQUEST_ERRORS:
                    raise _task_failed(env, *REQUEST_ERRORS[outcome], states_error=False)
                sagemaker = boto3.client("sagemaker", region_name=REGION)
                sagemaker.create_training_job(**request)  # moto refuses a name used before
                described = json.loads(
                    json.dumps(sagemaker.describe_training_job(TrainingJobName=request["TrainingJobName"]), default=str)
                )
                described.pop("ResponseMetadata", None)
                if outcome is True:
                    if kind == "validate" and emulator.verdict is not None:
                        run_id = request["HyperParameters"]["run_id"]
                        emulator.s3.put_object(
                            Bucket=emulator.bucket,
                            Key=f"runs/{run_id}/verdict.json",
                            Body=json.dumps(emulator.verdict).encode(),
                        )
                    env.stack.append({**described, "TrainingJobStatus": "Completed", "SecondaryStatus": "Completed"})
                    return
                if outcome == SPOT_GAVE_UP:
                    stopped = {**described, "TrainingJobStatus": "Stopped", "SecondaryStatus": "MaxWaitTimeExceeded"}
                    raise _task_failed(env, "States.TaskFailed", json.dumps(stopped), states_error=True)
                if outcome == NO_CAPACITY:
                    status, reason = "Failed", "CapacityError: Unable to provision requested ML compute capacity."
                elif outcome == INTERNAL:
                    status, reason = "Failed", "InternalServerError: We encountered an internal error."
                else:  # False: an unexpected crash (exit 1); an int: that exit code, as launch.py reports it
                    code = 1 if outcome is False else int(outcome)
                    status, reason = "Failed", f"AlgorithmError: {FAILURE_REASON_MARKER}{code}: the job failed"
                failed = {
                    **described,
                    "TrainingJobStatus": "Failed",
                    "SecondaryStatus": status,
                    "FailureReason": reason,
                }
                raise _task_failed(env, "States.TaskFailed", json.dumps(failed), states_error=True)

        super().__enter__()
        self._unwrap_indexed_fields()
        self._patch(
            state_task_factory,
            "state_task_service_for",
            lambda service_name: EmulatedTrainingJob() if service_name == "sagemaker" else original(service_name),
        )
        return self

    def _unwrap_indexed_fields(self) -> None:
        """moto 5.2.1 answers a path of one field under an array index (`$[0].ModelArtifact`, a Parallel's
        ResultSelector) with the value in a one-element list (json_path.extract_json, its fix for getmoto/moto#7825);
        Step Functions answers with the value, which the validation's model channel takes as its S3Uri string."""
        original = json_path.extract_json

        def extract_json(path, data):
            value = original(path, data)
            if re.fullmatch(r"\$\[\d+\]\.[A-Za-z_]\w*", path) and isinstance(value, list) and len(value) == 1:
                return value[0]
            return value

        for module in list(sys.modules.values()):
            if (
                module.__name__.startswith("moto.stepfunctions.parser")
                and getattr(module, "extract_json", None) is original
            ):
                self._patch(module, "extract_json", extract_json)

    def resolve(self, value, template: dict | None = None):
        """Also Fn::GetAZs (the region's zones as EC2 lists them: moto's) and Fn::Select: a training subnet in the
        VPC's first zone puts its zone, so written, into the pipeline's training-plan check (reservation_end.py)."""
        if isinstance(value, dict) and "Fn::GetAZs" in value:
            zones = boto3.client("ec2", region_name=REGION).describe_availability_zones()["AvailabilityZones"]
            return [zone["ZoneName"] for zone in zones]
        if isinstance(value, dict) and "Fn::Select" in value:
            index, items = value["Fn::Select"]
            return self.resolve(items, template)[int(index)]
        return super().resolve(value, template)

    def _create(self, kind: str, name: str, properties: dict | None = None) -> dict[str, str]:
        """The SageMaker stack's role, the network's subnet and group, the file system: only names reach the jobs."""
        if kind == "AWS::IAM::Role":
            return {"Ref": name, "Arn": f"arn:aws:iam::{ACCOUNT}:role/{name}"}
        if kind == "AWS::EC2::Subnet":
            return {"Ref": "subnet-0123456789abcdef0"}
        if kind == "AWS::EC2::SecurityGroup":
            return {"Ref": "sg-0123456789abcdef0", "GroupId": "sg-0123456789abcdef0"}
        if kind == "AWS::FSx::FileSystem":
            return {"Ref": "fs-0123456789abcdef0", "LustreMountName": "abcdefgh"}
        return super()._create(kind, name, properties)


@pytest.fixture(scope="module")
def world(synth):
    with emulated_account(synth(**SAGEMAKER_VARIANT), SageMakerEmulator) as emulated:
        yield emulated


@pytest.fixture
def emulator(world):
    """The shared emulator, reset between tests: no plan, no recorded jobs, no messages, no approval."""
    return cleared(world)


# Happy path: one training job on the run's instances (its own sanity check first), one validation job on one.
def test_happy_path_trains_validates_and_approves(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.kinds() == ["train", "validate"]
    train, validate = emulator.jobs
    assert train["ResourceConfig"]["InstanceCount"] == RUN["nodes"]
    assert train["HyperParameters"]["run_id"] == RUN["run_id"]
    assert train["HyperParameters"]["expected_nodes"] == str(RUN["nodes"])
    assert train["Environment"]["SANITY_BEFORE_TRAINING"] == "1"
    assert validate["ResourceConfig"]["InstanceCount"] == 1
    assert approval(emulator)["run_id"] == RUN["run_id"]
    assert [m["outcome"] for m in messages(emulator)] == ["APPROVED"]


# A declared workload's training and validation jobs run its image with its declaration, its hyperparameters whole
# (as JSON) and the contract's folders: checkpoints SageMaker syncs, the model where it uploads it (docs/workloads.md).
def test_a_declared_workload_runs_its_own_image_on_sagemaker(emulator):
    emulator.verdict = {**ACCEPTED, "metric": "eval_loss"}
    register(emulator, "torch-ddp", DDP)
    assert emulator.run({**RUN, "workload": "torch-ddp", "hyperparameters": {"lr": 0.1}})["status"] == "SUCCEEDED"
    train, validate = emulator.jobs
    assert train["AlgorithmSpecification"]["TrainingImage"] == validate["AlgorithmSpecification"]["TrainingImage"]
    assert train["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    for job in (train, validate):
        assert json.loads(job["Environment"]["WORKLOAD"])["name"] == "torch-ddp"
        assert json.loads(job["HyperParameters"]["hyperparameters"]) == {
            "lr": 0.1,
            "max_steps": 200,
            "checkpoint_every": 20,
        }
        arguments = job["AlgorithmSpecification"]["ContainerArguments"]
        assert arguments[arguments.index("--model-dir") + 1] == "/opt/ml/model"
    assert "model" not in train["HyperParameters"] and train["Environment"]["SANITY_BEFORE_TRAINING"] == "1"
    train_arguments = train["AlgorithmSpecification"]["ContainerArguments"]
    assert train_arguments[train_arguments.index("--checkpoint-dir") + 1] == train["CheckpointConfig"]["LocalPath"]
    assert approval(emulator)["verdict"]["metric"] == "eval_loss"


# Managed Spot: the training job checkpoints to the run's prefix, and validation reads the same prefix.
def test_training_checkpoints_to_the_runs_prefix_on_managed_spot(emulator):
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "spot-001"})["status"] == "SUCCEEDED"
    train, validate = emulator.jobs
    prefix = f"s3://{emulator.bucket}/checkpoints/spot-001/"
    assert train["CheckpointConfig"] == {"S3Uri": prefix, "LocalPath": "/opt/ml/checkpoints"}
    assert train["EnableManagedSpotTraining"] is True
    stopping = train["StoppingCondition"]
    assert stopping["MaxWaitTimeInSeconds"] >= stopping["MaxRuntimeInSeconds"]  # API_StoppingCondition
    channels = {c["ChannelName"]: c["DataSource"] for c in validate["InputDataConfig"]}
    assert channels["checkpoints"]["S3DataSource"]["S3Uri"] == prefix
    assert "EnableManagedSpotTraining" not in validate  # a trained model is never left waiting for Spot


# The environment's capacity wait (capacity_wait_hours, 2 by default) reaches the Spot training job as its allowance
# for Spot waits beyond its runtime (API_StoppingCondition MaxWaitTimeInSeconds), and its state gives up after the job's
# own end, within the execution's timeout's count of one training submission.
def test_a_spot_training_job_may_wait_the_environments_capacity_wait(world):
    states = json.loads(world.definition)["States"]
    job = states["Train"]["Branches"][0]["States"]["TrainJob"]
    stopping = job["Parameters"]["StoppingCondition"]
    assert stopping["MaxWaitTimeInSeconds"] - stopping["MaxRuntimeInSeconds"] >= 2 * 3600
    assert stopping["MaxWaitTimeInSeconds"] < job["TimeoutSeconds"] <= train_state_seconds(72)[-1]


# A Spot job that ran out of capacity after an interruption: the next submission is a new job on the same
# checkpoint prefix, so it resumes where the first stopped.
def test_a_spot_interruption_is_followed_by_a_resumed_attempt(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [SPOT_GAVE_UP, True]}
    result = emulator.run({**RUN, "run_id": "spot-002"})
    assert result["status"] == "SUCCEEDED", result
    assert emulator.kinds() == ["train", "train", "validate"]
    first, second, _ = emulator.jobs
    assert first["TrainingJobName"] != second["TrainingJobName"]  # names are unique forever in an account
    assert first["CheckpointConfig"]["S3Uri"] == second["CheckpointConfig"]["S3Uri"]
    assert len(emulator.retry_sleeps) == 1
    assert approved_model(emulator) is not None


def test_a_job_failing_every_time_fails_the_run_after_the_retries(emulator):
    emulator.outcomes = {"train": [False]}
    result = emulator.run({**RUN, "run_id": "crash-001"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    definition = json.loads(emulator.definition)
    retries = next(
        r["MaxAttempts"] for r in definition["States"]["Train"]["Retry"] if "TrainingAttemptFailed" in r["ErrorEquals"]
    )
    assert emulator.kinds() == ["train"] * (1 + retries)
    assert [m["outcome"] for m in messages(emulator)] == ["FAILED"]


# Exit 4 (diverged) in the job's FailureReason: the run itself failed, so no new instances are started for it.
@pytest.mark.parametrize("exit_code", [2, 4, 5])
def test_a_job_that_refuses_the_run_is_not_retried(emulator, exit_code):
    emulator.outcomes = {"train": [exit_code]}
    result = emulator.run({**RUN, "run_id": f"refused-{exit_code}"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    assert emulator.kinds() == ["train"] and emulator.retry_sleeps == []
    (alert,) = messages(emulator)
    assert alert["detail"] == "TrainingRefused" and f"exited with {exit_code}" in alert["cause"]


# No instance quota: the submission waits for it as long as a job waits for capacity (every 5 minutes for the queue
# wait), then the run fails naming it; no new training attempt is started for it.
def test_a_missing_instance_quota_is_waited_for_then_fails_the_run(emulator):
    emulator.outcomes = {"train": [NO_QUOTA]}
    result = emulator.run({**RUN, "run_id": "no-quota-001"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    assert emulator.kinds() == ["train"] * (1 + QUEUE_WAIT_MINUTES // 5)
    assert emulator.retry_sleeps == [300] * (QUEUE_WAIT_MINUTES // 5)
    (alert,) = messages(emulator)
    assert "ResourceLimitExceeded" in alert["cause"]


# A throttled CreateTrainingJob is retried within the submission, seconds later; the run goes on.
def test_a_throttled_request_is_retried_and_the_run_succeeds(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [THROTTLED, True]}
    result = emulator.run({**RUN, "run_id": "throttled-001"})
    assert result["status"] == "SUCCEEDED", result
    assert emulator.kinds() == ["train", "train", "validate"] and emulator.retry_sleeps == [5]


def test_a_rejected_model_is_not_approved(emulator):
    emulator.verdict = REJECTED
    result = emulator.run({**RUN, "run_id": "worse-001"})
    assert result["status"] == "FAILED" and result["error"] == "ValidationFailed", result
    assert emulator.kinds() == ["train", "validate"]
    assert approved_model(emulator) is None
    assert [m["outcome"] for m in messages(emulator)] == ["REJECTED"]


@pytest.mark.parametrize(
    ("execution_input", "cause"),
    [
        ({**RUN, "nodes": 0}, "nodes is not valid"),
        ({**RUN, "run_id": "under_score"}, "run_id"),
        ({**RUN, "dataset": "../etc"}, "dataset"),
    ],
)
def test_bad_input_starts_no_job(emulator, execution_input, cause):
    result = emulator.run(execution_input)
    assert result["status"] == "FAILED" and result["error"] == "InvalidInput", result
    assert cause in result.get("cause", "") and emulator.jobs == []


# No capacity for the instances: waited for every 5 minutes like a job in a queue, not counted as a failed attempt.
def test_missing_capacity_is_waited_for_without_using_up_the_attempts(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [NO_CAPACITY, NO_CAPACITY, True]}
    result = emulator.run({**RUN, "run_id": "capacity-001"})
    assert result["status"] == "SUCCEEDED", result
    assert emulator.kinds() == ["train", "train", "train", "validate"]
    assert emulator.retry_sleeps == [300, 300]


# A validation job SageMaker had no instance for, or failed itself, is tried again on fresh instances: the trained
# model is not left unjudged. Batch user guide, "Jobs stuck in RUNNABLE due to capacity" (SageMaker training jobs):
# "failedReason begins with CapacityError"; API_RetryStrategy: a job "fails due to an InternalServerError".
@pytest.mark.parametrize("failure", [NO_CAPACITY, INTERNAL])
def test_a_validation_job_sagemaker_failed_is_tried_again(emulator, failure):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"validate": [failure, True]}
    result = emulator.run({**RUN, "run_id": f"validate-again-{failure}"})
    assert result["status"] == "SUCCEEDED", result
    assert emulator.kinds() == ["train", "validate", "validate"] and emulator.retry_sleeps == [300]


# A validation that itself failed (its command exited 1: AlgorithmError) fails the same way on any instance: the run
# fails at once, naming it, and no second validation job is started.
def test_a_validation_that_failed_itself_is_not_tried_again(emulator):
    emulator.outcomes = {"validate": [False, True]}
    result = emulator.run({**RUN, "run_id": "validate-crash-001"})
    assert result["status"] == "FAILED" and result["error"] == "ValidationJobFailed", result
    assert emulator.kinds() == ["train", "validate"] and emulator.retry_sleeps == []
    (alert,) = messages(emulator)
    assert f"{FAILURE_REASON_MARKER}1:" in alert["cause"]


# A declared workload's validation starts with an empty /opt/ml/model: it gets the training job's model artifact
# (DescribeTrainingJob ModelArtifacts.S3ModelArtifacts, "The path of the S3 object that contains the model artifacts")
# as its `model` channel, copied whole (File mode), which the launcher unpacks into MODEL_DIR (--model-archive).
def test_a_declared_workloads_validation_gets_the_model_training_wrote(emulator):
    emulator.verdict = {**ACCEPTED, "metric": "eval_loss"}
    register(emulator, "torch-ddp", DDP)
    assert emulator.run({**RUN, "run_id": "model-channel-001", "workload": "torch-ddp"})["status"] == "SUCCEEDED"
    train, validate = emulator.jobs
    described = boto3.client("sagemaker", region_name=REGION).describe_training_job(
        TrainingJobName=train["TrainingJobName"]
    )
    channels = {c["ChannelName"]: c for c in validate["InputDataConfig"]}
    source = channels["model"]["DataSource"]["S3DataSource"]
    assert source["S3Uri"] == described["ModelArtifacts"]["S3ModelArtifacts"]
    assert channels["model"]["InputMode"] == "File"
    arguments = validate["AlgorithmSpecification"]["ContainerArguments"]
    assert arguments[arguments.index("--model-archive") + 1] == "/opt/ml/input/data/model"
    assert arguments[arguments.index("--model-dir") + 1] == "/opt/ml/model"


# Training job names: 1-63 letters, digits and '-', unique in the account (API_CreateTrainingJob); a run id of the
# contract's longest length still leaves room for the job and the fresh suffix.
def test_job_names_from_the_longest_run_id_fit_sagemakers_pattern(emulator):
    emulator.verdict = ACCEPTED
    run_id = "r" * (RUN_ID_MAX_LENGTH - 1) + "9"
    assert emulator.run({**RUN, "run_id": run_id})["status"] == "SUCCEEDED"
    names = [job["TrainingJobName"] for job in emulator.jobs]
    assert all(re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name) for name in names), names
    assert names[0].startswith(f"{run_id}-train-") and names[1].startswith(f"{run_id}-validate-")


# The request checks are wired in: a request its API model refuses fails the test when the execution ends, naming the
# problem, whatever the definition made of the failed call (a notification that fails does not fail the run). Publish
# goes through a moto integration client's hook, CreateTrainingJob through the emulated integration above.
@pytest.mark.parametrize("operation", ["Publish", "CreateTrainingJob"])
def test_a_request_its_api_model_refuses_fails_the_test(emulator, monkeypatch, operation):
    def refused(service: str, called: str, request: dict) -> list[str]:
        return [f"{called}: refused"] if called == operation else []

    monkeypatch.setattr(sfn_emulator, "check", refused)
    emulator.verdict = ACCEPTED
    with pytest.raises(AssertionError, match=f"would refuse:\n{operation}: refused"):
        emulator.run({**RUN, "run_id": f"refused-{operation.lower()}"})


# A workload registered after the deploy ends as the contract says on SageMaker too: exit 2 in its FailureReason not
# retried, 143 (stopped on SIGTERM) an attempt failure retried.
@pytest.mark.parametrize("outcomes, status, trains", [([2], "FAILED", 1), ([143, True], "SUCCEEDED", 2)])
def test_a_registered_workloads_exit_codes_end_as_the_contract_says_on_sagemaker(emulator, outcomes, status, trains):
    emulator.verdict = {**ACCEPTED, "metric": "eval_loss"}
    register(emulator, "torch-ddp", DDP)
    emulator.outcomes = {"train": outcomes}
    result = emulator.run({**RUN, "run_id": f"ddp-{trains}", "workload": "torch-ddp"})
    assert result["status"] == status, result
    assert emulator.kinds().count("train") == trains
