"""Every alarm names a metric its producer emits, with exactly the dimensions the alarm uses: a table from
(namespace, metric) to the dimension sets each producer is documented (cited) or tested to emit; one test per alarm.

A MetricStat (or a Metrics Insights query FROM SCHEMA(...)) matches one exact dimension set; a Metrics Insights query
FROM a bare namespace matches every series that has the dimensions it filters and groups on ("Metrics Insights query
components and syntax", SCHEMA). A producer's entry is derived from the producer itself wherever the producer is ours:
the agent configuration the Batch host script writes, the EMF lines the training image prints, the metric filter the
alarm construct creates."""

import io
import json
import math
import re
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Template

from config import CATALOGUE, Accelerator
from constructs.compute.batch.host_user_data import CWAGENT_CONFIG, host_commands
from constructs.observability.accelerator_metrics import accelerator_metrics
from constructs.observability.alarms import TrainingAlarms
from tests.observability.metrics import NVIDIA, alarms, training_image_module

Producers = dict[tuple[str, str], list[frozenset[str]]]
ENVIRONMENT, CLUSTER, PIPELINE_NAMESPACE = "dev", "training", "EfaTraining/dev/Pipeline"
# CloudWatch user guide, "Collect NVIDIA GPU metrics": the agent's nvidia_gpu measurements and their CloudWatch names,
# "collected with the following dimensions: index, name, host" (host unless the agent section sets omit_hostname).
NVIDIA_GPU_NAMES = {"utilization_gpu": "nvidia_smi_utilization_gpu", "memory_used": "nvidia_smi_memory_used"}
NVIDIA_GPU_DIMENSIONS = {"index", "name"}
# CloudWatch user guide, "Amazon EKS and Kubernetes Container Insights with enhanced observability metrics": each
# node_* metric with its documented dimension sets (ClusterName alone, and ClusterName, InstanceId, NodeName).
CONTAINER_INSIGHTS_NODE_SETS = [frozenset({"ClusterName"}), frozenset({"ClusterName", "InstanceId", "NodeName"})]
DOCUMENTED: Producers = {
    ("ContainerInsights", "node_gpu_utilization"): CONTAINER_INSIGHTS_NODE_SETS,
    ("ContainerInsights", "node_neuroncore_utilization"): CONTAINER_INSIGHTS_NODE_SETS,
    # FSx for Lustre user guide, "Amazon FSx for Lustre metrics and dimensions" (fs-metrics.html): FileSystemId.
    ("AWS/FSx", "FreeDataStorageCapacity"): [frozenset({"FileSystemId"})],
    # Step Functions developer guide, "Monitoring Step Functions metrics using Amazon CloudWatch": execution metrics
    # take the dimension StateMachineArn.
    ("AWS/States", "ExecutionsTimedOut"): [frozenset({"StateMachineArn"})],
    ("AWS/States", "ExecutionsAborted"): [frozenset({"StateMachineArn"})],
}
INSIGHTS = re.compile(
    r"SELECT \w+\((?P<metric>\w+)\) FROM (?:SCHEMA\((?P<schema>[^)]*)\)|(?P<namespace>\S+))"
    r"(?: WHERE (?P<where>.+?))?(?: GROUP BY (?P<group>[\w, ]+?))?(?: ORDER BY .*)?$"
)


def _emf_series(record: dict) -> Producers:
    """The (namespace, metric) -> dimension sets one EMF document declares (its _aws.CloudWatchMetrics)."""
    return {
        (directive["Namespace"], metric["Name"]): [frozenset(dims) for dims in directive["Dimensions"]]
        for directive in record["_aws"]["CloudWatchMetrics"]
        for metric in directive["Metrics"]
    }


def _batch_agent() -> Producers:
    """What the CloudWatch agent on a Batch GPU host publishes, read from the configuration the host script writes."""
    script = host_commands(instance=CATALOGUE[NVIDIA], fsx_dns_name="d", fsx_mount_name="m", environment=ENVIRONMENT)
    config = json.loads(script[script.index(f"cat > {CWAGENT_CONFIG} <<'CWAGENT'") + 1])
    section = config["metrics"]["metrics_collected"]["nvidia_gpu"]
    host = set() if config["agent"].get("omit_hostname") else {"host"}
    dimensions = frozenset(NVIDIA_GPU_DIMENSIONS | host | set(section.get("append_dimensions", {})))
    namespace = config["metrics"]["namespace"]
    return {(namespace, NVIDIA_GPU_NAMES[m]): [dimensions] for m in section["measurement"] if m in NVIDIA_GPU_NAMES}


