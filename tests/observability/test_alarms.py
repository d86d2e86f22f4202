"""TrainingAlarms alone, in a bare stack: idle accelerators per node, a non-finite loss, a filling file system, a broken
pipeline (rejected models and refused inputs apart), each to the topic it is given."""

import json

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Match, Template

from config import Accelerator
from constructs.observability.accelerator_metrics import AcceleratorMetrics, accelerator_metrics
from constructs.observability.alarms import GIB, TrainingAlarms
from tests.observability.metrics import alarms


def _alarms(
    accelerators: AcceleratorMetrics | None = None,
    *,
    idle_threshold_percent: float = 20,
    idle_minutes: int = 30,
    fsx_storage_gib: int = 1200,
    fsx_free_percent: float = 10,
    pipeline: bool = True,
) -> Template:
    stack = cdk.Stack()
    machine = (
        sfn.StateMachine(stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P")))
        if pipeline
        else None
    )
    log_group = logs.LogGroup(stack, "ExecutionLogs") if pipeline else None
    TrainingAlarms(
        stack,
        "Alarms",
        topic=sns.Topic(stack, "Alerts"),
        alarm_prefix="p",
        accelerators=accelerators or accelerator_metrics("batch", Accelerator.NVIDIA, environment="dev"),
        file_system_id="fs-1",
        fsx_storage_gib=fsx_storage_gib,
        fsx_free_percent=fsx_free_percent,
        idle_threshold_percent=idle_threshold_percent,
        idle_minutes=idle_minutes,
        state_machine=machine,
        execution_log_group=log_group,
        pipeline_namespace="EfaTraining/dev/Pipeline",
        environment="dev",
    )
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def batch_alarms() -> Template:
    return _alarms()


def test_every_alarm_notifies_the_topic(batch_alarms):
    # Each paging alarm's action is the topic the construct is given (the environment's alerts topic); NoProgress
    # pages through its composite, not its two halves.
    # The idle alarm pages through its composite too (not while a node says it is up but not training).
    found = alarms(batch_alarms)
    paging = {"p-non-finite-loss", "p-fsx-free-capacity-low", "p-pipeline-broken", "p-straggler"}
    parts = {"p-accelerators-idle", "p-accelerator-hosts-up", "p-progress-silent", "p-not-training"}
    assert set(found) == paging | parts
    (topic,) = batch_alarms.find_resources("AWS::SNS::Topic")
    composites = {
        c["Properties"]["AlarmName"]: c["Properties"]
        for c in batch_alarms.find_resources("AWS::CloudWatch::CompositeAlarm").values()
    }
    assert set(composites) == {"p-no-progress", "p-accelerators-idle-alert"}
    for name, props in [*((n, found[n]) for n in paging), *composites.items()]:
        assert props["AlarmActions"] == [{"Ref": topic}], name
    assert all("AlarmActions" not in found[name] for name in parts)


# NoProgress: accelerator hosts up (any utilisation value of this environment's nodes) AND no progress line of any
# run of this environment, both for the whole hour; no progress data at all breaches (a silent run sends nothing),
# no host data does not (no host up). The watchdog's default floor is 30 minutes, so by then it has acted or is gone.
def test_no_progress_pages_when_hosts_are_up_and_no_run_reports_progress(batch_alarms):
    found = alarms(batch_alarms)
    hosts, silent = found["p-accelerator-hosts-up"], found["p-progress-silent"]
    assert hosts["Metrics"][0]["Expression"] == (
        "SELECT COUNT(nvidia_smi_utilization_gpu) FROM CWAgent WHERE Environment = 'dev'"
    )
    assert (hosts["Threshold"], hosts["ComparisonOperator"], hosts["TreatMissingData"]) == (
        0, "GreaterThanThreshold", "notBreaching")  # fmt: skip
    assert silent["Metrics"][0]["Expression"] == (
        "SELECT SUM(ProgressLines) FROM SCHEMA(EfaTraining, Environment, RunId) WHERE Environment = 'dev'"
    )
    assert (silent["Threshold"], silent["ComparisonOperator"], silent["TreatMissingData"]) == (
        1, "LessThanThreshold", "breaching")  # fmt: skip
    for alarm in (hosts, silent):
        assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 12 and alarm["Metrics"][0]["Period"] == 300
    rule = json.dumps(_composite(batch_alarms, "p-no-progress")["AlarmRule"])
    assert rule.count("ALARM(") == 3 and rule.count(" AND ") == 2, rule
    assert "AlarmsNotTraining" in rule.split("NOT (ALARM(")[1], rule  # held while a node is not training


def _composite(template: Template, name: str) -> dict:
    (found,) = [
        c["Properties"]
        for c in template.find_resources("AWS::CloudWatch::CompositeAlarm").values()
        if c["Properties"]["AlarmName"] == name
    ]
    return found


# Not training: any node of this environment said so in the last 5 minutes (the launcher's NotTraining, once a minute
# in a sanity check, compile, validation or a training's warm-up); the idle and NoProgress alarms do not page then, so
# a Trainium compile of hours is not an idle node (training_image .../launch/stage_heartbeat.py).
def test_idle_pages_only_while_no_node_says_it_is_not_training(batch_alarms):
    stage = alarms(batch_alarms)["p-not-training"]
    assert stage["Metrics"][0]["Expression"] == (
        "SELECT MAX(NotTraining) FROM SCHEMA(EfaTraining, Environment, RunId) WHERE Environment = 'dev'"
    )
    assert (stage["Threshold"], stage["ComparisonOperator"], stage["TreatMissingData"]) == (
        1, "GreaterThanOrEqualToThreshold", "notBreaching")  # fmt: skip
    rule = json.dumps(_composite(batch_alarms, "p-accelerators-idle-alert")["AlarmRule"])
    assert rule.count("ALARM(") == 2 and "AlarmsAcceleratorsIdle" in rule.split(" AND ")[0], rule
    assert "AlarmsNotTraining" in rule.split("NOT (ALARM(")[1], rule


def test_idle_accelerator_alarm_uses_the_threshold_and_duration():
    # Below idle_threshold_percent for idle_minutes (5-minute periods) raises the alarm.
    alarm = alarms(_alarms(idle_threshold_percent=15, idle_minutes=45))["p-accelerators-idle"]
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (15, "LessThanThreshold")
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 45 // 5


def test_idle_alarm_on_batch_watches_each_host_of_this_environment(batch_alarms):
    # One contributor per host (GROUP BY host), only this environment's series (the agent's Environment
    # dimension): one idle node among busy ones raises it (CloudWatch multi-time-series Metrics Insights alarms).
    alarm = alarms(batch_alarms)["p-accelerators-idle"]
    assert alarm["Metrics"][0]["Expression"] == (
        "SELECT AVG(nvidia_smi_utilization_gpu) FROM CWAgent WHERE Environment = 'dev' GROUP BY host ORDER BY AVG() ASC"
    )


def test_idle_alarm_on_eks_watches_each_node_of_the_cluster():
    # On EKS: Container Insights' node_gpu_utilization (ClusterName, InstanceId, NodeName) per node of this cluster.
    template = _alarms(
        accelerator_metrics("eks", Accelerator.NVIDIA, environment="dev", cluster_name="training"), pipeline=False
    )
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "Metrics": [
                Match.object_like(
                    {
                        "Expression": " ".join(
                            (
                                "SELECT AVG(node_gpu_utilization)",
                                "FROM SCHEMA(ContainerInsights, ClusterName, InstanceId, NodeName)",
                                "WHERE ClusterName = 'training' GROUP BY NodeName ORDER BY AVG() ASC",
                            )
                        )
                    }
                )
            ]
        },
    )


