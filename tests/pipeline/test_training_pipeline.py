"""TrainingPipeline alone, in a bare stack, on a Batch job runner with queues and job definitions of its own: the
definition's states, timeouts, retries and permissions. Its executions: test_pipeline.py (the dev app, in moto)."""

import json

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
import pytest
from aws_cdk.assertions import Match, Template

from config import CATALOGUE
from constructs.compute.backend import TRAINING, VALIDATION
from constructs.compute.batch.job_runner import BatchJobRunner
from constructs.compute.eks.job_runner import EksJobRunner
from constructs.compute.eks.node_lease import NodeLease
from constructs.compute.eks.node_scaling import EksNodeScaling, SizedGroup
from constructs.observability.alarms import MODEL_REJECTED_ERROR
from constructs.pipeline.training_pipeline import PipelineOptions, TrainingPipeline, TrainingRetry
from contracts.run import CAPACITY_RETRY_MINUTES, PHASES, QUEUE_WAIT_MINUTES, phases, stages, train_state_seconds
from tests.pipeline.runs import definition, states


def _runs_table(stack: cdk.Stack) -> dynamodb.Table:
    return dynamodb.Table(
        stack, "Runs", partition_key=dynamodb.Attribute(name="run_id", type=dynamodb.AttributeType.STRING)
    )


def _pipeline(
    *,
    train_attempt_hours: int = 72,
    on_demand_fallback: bool = True,
    max_nodes: int = 2,
    training_retry: TrainingRetry | None = None,
    capacity_retries: int = QUEUE_WAIT_MINUTES // CAPACITY_RETRY_MINUTES,  # the construct's default
) -> Template:
    stack = cdk.Stack()
    runner = BatchJobRunner(
        multi_node_queue="MultiNodeQueue",
        single_node_queue="SingleNodeQueue",
        job_definitions={kind: kind for kind in ("sanity", "train", "validate")},
        single_node_on_demand_queue="SingleNodeOnDemandQueue" if on_demand_fallback else None,
    )
    TrainingPipeline(
        stack,
        "Pipeline",
        environment="test",
        max_nodes=max_nodes,
        bucket=s3.Bucket(stack, "Data"),
        runs_table=_runs_table(stack),
        topic=sns.Topic(stack, "Alerts"),
        runner=runner,
        log_retention=logs.RetentionDays.TWO_WEEKS,
        removal_policy=cdk.RemovalPolicy.DESTROY,
        options=PipelineOptions(
            train_attempt_hours=train_attempt_hours,
            training_retry=training_retry or TrainingRetry(),
            capacity_retries=capacity_retries,
        ),
    )
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def pipeline() -> dict:
    return dict(_pipeline().to_json())


def test_every_task_has_a_timeout_and_a_catch(pipeline):
    # Every Task waits a bounded time and is caught (notify the alerts topic, then fail).
    found = states(pipeline)
    task_states = {name: s for name, s in found.items() if s["Type"] == "Task"}
    assert {
        "ReadVerdict",
        "CopyVerdictToModels",
        "PublishApprovedModel",
        "NotifyApproved",
        "NotifyRejected",
        "NotifyFailure",
    } <= set(task_states)
    for name, state in task_states.items():
        assert state.get("TimeoutSeconds"), name
        assert state.get("Catch"), name
    # Validation (Spot, then on-demand), the sanity check and training (their failures named by the exit code) are
    # one state from the outside, caught like every task; the job states inside have their timeouts.
    for block, timeout in (
        ("Validate", "TimeoutSeconds"),
        ("SanityCheck", "TimeoutSeconds"),
        ("Train", "TimeoutSecondsPath"),
    ):
        assert found[block]["Type"] == "Parallel" and found[block]["Catch"], block
        (branch,) = found[block]["Branches"]
        tasks = [inner for inner in branch["States"].values() if inner["Type"] == "Task"]
        jobs = [inner for inner in tasks if str(inner["Resource"]).endswith(".sync")]
        assert jobs and all(inner.get(timeout) for inner in jobs), block
        # the branch's other calls (the quarantine's listing of bad hosts) have their own fixed timeouts
        assert all(inner.get("TimeoutSeconds") for inner in tasks if inner not in jobs), block
    (train_branch,) = found["Train"]["Branches"]
    assert train_branch["States"]["TrainJob"]["TimeoutSecondsPath"] == "$.timeouts.train"


