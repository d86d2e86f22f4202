"""EksJobRunner alone (the EKS side of the pipeline seam), and the hand-run templates k8s/render.py prints."""

import contextlib
import io
import json

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Template

from config import CATALOGUE
from constructs.compute.eks.job_runner import (
    VALIDATION_FAILED,
    VALIDATION_FAILURE_RULES,
    VALIDATION_PLATFORM_FAILED,
    EksJobRunner,
)
from contracts.eks.job_templates import NODE_NAME, indexed_job
from contracts.run import REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE, stages
from k8s import render
from tests.pipeline.runs import states
from tests.synthesis import ROOT

P5 = CATALOGUE["p5.48xlarge"]


def rendered(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert render.main(list(argv)) == 0
    return json.loads(out.getvalue())


def runner(stack: cdk.Stack | None = None) -> EksJobRunner:
    stack = stack or cdk.Stack()
    cluster = eks.Cluster.from_cluster_attributes(
        stack,
        "Cluster",
        cluster_name="training",
        cluster_endpoint="https://example",
        cluster_certificate_authority_data="ca",
    )
    return EksJobRunner(cluster=cluster, instance=P5, image="image:tag", max_nodes=4)


def machine_states(build) -> dict:
    """The states of a state machine made of what `build(stack)` returns, in a bare stack."""
    stack = cdk.Stack()
    sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(build(stack)))
    return states(Template.from_stack(stack).to_json())


