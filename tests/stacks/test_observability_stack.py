"""ObservabilityStack alone (with the stacks it reads): the alarms, dashboard and budget wired to the environment's
config, the alerts stack's topic and the compute backend's metrics and queues. Its constructs: tests/observability/."""

import json

import pytest
from aws_cdk.assertions import Template

from tests.alone import StacksAlone
from tests.observability.metrics import alarms


@pytest.fixture(scope="module")
def dev() -> Template:
    environment = StacksAlone()
    return environment.template(environment.observability())


def test_alarms_publish_to_the_alerts_stacks_topic(dev):
    # Every alarm's action is the environment's alerts topic, a reference into the Alerts stack.
    found = alarms(dev)
    assert len(found) == 4
    for name, props in found.items():
        assert "EfaTraining-dev-Alerts" in json.dumps(props["AlarmActions"]), name


def test_the_idle_alarm_follows_the_environments_config(dev):
    # gpu_idle_threshold_percent and gpu_idle_minutes (defaults 20 % over 30 minutes: six 5-minute periods).
    alarm = alarms(dev)["EfaTraining-dev-accelerators-idle"]
    assert (alarm["Threshold"], alarm["EvaluationPeriods"]) == (20, 6)


def test_the_budget_notifies_the_alerts_stacks_topic(dev):
    (budget,) = dev.find_resources("AWS::Budgets::Budget").values()
    for notification in budget["Properties"]["NotificationsWithSubscribers"]:
        assert "EfaTraining-dev-Alerts" in json.dumps(notification["Subscribers"][0]["Address"])


def test_job_states_are_counted_for_the_batch_stacks_queues(dev):
    # The seam (ComputeBackend.job_queue_arns): the job-state rule listens to the Batch stack's own queues.
    (rule,) = dev.find_resources("AWS::Events::Rule").values()
    queues = [q["Fn::GetStackOutput"] for q in rule["Properties"]["EventPattern"]["detail"]["jobQueue"]]
    assert {q["StackName"] for q in queues} == {"EfaTraining-dev-Batch"}
    assert [q["OutputName"].split("FnGetAtt")[1].split("Queue")[0] for q in queues] == ["MultiNode", "SingleNode"]


def test_eks_has_no_job_state_rule_and_watches_its_cluster():
    # EKS jobs go straight to the cluster: no queues to count; the dashboard names the environment's cluster.
    environment = StacksAlone(compute="eks")
    template = environment.template(environment.observability())
    assert template.find_resources("AWS::Events::Rule") == {}
    assert "ClusterName=" in json.dumps(template.find_resources("AWS::CloudWatch::Dashboard"))
