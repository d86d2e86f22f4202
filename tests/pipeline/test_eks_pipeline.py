"""The pipeline on the EKS backend: the synthesized definition run by moto's ASL interpreter (tests/sfn_emulator.py).

moto has no EKS service integration, so `eks:runJob.sync` is emulated here: the Job is recorded and completes at
once, or fails as `outcomes` plans (a succeeding validate Job writes its verdict, like the real one). The cluster
and its node groups are moto's EKS, which the pipeline's own states size (eks:updateNodegroupConfig through the AWS
SDK integration): each Job records the node groups' desired sizes when it was submitted.
"""

import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast

import boto3
import pytest
from moto.eks.models import eks_backends
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

from config import load_config
from constructs.compute.eks.node_lease import LEASE_PREFIX
from constructs.compute.eks.node_scaling import HOLD_TAG
from tests.pipeline.runs import (
    ACCEPTED,
    REGISTERED_DDP,
    RUN,
    WORKLOAD_IMAGE,
    approval,
    cleared,
    emulated_account,
    messages,
    register,
    run_item,
)
from tests.sfn_emulator import ACCOUNT, REGION, ROLE_ARN, Emulator
from tests.synthesis import context

DDP, IMAGE = REGISTERED_DDP, WORKLOAD_IMAGE  # registered after the deploy by the tests that run it
EKS_VARIANT = {"compute": "eks", "instance_type": "p4d.24xlarge"}
# Both tests on one xdist worker: the emulated account (an EKS app loaded into moto) is set up once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eks-pipeline")]


def auto_scaling_group(in_service: int, pending: int = 0) -> dict:
    """DescribeAutoScalingGroups' answer for the training node group's group (EC2 Auto Scaling API reference)."""
    instances = [
        {"InstanceId": f"i-{index:017x}", "AvailabilityZone": "us-east-1a", "LifecycleState": state,
         "HealthStatus": "Healthy", "ProtectedFromScaleIn": False}
        for index, state in enumerate(["InService"] * in_service + ["Pending"] * pending)
    ]  # fmt: skip
    return {"AutoScalingGroups": [{
        "AutoScalingGroupName": "eks-training-1", "MinSize": 0, "MaxSize": 4, "DesiredCapacity": in_service + pending,
        "DefaultCooldown": 300, "AvailabilityZones": ["us-east-1a"], "HealthCheckType": "EC2",
        "CreatedTime": "2026-11-27T08:00:00Z", "Instances": instances,
    }]}  # fmt: skip


def failed_launches(message: str, minutes_from_now: int = 5) -> dict:
    """DescribeScalingActivities' answer, newest first: a failed launch with EC2's message (started this many minutes
    from now: after the wait began, or, negative, before it), after an older success."""
    started = (datetime.now(UTC) + timedelta(minutes=minutes_from_now)).strftime("%Y-%m-%dT%H:%M:%SZ")
    activity = {"AutoScalingGroupName": "eks-training-1", "Cause": "a user request update of the desired capacity",
                "StartTime": started, "Progress": 100}  # fmt: skip
    return {"Activities": [
        {**activity, "ActivityId": "a-2", "StatusCode": "Failed", "StatusMessage": message},
        {**activity, "ActivityId": "a-1", "StatusCode": "Successful", "StartTime": "2026-01-05T08:05:00Z"},
    ]}  # fmt: skip


# EC2's words for a launch refused for capacity (EC2 Auto Scaling user guide, "Troubleshoot: EC2 instance launch
# failures", Insufficient capacity), as a scaling activity's StatusMessage carries them.
NO_P4D = (
    "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a). "
    "Our system will be working on provisioning additional capacity. Launching EC2 instance failed."
)


# An outcome: the Job's pod was disrupted (its node lost: DisruptionTarget), not failed by its container's exit code.
NODE_LOST = "node lost"


def failed_job(job: dict, outcome: bool | int | str) -> str:
    """A failed Job as the API server returns it (the task's Cause: assumed, Step Functions does not document it):
    an exit code the first matching FailJob rule of its own pod failure policy names fails it with the Job
    controller's message (contracts/eks/job_templates.py POD_FAILURE_POLICY; the validate Job's further rules,
    constructs/compute/eks/job_runner.py VALIDATION_FAILURE_RULES); any other failure, or a pod lost with its node
    (`NODE_LOST`, counted), reaches the backoff limit (0)."""
    code = None if outcome == NODE_LOST else 1 if outcome is False else int(outcome)
    name = job["metadata"]["name"]
    reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    # The rules in order, the first match wins; a lost pod matches no exit-code rule (counted either way).
    exit_rules = [] if code is None else job["spec"]["podFailurePolicy"]["rules"]
    for index, rule in enumerate(exit_rules):
        codes = rule.get("onExitCodes")
        if codes is None or (code in codes["values"]) != (codes["operator"] == "In"):
            continue
        if rule["action"] == "FailJob":
            reason = "PodFailurePolicy"
            message = (
                f"Container node for pod efa-training/{name}-0-x7k2p failed with exit code {code} "
                f"matching FailJob rule at index {index}"
            )
        break
    condition = {"type": "Failed", "status": "True", "reason": reason, "message": message}
    return json.dumps({**job, "status": {"failed": 1, "conditions": [condition]}})


