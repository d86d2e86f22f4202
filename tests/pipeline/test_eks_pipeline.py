"""The pipeline on the EKS backend: the synthesized definition run by moto's ASL interpreter (tests/sfn_emulator.py).

moto has no EKS service integration, so `eks:runJob.sync` is emulated here: the Job is recorded and completes at
once, or fails as `outcomes` plans (a succeeding validate Job writes its verdict, like the real one). Sizing the
node group is not part of the pipeline's definition (an EventBridge rule and its own state machine, checked in
tests/compute/test_eks_node_scaling.py).
"""

import json
from dataclasses import dataclass, field
from typing import cast

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

from tests.pipeline.runs import ACCEPTED, RUN, approval, cleared, emulated_account, messages
from tests.sfn_emulator import REGION, Emulator

EKS_VARIANT = {"compute": "eks", "instance_type": "p4d.24xlarge"}
# Both tests on one xdist worker: the emulated account (an EKS app loaded into moto) is set up once.
pytestmark = pytest.mark.xdist_group("eks-pipeline")


@dataclass
class EksEmulator(Emulator):
    jobs: list[dict] = field(default_factory=list)  # every Job eks:runJob.sync was asked to run

    def reset(self) -> None:
        super().reset()
        self.jobs.clear()

    def __enter__(self) -> "EksEmulator":
        emulator, original = self, state_task_factory.state_task_service_for

        class EmulatedRunJob(StateTaskService):
            def _validate_service_integration_is_supported(self):
                pass

            def _eval_service_task(self, env, resource_runtime_part, normalised_parameters, state_credentials):
                # Not checked against an API model: eks:runJob's request is a Kubernetes batch/v1 Job manifest and the
                # cluster's name, endpoint and CA (no botocore shape). The pipeline's other requests (S3, SSM, SNS)
                # are checked by the emulator's client hook like on any backend.
                job = normalised_parameters["Job"]
                emulator.jobs.append(job)
                args = job["spec"]["template"]["spec"]["containers"][0]["args"]
                plan = emulator.outcomes.get(args[0], [True])
                attempt = (
                    sum(
                        1 for j in emulator.jobs if j["spec"]["template"]["spec"]["containers"][0]["args"][0] == args[0]
                    )
                    - 1
                )
                outcome = plan[min(attempt, len(plan) - 1)]
                if isinstance(outcome, str):  # the API server refused the request: eks:runJob names its status
                    raise FailureEventException(
                        FailureEvent(
                            env=env,
                            error_name=CustomErrorName(outcome),
                            event_type=HistoryEventType.TaskFailed,
                            event_details=cast(
                                EventDetails,
                                {
                                    "taskFailedEventDetails": TaskFailedEventDetails(
                                        error=outcome, cause=f"{outcome}: refused"
                                    )
                                },
                            ),
                        )
                    )
                if outcome is not True:  # False, or an exit code: a container that exits non-zero fails the Job
                    raise FailureEventException(
                        FailureEvent(  # what eks:runJob.sync reports for a failed Job
                            env=env,
                            error_name=StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                            event_type=HistoryEventType.TaskFailed,
                            event_details=cast(
                                EventDetails,
                                {
                                    "taskFailedEventDetails": TaskFailedEventDetails(
                                        error="States.TaskFailed", cause=f"Job {job['metadata']['name']} failed"
                                    )
                                },
                            ),
                        )
                    )
                if args[0] == "validate" and emulator.verdict is not None:
                    run_id = args[args.index("--run-id") + 1]
                    emulator.s3.put_object(
                        Bucket=emulator.bucket,
                        Key=f"runs/{run_id}/verdict.json",
                        Body=json.dumps(emulator.verdict).encode(),
                    )
                env.stack.append(
                    {
                        "ResponseBody": {
                            "metadata": {"name": job["metadata"]["name"], "uid": f"uid-{len(emulator.jobs)}"},
                            "status": {"succeeded": job["spec"]["completions"]},
                        }
                    }
                )

        super().__enter__()  # starts the patch list; moto parses the definition per execution
        self._patch(
            state_task_factory,
            "state_task_service_for",
            lambda service_name: EmulatedRunJob() if service_name == "eks" else original(service_name),
        )
        return self

    def _create(self, kind: str, name: str) -> dict[str, str]:
        if kind == "AWS::EKS::Cluster":  # only its name, endpoint and CA reach the definition
            return {
                "Ref": name,
                "Arn": f"arn:aws:eks:{REGION}:123456789012:cluster/{name}",
                "Endpoint": "https://eks.example",
                "CertificateAuthorityData": "Q0E=",
            }
        return super()._create(kind, name)

    def template_retries(self, state: str) -> int:
        """MaxAttempts of the pipeline's retry of a failed job attempt on `state`."""
        definition = json.loads(self.definition)
        retry = definition["States"][state]["Retry"]
        return next(
            r["MaxAttempts"] for r in retry if {"States.TaskFailed", "TrainingAttemptFailed"} & set(r["ErrorEquals"])
        )


@pytest.fixture(scope="module")
def world(synth):
    with emulated_account(synth(**EKS_VARIANT), EksEmulator) as emulated:
        yield emulated


@pytest.fixture
def emulator(world):
    """The shared emulator, reset between tests: no plan, no recorded jobs, no messages, no approval."""
    return cleared(world)


# Happy path on EKS: sanity, train and validate run as Indexed Jobs on the run's nodes; the model is approved.
def test_happy_path_on_eks_approves_the_model(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    phases = [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]
    assert phases == ["sanity", "train", "validate"]
    train = emulator.jobs[1]
    assert train["spec"]["completions"] == train["spec"]["parallelism"] == RUN["nodes"]
    args = train["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--run-id") + 1] == RUN["run_id"]
    assert approval(emulator)["run_id"] == RUN["run_id"]
    assert [m["outcome"] for m in messages(emulator)] == ["APPROVED"]


# A training Job that keeps failing is retried by the pipeline's Retry, then fails the run with TrainingFailed.
def test_failing_training_is_retried_then_fails_the_run(emulator):
    emulator.outcomes = {"train": [False]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-002"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    phases = [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]
    assert phases[0] == "sanity" and phases.count("train") == 1 + emulator.template_retries("Train")
    assert [m["outcome"] for m in messages(emulator)] == ["FAILED"]


# A request the API server refuses (here 403: the state machine's role has no access entry) ends the run at once,
# naming the error: resubmitting cannot help, and every retry's backoff would keep the nodes up.
def test_a_refused_job_request_is_not_retried(emulator):
    emulator.outcomes = {"train": ["EKS.403"]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-003"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    assert "EKS.403: refused" in result["cause"]
    phases = [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]
    assert phases == ["sanity", "train"]
