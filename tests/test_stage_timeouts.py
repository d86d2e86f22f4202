"""Issue 11 item 4: one place (contracts/run.py) defines each stage's timeouts; the Batch job definitions and the
pipeline's states read it, and both follow batch_train_timeout_hours."""

import json

import aws_cdk as cdk
import aws_cdk.aws_batch as batch
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
from aws_cdk.assertions import Template

from config import CATALOGUE
from constructs.compute.batch.job_definitions import job_specs
from constructs.compute.batch.job_runner import BatchJobRunner
from constructs.pipeline.training_pipeline import TrainingPipeline
from contracts.run import stages, train_state_seconds


def _states(template: dict) -> dict:
    machine = next(r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine")
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    return json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))["States"], machine


def _pipeline(train_attempt_hours: int) -> dict:
    stack = cdk.Stack()
    container = batch.EcsEc2ContainerDefinition(stack, "Container", image=ecs.ContainerImage.from_registry("t"),
                                                cpu=1, memory=cdk.Size.mebibytes(512))
    queue = batch.JobQueue(stack, "Queue", compute_environments=[batch.OrderedComputeEnvironment(
        compute_environment=batch.UnmanagedComputeEnvironment(stack, "Hosts"), order=1)])
    runner = BatchJobRunner(multi_node_queue=queue, single_node_queue=queue, job_definitions={
        kind: batch.EcsJobDefinition(stack, kind, container=container) for kind in ("sanity", "train", "validate")})
    TrainingPipeline(stack, "Pipeline", environment="test", max_nodes=2, bucket=s3.Bucket(stack, "Data"),
                     topic=sns.Topic(stack, "Alerts"), runner=runner, log_retention=logs.RetentionDays.ONE_WEEK,
                     removal_policy=cdk.RemovalPolicy.DESTROY, train_attempt_hours=train_attempt_hours)
    return Template.from_stack(stack).to_json()


# Task state TimeoutSeconds / TimeoutSecondsPath: https://docs.aws.amazon.com/step-functions/latest/dg/state-task.html
def test_states_wait_for_their_jobs_and_follow_the_training_timeout():
    states, machine = _states(_pipeline(train_attempt_hours=24))
    table = stages(24)
    assert states["SanityCheck"]["TimeoutSeconds"] == table["sanity"].state_seconds()
    assert states["Validate"]["TimeoutSeconds"] == table["validate"].state_seconds()
    # Train: the run's max_attempts picks its timeout from the table (every Batch attempt plus queue wait).
    (train_branch,) = states["Train"]["Branches"]  # the job inside the block that names its failures
    assert train_branch["States"]["TrainJob"]["TimeoutSecondsPath"] == "$.timeouts.train"
    lookup = states["PrepareRun"]["Parameters"]["timeouts"]["train.$"]
    assert lookup == (f"States.ArrayGetItem(States.Array({', '.join(map(str, train_state_seconds(24)))}), "
                      "$.run.max_attempts)")
    assert machine["Properties"]["DefinitionString"]  # and the execution outlasts the stages:
    definition_timeout = json.loads("".join(p if isinstance(p, str) else "T" for p in
                                            machine["Properties"]["DefinitionString"]["Fn::Join"][1]))["TimeoutSeconds"]
    retries = states["Train"]["Retry"][1]["MaxAttempts"]
    assert definition_timeout >= (1 + retries) * train_state_seconds(24)[-1] + 2 * table["sanity"].state_seconds()


def test_a_longer_training_timeout_lengthens_the_train_state():
    short, _ = _states(_pipeline(train_attempt_hours=24))
    long, _ = _states(_pipeline(train_attempt_hours=96))
    assert long["PrepareRun"]["Parameters"] != short["PrepareRun"]["Parameters"]
    assert str(train_state_seconds(96)[2]) in long["PrepareRun"]["Parameters"]["timeouts"]["train.$"]


def test_job_definitions_read_the_same_stage_table():
    specs = job_specs(instance=CATALOGUE["p5.48xlarge"], nodes=2, bucket_name="b", train_timeout=cdk.Duration.hours(24))
    for name, stage in stages(24).items():
        assert specs[name].timeout.to_seconds() == stage.attempt_seconds
        assert specs[name].attempts == stage.attempts
