"""Service trusts and resource policies that name their source (the confused deputy), each as its service documents:
the Batch jobs' roles (ECS tasks of this account and region), the EKS reconciler's EventBridge role, the Batch
job-state log group's policy."""

import json

import pytest

from tests.synthesis import synthesize


@pytest.fixture(scope="module")
def batch():
    return synthesize(env="dev")


def _trusts(template: dict, service: str) -> list[dict]:
    return [
        statement
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::IAM::Role"
        for statement in resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        if statement["Principal"].get("Service") == service
    ]


def test_the_batch_jobs_roles_trust_this_accounts_ecs_tasks_only(batch):
    # ECS developer guide, "Task IAM role": aws:SourceAccount and an aws:SourceArn of the account's ECS resources.
    trusts = _trusts(batch.raw("compute"), "ecs-tasks.amazonaws.com")
    assert len(trusts) == 2  # the job role and the execution role
    for trust in trusts:
        assert set(trust["Condition"]) == {"StringEquals", "ArnLike"}
        assert "aws:SourceAccount" in trust["Condition"]["StringEquals"]
        assert ":ecs:" in json.dumps(trust["Condition"]["ArnLike"]["aws:SourceArn"])


def test_the_job_state_log_group_takes_this_accounts_deliveries_only(batch):
    policies = [r for r in batch.raw("observability")["Resources"].values() if r["Type"] == "AWS::Logs::ResourcePolicy"]
    documents = [json.loads(p["Properties"]["PolicyDocument"]) if isinstance(p["Properties"]["PolicyDocument"], str)
                 else p["Properties"]["PolicyDocument"] for p in policies]  # fmt: skip
    assert documents and "aws:SourceAccount" in json.dumps(documents)


def test_the_eks_reconcilers_starter_is_this_accounts_eventbridge_only():
    # EventBridge user guide, "Cross-service confused deputy prevention".
    eks = synthesize(env="dev", compute="eks")
    trusts = _trusts(eks.raw("pipeline"), "events.amazonaws.com")
    assert trusts and all("aws:SourceAccount" in t.get("Condition", {}).get("StringEquals", {}) for t in trusts)
