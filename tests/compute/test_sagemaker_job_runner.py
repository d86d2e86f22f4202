"""SageMakerJobRunner alone, in a bare stack: the `sagemaker:createTrainingJob.sync` state of each job and what the
state machine's role may do. The pipeline running these states: tests/pipeline/test_sagemaker_pipeline.py."""

import json

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_stepfunctions as sfn
import pytest

from config import CATALOGUE
from constructs.compute.sagemaker.job_runner import SageMakerJobRunner
from constructs.compute.sagemaker.validation import VALIDATION_INFRASTRUCTURE
from contracts.run import QUEUE_WAIT_MINUTES, stages, train_state_seconds
from tests.alone import template_of
from tests.request_validator import assert_valid

TRAIN_PARAMETERS = {"run_id": "$.job.run_id", "dataset": "$.job.dataset", "max_steps": "$.job.max_steps"}
VALIDATE_PARAMETERS = {"run_id": "$.job.run_id", "dataset": "$.job.dataset", "baseline": "$.job.baseline"}


def _runner(
    *,
    spot: bool = False,
    fsx: bool = True,
    instance: str = "p4d.24xlarge",
    neuron_cc_flags: str = "",
    training_plan: str | None = None,
    tracking_uri: str = "",
    capacity_wait_hours: int = 0,
    train_attempt_hours: int = 72,
) -> tuple[cdk.Stack, SageMakerJobRunner]:
    stack = cdk.Stack()
    role = iam.Role(stack, "Execution", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    return stack, SageMakerJobRunner(
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1",
        role=role,
        bucket_name="data-bucket",
        subnet_id="subnet-1",
        security_group_id="sg-1",
        instance=CATALOGUE[instance],
        validation_instance=CATALOGUE["g5.xlarge"],
        environment="dev",
        train_attempt_hours=train_attempt_hours,
        spot=spot,
        file_system=("fs-1", "abcdefgh", "rev1") if fsx else None,
        neuron_cc_flags=neuron_cc_flags,
        training_plan=training_plan,
        tracking_uri=tracking_uri,
        capacity_wait_hours=capacity_wait_hours,
    )


def _request(job: str = "train", **options) -> dict:
    stack, runner = _runner(**options)
    multi_node = job in ("train", "compile")
    parameters = TRAIN_PARAMETERS if multi_node else VALIDATE_PARAMETERS
    state = runner.submit(
        stack,
        job.capitalize(),
        job=job,  # type: ignore[arg-type]
        parameters=parameters,
        job_name=f"States.Format('{{}}-{job}', $.run.run_id)",
        nodes="$.run.nodes" if multi_node else None,
    )
    if job == "validate":  # a block's branch exists once the block is in a state machine
        sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(state))
    resolved = stack.resolve(state.to_state_json())
    if job == "validate":  # the job inside its block, retried on SageMaker's failures only (validation.py)
        resolved = resolved["Branches"][0]["States"]["ValidateJob"]
    assert ":states:::sagemaker:createTrainingJob.sync" in json.dumps(resolved["Resource"])
    return resolved["Parameters"]


def test_training_runs_on_the_runs_instances_with_the_run_as_hyperparameters():
    request = _request()
    assert request["ResourceConfig"]["InstanceType"] == "ml.p4d.24xlarge"
    assert request["ResourceConfig"]["InstanceCount.$"] == "$.run.nodes"
    assert request["HyperParameters"]["run_id.$"] == "$.job.run_id"
    assert request["HyperParameters"]["expected_nodes.$"] == "States.Format('{}', $.run.nodes)"