def _training_image(monkeypatch: pytest.MonkeyPatch) -> Producers:
    """What the training image prints: one training step with a NaN loss, and one host utilisation line."""
    metrics, host_metrics = training_image_module("metrics"), training_image_module("host_metrics")
    monkeypatch.setenv("TRAINING_ENVIRONMENT", ENVIRONMENT)
    stream = io.StringIO()
    # A step line as the built-in trainer prints it on several ranks: with the straggler figures (runtime/stragglers.py)
    straggler = {"StragglerRatio": 1.0, "DataWaitSeconds": 0.0, "StragglerPersistSeconds": 0.0}
    metrics.MetricsLogger("run-1", True, stream=stream, environ={}).step(1, math.nan, 1.0, 1.0, None, {}, **straggler)
    step = _emf_series(json.loads(stream.getvalue()))
    # A node up but not training, as the launcher says it once a minute (runtime/launch/stage_heartbeat.py)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "training_image"))  # the image's root
    from efa_training.runtime.launch.stage_heartbeat import StageHeartbeat

    heartbeat = StageHeartbeat("compile", {}, "run-1")
    heartbeat.metrics.stream = stream = io.StringIO()
    assert heartbeat.beat()
    stage = _emf_series(json.loads(stream.getvalue()))
    return {**step, **stage, **_emf_series(host_metrics.emf_record(ENVIRONMENT, "job/algo-1", 50.0, 0))}


def _pipeline_filters(template: Template) -> Producers:
    """The metric filters the alarm construct creates on the execution log (no dimensions)."""
    return {
        (t["MetricNamespace"], t["MetricName"]): [frozenset(d["Key"] for d in t.get("Dimensions", []))]
        for f in template.find_resources("AWS::Logs::MetricFilter").values()
        for t in f["Properties"]["MetricTransformations"]
    }


def _alarms(backend: str, accelerator: Accelerator) -> Template:
    stack = cdk.Stack()
    machine = sfn.StateMachine(stack, "M", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P")))
    TrainingAlarms(
        stack,
        "Alarms",
        topic=sns.Topic(stack, "T"),
        alarm_prefix="p",
        accelerators=accelerator_metrics(backend, accelerator, environment=ENVIRONMENT, cluster_name=CLUSTER),
        file_system_id="fs-1",
        fsx_storage_gib=1200,
        fsx_free_percent=10,
        idle_threshold_percent=20,
        idle_minutes=30,
        state_machine=machine,
        execution_log_group=logs.LogGroup(stack, "ExecutionLogs"),
        pipeline_namespace=PIPELINE_NAMESPACE,
        environment=ENVIRONMENT,
    )
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def batch_gpu() -> Template:
    return _alarms("batch", Accelerator.NVIDIA)


@pytest.fixture
def producers(monkeypatch: pytest.MonkeyPatch, batch_gpu: Template) -> Producers:
    return {**DOCUMENTED, **_batch_agent(), **_training_image(monkeypatch), **_pipeline_filters(batch_gpu)}


def _queried(alarm: dict) -> list[tuple[str, str, frozenset[str], bool]]:
    """(namespace, metric, dimensions, exact) of every metric an alarm reads."""
    if "MetricName" in alarm:
        return [(alarm["Namespace"], alarm["MetricName"], frozenset(d["Name"] for d in alarm["Dimensions"]), True)]
    found = []
    for query in alarm["Metrics"]:
        if "MetricStat" in query:
            metric = query["MetricStat"]["Metric"]
            names = frozenset(d["Name"] for d in metric.get("Dimensions", []))
            found.append((metric["Namespace"], metric["MetricName"], names, True))
        elif query["Expression"].startswith("SELECT"):
            found.append(_insights(query["Expression"]))
    return found


def _insights(query: str) -> tuple[str, str, frozenset[str], bool]:
    match = INSIGHTS.fullmatch(query)
    assert match, query
    if match["schema"]:
        namespace, *schema = [part.strip().strip('"') for part in match["schema"].split(",")]
        return namespace, match["metric"], frozenset(schema), True
    used = {part.split("=")[0].strip() for part in (match["where"] or "").split(" AND ") if part}
    used |= {name.strip() for name in (match["group"] or "").split(",") if name.strip()}
    return match["namespace"].strip('"'), match["metric"], frozenset(used), False


def _unproduced(alarm: dict, producers: Producers) -> list[tuple]:
    """The metrics an alarm reads that no producer emits with those dimensions (empty when all are)."""
    missing = []
    for namespace, metric, dimensions, exact in _queried(alarm):
        sets = producers.get((namespace, metric), [])
        if not any(dimensions == s if exact else dimensions <= s for s in sets):
            missing.append((namespace, metric, sorted(dimensions), sets))
    return missing


# Each test below covers one alarm; a new alarm without its test fails here.
def test_every_alarm_has_its_producer_test(batch_gpu):
    covered = {"p-accelerators-idle", "p-non-finite-loss", "p-fsx-free-capacity-low", "p-pipeline-broken",
               "p-accelerator-hosts-up", "p-progress-silent", "p-straggler", "p-not-training"}  # fmt: skip
    assert set(alarms(batch_gpu)) == covered


# The idle alarm and NoProgress's half "hosts up" of every backend read a utilisation its producer emits with the
# dimensions the query filters and groups on: the CloudWatch agent's (Batch GPU), Container Insights' (EKS), the
# training image's own (Batch Trainium hosts, SageMaker jobs).
@pytest.mark.parametrize("name", ["p-accelerators-idle", "p-accelerator-hosts-up"])
@pytest.mark.parametrize(
    ("backend", "accelerator"),
    [(b, a) for b in ("batch", "eks", "sagemaker") for a in (Accelerator.NVIDIA, Accelerator.NEURON)],
)
def test_utilisation_alarms_read_an_emitted_utilisation(name, backend, accelerator, producers):
    alarm = alarms(_alarms(backend, accelerator))[name]
    assert _queried(alarm) and not _unproduced(alarm, producers)


# NoProgress's half "progress silent": ProgressLines, on the built-in trainer's step line and on the lines the launcher
# turns a declared workload's log into (the same Environment, RunId).
def test_progress_silent_reads_what_every_workload_emits(batch_gpu, producers, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "training_image"))  # the image's root
    from efa_training.runtime.user_workload import UserWorkload
    from efa_training.runtime.workload_metrics import LogMetrics

    assert not _unproduced(alarms(batch_gpu)["p-progress-silent"], producers)
    declared = UserWorkload.from_json(json.dumps({"name": "w", "launch": "torchrun", "train": ["t"], "validate": ["v"],
                                                  "metric": {"name": "loss", "direction": "lower"},
                                                  "metrics": {"loss": "loss=([0-9.]+)"}}))  # fmt: skip
    lines: list[str] = []
    LogMetrics(declared, "run-1", ENVIRONMENT, emit=lines.append).feed("step 3 loss=0.5")
    declared_producers = _emf_series(json.loads(lines[0]))
    assert not _unproduced(alarms(batch_gpu)["p-progress-silent"], declared_producers)