@dataclass
class EksEmulator(Emulator):
    jobs: list[dict] = field(default_factory=list)  # every Job eks:runJob.sync was asked to run
    sizes_at_jobs: list[dict[str, int]] = field(default_factory=list)  # node group -> desired, per Job submitted
    resizes: list[tuple[str, int]] = field(default_factory=list)  # (node group, desired) per UpdateNodegroupConfig
    # Kubernetes nodes by name, as the API server holds them; every eks:call (method, path, body) on them
    nodes: dict[str, dict] = field(default_factory=dict)
    node_calls: list[tuple[str, str, dict | None]] = field(default_factory=list)
    # The API server's answer to a PUT of these nodes, by name: an eks:call error (e.g. "EKS.409", a Conflict)
    refused_puts: dict[str, str] = field(default_factory=dict)
    _cluster: str = ""

    def node_call(self, request: dict) -> dict | str:
        """eks:call's answer for GET or PUT /api/v1/nodes/<name> (Step Functions developer guide, "Call Amazon
        EKS": the API server's reply in ResponseBody), or the error eks:call names: EKS.404 for an unknown node, a
        refused PUT's (`refused_puts`)."""
        method, path, body = request["Method"], request["Path"], request.get("RequestBody")
        self.node_calls.append((method, path, body))
        name = path.removeprefix("/api/v1/nodes/")
        if name not in self.nodes:
            return "EKS.404"
        if method == "PUT" and name in self.refused_puts:
            return self.refused_puts[name]
        if method == "PUT":
            self.nodes[name] = dict(body or {})
        return {"ResponseBody": self.nodes[name], "StatusCode": 200}

    def reset(self) -> None:
        super().reset()
        # The training node group's instances, all in service as a run starts its jobs (constructs/compute/eks/
        # node_wait.py reads them before each multi-node job); a test that wants a shortage answers otherwise.
        self.answers["autoscaling.describe_auto_scaling_groups"] = auto_scaling_group(in_service=4)
        self.jobs.clear()
        self.sizes_at_jobs.clear()
        self.resizes.clear()
        self.nodes.clear()
        self.node_calls.clear()
        self.refused_puts.clear()
        for group in self.eks.list_nodegroups(clusterName=self._cluster)["nodegroups"]:  # as a deploy leaves them
            self.eks.update_nodegroup_config(
                clusterName=self._cluster, nodegroupName=group, scalingConfig={"desiredSize": 0}
            )

    def check_request(self, service: str, operation: str, request: dict) -> None:
        super().check_request(service, operation, request)
        if operation == "UpdateNodegroupConfig":
            self.resizes.append((request["nodegroupName"], request["scalingConfig"]["desiredSize"]))

    @property
    def eks(self):
        return boto3.client("eks", region_name=REGION)

    def node_sizes(self) -> dict[str, int]:
        """Desired size per node group, by role: "training" or "validation" (from the node group's logical id)."""
        sizes = {}
        for name in self.eks.list_nodegroups(clusterName=self._cluster)["nodegroups"]:
            group = self.eks.describe_nodegroup(clusterName=self._cluster, nodegroupName=name)["nodegroup"]
            sizes["validation" if "validation" in name else "training"] = group["scalingConfig"]["desiredSize"]
        return sizes

    def __enter__(self) -> "EksEmulator":
        emulator, original = self, state_task_factory.state_task_service_for

        class EmulatedRunJob(StateTaskService):
            def _validate_service_integration_is_supported(self):
                pass

            def _eval_service_task(self, env, resource_runtime_part, normalised_parameters, state_credentials):
                if self.resource.api_action == "call":  # eks:call on a node: the pipeline's quarantine
                    answer = emulator.node_call(normalised_parameters)
                    if isinstance(answer, str):  # the API server's error status: eks:call names it
                        raise FailureEventException(
                            FailureEvent(
                                env=env,
                                error_name=CustomErrorName(answer),
                                event_type=HistoryEventType.TaskFailed,
                                event_details=cast(
                                    EventDetails,
                                    {"taskFailedEventDetails": TaskFailedEventDetails(error=answer, cause="none")},
                                ),
                            )
                        )
                    env.stack.append(answer)
                    return
                # Not checked against an API model: eks:runJob's request is a Kubernetes batch/v1 Job manifest and the
                # cluster's name, endpoint and CA (no botocore shape). The pipeline's other requests (S3, SSM, SNS)
                # are checked by the emulator's client hook like on any backend.
                job = normalised_parameters["Job"]
                emulator.jobs.append(job)
                emulator.sizes_at_jobs.append(emulator.node_sizes())
                args = job["spec"]["template"]["spec"]["containers"][0]["args"]
                held = emulator.held.get(args[0])
                if (
                    held is not None
                    and sum(
                        1 for j in emulator.jobs if j["spec"]["template"]["spec"]["containers"][0]["args"][0] == args[0]
                    )
                    == 1
                ):
                    held.wait(timeout=60)
                plan = emulator.outcomes.get(args[0], [True])
                attempt = (
                    sum(
                        1 for j in emulator.jobs if j["spec"]["template"]["spec"]["containers"][0]["args"][0] == args[0]
                    )
                    - 1
                )
                outcome = plan[min(attempt, len(plan) - 1)]
                if "--run-id" in args:  # hosts the job names bad before it ends, as a training container does
                    emulator.record_bad_hosts(args[0], attempt, str(args[args.index("--run-id") + 1]))
                if isinstance(outcome, str) and outcome != NODE_LOST:  # the API server's error: eks:runJob names it
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
                                        error="States.TaskFailed", cause=failed_job(job, outcome)
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

    def _create(self, kind: str, name: str, properties: dict | None = None) -> dict[str, str]:
        if kind == "AWS::EKS::Cluster":  # its name, endpoint and CA reach the definition; moto holds the node groups
            self.eks.create_cluster(name=name, roleArn=ROLE_ARN, resourcesVpcConfig={"subnetIds": ["subnet-1"]})
            self._cluster = name
            return {
                "Ref": name,
                "Arn": f"arn:aws:eks:{REGION}:123456789012:cluster/{name}",
                "Endpoint": "https://eks.example",
                "CertificateAuthorityData": "Q0E=",
            }
        if kind == "AWS::EKS::Nodegroup":  # scaled by the pipeline: moto's, sized 0 as deployed
            group = self.eks.create_nodegroup(
                clusterName=self._cluster,
                nodegroupName=name,
                nodeRole=ROLE_ARN,
                subnets=["subnet-1"],
                scalingConfig={"minSize": 0, "maxSize": 4, "desiredSize": 0},
            )["nodegroup"]
            return {"Ref": f"{self._cluster}/{name}", "NodegroupName": name, "Arn": group["nodegroupArn"]}
        if kind == "AWS::StepFunctions::StateMachine":  # the pipeline, named by the reconciler
            return {"Ref": self.state_machine_arn, "Name": self.name}
        return super()._create(kind, name, properties)

    def _resource(self, template: dict, logical: str) -> dict[str, str]:
        resource = template["Resources"][logical]
        if resource["Type"] == "AWS::EKS::Nodegroup":  # its cluster first
            self.resolve(resource["Properties"]["ClusterName"], template)
        return super()._resource(template, logical)

    def reconciler(self) -> str:
        """The reconciler's state machine, created in moto from the pipeline stack's template (its other machine)."""
        existing = [m for m in self.sfn.list_state_machines()["stateMachines"] if m["name"] == "reconciler"]
        if existing:
            return existing[0]["stateMachineArn"]
        machine = next(
            r
            for r in self.template["Resources"].values()
            if r["Type"] == "AWS::StepFunctions::StateMachine" and "StateMachineName" not in r["Properties"]
        )
        definition = self.resolve(machine["Properties"]["DefinitionString"])
        return self.sfn.create_state_machine(name="reconciler", definition=definition, roleArn=ROLE_ARN)[
            "stateMachineArn"
        ]

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