def test_validation_falls_back_to_the_on_demand_queue_when_spot_has_no_capacity(pipeline):
    # A failed Spot attempt is caught and the same job definition goes to the runner's on-demand queue.
    (branch,) = states(pipeline)["Validate"]["Branches"]
    on_spot, on_demand = branch["States"]["ValidateOnSpot"], branch["States"]["ValidateOnDemand"]
    assert branch["StartAt"] == "ValidateOnSpot"
    assert on_spot["Catch"][0] == {
        "ErrorEquals": ["States.TaskFailed"],
        "ResultPath": "$.spot_failure",
        "Next": "ValidateIsSpotFailureReadable",
    }
    assert on_spot["Parameters"]["JobDefinition"] == on_demand["Parameters"]["JobDefinition"]


def test_a_rejected_training_request_is_not_retried(pipeline):
    # States.TaskFailed in a Catch also matches Batch.ClientException (ASL error names): the block re-raises it
    # under its own name, which the Train block's Retry (MaxAttempts 0) and the failure path receive.
    found = states(pipeline)
    (branch,) = found["Train"]["Branches"]
    choice = branch["States"]["TrainIsRequestRejected"]["Choices"][0]
    assert choice == {
        "Variable": "$.caught.Error",
        "StringEquals": "Batch.ClientException",
        "Next": "TrainRequestRejected",
    }
    assert branch["States"]["TrainRequestRejected"]["Error"] == "Batch.ClientException"
    assert found["Train"]["Retry"][0] == {"ErrorEquals": ["Batch.ClientException"], "MaxAttempts": 0}


def test_training_retry_has_exponential_backoff_with_full_jitter(pipeline):
    # Only attempt failures retry (a refusal by the run itself is TrainingRefused: constructs/pipeline/train_attempt).
    retry = states(pipeline)["Train"]["Retry"]
    assert retry[0] == {"ErrorEquals": ["Batch.ClientException"], "MaxAttempts": 0}
    assert retry[1]["ErrorEquals"] == ["TrainingAttemptFailed"]
    assert retry[1]["JitterStrategy"] == "FULL" and retry[1]["BackoffRate"] == 2 and retry[1]["MaxAttempts"] == 3
    sanity = states(pipeline)["SanityCheck"]["Retry"]
    assert sanity[1]["ErrorEquals"] == ["TrainingAttemptFailed"] and sanity[1]["MaxAttempts"] == 1


@pytest.mark.parametrize("stage", ["SanityCheck", "Train"])
def test_no_capacity_is_asked_again_apart_from_the_attempts_and_ends_the_run_as_capacity_unavailable(pipeline, stage):
    # Each Retrier counts its own retries (ASL "Retry"): waiting for capacity spends none of the attempts'.
    found = states(pipeline)[stage]
    (capacity,) = [r for r in found["Retry"] if r["ErrorEquals"] == ["TrainingCapacityUnavailable"]]
    assert capacity["IntervalSeconds"] == 300 and capacity["BackoffRate"] == 1
    first, last = found["Catch"][0], found["Catch"][-1]
    assert first["ErrorEquals"] == ["TrainingCapacityUnavailable"] and last["ErrorEquals"] == ["States.ALL"]
    assert states(pipeline)[first["Next"]]["Parameters"]["failure"]["error"] == "CapacityUnavailable"