# A straggler: one contributor per run of this environment, the same rank the slowest at 1.5 x the median's time for
# fifteen minutes (StragglerPersistSeconds, rank 0's count: the bad-host rule's), not a ratio averaged over a run's
# lines that one rank's noise can lift at 32 ranks.
def test_straggler_alarm_pages_when_the_same_rank_stayed_the_slowest_for_fifteen_minutes(batch_alarms):
    alarm = alarms(batch_alarms)["p-straggler"]
    assert alarm["Metrics"][0]["Expression"] == (
        "SELECT MAX(StragglerPersistSeconds) FROM SCHEMA(EfaTraining, Environment, RunId) WHERE Environment = 'dev' "
        "GROUP BY RunId"
    )
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (900, "GreaterThanOrEqualToThreshold")
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 1 and alarm["Metrics"][0]["Period"] == 300
    assert "SlowestHost" in alarm["AlarmDescription"]


def test_non_finite_loss_alarm_fires_on_any_run(batch_alarms):
    # One NonFiniteLoss >= 1 in any RunId of this environment within a minute raises the alarm; other
    # environments' runs (same namespace, another Environment value) never do.
    alarm = alarms(batch_alarms)["p-non-finite-loss"]
    assert alarm["Metrics"][0]["Expression"] == (
        "SELECT MAX(NonFiniteLoss) FROM SCHEMA(EfaTraining, Environment, RunId) WHERE Environment = 'dev'"
    )
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")