# The straggler ratio: the built-in trainer's step line (Environment, RunId), exactly the SCHEMA the alarm reads.
def test_straggler_alarm_reads_what_training_emits(batch_gpu, producers):
    assert not _unproduced(alarms(batch_gpu)["p-straggler"], producers)


# NonFiniteLoss: the training image's EMF line (Environment, RunId), exactly the SCHEMA the alarm reads.
def test_non_finite_loss_alarm_reads_what_training_emits(batch_gpu, producers):
    assert not _unproduced(alarms(batch_gpu)["p-non-finite-loss"], producers)


# FreeDataStorageCapacity with FileSystemId, as FSx documents it.
def test_fsx_alarm_reads_what_fsx_publishes(batch_gpu, producers):
    assert not _unproduced(alarms(batch_gpu)["p-fsx-free-capacity-low"], producers)


# The broken pipeline: its own metric filter's PipelineFailures, and Step Functions' ExecutionsTimedOut and
# ExecutionsAborted by StateMachineArn.
def test_pipeline_alarm_reads_its_filter_and_step_functions(batch_gpu, producers):
    alarm = alarms(batch_gpu)["p-pipeline-broken"]
    assert len(_queried(alarm)) == 3 and not _unproduced(alarm, producers)


# The check itself tells a wrong name or a missing dimension apart from an emitted one.
def test_a_metric_nobody_emits_is_caught(producers):
    undocumented = {"Metrics": [{"Expression": 'SELECT AVG(NeuronCoreUtilization) FROM "/aws/sagemaker/TrainingJobs"'}]}
    wrong_set = {"Namespace": "AWS/FSx", "MetricName": "FreeDataStorageCapacity", "Dimensions": [{"Name": "Host"}]}
    assert _unproduced(undocumented, producers) and _unproduced(wrong_set, producers)


# Not training: NotTraining, as the launcher's stage heartbeat sends it (Environment, RunId).
def test_not_training_reads_what_the_launcher_emits(batch_gpu, producers):
    assert not _unproduced(alarms(batch_gpu)["p-not-training"], producers)
