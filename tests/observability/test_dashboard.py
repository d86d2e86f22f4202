"""TrainingDashboard alone, in a bare stack: the backend's accelerator and EFA series (never the other accelerator's),
the training metrics over run ids, FSx, the pipeline's outcomes and, on Batch, its job states."""

import json

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import pytest
from aws_cdk.assertions import Template

from config import Accelerator
from constructs.observability.accelerator_metrics import AcceleratorMetrics, accelerator_metrics
from constructs.observability.alarms import TrainingAlarms
from constructs.observability.dashboard import (
    PS_GRAPHS,
    PS_METRICS,
    STRAGGLER_GRAPHS,
    TRAINING_METRICS,
    TrainingDashboard,
)
from tests.observability.metrics import body

EXPECTED_ACCELERATOR_METRICS = {
    ("batch", Accelerator.NVIDIA): [
        "nvidia_smi_utilization_gpu",
        "nvidia_smi_memory_used",
        "efa_rx_bytes",
        "efa_tx_bytes",
    ],
    ("batch", Accelerator.NEURON): ["AcceleratorUtilization", "efa_rx_bytes", "efa_tx_bytes"],
    ("eks", Accelerator.NVIDIA): [
        "node_gpu_utilization",
        "node_gpu_memory_utilization",
        "node_efa_rx_bytes",
        "node_efa_tx_bytes",
    ],
    ("eks", Accelerator.NEURON): ["node_neuroncore_utilization", "node_efa_rx_bytes", "node_efa_tx_bytes"],
    ("sagemaker", Accelerator.NVIDIA): ["AcceleratorUtilization"],
    ("sagemaker", Accelerator.NEURON): ["AcceleratorUtilization"],
}


def _metrics(backend: str, accelerator: Accelerator) -> AcceleratorMetrics:
    return accelerator_metrics(
        backend, accelerator, environment="dev", cluster_name="training" if backend == "eks" else None
    )


def _dashboard(accelerators: AcceleratorMetrics, *, pipeline: bool = False, job_states: bool = False) -> Template:
    stack = cdk.Stack()
    machine = outcomes = None
    if pipeline:
        machine = sfn.StateMachine(
            stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P"))
        )
        outcomes = TrainingAlarms(
            stack,
            "Alarms",
            topic=sns.Topic(stack, "T"),
            alarm_prefix="p",
            accelerators=accelerators,
            file_system_id="fs-1",
            fsx_storage_gib=1200,
            fsx_free_percent=10,
            idle_threshold_percent=20,
            idle_minutes=30,
            state_machine=machine,
            execution_log_group=logs.LogGroup(stack, "ExecutionLogs"),
            pipeline_namespace="EfaTraining/dev/Pipeline",
            environment="dev",
        ).pipeline_metrics
    TrainingDashboard(
        stack,
        "Dashboard",
        dashboard_name="d",
        accelerators=accelerators,
        file_system_id="fs-1",
        state_machine=machine,
        pipeline_outcomes=outcomes,
        job_state_namespace="EfaTraining/dev/Batch" if job_states else None,
        environment="dev",
    )
    return Template.from_stack(stack)


@pytest.mark.parametrize(("backend", "accelerator"), list(EXPECTED_ACCELERATOR_METRICS))
def test_dashboard_graphs_the_backends_accelerator_and_efa_metrics(backend, accelerator):
    # GPU/NeuronCore utilisation, memory and EFA bytes come from the metric source of the backend.
    found = body(_dashboard(_metrics(backend, accelerator)))
    for metric in EXPECTED_ACCELERATOR_METRICS[(backend, accelerator)]:
        assert f'MetricName=\\\\\\"{metric}\\\\\\"' in found, metric


@pytest.mark.parametrize("backend", ["batch", "eks"])
def test_dashboard_never_graphs_the_other_accelerators_metrics(backend):
    # A Neuron environment shows no nvidia/GPU series (and vice versa), so no widget stays empty by design.
    neuron = body(_dashboard(_metrics(backend, Accelerator.NEURON)))
    assert "nvidia_smi" not in neuron and "node_gpu_" not in neuron
    nvidia = body(_dashboard(_metrics(backend, Accelerator.NVIDIA)))
    assert "neuroncore" not in nvidia


def test_sagemaker_dashboard_says_where_efa_is_proven_instead_of_an_empty_graph():
    # SageMaker publishes no EFA counters: the dashboard points at the in-job sanity check's report instead.
    found = body(_dashboard(_metrics("sagemaker", Accelerator.NVIDIA)))
    assert "EFA bytes" not in found and "publishes no EFA counters" in found


def test_dashboard_searches_every_training_metric_over_run_ids():
    # Run ids are dynamic: each EMF metric is a SEARCH over the RunId dimension of namespace EfaTraining,
    # limited to this environment's runs (the Environment dimension every job of the environment sets).
    found = body(_dashboard(_metrics("batch", Accelerator.NVIDIA)))
    for metric in TRAINING_METRICS:
        assert (
            f'SEARCH(\'{{EfaTraining,Environment,RunId}} Environment=\\\\\\"dev\\\\\\" '
            f'MetricName=\\\\\\"{metric}\\\\\\"\''
        ) in found, metric


