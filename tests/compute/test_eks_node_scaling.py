"""EksNodeScaling alone, in a bare stack: the pipeline's executions size the accelerator node group, the run's nodes
while one runs and 0 once it has ended, however it ended."""

import json

import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_logs as logs
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Match, Template

from constructs.compute.eks.cluster import as_icluster
from constructs.compute.eks.node_scaling import EksNodeScaling
from tests.alone import bare_stack
from tests.compute.eks_parts import cluster, vpc
from tests.pipeline.runs import definition


@pytest.fixture(scope="module")
def scaling() -> Template:
    stack = bare_stack()
    training = cluster(stack, vpc(stack))
    nodegroup = eks.Nodegroup(
        stack, "Accelerators", cluster=as_icluster(training), min_size=0, desired_size=0, max_size=4
    )
    pipeline = sfn.StateMachine(
        stack, "Pipeline", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "Run"))
    )
    EksNodeScaling(
        stack,
        "Scaling",
        cluster=as_icluster(training),
        nodegroup=nodegroup,
        max_nodes=4,
        pipeline=pipeline,
        log_retention=logs.RetentionDays.TWO_WEEKS,
    )
    return Template.from_stack(stack)


def _scaling_definition(template: Template) -> dict:
    (machine,) = [
        m
        for k, m in template.to_json()["Resources"].items()
        if m["Type"] == "AWS::StepFunctions::StateMachine" and k.startswith("Scaling")
    ]
    return definition({"Resources": {"Machine": machine}})


def test_every_execution_status_change_of_the_pipeline_starts_the_scaling(scaling):
    # Step Functions execution status change events (EventBridge): started, and every way an execution ends.
    scaling.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.states"],
                "detail-type": ["Step Functions Execution Status Change"],
                "detail": {
                    "stateMachineArn": [{"Ref": Match.string_like_regexp("^Pipeline")}],
                    "status": ["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"],
                },
            },
            "Targets": [Match.object_like({"Arn": {"Ref": Match.string_like_regexp("^ScalingStateMachine")}})],
        },
    )


def test_a_started_run_gets_its_nodes_and_an_ended_one_none(scaling):
    # RUNNING with a numeric `nodes` in the input: that many; RUNNING without: the maximum; anything else: 0.
    states = _scaling_definition(scaling)["States"]
    choice = states["StartedOrEnded"]
    assert [c["Next"] for c in choice["Choices"]] == ["ScaleToRunNodes", "ScaleToMaxNodes"]
    assert choice["Default"] == "ScaleToZero"
    desired = {
        name: states[name]["Parameters"]["ScalingConfig"]
        for name in ("ScaleToRunNodes", "ScaleToMaxNodes", "ScaleToZero")
    }
    assert desired["ScaleToRunNodes"]["DesiredSize.$"] == "$.input.nodes"
    assert desired["ScaleToMaxNodes"]["DesiredSize"] == 4 and desired["ScaleToZero"]["DesiredSize"] == 0
    assert all(config["MinSize"] == 0 and config["MaxSize"] == 4 for config in desired.values())


def test_an_update_in_progress_is_waited_for(scaling):
    # UpdateNodegroupConfig refuses a second update while one runs (ResourceInUseException): retry it.
    states = _scaling_definition(scaling)["States"]
    for name in ("ScaleToRunNodes", "ScaleToMaxNodes", "ScaleToZero"):
        (retry,) = states[name]["Retry"]
        assert retry["ErrorEquals"] == ["Eks.ResourceInUseException"] and retry["MaxAttempts"] >= 10, name


def test_the_scaling_may_update_only_its_node_group(scaling):
    # The state machine's role (its events role may only start it).
    (policy,) = [
        p
        for k, p in scaling.find_resources("AWS::IAM::Policy").items()
        if k.startswith("ScalingStateMachineRoleDefaultPolicy")
    ]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    (update,) = [s for s in statements if s["Action"] == "eks:updateNodegroupConfig"]
    assert "Accelerators" in json.dumps(update["Resource"])