# A declared workload's train and validate pods run its image with its declaration; its hyperparameters go whole,
# as JSON, to the launcher (docs/workloads.md); the sanity check is the platform's, on the same nodes.
def test_a_declared_workload_runs_its_own_image_on_eks(emulator):
    emulator.verdict = {**ACCEPTED, "metric": "eval_loss"}
    register(emulator, "torch-ddp", DDP)
    run = {**RUN, "workload": "torch-ddp", "hyperparameters": {"lr": 0.1}}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    containers = [job["spec"]["template"]["spec"]["containers"][0] for job in emulator.jobs]
    assert [c["args"][0] for c in containers] == ["sanity", "train", "validate"]
    sanity, train, validate = containers
    assert train["image"] == validate["image"] == IMAGE != sanity["image"]
    for container in (train, validate):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert json.loads(env["WORKLOAD"])["name"] == "torch-ddp"
        args = container["args"]
        assert json.loads(args[args.index("--hyperparameters") + 1]) == {
            "lr": 0.1,
            "max_steps": 200,
            "checkpoint_every": 20,
        }
    assert "WORKLOAD" not in {e["name"] for e in sanity["env"]}
    assert approval(emulator)["verdict"]["metric"] == "eval_loss"


# A training Job that keeps failing is retried by the pipeline's Retry, then fails the run with TrainingFailed.
def test_failing_training_is_retried_then_fails_the_run(emulator):
    emulator.outcomes = {"train": [False]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-002"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    phases = [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]
    assert phases[0] == "sanity" and phases.count("train") == 1 + emulator.template_retries("Train")
    assert [m["outcome"] for m in messages(emulator)] == ["FAILED"]


# A pod that exits with a refusal's code (2: bad input) fails its Job through the pod failure policy, whose message
# names the code: the run ends TrainingRefused at the first attempt, as on Batch, instead of booting every node again.
def test_a_training_that_refuses_the_run_is_not_retried_on_eks(emulator):
    emulator.outcomes = {"train": [2]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-refused"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    assert "exited with 2: the run itself failed" in result["cause"]
    assert _phases(emulator) == ["sanity", "train"]


# Exit 7: the training saved and stopped before its reservation ends; resumable, not retried (ReservationEnded).
def test_a_training_stopped_for_its_reservations_end_ends_the_run_resumable_on_eks(emulator):
    emulator.outcomes = {"train": [7]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-window"})
    assert result["status"] == "FAILED" and result["error"] == "ReservationEnded", result
    assert _phases(emulator) == ["sanity", "train"]
    assert emulator.node_sizes()["training"] == 0  # released like any ending


# Before each multi-node job, the training nodes: a run waits while they come up (a Wait per poll, not a Job at its
# deadline), then submits; here two polls find 1 of 2 nodes in service, the third both.
def test_the_pipeline_waits_for_the_training_nodes_before_a_multi_node_job(emulator):
    emulator.answers["autoscaling.describe_auto_scaling_groups"] = [
        auto_scaling_group(in_service=0, pending=2), auto_scaling_group(in_service=1, pending=1),
        auto_scaling_group(in_service=2),
    ]  # fmt: skip
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "gpt-tiny-nodes"})["status"] == "SUCCEEDED"
    assert emulator.waits == [60, 60]  # then sanity, and training on nodes already up
    assert _phases(emulator) == ["sanity", "train", "validate"]
    assert emulator.refused_requests == []  # DescribeNodegroup, DescribeAutoScalingGroups checked by botocore's models


# Nodes EC2 cannot launch for capacity: no Job is submitted; the stage asks again every CAPACITY_RETRY_MINUTES without
# spending an attempt, then the run ends CapacityUnavailable with EC2's words, and its nodes are released.
def test_training_nodes_ec2_cannot_launch_end_the_run_capacity_unavailable(emulator):
    emulator.answers["autoscaling.describe_auto_scaling_groups"] = auto_scaling_group(in_service=1, pending=1)
    emulator.answers["autoscaling.describe_scaling_activities"] = failed_launches(NO_P4D)
    result = emulator.run({**RUN, "run_id": "gpt-tiny-short"})
    assert result["status"] == "FAILED" and result["error"] == "CapacityUnavailable", result
    assert (
        "not in service after 20 minutes (1 of 2)" in result["cause"] and "sufficient p4d.24xlarge" in result["cause"]
    )
    assert emulator.jobs == []
    retries = load_config(context(**EKS_VARIANT)).capacity_retries
    assert len(emulator.waits) == 20 * (1 + retries) and emulator.retry_sleeps.count(300) == retries
    assert emulator.node_sizes()["training"] == 0


# While the stage waits for capacity, nobody trains: the nodes that did launch are released at each shortage (an idle
# p5 costs its hourly price through every CAPACITY_RETRY_MINUTES), and each try sizes the group again.
def test_nodes_that_came_are_released_while_the_run_waits_for_the_rest(emulator):
    emulator.answers["autoscaling.describe_auto_scaling_groups"] = auto_scaling_group(in_service=1, pending=1)
    emulator.answers["autoscaling.describe_scaling_activities"] = failed_launches(NO_P4D)
    result = emulator.run({**RUN, "run_id": "gpt-tiny-idle"})
    assert result["status"] == "FAILED" and result["error"] == "CapacityUnavailable", result
    training = [size for group, size in emulator.resizes if "validation" not in group]
    tries = 1 + load_config(context(**EKS_VARIANT)).capacity_retries
    # sized for the run, then per try: released at the shortage, sized again by the next try (the run's release at its
    # end finds the group at 0 already)
    assert training == [2] + [0, 2] * (tries - 1) + [0], training


# Nodes that fail for another reason (here a launch template the type cannot use) fail the attempt with the message.
def test_training_nodes_that_fail_otherwise_fail_the_attempt_with_its_message(emulator):
    emulator.answers["autoscaling.describe_auto_scaling_groups"] = auto_scaling_group(in_service=0)
    emulator.answers["autoscaling.describe_scaling_activities"] = failed_launches(
        "The requested configuration is currently not supported. Launching EC2 instance failed."
    )
    result = emulator.run({**RUN, "run_id": "gpt-tiny-broken"})
    assert result["status"] == "FAILED" and result["error"] == "SanityCheckFailed", result
    assert "currently not supported" in result["cause"] and emulator.jobs == []


# A capacity failure from before this wait (an earlier run's) says nothing of this one: the attempt fails as nodes
# not in service with no failed launch since the wait began, not as a shortage waited for hours.
def test_an_older_launch_failure_does_not_decide_this_wait(emulator):
    emulator.answers["autoscaling.describe_auto_scaling_groups"] = auto_scaling_group(in_service=0, pending=2)
    emulator.answers["autoscaling.describe_scaling_activities"] = failed_launches(NO_P4D, minutes_from_now=-60)
    result = emulator.run({**RUN, "run_id": "gpt-tiny-stale"})
    assert result["status"] == "FAILED" and result["error"] == "SanityCheckFailed", result
    assert "no failed launch reported since the wait began" in result["cause"]


# The wait only advises: Auto Scaling's reads denied (an SCP, say) submit the job as before the wait existed.
def test_a_node_wait_that_cannot_read_the_group_submits_the_job(emulator):
    emulator.faults["autoscaling.describe_auto_scaling_groups"] = ["AccessDenied"] * 20
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "gpt-tiny-unread"})["status"] == "SUCCEEDED"
    assert _phases(emulator) == ["sanity", "train", "validate"] and emulator.waits == []