@pytest.mark.parametrize(("storage_gib", "free_percent"), [(1200, 10), (4800, 12.5)])
def test_fsx_alarm_threshold_is_the_given_share_of_the_fullest_target(storage_gib, free_percent):
    # The fullest storage target's free bytes over one target's share of fsx_storage_gib, in percent, below
    # fsx_free_percent raises the alarm.
    alarm = alarms(_alarms(fsx_storage_gib=storage_gib, fsx_free_percent=free_percent))["p-fsx-free-capacity-low"]
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert expression["Expression"] == f"100 * fullest * targets / {storage_gib * GIB}"
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (free_percent, "LessThanThreshold")


def test_fsx_alarm_reads_the_fullest_storage_target(batch_alarms):
    # FSx for Lustre user guide (fs-metrics.html): FreeDataStorageCapacity's Minimum is the fullest storage target's
    # free bytes, SampleCount the number of targets; one-minute periods hold one sample per target. A full target
    # fails the writes striped to it while the Sum over the file system still looks free.
    alarm = alarms(batch_alarms)["p-fsx-free-capacity-low"]
    stats = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert {k: (v["Stat"], v["Period"]) for k, v in stats.items()} == {
        "fullest": ("Minimum", 60),
        "targets": ("SampleCount", 60),
    }
    for stat in stats.values():
        assert stat["Metric"]["MetricName"] == "FreeDataStorageCapacity"
        assert stat["Metric"]["Dimensions"] == [{"Name": "FileSystemId", "Value": "fs-1"}]


def test_broken_pipeline_alarm_adds_failures_timeouts_and_aborts(batch_alarms):
    # failed (other than a rejected model) + timed out + aborted >= 1 in 5 minutes pages the topic.
    alarm = alarms(batch_alarms)["p-pipeline-broken"]
    metrics = {m["Id"]: m for m in alarm["Metrics"]}
    assert metrics["expr_1"]["Expression"] == "FILL(failed, 0) + FILL(timedOut, 0) + FILL(aborted, 0)"
    assert metrics["failed"]["MetricStat"]["Metric"]["MetricName"] == "PipelineFailures"
    assert [metrics[k]["MetricStat"]["Metric"]["MetricName"] for k in ("timedOut", "aborted")] == [
        "ExecutionsTimedOut",
        "ExecutionsAborted",
    ]
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold")


@pytest.mark.parametrize(
    ("metric", "pattern"),
    [
        # A refused input (InvalidInput: malformed, or a run id already taken) ran nothing, and a designed ending the
        # pipeline mailed (no capacity, a reservation's end, over budget, a reservation that cannot serve the run) asks
        # nothing of the on-call: neither is a broken pipeline.
        (
            "PipelineFailures",
            '{ ($.type = "ExecutionFailed") && ($.details.error != "ValidationFailed") && '
            '($.details.error != "InvalidInput") && ($.details.error != "CapacityUnavailable") && '
            '($.details.error != "ReservationEnded") && ($.details.error != "OverBudget") && '
            '($.details.error != "ReservationEndsTooSoon") && ($.details.error != "ReservationOver") && '
            '($.details.error != "ReservationZoneMismatch") }',
        ),
        ("ModelsRejected", '{ ($.type = "ExecutionFailed") && ($.details.error = "ValidationFailed") }'),
    ],
)
def test_execution_log_filters_split_failures_from_rejected_models(batch_alarms, metric, pattern):
    # Step Functions' ExecutionFailed log event names the error: a rejected model is counted apart, never paged.
    batch_alarms.has_resource_properties(
        "AWS::Logs::MetricFilter",
        {
            "FilterPattern": pattern,
            "MetricTransformations": [
                Match.object_like(
                    {"MetricName": metric, "MetricNamespace": "EfaTraining/dev/Pipeline", "MetricValue": "1"}
                )
            ],
        },
    )


def test_without_a_pipeline_there_is_no_pipeline_alarm():
    assert "p-pipeline-broken" not in alarms(_alarms(pipeline=False))


@pytest.mark.parametrize("accelerator", [Accelerator.NVIDIA, Accelerator.NEURON])
def test_idle_alarm_on_sagemaker_has_one_per_host_threshold(accelerator):
    # The jobs' own utilisation is the mean over the host's accelerators: 20 % is 20 on an 8-GPU host as on a 1-GPU one.
    metrics = accelerator_metrics("sagemaker", accelerator, environment="dev")
    alarm = alarms(_alarms(metrics, idle_threshold_percent=20, pipeline=False))["p-accelerators-idle"]
    assert alarm["Threshold"] == 20
