"""EksNodeScaling and EksNodeReconciler alone, in a bare stack: the states that size the node groups, and the
reconciler's schedule and events. Their behaviour in a running pipeline: tests/pipeline/test_eks_pipeline.py."""

import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_logs as logs
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Match, Template

from constructs.compute.backend import TRAINING, VALIDATION
from constructs.compute.eks.cluster import as_icluster
from constructs.compute.eks.node_scaling import (
    IN_USE,
    RECONCILE_EVERY,
    UPDATE_TRIES,
    EksNodeReconciler,
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
    return EksNodeScaling(
        cluster_name=training.cluster_name,
        groups={TRAINING: SizedGroup(groups[TRAINING], 4), VALIDATION: SizedGroup(groups[VALIDATION], 1)},
    )


@pytest.fixture(scope="module")
def reconciler() -> Template:
    stack = bare_stack()
    pipeline = sfn.StateMachine(
        stack, "Pipeline", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "Run"))
    )
    EksNodeReconciler(
        stack, "Reconciler", scaling=_scaling(stack), pipeline=pipeline, log_retention=logs.RetentionDays.TWO_WEEKS
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


# The reconciler releases a group only when no execution runs (others=0), and lists them right before the update.
def test_the_reconciler_scales_a_group_down_only_when_no_execution_runs(reconciler):
    states = _reconciler_states(reconciler)["ReleaseNodes"]["ItemProcessor"]["States"]
    (held,) = states["ReleaseNodesIsHeld"]["Choices"]
    assert held == {"Variable": "$.running.count", "NumericGreaterThan": 0, "Next": "ReleaseNodesDone"}
    assert states["ReleaseNodesIsHeld"]["Default"] == "ReleaseNodesScaleToZero"
    assert states["ReleaseNodesListRunning"]["Parameters"]["StatusFilter"] == "RUNNING"
    assert states["ReleaseNodesScaleToZero"]["Parameters"]["ScalingConfig"]["DesiredSize"] == 0


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