# A request the API server refuses (here 403: the state machine's role has no access entry) ends the run at once,
# naming the error: resubmitting cannot help, and every retry's backoff would keep the nodes up.
def test_a_refused_job_request_is_not_retried(emulator):
    emulator.outcomes = {"train": ["EKS.403"]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-003"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    assert "EKS.403: refused" in result["cause"]
    phases = [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]
    assert phases == ["sanity", "train"]


def _phases(emulator) -> list[str]:
    return [job["spec"]["template"]["spec"]["containers"][0]["args"][0] for job in emulator.jobs]


def _start(emulator, run: dict, name: str) -> str:
    return emulator.sfn.start_execution(stateMachineArn=emulator.state_machine_arn, name=name, input=json.dumps(run))[
        "executionArn"
    ]


def _wait_for_job(emulator, phase: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while phase not in _phases(emulator):
        assert time.monotonic() < deadline, f"no {phase} Job after {timeout}s"
        time.sleep(0.05)


# The pipeline sizes the node groups itself: the run's nodes for sanity and training, then the training nodes down
# and one validation node up for validation, then none; the validation Job asks for one accelerator and no EFA.
def test_the_pipeline_sizes_the_node_groups_for_each_stage(emulator):
    emulator.verdict = ACCEPTED
    result = emulator.run({**RUN, "run_id": "gpt-tiny-010"})
    assert result["status"] == "SUCCEEDED", result
    assert _phases(emulator) == ["sanity", "train", "validate"]
    training = {"training": RUN["nodes"], "validation": 0}
    assert emulator.sizes_at_jobs == [training, training, {"training": 0, "validation": 1}]
    assert emulator.node_sizes() == {"training": 0, "validation": 0}
    pod = emulator.jobs[2]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.4xlarge"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "128Gi"}


# A failed run releases its nodes on the failure path, before the alert: nothing is left running.
def test_a_failed_run_leaves_no_nodes_up(emulator):
    emulator.outcomes = {"train": [False]}
    result = emulator.run({**RUN, "run_id": "gpt-tiny-011"})
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed", result
    assert max(size for _, size in emulator.resizes) == RUN["nodes"]
    assert emulator.node_sizes() == {"training": 0, "validation": 0}


# A run refused a second after it started (its run id is taken) never sized a node group.
def test_a_run_refused_at_its_start_never_sizes_a_node_group(emulator):
    emulator.verdict = ACCEPTED
    assert emulator.run({**RUN, "run_id": "gpt-tiny-012"})["status"] == "SUCCEEDED"
    emulator.resizes.clear()
    result = emulator.run({**RUN, "run_id": "gpt-tiny-012"}, name="again")
    assert result["status"] == "FAILED" and result["error"] == "InvalidInput", result
    assert emulator.resizes == [] and emulator.node_sizes() == {"training": 0, "validation": 0}


def _lease(emulator) -> dict[str, str] | None:
    """The node groups' lease in the runs table (constructs/compute/eks/node_lease.py), strongly consistent."""
    return run_item(emulator, f"{LEASE_PREFIX}dev")


def _holder(emulator) -> str | None:
    """The execution holding the lease, if any."""
    return (_lease(emulator) or {}).get("execution")


def _trained(emulator) -> list[str]:
    """The run id of every training Job submitted."""
    return [args[args.index("--run-id") + 1] for j in emulator.jobs
            if (args := j["spec"]["template"]["spec"]["containers"][0]["args"])[0] == "train"]  # fmt: skip


# Two starts back to back: the lease (a conditional PutItem; ListExecutions "is eventually consistent", Step
# Functions API reference) lets exactly one through; the other is refused in one line naming the holder, and the
# holder's nodes stay up while it trains on to approval.
def test_two_starts_back_to_back_one_trains_the_other_is_refused_naming_the_holder(emulator):
    emulator.verdict = ACCEPTED
    emulator.held["train"] = threading.Event()
    arns = {run_id: _start(emulator, {**RUN, "run_id": run_id}, run_id) for run_id in ("gpt-tiny-013", "gpt-tiny-014")}
    try:
        _wait_for_job(emulator, "train")
        (holder,) = _trained(emulator)
        (other,) = set(arns) - {holder}
        refused = emulator.wait(arns[other])
        assert refused["status"] == "FAILED" and refused["error"] == "InvalidInput", refused
        assert f"execution {arns[holder]} holds them" in refused["cause"] and "\n" not in refused["cause"]
        assert _holder(emulator) == arns[holder]
        assert emulator.node_sizes()["training"] == RUN["nodes"]
    finally:
        emulator.held["train"].set()
    assert emulator.wait(arns[holder])["status"] == "SUCCEEDED"
    assert _trained(emulator) == [holder] and run_item(emulator, other) is None  # the refused one claimed nothing


# The lease is given back at every ending: after validation on success, on the failure path, and before a refusal
# of the run id (a DeleteItem conditioned on this execution holding it: DynamoDB API reference, DeleteItem).
@pytest.mark.parametrize(
    ("outcomes", "again", "error"),
    [({}, False, None), ({"train": [False]}, False, "TrainingFailed"), ({}, True, "InvalidInput")],
    ids=["success", "failure", "refused-after-the-lease"],
)
def test_the_lease_is_given_back_at_every_ending(emulator, outcomes, again, error):
    emulator.verdict = ACCEPTED
    run = {**RUN, "run_id": "gpt-tiny-lease"}
    if again:  # the run id already names a run: refused by the claim, after the lease was taken
        assert emulator.run(run, name="first")["status"] == "SUCCEEDED"
    emulator.outcomes = outcomes
    result = emulator.run(run, name="ending")
    assert result["status"] == ("FAILED" if error else "SUCCEEDED") and result.get("error") == error, result
    taken = [e for e in emulator.history(result["executionArn"]) if e["type"] == "TaskStateExited"
             and e["stateExitedEventDetails"]["name"] == "TakeNodeLease"]  # fmt: skip
    assert taken and _lease(emulator) is None


# A lease left by an execution that was stopped (it runs no more states) is taken over by the next run, which
# describes the holder first: not RUNNING, so the lease is its own (a PutItem conditioned on the holder read).
# DescribeExecution "is eventually consistent" (Step Functions API reference): only an ended holder is taken over.
def test_a_stale_lease_of_a_stopped_execution_is_taken_over(emulator):
    emulator.verdict = ACCEPTED
    emulator.held["train"] = threading.Event()
    stopped = _start(emulator, {**RUN, "run_id": "gpt-tiny-015"}, "to-stop")
    try:
        _wait_for_job(emulator, "train")
        emulator.sfn.stop_execution(executionArn=stopped)
    finally:
        emulator.held["train"].set()
    assert emulator.wait(stopped)["status"] == "ABORTED" and _holder(emulator) == stopped
    result = emulator.run({**RUN, "run_id": "gpt-tiny-016"}, name="next")
    assert result["status"] == "SUCCEEDED", result
    assert _trained(emulator) == ["gpt-tiny-015", "gpt-tiny-016"] and _lease(emulator) is None


# An aborted execution runs no more states, so its lease and nodes stay until the reconciler (every 5 minutes and on
# every ended execution) finds the lease's holder no longer RUNNING: it releases the lease, then the nodes; while the
# holder runs, the reconciler leaves both alone.
def test_the_reconciler_releases_an_aborted_runs_lease_and_nodes_and_no_running_ones(emulator):
    emulator.held["train"] = threading.Event()
    running = _start(emulator, {**RUN, "run_id": "gpt-tiny-017"}, "to-abort")
    reconciler = emulator.reconciler()
    try:
        _wait_for_job(emulator, "train")
        arn = emulator.sfn.start_execution(stateMachineArn=reconciler, name="while-running")["executionArn"]
        assert emulator.wait(arn)["status"] == "SUCCEEDED"
        assert emulator.node_sizes()["training"] == RUN["nodes"] and _holder(emulator) == running
        emulator.sfn.stop_execution(executionArn=running)
    finally:
        emulator.held["train"].set()
    assert emulator.wait(running)["status"] == "ABORTED"
    assert emulator.node_sizes()["training"] == RUN["nodes"] and _lease(emulator) is not None
    arn = emulator.sfn.start_execution(stateMachineArn=reconciler, name="after-abort")["executionArn"]
    assert emulator.wait(arn)["status"] == "SUCCEEDED"
    assert _lease(emulator) is None and emulator.node_sizes() == {"training": 0, "validation": 0}


# Jobs run by hand (docs/eks.md): a node group tagged HoldUntil with a later time keeps its nodes through the
# reconciler; once that time has passed, the next reconciliation brings it to 0.
def test_a_node_group_held_by_hand_is_left_up_until_its_hold_ends(emulator):
    (training,) = [
        n for n in emulator.eks.list_nodegroups(clusterName=emulator._cluster)["nodegroups"] if "validation" not in n
    ]
    emulator.eks.update_nodegroup_config(
        clusterName=emulator._cluster, nodegroupName=training, scalingConfig={"desiredSize": 2}
    )
    reconciler = emulator.reconciler()
    for hold, left_up in (("2999-01-01T00:00:00Z", 2), ("2001-01-01T00:00:00Z", 0)):
        # moto 5.2's TagResource finds clusters only: the tag goes on its node group model, as TagResource would.
        eks_backends[ACCOUNT][REGION].clusters[emulator._cluster].nodegroups[training].tags[HOLD_TAG] = hold
        run = emulator.sfn.start_execution(stateMachineArn=reconciler, name=f"hold-{left_up}")["executionArn"]
        assert emulator.wait(run)["status"] == "SUCCEEDED"
        assert emulator.node_sizes()["training"] == left_up


def _node(emulator, name: str) -> str:
    """A node of the accelerator node group, its instance in moto's EC2 with the launch template's tags."""
    ec2 = boto3.client("ec2", region_name=REGION)
    tags = [{"Key": "Project", "Value": "efa-training"}, {"Key": "Environment", "Value": "dev"}]
    (instance,) = ec2.run_instances(
        ImageId=ec2.describe_images()["Images"][0]["ImageId"], MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"]  # fmt: skip
    taint = {"key": "efa-training/accelerator", "value": "true", "effect": "NoSchedule"}
    emulator.nodes[name] = {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "7"},
        "spec": {"providerID": f"aws:///{REGION}a/{instance['InstanceId']}", "taints": [taint]},
    }  # fmt: skip
    return instance["InstanceId"]


def test_a_node_the_training_named_bad_is_cordoned_tainted_and_replaced_before_the_retry(emulator):
    # Cordoned (spec.unschedulable, what kubectl cordon sets) and tainted, its own taints kept; then its instance
    # is terminated so that the node group's Auto Scaling group launches a fresh one for the retry.
    emulator.verdict = ACCEPTED
    name = "ip-10-0-1-17.ec2.internal"
    instance = _node(emulator, name)
    emulator.outcomes = {"train": [False, True]}
    emulator.bad_hosts = {"train": [[name]]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert [(method, path) for method, path, _ in emulator.node_calls] == [
        ("GET", f"/api/v1/nodes/{name}"), ("PUT", f"/api/v1/nodes/{name}")
    ]  # fmt: skip
    spec = emulator.nodes[name]["spec"]
    assert spec["unschedulable"] is True and emulator.nodes[name]["metadata"]["resourceVersion"] == "7"
    assert [t["key"] for t in spec["taints"]] == ["efa-training/accelerator", "efa-training/quarantined"]
    (reservation,) = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[instance])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")
    phases = [j["spec"]["template"]["spec"]["containers"][0]["args"][0] for j in emulator.jobs]
    assert phases == ["sanity", "train", "train", "validate"]


def test_a_node_already_gone_leaves_its_record_and_the_run_goes_on(emulator):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [False, True]}
    emulator.bad_hosts = {"train": [["ip-10-0-9-9.ec2.internal"]]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    kept = emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="bad-hosts/")["Contents"]
    assert [o["Key"] for o in kept] == ["bad-hosts/ip-10-0-9-9.ec2.internal"]


def test_the_quarantines_node_calls_retry_throttling_and_server_errors(emulator):
    # A throttled cordon would otherwise skip the node's termination too (the chain stops at the failed call).
    definition = json.loads(emulator.definition)
    calls = [
        state
        for branch in _all_states(definition)
        for state in branch
        if isinstance(state, dict) and str(state.get("Resource", "")).endswith("eks:call")
    ]
    assert calls and all("EKS.429" in state["Retry"][0]["ErrorEquals"] for state in calls)


def _all_states(node):
    """Every dict of states in a definition, nested branches and item processors included."""
    if isinstance(node, dict):
        if "States" in node:
            yield list(node["States"].values())
        for value in node.values():
            yield from _all_states(value)
    elif isinstance(node, list):
        for value in node:
            yield from _all_states(value)


# A workload registered after the deploy ends as the contract says on EKS too: exit 2 not retried, 143 (stopped on
# SIGTERM) an attempt failure retried, resuming.
@pytest.mark.parametrize("outcomes, status, trains", [([2], "FAILED", 1), ([143, True], "SUCCEEDED", 2)])
def test_a_registered_workloads_exit_codes_end_as_the_contract_says_on_eks(emulator, outcomes, status, trains):
    emulator.verdict = {**ACCEPTED, "metric": "eval_loss"}
    register(emulator, "torch-ddp", DDP)
    emulator.outcomes = {"train": outcomes}
    result = emulator.run({**RUN, "run_id": f"ddp-{trains}", "workload": "torch-ddp"})
    assert result["status"] == status, result
    assert _phases(emulator).count("train") == trains


def test_a_node_whose_cordon_fails_still_has_its_instance_terminated(emulator):
    # A PUT refused with 409 Conflict (the node changed between the GET and the PUT: the Kubernetes API's optimistic
    # concurrency on resourceVersion) leaves the node uncordoned, but its instance is terminated all the same: cordoned
    # or not, it would hold one of the node group's places and leave the retry's pods Pending.
    emulator.verdict = ACCEPTED
    name = "ip-10-0-1-18.ec2.internal"
    instance = _node(emulator, name)
    emulator.refused_puts = {name: "EKS.409"}
    emulator.outcomes = {"train": [False, True]}
    emulator.bad_hosts = {"train": [[name]]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert [(method, path) for method, path, _ in emulator.node_calls] == [
        ("GET", f"/api/v1/nodes/{name}"), ("PUT", f"/api/v1/nodes/{name}")
    ]  # fmt: skip
    assert "unschedulable" not in emulator.nodes[name]["spec"]
    (reservation,) = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[instance])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] in ("shutting-down", "terminated")
    kept = emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="bad-hosts/")["Contents"]
    assert [o["Key"] for o in kept] == [f"bad-hosts/{name}"]
    assert _phases(emulator) == ["sanity", "train", "train", "validate"]


# Validation is submitted once more when the platform failed it (its pod lost with its node, eks:runJob's 5xx: as on
# SageMaker and Batch), never when the validation did: a container exit code (2: refused; 1: its own error) or a
# request the API server refused.
@pytest.mark.parametrize(
    ("outcomes", "error", "validations"),
    [
        ([NODE_LOST, True], None, 2),
        (["EKS.503", True], None, 2),
        ([NODE_LOST, NODE_LOST], "ValidationJobFailed", 2),
        ([2], "ValidationJobFailed", 1),
        ([False], "ValidationJobFailed", 1),
        (["EKS.403"], "ValidationJobFailed", 1),
    ],
    ids=["node-lost", "api-503", "lost-twice", "refused", "exit-1", "api-403"],
)
def test_validation_is_retried_for_a_platform_failure_only(emulator, outcomes, error, validations):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"validate": outcomes}
    result = emulator.run({**RUN, "run_id": f"gpt-tiny-validate-{validations}"})
    assert result["status"] == ("FAILED" if error else "SUCCEEDED") and result.get("error") == error, result
    assert _phases(emulator) == ["sanity", "train", *["validate"] * validations]
    assert emulator.retry_sleeps.count(60) == (validations - 1)