def test_every_aws_call_of_the_pipeline_retries_with_full_jitter(pipeline):
    # Throttling, 5xx and timeouts of the pipeline's own calls are retried with backoff and full jitter
    # (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html).
    calls = {
        name: state
        for name, state in states(pipeline).items()
        if state["Type"] == "Task"
        and (":aws-sdk:" in state["Resource"] or ":dynamodb:" in state["Resource"])
        or state.get("Resource", "").endswith(":sns:publish")
    }
    assert {
        "ClaimRun",
        "FindCheckpoints",
        "ReadRunRecord",
        "DescribeRunHolder",
        "TakeOverRun",
        "ReadVerdict",
        "CopyVerdictToModels",
        "RecordApproval",
        "ReadRecordedApproval",
        "WriteApprovalCopy",
        "PublishApprovedModel",
        "NotifyApproved",
        "NotifyRejected",
        "NotifyFailure",
    } <= set(calls)
    for name, state in calls.items():
        (retry,) = state["Retry"]
        assert retry["JitterStrategy"] == "FULL" and retry["BackoffRate"] == 2 and retry["MaxAttempts"] >= 3, name
        assert "States.Timeout" in retry["ErrorEquals"], name


def test_the_run_phases_the_cli_counts_are_states(pipeline):
    # tools/pipeline_cli.py shows progress over contracts.run.phases(): each is a state of the definition (a GPU
    # pipeline with a sanity job: no Compile state).
    assert set(phases(sanity_in_training=False)) <= set(states(pipeline))
    assert "Compile" not in states(pipeline) and set(PHASES) - set(states(pipeline)) == {"Compile"}


def test_a_rejected_model_fails_with_the_error_the_alarms_leave_out(pipeline):
    # The broken-pipeline alarm's filter excludes this error name; the pipeline's Fail state for a rejected model
    # raises exactly it (constructs/observability/alarms.py).
    failures = [state for state in states(pipeline).values() if state["Type"] == "Fail"]
    assert any(state.get("Error") == MODEL_REJECTED_ERROR for state in failures)


def test_executions_are_logged_and_traced():
    # Every execution's events (with their data) go to the execution log group, kept as long as the stack says.
    template = _pipeline()
    template.has_resource_properties(
        "AWS::StepFunctions::StateMachine",
        {
            "TracingConfiguration": {"Enabled": True},
            "LoggingConfiguration": Match.object_like({"Level": "ALL", "IncludeExecutionData": True}),
        },
    )
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 14})


def test_the_construct_takes_its_retry_policy_and_maximum_nodes():
    template = _pipeline(max_nodes=4, training_retry=TrainingRetry(max_attempts=5, interval=cdk.Duration.seconds(30)))
    found = states(template.to_json())
    # The construct's retry policy, and the environment's maximum in the input check.
    assert found["Train"]["Retry"][1]["MaxAttempts"] == 5 and found["Train"]["Retry"][1]["IntervalSeconds"] == 30
    assert found["ApplyDefaults"]["Parameters"]["defaults"]["nodes"] == 4


def test_the_state_machine_may_submit_only_to_its_queues_and_job_definitions():
    # Least privilege: SubmitJob on the two queues, three job definitions, the registered workloads' (by their
    # prefix) and the job it creates, nothing else.
    template = _pipeline(on_demand_fallback=False)
    (policy,) = [
        r
        for r in template.find_resources("AWS::IAM::Policy").values()
        if "StateMachine" in json.dumps(r["Properties"]["Roles"])
    ]
    (submit,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s["Action"] == "batch:SubmitJob"]
    assert len(submit["Resource"]) == 7