# Pipeline parameters become launcher flags after the phase, resolved per execution.
def test_parameters_become_launcher_flags():
    job = runner().job_manifest(
        job="train",
        parameters={"run_id": "$.job.run_id", "max_steps": "$.job.max_steps"},
        job_name="$.name",
        nodes="$.run.nodes",
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args.$"] == "States.Array('train', '--run-id', $.job.run_id, '--max-steps', $.job.max_steps)"


# Multi-node jobs take the run's node count; every retry gets a fresh, DNS-safe name.
def test_node_count_and_fresh_name_per_submission():
    job = runner().job_manifest(job="sanity", parameters={}, job_name="$.name", nodes="$.run.nodes")
    assert job["spec"]["completions.$"] == job["spec"]["parallelism.$"] == "$.run.nodes"
    assert job["metadata"]["name.$"] == "States.Format('sanity-{}', States.UUID())"
    assert job["metadata"]["annotations"] == {"efa-training/job-name.$": "$.name"}


# Validation runs on one node whatever the run's size.
def test_validate_is_single_node():
    job = runner().job_manifest(job="validate", parameters={}, job_name="$.name", nodes="$.run.nodes")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1


# The Indexed Job gives the launcher MASTER_ADDR (rank 0's DNS name), MASTER_PORT and PET_NODE_RANK.
def test_indexed_job_sets_launcher_rendezvous():
    env = {
        v["name"]: v
        for v in indexed_job(P5, image="i", phase="train", nodes=2, name="x")["spec"]["template"]["spec"]["containers"][
            0
        ]["env"]
    }
    assert env["MASTER_ADDR"]["value"] == "$(JOB_NAME)-0.training-workers"
    assert "job-completion-index" in env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["ACCELERATORS_PER_NODE"]["value"] == str(P5.workers_per_node)


# Every pipeline pod learns its node's name from the downward API (Kubernetes docs, "Expose Pod Information to
# Containers Through Environment Variables": fieldRef spec.nodeName): a bad-host record names the node to cordon.
@pytest.mark.parametrize("job", ["sanity", "train", "validate"])
def test_every_pipeline_pod_knows_its_node_name(job):
    manifest = runner().job_manifest(job=job, parameters={}, job_name="$.name", nodes="$.run.nodes")
    env = {v["name"]: v for v in manifest["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[NODE_NAME] == {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


# k8s/render.py prints a TrainJob requesting every EFA interface of the chosen type.
def test_render_cli_prints_a_whole_node_trainjob():
    limits = rendered("train", "--instance-type", "trn1.32xlarge", "--image", "img")["spec"]["trainer"][
        "resourcesPerNode"
    ]["limits"]
    assert limits["vpc.amazonaws.com/efa"] == "8" and limits["aws.amazon.com/neuron"] == "16"


# The job's state is a plain eks:runJob.sync Task, so Job errors reach the pipeline's Retry and Catch unchanged.
def test_job_state_is_a_plain_run_job_task():
    stack = cdk.Stack()
    cluster = eks.Cluster.from_cluster_attributes(
        stack,
        "Cluster",
        cluster_name="training",
        cluster_endpoint="https://example",
        cluster_certificate_authority_data="ca",
    )
    runner_ = EksJobRunner(cluster=cluster, instance=P5, image="image:tag", max_nodes=4)
    state = stack.resolve(
        runner_.submit(
            stack,
            "Train",
            job="train",
            parameters={},
            job_name="$.name",
            nodes="$.run.nodes",
            result_path="$.jobs.train",
        ).to_state_json()
    )
    assert state["Type"] == "Task" and ":states:::eks:runJob.sync" in json.dumps(state["Resource"])
    assert state["ResultPath"] == "$.jobs.train" and "Catch" not in state


# The examples in k8s/examples are what k8s/render.py prints today (regenerate them when the pod spec changes).
def test_checked_in_examples_are_current():
    for phase in ("sanity", "train", "validate", "runtime"):
        current = rendered(phase, "--instance-type", "p5.48xlarge", "--nodes", "2", "--image", "<TRAINING_IMAGE_URI>")
        assert current == json.loads((ROOT / "k8s" / "examples" / f"p5.48xlarge-{phase}.json").read_text()), phase


# A Job that lost a pod is not restarted in place (backoffLimit 0): the runner refuses an attempts count rather
# than silently ignoring it, and says so to the pipeline (restarts_lost_hosts), which then passes none.
def test_runner_refuses_in_place_attempts():
    eks_runner = runner()
    assert eks_runner.restarts_lost_hosts is False
    with pytest.raises(ValueError, match="backoffLimit 0"):
        eks_runner.submit(cdk.Stack(), "Train", job="train", parameters={}, job_name="$.n", attempts="$.a")


@pytest.mark.parametrize("job", ["sanity", "train", "validate"])
def test_a_job_ends_itself_after_one_attempts_time(job):
    # activeDeadlineSeconds (Kubernetes docs, "Jobs") bounds one attempt, scale-up and image pull included, inside
    # its share of the state's wait: a hung collective is an attempt failure within hours, not 144-720 h of nodes.
    stage = stages(72)[job]
    manifest = runner().job_manifest(job=job, parameters={}, job_name="$.n", nodes="$.run.nodes")
    deadline = manifest["spec"]["activeDeadlineSeconds"]
    assert deadline == stage.deadline_seconds and stage.attempt_seconds < deadline < stage.state_seconds(1)


@pytest.mark.parametrize("job", ["sanity", "train", "validate"])
def test_a_run_ending_exit_code_fails_the_job_with_a_message_naming_it(job):
    # The pod failure policy's FailJob rule (Kubernetes docs, "Handling retriable and non-retriable pod failures with
    # Pod failure policy") puts the code in the Job's Failed condition, where the pipeline reads it
    # (constructs/pipeline/train_attempt.py EKS_EXIT_CODE): every refusal's code and the reservation's end, no other
    # (validation's further rules, after it: test_the_validate_job_fails_for_any_exit_code_of_its_own).
    manifest = runner().job_manifest(job=job, parameters={}, job_name="$.n", nodes="$.run.nodes")
    rule, *further = manifest["spec"]["podFailurePolicy"]["rules"]
    assert rule == {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 4, 5, 7]}}
    assert further == ([] if job != "validate" else list(VALIDATION_FAILURE_RULES))
    assert sorted({*REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE}) == [2, 4, 5, 7]
    assert manifest["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # the policy requires it


def test_the_validate_job_fails_for_any_exit_code_of_its_own():
    # After the run-ending codes' rule, in order (Kubernetes docs, "Jobs", Pod failure policy: the first rule that
    # matches decides): a pod disrupted by the platform (DisruptionTarget: its node lost, drained, evicted) is counted
    # (BackoffLimitExceeded: the platform's failure), and any other non-zero exit fails the Job with a message naming
    # the code (the validation's own failure).
    manifest = runner().job_manifest(job="validate", parameters={}, job_name="$.n", nodes="$.run.nodes")
    assert manifest["spec"]["podFailurePolicy"]["rules"][1:] == [
        {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
    ]


def _validate_block(stack: cdk.Stack) -> sfn.IChainable:
    return runner(stack).submit(stack, "Validate", job="validate", parameters={}, job_name="$.n", result_path="$.v")


def test_validation_is_retried_for_what_the_platform_failed_not_for_its_own_failure():
    # Like SageMaker's validation block: the Job's failure is read in a one-branch Parallel whose Retry names only the
    # platform's failure; a Job failed for its container's exit code (the pod failure policy's FailJob message), or a
    # request the API server refused, leaves it as ValidationJobFailed, not retried.
    block = machine_states(_validate_block)["Validate"]
    assert block["Type"] == "Parallel" and block["ResultPath"] == "$.v"
    (retry,) = block["Retry"]
    assert retry["ErrorEquals"] == [VALIDATION_PLATFORM_FAILED] and retry["MaxAttempts"] == 1
    (branch,) = block["Branches"]
    job, choice = branch["States"]["ValidateJob"], branch["States"]["ValidateIsPlatformFailure"]
    assert job["Catch"] == [
        {"ErrorEquals": ["States.TaskFailed"], "ResultPath": "$.caught", "Next": "ValidateIsPlatformFailure"}
    ]
    own = choice["Choices"][0]
    assert branch["States"][own["Next"]] == {"Type": "Fail", "Error": VALIDATION_FAILED, "CausePath": "$.caught.Cause"}
    assert branch["States"][choice["Default"]]["Error"] == VALIDATION_PLATFORM_FAILED
    matched = json.dumps(own)
    assert "*failed with exit code * matching FailJob rule*" in matched
    assert all(f'"StringEquals": "{error}"' in matched for error in EksJobRunner.rejected_errors)
    assert "EKS.503" not in matched  # the API server's 5xx is the platform's


def test_a_failed_cordon_still_terminates_the_instance():
    # A cordon refused (409 Conflict: the node changed between the GET and the PUT) or failed otherwise goes on to the
    # termination, its error beside `instance` (the instance id the termination reads): cordoned or not, the bad
    # node would hold one of the node group's places (quarantine_host).
    found = machine_states(lambda stack: runner(stack).quarantine_host(stack, "Q"))
    cordon = found["QCordon"]
    assert cordon["Next"] == "QTerminate"
    (catch,) = cordon["Catch"]
    assert catch["ErrorEquals"] == ["States.ALL"] and catch["Next"] == "QTerminate"
    assert catch["Output"] == "{% $merge([$states.input, {'not_cordoned': $states.errorOutput}]) %}"
    assert found["QTerminate"]["Parameters"] == {"InstanceIds.$": "States.Array($.instance)"}
    assert "Catch" not in found["QRead"]  # a node gone at the read: quarantine.py's catch moves its record
