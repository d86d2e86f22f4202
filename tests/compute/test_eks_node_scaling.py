"""EksNodeScaling and EksNodeReconciler alone, in a bare stack: the states that size the node groups, and the
reconciler's schedule and events. Their behaviour in a running pipeline: tests/pipeline/test_eks_pipeline.py."""

import json

import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Match, Template

from config.layout import RUNS_TABLE_KEY
from constructs.compute.backend import TRAINING, VALIDATION
from constructs.compute.eks.cluster import as_icluster
from constructs.compute.eks.node_lease import NodeLease
from constructs.compute.eks.node_reconciler import RECONCILE_EVERY, EksNodeReconciler
from constructs.compute.eks.node_scaling import (
    IN_USE,
    UPDATE_TRIES,
    EksNodeScaling,
    SizedGroup,
)
from tests.alone import bare_stack
from tests.compute.eks_parts import cluster, vpc
from tests.pipeline.runs import definition


def _scaling(stack) -> EksNodeScaling:
    training = cluster(stack, vpc(stack))
    groups = {
        TRAINING: eks.Nodegroup(stack, "Accelerators", cluster=as_icluster(training), min_size=0, max_size=4),
        VALIDATION: eks.Nodegroup(stack, "Validation", cluster=as_icluster(training), min_size=0, max_size=1),
    }
    runs = dynamodb.Table(
        stack, "Runs", partition_key=dynamodb.Attribute(name=RUNS_TABLE_KEY, type=dynamodb.AttributeType.STRING)
    )
    return EksNodeScaling(
        cluster_name=training.cluster_name,
        groups={TRAINING: SizedGroup(groups[TRAINING], 4), VALIDATION: SizedGroup(groups[VALIDATION], 1)},
        lease=NodeLease(table=runs, environment="dev"),
    )


@pytest.fixture(scope="module")
def reconciler() -> Template:
    stack = bare_stack()
    pipeline = sfn.StateMachine(
        stack,
        "Pipeline",
        state_machine_name="dev-Pipeline",  # fixed, as the training pipeline's
        definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "Run")),
    )
    EksNodeReconciler(
        stack,
        "Reconciler",
        scaling=_scaling(stack),
        pipeline=pipeline,
        log_retention=logs.RetentionDays.TWO_WEEKS,
        alerts=sns.Topic(stack, "Alerts"),
        alarm_name="p-eks-reconciler-failing",
    )
    return Template.from_stack(stack)


def _reconciler_states(template: Template) -> dict:
    (machine,) = [
        m
        for k, m in template.to_json()["Resources"].items()
        if m["Type"] == "AWS::StepFunctions::StateMachine" and k.startswith("Reconciler")
    ]
    return definition({"Resources": {"Machine": machine}})["States"]


def _sized_states(desired: dict, stage: str = "ForValidation") -> dict:
    stack = bare_stack()
    chain, _ = _scaling(stack).size(stack, stage, desired)
    sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(chain))
    return definition(Template.from_stack(stack).to_json())["States"]


# The reconciler runs on a schedule (what no event reports: a lost one) and when an execution ends, however it
# ended (Step Functions execution status change events, EventBridge); a start is not its business.
def test_the_reconciler_runs_every_five_minutes_and_on_every_ended_execution(reconciler):
    assert RECONCILE_EVERY.to_minutes() == 5
    reconciler.has_resource_properties("AWS::Events::Rule", {"ScheduleExpression": "rate(5 minutes)"})
    reconciler.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.states"],
                "detail-type": ["Step Functions Execution Status Change"],
                "detail": {
                    "stateMachineArn": [{"Ref": Match.string_like_regexp("^Pipeline")}],
                    "status": ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"],
                },
            },
            "Targets": [Match.object_like({"Arn": {"Ref": Match.string_like_regexp("^ReconcilerStateMachine")}})],
        },
    )


# The reconciler scales a group down only when no execution holds the lease (its own id never does), and reads the
# lease right before the update: one read-then-update is the only window a run starting meanwhile can fall in.
def test_the_reconciler_scales_a_group_down_only_when_no_execution_holds_the_lease(reconciler):
    states = _reconciler_states(reconciler)["ReleaseNodes"]["ItemProcessor"]["States"]
    (held,) = states["ReleaseNodesIsHeld"]["Choices"]
    holder = "$.lease.Item.execution.S"
    assert held["And"] == [
        {"Variable": holder, "IsPresent": True},
        {"Not": {"Variable": holder, "StringEqualsPath": "$.execution"}},
    ]
    assert held["Next"] == "ReleaseNodesDone" and states["ReleaseNodesIsHeld"]["Default"] == "ReleaseNodesScaleToZero"
    assert states["ReleaseNodesReadLease"]["Parameters"]["ConsistentRead"] is True
    assert states["ReleaseNodesScaleToZero"]["Parameters"]["ScalingConfig"]["DesiredSize"] == 0


# Before any group, a lease whose holder is no longer RUNNING is released (DeleteItem conditioned on that holder);
# a RUNNING holder's groups are left alone.
def test_the_reconciler_releases_a_stale_lease_and_leaves_a_running_holder_alone(reconciler):
    states = _reconciler_states(reconciler)
    (running,) = states["ReleaseNodesLeaseIsHolderRunning"]["Choices"]
    assert running == {
        "Variable": "$.lease_holder.status", "StringEquals": "RUNNING", "Next": "ReleaseNodesLeaseHeldByARun"
    }  # fmt: skip
    assert states["ReleaseNodesLeaseHeldByARun"]["Next"] == "ReleaseNodesLeftToTheHolder"
    assert states["ReleaseNodesLeaseIsHolderRunning"]["Default"] == "ReleaseNodesLeaseReleaseStale"
    stale = states["ReleaseNodesLeaseReleaseStale"]
    assert stale["Resource"].endswith(":dynamodb:deleteItem") and stale["Next"] == "ReleaseNodesLeaseFree"
    assert stale["Parameters"]["ConditionExpression"] == "#holder = :holder"
    assert stale["Parameters"]["ExpressionAttributeValues"] == {":holder": {"S.$": "$.lease.Item.execution.S"}}
    assert stale["Parameters"]["Key"] == {"run_id": {"S": "lease#dev"}}