# The members CreateTrainingJob requires besides ResourceConfig, so botocore's model judges the resource config.
MINIMAL_TRAINING_JOB = {
    "TrainingJobName": "run-train-1a2b3c4d",
    "AlgorithmSpecification": {"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/trainer:1",
                               "TrainingInputMode": "File"},
    "RoleArn": "arn:aws:iam::123456789012:role/Execution",
    "OutputDataConfig": {"S3OutputPath": "s3://data-bucket/runs/"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}  # fmt: skip


def test_training_runs_in_the_environments_training_plan_and_validation_outside_it():
    # SageMaker API reference: CreateTrainingPlan ("Queue training jobs"), ResourceConfig.TrainingPlanArn; validation
    # runs on its own small type, which the plan does not hold.
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week"
    resources = _request(training_plan=plan)["ResourceConfig"]
    assert resources["TrainingPlanArn"] == plan
    static = {k: v for k, v in resources.items() if not k.endswith(".$")} | {"InstanceCount": 2}
    assert_valid("sagemaker", "CreateTrainingJob", {**MINIMAL_TRAINING_JOB, "ResourceConfig": static})
    assert "TrainingPlanArn" not in _request("validate", training_plan=plan)["ResourceConfig"]
    assert "TrainingPlanArn" not in _request()["ResourceConfig"]


def test_trainiums_compile_job_runs_in_the_training_plan_too():
    # The compile job runs on the run's nodes, of the plan's type, for up to 4 h: in the plan, which a run's quote
    # counts at $0 (contracts/quote.py: reserved capacity adds nothing), not on demand beside it. A plan's capacity
    # takes any training job (SageMaker developer guide, "Training plans utilization for SageMaker training jobs").
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/trn1-week"
    resources = _request("compile", instance="trn1.32xlarge", training_plan=plan)["ResourceConfig"]
    assert resources["TrainingPlanArn"] == plan
    assert "TrainingPlanArn" not in _request("compile", instance="trn1.32xlarge")["ResourceConfig"]


def test_the_image_runs_its_own_launcher_with_the_mode_first():
    # ContainerEntrypoint/ContainerArguments replace the image's entry point and SageMaker's `train` argument
    # (API_AlgorithmSpecification).
    spec = _request()["AlgorithmSpecification"]
    assert spec["ContainerEntrypoint"] == ["python", "/opt/training/launch.py"]
    assert spec["ContainerArguments"][:1] == ["train"]
    assert spec["ContainerArguments"][1:] == [
        "--data",
        "/opt/ml/input/data/training",
        "--checkpoint-dir",
        "/opt/ml/checkpoints",
        "--init-checkpoints-root",
        "/opt/ml/input/data/fsx/checkpoints",
    ]


def test_training_reads_other_runs_checkpoints_from_the_file_system_read_only():
    # An incremental run's initial model: the run id's folder under the FSx root channel, never written.
    channels = {c["ChannelName"]: c for c in _request(fsx=True)["InputDataConfig"]}
    source = channels["fsx"]["DataSource"]["FileSystemDataSource"]
    assert (source["DirectoryPath"], source["FileSystemAccessMode"]) == ("/abcdefgh", "ro")
    assert "fsx" not in {c["ChannelName"] for c in _request(fsx=False)["InputDataConfig"]}


def test_training_checks_its_own_hosts_and_keeps_node_local_checkpoints():
    environment = _request()["Environment"]
    assert environment["SANITY_BEFORE_TRAINING"] == "1"
    assert environment["CHECKPOINT_NODE_LOCAL"] == "1"
    assert environment["EFA_INTERFACES"] == str(CATALOGUE["p4d.24xlarge"].efa_interfaces)
    assert "NCCL_SOCKET_IFNAME" not in environment  # launch.py takes it from resourceconfig.json


def test_every_environment_value_fits_sagemakers_limit():
    # API_CreateTrainingJob Environment: keys [a-zA-Z_][a-zA-Z0-9_]{0,1023}, values up to 512 characters.
    for name in CATALOGUE:
        if CATALOGUE[name].has_efa:
            environment = _request(instance=name)["Environment"]
            assert all(len(str(value)) <= 512 for value in environment.values()), name


def test_training_checkpoints_sync_to_the_runs_prefix():
    checkpoint = _request()["CheckpointConfig"]
    assert checkpoint["S3Uri.$"] == "States.Format('s3://data-bucket/checkpoints/{}/', $.job.run_id)"
    assert checkpoint["LocalPath"] == "/opt/ml/checkpoints"


def test_one_attempt_runs_for_one_attempts_time_and_ends_before_its_state_gives_up():
    # No RetryStrategy: with one, MaxRuntimeInSeconds bounds all attempts together (API_StoppingCondition), so a hung
    # attempt would run max_attempts x 72 h. SageMaker's own end is an attempt failure the pipeline retries, the
    # state's timeout is not: the job's bounds stay under one attempt of the Train state's timeout.
    request = _request(spot=True)
    assert "RetryStrategy" not in request
    runtime, wait = (
        request["StoppingCondition"]["MaxRuntimeInSeconds"],
        request["StoppingCondition"]["MaxWaitTimeInSeconds"],
    )
    assert runtime == stages(72)["train"].attempt_seconds == 72 * 3600
    assert runtime < wait <= 28 * 24 * 3600  # "MaxWaitTimeInSeconds must be larger than MaxRuntimeInSeconds"
    assert wait + 30 * 60 <= train_state_seconds(72)[1]


def test_managed_spot_waits_for_capacity_within_each_attempt():
    request = _request(spot=True)
    assert request["EnableManagedSpotTraining"] is True
    wait = request["StoppingCondition"]["MaxWaitTimeInSeconds"]
    assert wait == stages(72)["train"].attempt_seconds + (QUEUE_WAIT_MINUTES - 30) * 60


def _train_state(**options) -> dict:
    """The train job's state as the pipeline submits it, its timeout the Train state's per-run path."""
    stack, runner = _runner(**options)
    state = runner.submit(
        stack,
        "Train",
        job="train",
        parameters=TRAIN_PARAMETERS,
        job_name="$.name",
        nodes="$.run.nodes",
        timeout="$.timeouts.train",
    )
    return stack.resolve(state.to_state_json())


# API_StoppingCondition MaxWaitTimeInSeconds: "the amount of time spent waiting for Spot capacity plus the amount of
# time the job can run ... If the job does not complete during this time, SageMaker ends the job." The allowance beyond
# the runtime holds the environment's capacity wait, so Spot waits and interruptions within it never end the attempt.
@pytest.mark.parametrize("hours", [0, 2, 24])
def test_a_spot_attempt_may_wait_the_environments_capacity_wait_for_spot(hours):
    state = _train_state(spot=True, capacity_wait_hours=hours)
    stopping = state["Parameters"]["StoppingCondition"]
    runtime, wait = stopping["MaxRuntimeInSeconds"], stopping["MaxWaitTimeInSeconds"]
    assert runtime == stages(72)["train"].attempt_seconds  # the attempt's time, as on every backend
    assert wait - runtime >= hours * 3600 + (QUEUE_WAIT_MINUTES - 30) * 60
    # The state gives up after SageMaker's own end (the margin uploads the output), within what the execution's
    # timeout counts for one training submission (contracts.run.execution_seconds: the Train state at its longest).
    assert "TimeoutSecondsPath" not in state
    assert state["TimeoutSeconds"] == wait + 30 * 60 <= train_state_seconds(72)[-1]


def test_a_spot_allowance_beyond_the_executions_count_is_cut_to_it():
    # 168 h of capacity wait beside 1-hour attempts: more than one submission's share of the execution's timeout.
    state = _train_state(spot=True, capacity_wait_hours=168, train_attempt_hours=1)
    stopping = state["Parameters"]["StoppingCondition"]
    assert stopping["MaxRuntimeInSeconds"] == 3600 < stopping["MaxWaitTimeInSeconds"]
    assert state["TimeoutSeconds"] == stopping["MaxWaitTimeInSeconds"] + 30 * 60 == train_state_seconds(1)[-1]


def test_on_demand_training_waits_as_long_as_the_train_state_says():
    state = _train_state(spot=False, capacity_wait_hours=2)
    assert state["TimeoutSecondsPath"] == "$.timeouts.train" and "TimeoutSeconds" not in state
    assert state["Parameters"]["StoppingCondition"] == {"MaxRuntimeInSeconds": 72 * 3600}


def test_on_demand_training_sets_no_spot_fields():
    request = _request(spot=False)
    assert "EnableManagedSpotTraining" not in request
    assert list(request["StoppingCondition"]) == ["MaxRuntimeInSeconds"]


def test_validation_never_waits_for_spot_and_reads_the_runs_checkpoints():
    request = _request("validate", spot=True)
    assert "EnableManagedSpotTraining" not in request and "CheckpointConfig" not in request
    # NVMe instance storage: VolumeSizeInGB may not exceed it (API_ResourceConfig; g5.xlarge has 250 GB).
    assert request["ResourceConfig"] == {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100}
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": stages(72)["validate"].attempt_seconds}
    channels = {c["ChannelName"]: c for c in request["InputDataConfig"]}
    assert channels["checkpoints"]["InputMode"] == "FastFile"  # streamed: only what validation reads
    assert channels["checkpoints"]["DataSource"]["S3DataSource"]["S3Uri.$"] == (
        "States.Format('s3://data-bucket/checkpoints/{}/', $.job.run_id)"
    )
    assert request["AlgorithmSpecification"]["ContainerArguments"][-2:] == [
        "--checkpoint",
        "/opt/ml/input/data/checkpoints",
    ]


def test_fsx_datasets_are_a_read_only_file_system_channel():
    (channel,) = [c for c in _request(fsx=True)["InputDataConfig"] if c["ChannelName"] == "training"]
    source = channel["DataSource"]["FileSystemDataSource"]
    assert source == {
        "FileSystemId": "fs-1",
        "FileSystemType": "FSxLustre",
        "FileSystemAccessMode": "ro",
        "DirectoryPath.$": "States.Format('/abcdefgh/{}', $.job.dataset)",
    }


def test_s3_datasets_stream_in_fast_file_mode():
    (channel,) = _request(fsx=False)["InputDataConfig"]
    assert channel["InputMode"] == "FastFile"
    assert channel["DataSource"]["S3DataSource"]["S3Uri.$"] == "States.Format('s3://data-bucket/{}', $.job.dataset)"


def test_the_jobs_run_in_the_training_subnet_with_the_efa_group():
    assert _request()["VpcConfig"] == {"Subnets": ["subnet-1"], "SecurityGroupIds": ["sg-1"]}


def test_the_runner_refuses_in_job_attempts_and_tells_the_pipeline():
    # The pipeline passes an attempts count only where restarts_lost_hosts; here each submission is one attempt.
    stack, runner = _runner()
    assert runner.restarts_lost_hosts is False
    with pytest.raises(ValueError, match="one attempt's runtime"):
        runner.submit(stack, "Train", job="train", parameters=TRAIN_PARAMETERS, job_name="$.n", attempts="$.a")


def test_the_run_is_tagged_for_cost_allocation():
    tags = {t["Key"]: t.get("Value", t.get("Value.$")) for t in _request()["Tags"]}
    assert tags == {"Project": "efa-training", "Environment": "dev", "RunId": "$.job.run_id"}


def test_there_is_no_separate_sanity_job():
    stack, runner = _runner()
    assert runner.sanity_in_training
    with pytest.raises(ValueError, match="inside the training job"):
        runner.submit(stack, "Sanity", job="sanity", parameters={"run_id": "$.job.run_id"}, job_name="$.name")


def _granted(**options) -> list[dict]:
    """The statements a state machine running a training job is granted by the runner."""
    stack, runner = _runner(**options)
    machine = sfn.StateMachine(
        stack,
        "Machine",
        definition_body=sfn.DefinitionBody.from_chainable(
            runner.submit(stack, "Train", job="train", parameters=TRAIN_PARAMETERS, job_name="$.name", nodes="$.n")
        ),
    )
    runner.grant(machine)
    return [
        s
        for r in template_of(stack)["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_state_machine_may_create_describe_and_stop_training_jobs_and_pass_only_the_jobs_role():
    statements = _granted()
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert {"sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"} <= actions
    (pass_role,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    assert "Execution" in json.dumps(pass_role["Resource"])
    rule = next(s for s in statements if "events:PutRule" in s["Action"])
    assert "StepFunctionsGetEventsForSageMakerTrainingJobsRule" in json.dumps(rule["Resource"])


def test_the_state_machine_touches_only_this_environments_training_jobs():
    # Service Authorization Reference, Amazon SageMaker: CreateTrainingJob and AddTags take aws:RequestTag, the
    # training-job resource aws:ResourceTag; every job is created with Environment=<env> (training_job's Tags).
    by_action = {a: s for s in _granted() for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    for action in ("sagemaker:CreateTrainingJob", "sagemaker:AddTags"):
        assert by_action[action]["Condition"] == {"StringEquals": {"aws:RequestTag/Environment": "dev"}}, action
    for action in ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"):
        assert by_action[action]["Condition"] == {"StringEquals": {"aws:ResourceTag/Environment": "dev"}}, action


def test_a_job_in_a_training_plan_may_name_the_plan():
    # CreateTrainingJob's resource types include training-plan (Service Authorization Reference): a request whose
    # ResourceConfig names the plan is authorized on the plan's ARN too, or every run in it is denied.
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p1"
    (create,) = [s for s in _granted(training_plan=plan) if s["Action"] == "sagemaker:CreateTrainingJob"]
    assert plan in create["Resource"]
    (create,) = [s for s in _granted() if s["Action"] == "sagemaker:CreateTrainingJob"]
    assert isinstance(create["Resource"], dict) or len(create["Resource"]) == 1


def test_a_submission_retries_sagemakers_own_errors_and_waits_for_instance_quota():
    # Step Functions' SageMaker training job example retries SageMaker.AmazonSageMakerException and
    # SageMaker.ResourceLimitExceededException (connect-sagemaker.html); the quota is waited for the queue wait.
    stack, runner = _runner()
    state = stack.resolve(
        runner.submit(stack, "Train", job="train", parameters=TRAIN_PARAMETERS, job_name="$.name").to_state_json()
    )
    retries = {tuple(r["ErrorEquals"]): r for r in state["Retry"]}
    assert retries[("SageMaker.AmazonSageMakerException",)]["MaxAttempts"] == 6
    quota = retries[("SageMaker.ResourceLimitExceededException",)]
    assert quota["IntervalSeconds"] * quota["MaxAttempts"] == QUEUE_WAIT_MINUTES * 60
    assert runner.rejected_errors == ("SageMaker.ResourceLimitExceededException",)


def test_neuron_jobs_keep_checkpoints_in_the_shared_file_system():
    # Node-local checkpoint folders need object collectives (the XLA backend has none): a Neuron job mounts the
    # file system read-write and writes /fsx/checkpoints/<run_id> as on Batch and EKS; no checkpoint sync.
    request = _request(instance="trn1.32xlarge")
    assert "CheckpointConfig" not in request and "CHECKPOINT_NODE_LOCAL" not in request["Environment"]
    channels = {c["ChannelName"]: c["DataSource"] for c in request["InputDataConfig"]}
    assert channels["fsx"]["FileSystemDataSource"]["FileSystemAccessMode"] == "rw"
    assert channels["fsx"]["FileSystemDataSource"]["DirectoryPath"] == "/abcdefgh"
    arguments = request["AlgorithmSpecification"]["ContainerArguments"]
    assert arguments[-2:] == ["--checkpoints-root", "/opt/ml/input/data/fsx/checkpoints"]


def test_neuron_validation_reads_the_shared_checkpoints_read_only():
    request = _request("validate", instance="trn1.32xlarge")
    channels = {c["ChannelName"]: c["DataSource"] for c in request["InputDataConfig"]}
    assert channels["fsx"]["FileSystemDataSource"]["FileSystemAccessMode"] == "ro"
    assert request["AlgorithmSpecification"]["ContainerArguments"][-2:] == [
        "--checkpoints-root",
        "/opt/ml/input/data/fsx/checkpoints",
    ]


# Tried again on fresh instances only when SageMaker failed it (no capacity, its internal error), never for any task
# failure (the validate command's exit 1 fails the same way again). Batch user guide, "Jobs stuck in RUNNABLE due to
# capacity": "failedReason begins with CapacityError"; API_RetryStrategy: "fails due to an InternalServerError".
def test_a_validation_job_is_tried_again_only_when_sagemaker_failed_it():
    stack, runner = _runner()
    state = runner.submit(stack, "Validate", job="validate", parameters=VALIDATE_PARAMETERS, job_name="$.name")
    sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(state))
    block = stack.resolve(state.to_state_json())
    assert [(r["ErrorEquals"], r["MaxAttempts"]) for r in block["Retry"]] == [([VALIDATION_INFRASTRUCTURE], 3)]
    (reasons,) = block["Branches"][0]["States"]["ValidateIsInfrastructure"]["Choices"]
    assert [c["StringMatches"] for c in reasons["And"][2]["Or"]] == ["CapacityError*", "InternalServerError*"]


def test_the_longest_attempt_keeps_max_wait_above_max_runtime():
    # A 120-hour attempt (the longest the configuration allows); MaxWait must be larger than MaxRuntime.
    stack = cdk.Stack()
    role = iam.Role(stack, "Execution", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    runner = SageMakerJobRunner(
        image="i",
        role=role,
        bucket_name="b",
        subnet_id="s",
        security_group_id="g",
        instance=CATALOGUE["p5.48xlarge"],
        validation_instance=CATALOGUE["p5.4xlarge"],
        environment="dev",
        train_attempt_hours=120,
        spot=True,
    )
    stopping = runner.training_job(job="train", parameters=TRAIN_PARAMETERS, job_name="$.n", nodes="$.run.nodes")[
        "StoppingCondition"
    ]
    assert stopping["MaxRuntimeInSeconds"] == 120 * 3600 < stopping["MaxWaitTimeInSeconds"] <= 28 * 24 * 3600


def test_trainiums_compile_job_fills_the_cache_in_the_file_system_on_the_runs_instances():
    # training_image/efa_training/runtime/launch/neuron_compile.py: the cache root is the FSx channel (read-write), the
    # same one training reads.
    request = _request("compile", instance="trn1.32xlarge", spot=True, neuron_cc_flags="--model-type=transformer -O1")
    assert request["AlgorithmSpecification"]["ContainerArguments"][0] == "compile"
    assert request["ResourceConfig"] == {
        "InstanceType": "ml.trn1.32xlarge",
        "InstanceCount.$": "$.run.nodes",
        "VolumeSizeInGB": 100,
    }
    environment = request["Environment"]
    assert environment["NEURON_CACHE_ROOT"] == "/opt/ml/input/data/fsx/neuron-cache"
    assert environment["NEURON_CC_FLAGS"] == "--model-type=transformer -O1"
    assert "SANITY_BEFORE_TRAINING" not in environment
    (fsx,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == "fsx"]
    assert fsx["DataSource"]["FileSystemDataSource"]["FileSystemAccessMode"] == "rw"
    # A throwaway trial run: never on Spot, no checkpoints synced, no retries of its own (the pipeline retries).
    assert "EnableManagedSpotTraining" not in request and "CheckpointConfig" not in request
    assert "RetryStrategy" not in request


def test_training_on_trainium_reads_the_same_cache_with_the_same_flags():
    environment = _request("train", instance="trn1.32xlarge", neuron_cc_flags="--model-type=transformer -O1")[
        "Environment"
    ]
    assert environment["NEURON_CACHE_ROOT"] == "/opt/ml/input/data/fsx/neuron-cache"
    assert environment["NEURON_CC_FLAGS"] == "--model-type=transformer -O1"
