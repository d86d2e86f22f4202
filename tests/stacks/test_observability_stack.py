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
    # Every paging alarm's action is the environment's alerts topic, a reference into the Alerts stack; the parts of
    # NoProgress and of the idle alert page nobody themselves (their composites do).
    found = {name: props for name, props in alarms(dev).items() if "AlarmActions" in props}
    composites = [c["Properties"] for c in dev.find_resources("AWS::CloudWatch::CompositeAlarm").values()]
    assert len(found) == 4 and len(composites) == 2  # the idle alarm pages through its composite
    for name, props in [*found.items(), *((c["AlarmName"], c) for c in composites)]:
        assert "EfaTraining-dev-Alerts" in json.dumps(props["AlarmActions"]), name


def test_the_idle_alarm_follows_the_environments_config(dev):
    # gpu_idle_threshold_percent and gpu_idle_minutes (defaults 20 % over 30 minutes: six 5-minute periods).
    alarm = alarms(dev)["EfaTraining-dev-accelerators-idle"]
    assert (alarm["Threshold"], alarm["EvaluationPeriods"]) == (20, 6)


def test_the_budget_notifies_the_alerts_stacks_topic(dev):
    (budget,) = dev.find_resources("AWS::Budgets::Budget").values()
    for notification in budget["Properties"]["NotificationsWithSubscribers"]:
        assert "EfaTraining-dev-Alerts" in json.dumps(notification["Subscribers"][0]["Address"])


def test_job_states_are_counted_for_every_batch_queue(dev):
    # The seam (ComputeBackend.job_queue_names): the job-state rule listens to the Batch stack's three queues, the
    # on-demand validation queue included, by ARNs formatted from their fixed names (no cross-stack reference).
    (rule,) = dev.find_resources("AWS::Events::Rule").values()
    queues = [json.dumps(q) for q in rule["Properties"]["EventPattern"]["detail"]["jobQueue"]]
    assert [q.split("job-queue/")[1].split('"')[0] for q in queues] == [
        "efa-training-dev-multi-node",
        "efa-training-dev-single-node",
        "efa-training-dev-single-node-on-demand",
    ]
    assert not any("GetStackOutput" in q for q in queues)


def test_eks_has_no_job_state_rule_and_watches_its_cluster():
    # EKS jobs go straight to the cluster: no queues to count; the dashboard names the environment's cluster.
    environment = StacksAlone(compute="eks")
    template = environment.template(environment.observability())
    assert template.find_resources("AWS::Events::Rule") == {}
    assert "ClusterName=" in json.dumps(template.find_resources("AWS::CloudWatch::Dashboard"))


def test_a_replaced_file_system_changes_the_alarms_template():
    # The alarms and dashboard read the file system's id through Fn::GetStackOutput, resolved only when this stack is
    # updated (CloudFormation template reference, "Fn::GetStackOutput"): its revision makes a replacement update it.
    def description(**overrides: object) -> str:
        environment = StacksAlone(**overrides)
        return alarms(environment.template(environment.observability()))["EfaTraining-dev-fsx-free-capacity-low"][
            "AlarmDescription"
        ]

    before, after = description(), description(fsx_deployment_type="PERSISTENT_2", fsx_storage_gib="2400")
    assert before != after and "file system revision" in after