def _statements(template: Template, role_prefix: str) -> list[dict]:
    return [
        statement
        for key, policy in template.find_resources("AWS::IAM::Policy").items()
        if key.startswith(role_prefix)
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


# The reconciler's grants on the runs table: read and conditional delete of the lease, no write; no ListExecutions
# (eventually consistent: the lease replaced it) anywhere, and DescribeExecution on the pipeline's executions only.
def test_the_reconciler_may_read_and_delete_in_the_runs_table_and_describe_the_pipelines_executions(reconciler):
    statements = _statements(reconciler, "ReconcilerStateMachineRoleDefaultPolicy")
    table = [s for s in statements if any(str(a).startswith("dynamodb:") for a in _listed(s["Action"]))]
    assert sorted(a for s in table for a in _listed(s["Action"])) == ["dynamodb:DeleteItem", "dynamodb:GetItem"]
    table_arn = {
        "Fn::Join": [
            "",
            [
                "arn:",
                {"Ref": "AWS::Partition"},
                ":dynamodb:",
                {"Ref": "AWS::Region"},
                ":",
                {"Ref": "AWS::AccountId"},
                ":table/",
                {"Ref": _logical(reconciler, "AWS::DynamoDB::Table")},
            ],
        ]
    }
    assert [s["Resource"] for s in table] == [table_arn, table_arn]  # fmt: skip
    actions = [a for s in statements for a in _listed(s["Action"])]
    assert "states:ListExecutions" not in actions
    (describe,) = [s for s in statements if "states:DescribeExecution" in _listed(s["Action"])]
    assert ":execution:dev-Pipeline:*" in json.dumps(describe["Resource"])


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _logical(template: Template, kind: str) -> str:
    (logical,) = template.find_resources(kind)
    return logical


# Another update in progress (ResourceInUse) sends the reconciler back to read and list again, a bounded number of
# times, instead of retrying the same update while a run might have started.
def test_an_update_in_progress_starts_the_check_over_a_bounded_number_of_times(reconciler):
    states = _reconciler_states(reconciler)["ReleaseNodes"]["ItemProcessor"]["States"]
    (catch,) = states["ReleaseNodesScaleToZero"]["Catch"]
    assert catch["ErrorEquals"] == [IN_USE] and catch["Next"] == "ReleaseNodesTryAgain"
    (left,) = states["ReleaseNodesTriesLeft"]["Choices"]
    assert left["NumericLessThan"] == UPDATE_TRIES and left["Next"] == "ReleaseNodesWaitForUpdate"
    assert states["ReleaseNodesWaitForUpdate"]["Next"] == "ReleaseNodesDescribe"


# Sizing for a stage sets each named group, in order, with its own maximum; an update in progress is the run's own.
def test_sizing_for_validation_takes_training_down_then_one_validation_node_up():
    states = _sized_states({TRAINING: 0, VALIDATION: 1})
    assert states["SizeTrainingNodesForValidation"]["Next"] == "SizeValidationNodesForValidation"
    assert states["SizeTrainingNodesForValidation"]["Parameters"]["ScalingConfig"] == {
        "MinSize": 0,
        "MaxSize": 4,
        "DesiredSize": 0,
    }
    assert states["SizeValidationNodesForValidation"]["Parameters"]["ScalingConfig"] == {
        "MinSize": 0,
        "MaxSize": 1,
        "DesiredSize": 1,
    }
    assert any(r["ErrorEquals"] == [IN_USE] for r in states["SizeValidationNodesForValidation"]["Retry"])


# The run's node count comes from the execution input.
def test_sizing_for_training_reads_the_runs_node_count():
    states = _sized_states({TRAINING: "$.run.nodes"}, "ForTraining")
    assert states["SizeTrainingNodesForTraining"]["Parameters"]["ScalingConfig"]["DesiredSize.$"] == "$.run.nodes"


def test_the_reconcilers_own_failures_page(reconciler):
    # It is what brings idle nodes to 0: failed, timed out or aborted executions in 15 minutes page the alerts topic
    # (Step Functions' ExecutionsFailed/TimedOut/Aborted by StateMachineArn).
    (alarm,) = reconciler.find_resources("AWS::CloudWatch::Alarm").values()
    properties = alarm["Properties"]
    assert properties["AlarmName"] == "p-eks-reconciler-failing" and properties["AlarmActions"]
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in properties["Metrics"] if "MetricStat" in m}
    assert names == {"ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"}
    assert (properties["Threshold"], properties["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")


def test_the_reconcilers_log_group_is_under_vended_logs(reconciler):
    # Step Functions developer guide, "Avoiding CloudWatch Logs resource policy size restrictions".
    (group,) = reconciler.find_resources("AWS::Logs::LogGroup").values()
    joined = group["Properties"]["LogGroupName"]["Fn::Join"][1]
    assert joined[0] == "/aws/vendedlogs/states/dev-Pipeline-reconciler-"