def test_the_dashboard_lists_each_runs_quote_beside_its_actual_cost():
    # The figures the pipeline puts as a run's validation ends (constructs/pipeline/run_cost.py), a row per run.
    (dashboard,) = (
        _dashboard(_metrics("batch", Accelerator.NVIDIA)).find_resources("AWS::CloudWatch::Dashboard").values()
    )
    joined = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    widgets = json.loads("".join(part if isinstance(part, str) else "X" for part in joined))["widgets"]
    (table,) = [w for w in widgets if w["properties"].get("title", "").startswith("Run cost by run")]
    assert table["properties"]["view"] == "table" and table["properties"]["table"]["summaryColumns"] == ["MAX"]
    searched = json.dumps(table["properties"]["metrics"])
    for metric in ("RunQuotedUsd", "RunActualUsd"):
        assert f'Environment=\\"dev\\" MetricName=\\"{metric}\\"' in searched, metric


# The straggler graphs: the slowest device over the median and the longest input wait, by run, as the image names them.
def test_the_straggler_graphs_draw_metrics_the_image_emits():
    from tests.observability.metrics import training_image_module

    assert set(STRAGGLER_GRAPHS.values()) <= set(training_image_module("metrics").UNITS)
    found = body(_dashboard(_metrics("batch", Accelerator.NVIDIA)))
    for title, metric in STRAGGLER_GRAPHS.items():
        assert title in found and f'MetricName=\\\\\\"{metric}\\\\\\"' in found, metric


def test_the_parameter_server_graphs_draw_metrics_the_image_emits():
    # Names are a contract with the image's runtime/metrics.py UNITS (what the parameter-server workers write).
    from tests.observability.metrics import training_image_module

    UNITS = training_image_module("metrics").UNITS

    assert set(PS_METRICS) <= set(UNITS) and {m for names in PS_GRAPHS.values() for m in names} == set(PS_METRICS)


def test_dashboard_graphs_the_parameter_servers_metrics_with_their_statistics():
    # ps.py's workers each emit their own lines: rates are averaged, latencies at p90, staleness at its maximum.
    found = body(_dashboard(_metrics("batch", Accelerator.NVIDIA)))
    for metric, statistic in PS_METRICS.items():
        assert f"MetricName=\\\\\\\"{metric}\\\\\\\"', '{statistic}', 60)" in found, metric


def test_dashboard_graphs_fsx_throughput_and_free_capacity():
    # FSx read/write bytes become bytes per second; free capacity is graphed at its minimum.
    found = body(_dashboard(_metrics("batch", Accelerator.NVIDIA)))
    for fragment in ("DataReadBytes", "DataWriteBytes", "FreeDataStorageCapacity", "r/PERIOD(r)", "w/PERIOD(w)"):
        assert fragment in found, fragment


@pytest.mark.parametrize("accelerator", [Accelerator.NVIDIA, Accelerator.NEURON])
def test_sagemaker_accelerator_graph_shows_this_environments_hosts_only(accelerator):
    # The jobs' own utilisation, searched with Environment="dev": other environments' SageMaker jobs never appear.
    found = body(_dashboard(_metrics("sagemaker", accelerator)))
    assert 'MetricName=\\\\\\"AcceleratorUtilization\\\\\\" Environment=\\\\\\"dev\\\\\\"' in found
    assert "/aws/sagemaker/TrainingJobs" not in found


def test_eks_dashboard_is_scoped_to_the_environments_cluster():
    # On EKS every Container Insights SEARCH names this environment's cluster, so two clusters never mix.
    found = body(_dashboard(_metrics("eks", Accelerator.NVIDIA)))
    assert found.count("ClusterName=") >= len(EXPECTED_ACCELERATOR_METRICS[("eks", Accelerator.NVIDIA)])


def test_pipeline_widgets_graph_every_execution_outcome():
    # Started, succeeded, broken, rejected, timed out, aborted, and execution time.
    found = body(_dashboard(_metrics("batch", Accelerator.NVIDIA), pipeline=True))
    for metric in (
        "ExecutionsStarted",
        "ExecutionsSucceeded",
        "PipelineFailures",
        "ModelsRejected",
        "ExecutionsTimedOut",
        "ExecutionsAborted",
        "ExecutionTime",
    ):
        assert metric in found, metric


def test_job_states_are_graphed_where_the_backend_has_queues():
    with_queues = body(_dashboard(_metrics("batch", Accelerator.NVIDIA), job_states=True))
    assert "EfaTraining/dev/Batch" in with_queues
    assert "EfaTraining/dev/Batch" not in body(_dashboard(_metrics("batch", Accelerator.NVIDIA)))
