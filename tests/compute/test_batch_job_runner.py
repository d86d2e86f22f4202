"""BatchJobRunner alone, in a bare stack: the `batch:submitJob.sync` state of each job, the Spot-then-on-demand
block of single-node jobs, and what the state machine's role may do."""

import json
import re

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_stepfunctions as sfn
import pytest

from constructs.compute.batch.job_definitions import RETRY_RULES
from constructs.compute.batch.job_runner import BatchJobRunner
from tests.alone import template_of
from tests.pipeline.runs import queue_of, states


def _runner(*, on_demand_fallback: bool = False, share: str | None = "production") -> tuple[cdk.Stack, BatchJobRunner]:
    stack = cdk.Stack()
    return stack, BatchJobRunner(
        multi_node_queue="MultiNodeQueue",
        single_node_queue="SingleNodeQueue",
        job_definitions={kind: f"{kind.capitalize()}Definition" for kind in ("sanity", "train", "validate")},
        share_identifier=share,
        single_node_on_demand_queue="SingleNodeOnDemandQueue" if on_demand_fallback else None,
    )


def _state(stack: cdk.Stack, chainable) -> dict:
    return stack.resolve(chainable.to_state_json())


def test_a_job_is_a_submit_job_sync_task_with_its_queue_definition_and_parameters():
    stack, runner = _runner()
    state = _state(
        stack,
        runner.submit(
            stack,
            "Train",
            job="train",
            parameters={"run_id": "$.job.run_id"},
            job_name="$.name",
            nodes="$.run.nodes",
            result_path="$.jobs.train",
            timeout="$.timeouts.train",
        ),
    )
    assert state["Type"] == "Task" and ":states:::batch:submitJob.sync" in json.dumps(state["Resource"])
    request = state["Parameters"]
    # The queue by an ARN formatted from its fixed name in this stack; the job definition by its name alone, so
    # SubmitJob runs its latest active revision (Batch API reference, SubmitJob `jobDefinition`).
    assert json.dumps(request["JobQueue"]).endswith(':job-queue/MultiNodeQueue"]]}')
    assert request["JobDefinition"] == "TrainDefinition"
    # Per-run values as job Parameters (multi-node jobs take no container overrides); the run's node count too.
    assert request["Parameters"] == {"run_id.$": "$.job.run_id", "nodes.$": "States.Format('{}', $.run.nodes)"}
    assert request["JobName.$"] == "$.name" and request["PropagateTags"] is True
    # Fair-share queues reject a SubmitJob without a share identifier.
    assert request["ShareIdentifier"] == "production"
    assert state["ResultSelector"] == {"JobId.$": "$.JobId", "JobName.$": "$.JobName", "Status.$": "$.Status"}
    assert (state["ResultPath"], state["TimeoutSecondsPath"]) == ("$.jobs.train", "$.timeouts.train")


def test_single_node_jobs_go_to_the_single_node_queue_without_a_node_count():
    stack, runner = _runner()
    state = _state(
        stack,
        runner.submit(
            stack,
            "Validate",
            job="validate",
            parameters={},
            job_name="$.name",
            nodes="$.run.nodes",
            timeout=cdk.Duration.hours(2),
        ),
    )
    assert "SingleNodeQueue" in json.dumps(state["Parameters"]["JobQueue"])
    assert "nodes.$" not in state["Parameters"]["Parameters"] and state["TimeoutSeconds"] == 7200


def test_attempts_come_with_the_job_definitions_own_exit_rules():
    # A SubmitJob RetryStrategy replaces the job definition's (Batch SubmitJob API): the same EvaluateOnExit rules.
    stack, runner = _runner()
    state = _state(
        stack,
        runner.submit(stack, "Train", job="train", parameters={}, job_name="$.name", attempts="$.run.max_attempts"),
    )
    strategy = state["Parameters"]["RetryStrategy"]
    assert strategy["Attempts.$"] == "$.run.max_attempts"
    assert [rule["Action"] for rule in strategy["EvaluateOnExit"]] == [action.value for action, _ in RETRY_RULES]
    assert strategy["EvaluateOnExit"][0] == {"OnStatusReason": "Host EC2*", "Action": "RETRY"}


def test_a_single_node_job_falls_back_to_on_demand_in_one_block():
    # Batch documents no fall-through from Spot to on-demand capacity: the runner catches the Spot attempt.
    stack, runner = _runner(on_demand_fallback=True)
    block = runner.submit(stack, "Validate", job="validate", parameters={}, job_name="$.name")
    assert isinstance(block, sfn.Parallel)
    sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(block))
    template = template_of(stack)
    (branch,) = states(template)["Validate"]["Branches"]
    assert branch["StartAt"] == "ValidateOnSpot"
    assert "SingleNodeOnDemandQueue" in queue_of(template, "ValidateOnDemand")
    assert "SingleNodeQueue" in queue_of(template, "ValidateOnSpot")


def test_the_role_may_submit_to_its_queues_and_definitions_and_follow_its_jobs():
    stack, runner = _runner()
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("states.amazonaws.com"))
    runner.grant(role)
    (policy,) = [p for k, p in template_of(stack)["Resources"].items() if k.startswith("RoleDefaultPolicy")]
    statements = {json.dumps(s["Action"]): s["Resource"] for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    submit = statements['"batch:SubmitJob"']
    assert len(submit) == 7  # two queues, three job definitions, the registered workloads', the job SubmitJob creates
    # Every revision of each definition: the request's ARN carries the revision SubmitJob resolved (Batch user
    # guide, "Restrict job submission", "Accounting for job definition revisions").
    definitions = sorted(re.findall(r'job-definition/([^"]+)"', json.dumps(submit)))
    assert definitions == [
        "SanityDefinition:*",
        "TrainDefinition:*",
        "ValidateDefinition:*",
        "efa-training-manual-wl-*:*",
    ]
    assert statements['"batch:DescribeJobs"'] == "*"  # no resource-level permissions
    # A registered workload's definitions: registered under its prefix only, passing on the Batch stack's roles.
    assert "job-definition/efa-training-manual-wl-*" in json.dumps(
        statements['["batch:RegisterJobDefinition", "batch:TagResource"]']
    )
    assert "role/EfaTraining-manual-Batch-*" in json.dumps(statements['"iam:PassRole"'])
    assert "job/*" in json.dumps(statements['"batch:TerminateJob"'])
    assert "StepFunctionsGetEventsForBatchJobsRule" in json.dumps(
        statements['["events:PutTargets", "events:PutRule", "events:DescribeRule"]']
    )


def test_a_job_without_its_definition_is_refused():
    with pytest.raises(ValueError, match="job_definitions lacks validate"):
        BatchJobRunner(
            multi_node_queue="q", single_node_queue="q", job_definitions={kind: kind for kind in ("sanity", "train")}
        )