def _eks_pipeline(node_wait_minutes: int | None = None) -> Template:
    """TrainingPipeline on an EksJobRunner; with `node_wait_minutes`, the node groups sized by the pipeline, which
    waits for the training nodes that long before each multi-node job (EksNodeScaling)."""
    stack = cdk.Stack()
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id="vpc-1", availability_zones=["us-east-1a"], private_subnet_ids=["subnet-1"]
    )
    cluster = eks.Cluster.from_cluster_attributes(
        stack, "Cluster", cluster_name="training", vpc=vpc, cluster_endpoint="https://e",
        cluster_certificate_authority_data="ca",
    )  # fmt: skip
    scaling, runs_table = None, _runs_table(stack)
    if node_wait_minutes is not None:
        role = iam.Role(stack, "NodeRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        groups = {
            name: SizedGroup(eks.Nodegroup(stack, name, cluster=cluster, node_role=role, min_size=0), size)
            for name, size in ((TRAINING, 2), (VALIDATION, 1))
        }
        scaling = EksNodeScaling(
            cluster_name="training",
            groups=groups,
            lease=NodeLease(table=runs_table, environment="test"),
            training_wait_minutes=node_wait_minutes,
        )
    TrainingPipeline(
        stack,
        "Pipeline",
        environment="test",
        max_nodes=2,
        bucket=s3.Bucket(stack, "Data"),
        runs_table=runs_table,
        topic=sns.Topic(stack, "Alerts"),
        runner=EksJobRunner(
            cluster=cluster, instance=CATALOGUE["p4d.24xlarge"], image="image:tag", max_nodes=2, node_scaling=scaling
        ),
        log_retention=logs.RetentionDays.TWO_WEEKS,
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    return Template.from_stack(stack)


def test_on_eks_the_definition_names_no_batch_error():
    # The generic pipeline names no backend's errors: EksJobRunner.rejected_errors is empty, so nothing refers to Batch.
    template = _eks_pipeline()
    machine = json.dumps(template.find_resources("AWS::StepFunctions::StateMachine"))
    assert "eks:runJob.sync" in machine and "Batch." not in machine


def _state_definitions(node) -> list[dict]:
    """Every state of a definition, those inside Map item processors and Parallel branches included."""
    found = []
    if isinstance(node, dict):
        found += [state for state in node.get("States", {}).values() if isinstance(state, dict)]
        for value in node.values():
            found += _state_definitions(value)
    elif isinstance(node, list):
        for value in node:
            found += _state_definitions(value)
    return found


# On EKS every write to the runs table is conditional (the claim and the nodes' lease: a PutItem or DeleteItem
# succeeds only "if the condition expression evaluates to true", DynamoDB developer guide, "Condition expressions"),
# and the lease's writes and reads are granted on the runs table only; nothing lists executions any more
# (ListExecutions "is eventually consistent", Step Functions API reference).
def test_on_eks_every_runs_table_write_is_conditional_and_granted_on_the_table_only():
    template = _eks_pipeline(node_wait_minutes=20)
    writes = [
        state for state in _state_definitions(definition(template.to_json()))
        if str(state.get("Resource", "")).split(":")[-1] in ("putItem", "deleteItem", "updateItem")
    ]  # fmt: skip
    assert {w["Resource"].split(":")[-1] for w in writes} == {"putItem", "deleteItem", "updateItem"}
    assert all(w["Parameters"].get("ConditionExpression") for w in writes)
    statements = [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    (table,) = template.find_resources("AWS::DynamoDB::Table")
    granted = [s for s in statements if any(str(a).startswith("dynamodb:") for a in _as_list(s["Action"]))]
    assert {a for s in granted for a in _as_list(s["Action"])} == {
        "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:DeleteItem", "dynamodb:UpdateItem"
    }  # fmt: skip
    assert all(
        f'"Ref": "{table}"' in json.dumps(s["Resource"]) and "*" not in json.dumps(s["Resource"]) for s in granted
    )
    assert "states:ListExecutions" not in json.dumps(statements)


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


# ---- stage timeouts: one table (contracts/run.py) for the job definitions and the states ---------------------
# Task state TimeoutSeconds / TimeoutSecondsPath: https://docs.aws.amazon.com/step-functions/latest/dg/state-task.html


def test_states_wait_for_their_jobs_and_follow_the_training_timeout():
    template = _pipeline(train_attempt_hours=24, on_demand_fallback=False).to_json()
    found, table = states(template), stages(24)
    (sanity_branch,) = found["SanityCheck"]["Branches"]
    assert sanity_branch["States"]["SanityCheckJob"]["TimeoutSeconds"] == table["sanity"].state_seconds()
    assert found["Validate"]["TimeoutSeconds"] == table["validate"].state_seconds()
    # Train: the run's max_attempts picks its timeout from the table (every Batch attempt plus queue wait).
    (train_branch,) = found["Train"]["Branches"]  # the job inside the block that names its failures
    assert train_branch["States"]["TrainJob"]["TimeoutSecondsPath"] == "$.timeouts.train"
    lookup = found["PrepareRun"]["Parameters"]["timeouts"]["train.$"]
    assert lookup == (
        f"States.ArrayGetItem(States.Array({', '.join(map(str, train_state_seconds(24)))}), $.run.max_attempts)"
    )
    # The execution outlasts the stages.
    retries = found["Train"]["Retry"][1]["MaxAttempts"]
    assert (
        definition(template)["TimeoutSeconds"]
        >= (1 + retries) * train_state_seconds(24)[-1] + 2 * table["sanity"].state_seconds()
    )


def test_a_longer_training_timeout_lengthens_the_train_state():
    short = states(_pipeline(train_attempt_hours=24, on_demand_fallback=False).to_json())
    long = states(_pipeline(train_attempt_hours=96, on_demand_fallback=False).to_json())
    assert long["PrepareRun"]["Parameters"] != short["PrepareRun"]["Parameters"]
    assert str(train_state_seconds(96)[2]) in long["PrepareRun"]["Parameters"]["timeouts"]["train.$"]


def test_a_job_without_instances_is_asked_again_for_the_queue_wait_not_as_a_failed_attempt(pipeline):
    # No capacity (SageMaker's CapacityError) is waited for like a job in a queue: every 5 minutes for
    # QUEUE_WAIT_MINUTES, apart from the 3 retries of failed attempts.
    (capacity,) = [r for r in states(pipeline)["Train"]["Retry"] if r["ErrorEquals"] == ["TrainingCapacityUnavailable"]]
    assert capacity["IntervalSeconds"] * capacity["MaxAttempts"] == QUEUE_WAIT_MINUTES * 60
    assert capacity.get("BackoffRate", 1) == 1


def test_the_environments_capacity_wait_sets_how_often_capacity_is_asked_again():
    # capacity_wait_hours=0: the first shortage ends the run (as CapacityUnavailable), no retry.
    found = states(_pipeline(capacity_retries=0, on_demand_fallback=False).to_json())
    for stage in ("SanityCheck", "Train"):
        (capacity,) = [r for r in found[stage]["Retry"] if r["ErrorEquals"] == ["TrainingCapacityUnavailable"]]
        assert capacity["MaxAttempts"] == 0, stage


def test_the_initial_model_reads_are_limited_to_the_environments_registry_and_approval_records(pipeline):
    # init_from: DescribeModelPackage on this environment's model package groups' versions (the run id of the newest
    # approved one), GetItem on the runs table (its approval: approval_record.py), never a models/ object a job could
    # have written; the SSM parameter is no longer read.
    statements = [
        s
        for r in pipeline["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]
    (describe,) = [s for s in statements if s["Action"] == "sagemaker:DescribeModelPackage"]
    assert json.dumps(describe["Resource"]).endswith(':model-package/efa-training-test-*"]]}')
    assert not [s for s in statements if s["Action"] == "ssm:GetParameter"]
    assert [s for s in statements if s["Action"] == "dynamodb:GetItem"]
    reads = [s for s in statements if s["Action"] == "s3:GetObject"]
    assert not any("/models/" in json.dumps(s["Resource"]) for s in reads), reads


def test_execution_logs_go_to_a_vended_logs_group_of_this_stack():
    # /aws/vendedlogs/ keeps log delivery out of the account's size-limited CloudWatch Logs resource policy (Step
    # Functions developer guide, "Avoiding CloudWatch Logs resource policy size restrictions"); the stack's id in the
    # name keeps a group that a destroyed prod stack retained from colliding with the next deploy's.
    (group,) = _pipeline().find_resources("AWS::Logs::LogGroup").values()
    name = json.dumps(group["Properties"]["LogGroupName"])
    assert "/aws/vendedlogs/states/" in name and "AWS::StackId" in name


def test_the_execution_outlasts_every_wait_for_the_training_nodes():
    # On EKS each sanity and training submission may first wait eks_node_wait_minutes for its nodes
    # (constructs/compute/eks/node_wait.py): the execution's timeout grows by that much per submission.
    submissions = (1 + 1 + 2) + (1 + TrainingRetry().max_attempts + 2)  # sanity, train: retries and quarantines
    timeout = {minutes: definition(_eks_pipeline(minutes).to_json())["TimeoutSeconds"] for minutes in (5, 60)}
    assert timeout[60] - timeout[5] == 55 * 60 * submissions
