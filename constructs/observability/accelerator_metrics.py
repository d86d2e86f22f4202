"""Where each compute backend publishes accelerator and EFA metrics: one table, read by the dashboard and the alarms.

Batch GPU hosts run the CloudWatch agent (namespace CWAgent): `nvidia_gpu` gives nvidia_smi_* (dimensions index,
name, host, plus the Environment dimension the agent appends, see host_user_data), `efa` gives efa_rx_bytes/
efa_tx_bytes (dimensions device, port, eniId; the agent's `efa` section takes no extra dimensions). EKS nodes
get Container Insights from the amazon-cloudwatch-observability add-on (namespace ContainerInsights, dimension
ClusterName). Where no service documents a per-host utilisation scoped to this environment, the project publishes
its own (training_image/efa_training/runtime/host_metrics.py: EfaTraining AcceleratorUtilization, dimensions Environment
and Host):
Batch Trainium hosts (neuron-monitor's CloudWatch companion script documents no metric names) and SageMaker training
jobs (SageMaker's /aws/sagemaker/TrainingJobs instance metrics carry only Host = <job>/algo-N, so they cannot be
limited to this environment: Metrics Insights has no prefix match, its WHERE takes =, != and AND only, and its tag
filters (tag.<key>, CloudWatch user guide, "Metrics Insights query components and syntax") apply to resources that
"resource tags for telemetry" enriches, among which no document found here names SageMaker training jobs).
Node metrics carry several dimension sets, so graphs use SEARCH (any dimension set) and alarms use CloudWatch
Metrics Insights queries, the form of query an alarm accepts over many time series.
"""

import re
from dataclasses import dataclass

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch

from config import Accelerator
from config.layout import TRAINING_METRICS_NAMESPACE

CWAGENT = "CWAgent"
CONTAINER_INSIGHTS = "ContainerInsights"
# SageMaker's own namespace for training jobs' instance metrics (and their log group): not read here, see above.
SAGEMAKER_TRAINING = "/aws/sagemaker/TrainingJobs"
# The dimension the CloudWatch agent on Batch hosts appends to its GPU, memory and disk metrics.
ENVIRONMENT_DIMENSION = "Environment"
# The project's own per-host utilisation (training_image/efa_training/runtime/host_metrics.py: NAMESPACE, METRIC,
# DIMENSIONS).
HOST_UTILIZATION = "AcceleratorUtilization"
HOST_DIMENSION = "Host"


def batch_host_metrics_log_group(environment: str) -> str:
    """Where the CloudWatch agent on Batch Trainium hosts writes host_metrics.py's EMF lines (created by the agent)."""
    return f"/efa-training/{environment}/batch-host-metrics"


@dataclass(frozen=True)
class AcceleratorMetrics:
    backend: str
    accelerator: Accelerator
    namespace: str
    utilization: str  # percent busy, per GPU or NeuronCore or their mean over the host
    memory: str | None  # accelerator memory in use
    node_dimension: str  # one value per host/node: the idle alarm's GROUP BY
    # Where EFA byte counters are published; None where the backend publishes none (SageMaker).
    efa_namespace: str | None = None
    efa_rx_bytes: str = ""
    efa_tx_bytes: str = ""
    scope: tuple[str, str] | None = None  # (dimension, value) naming this environment's series, where they have one
    schema: tuple[str, ...] = ()  # the node-level dimension set, for Metrics Insights SCHEMA(...)
    efa_scoped: bool = False  # whether the EFA series carry the scope dimension too

    def search(
        self,
        metric_name: str,
        statistic: str,
        label: str,
        *,
        namespace: str | None = None,
        period: cdk.Duration = cdk.Duration.minutes(1),
        scoped: bool = True,
    ) -> cloudwatch.MathExpression:
        """One line per time series of `metric_name`, whatever its dimensions, within this environment."""
        ns = namespace or self.namespace
        scope = f' {self.scope[0]}="{self.scope[1]}"' if scoped and self.scope else ""
        query = f'Namespace="{ns}" MetricName="{metric_name}"{scope}'
        return cloudwatch.MathExpression(
            expression=f"SEARCH('{query}', '{statistic}', {int(period.to_seconds())})",
            label=label,
            period=period,
            using_metrics={},
        )

    def insights_lowest_node(self, metric_name: str) -> str:
        """Metrics Insights query: `metric_name` averaged per host/node of this environment, lowest first.
        An alarm on it has one contributor per node, so one idle node raises it (CloudWatch user guide,
        Create_Metrics_Insights_Alarm.html and multi-time-series-alarm.html)."""
        grouped = f"GROUP BY {self.node_dimension} ORDER BY AVG() ASC"
        return f"SELECT AVG({metric_name}) FROM {self._insights_source()} {grouped}"

    def insights_reported(self, metric_name: str) -> str:
        """Metrics Insights query: how many values of `metric_name` this environment's nodes reported (none, no data:
        no accelerator host is up)."""
        return f"SELECT COUNT({metric_name}) FROM {self._insights_source()}"

    def _insights_source(self) -> str:
        # Metrics Insights: a namespace with characters other than letters, digits and '_' is double-quoted
        # (CloudWatch user guide, "Metrics Insights query components and syntax").
        namespace = self.namespace if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.namespace) else f'"{self.namespace}"'
        source = f"SCHEMA({namespace}, {', '.join(self.schema)})" if self.schema else namespace
        return source + (f" WHERE {self.scope[0]} = '{self.scope[1]}'" if self.scope else "")


def accelerator_metrics(
    backend: str,
    accelerator: Accelerator,
    *,
    environment: str,
    cluster_name: str | None = None,
) -> AcceleratorMetrics:
    """Every utilisation here is a percentage per GPU or NeuronCore, or their mean over the host: the idle threshold
    is one per-host percentage whatever the host's accelerator count."""
    nvidia = accelerator is Accelerator.NVIDIA
    if backend == "eks":
        # Container Insights with enhanced observability (CloudWatch user guide, "Amazon EKS and Kubernetes Container
        # Insights with enhanced observability metrics"): node_gpu_utilization and node_neuroncore_utilization, Percent,
        # each with the dimension set ClusterName, InstanceId, NodeName among others.
        return AcceleratorMetrics(
            backend=backend,
            accelerator=accelerator,
            namespace=CONTAINER_INSIGHTS,
            utilization="node_gpu_utilization" if nvidia else "node_neuroncore_utilization",
            memory="node_gpu_memory_utilization" if nvidia else "node_neuroncore_memory_usage_total",
            efa_namespace=CONTAINER_INSIGHTS,
            efa_rx_bytes="node_efa_rx_bytes",
            efa_tx_bytes="node_efa_tx_bytes",
            node_dimension="NodeName",
            scope=("ClusterName", cluster_name) if cluster_name else None,
            schema=("ClusterName", "InstanceId", "NodeName"),
            efa_scoped=True,
        )
    if backend == "batch" and nvidia:
        # CloudWatch user guide, "Collect NVIDIA GPU metrics": nvidia_smi_utilization_gpu, dimensions index, name, host.
        return AcceleratorMetrics(
            backend=backend,
            accelerator=accelerator,
            namespace=CWAGENT,
            utilization="nvidia_smi_utilization_gpu",
            memory="nvidia_smi_memory_used",
            efa_namespace=CWAGENT,
            efa_rx_bytes="efa_rx_bytes",
            efa_tx_bytes="efa_tx_bytes",
            node_dimension="host",
            scope=(ENVIRONMENT_DIMENSION, environment),
        )
    # Our own (training_image/efa_training/runtime/host_metrics.py), one series per host: Batch Trainium hosts and
    # SageMaker training jobs.
    # Only `train` jobs publish on SageMaker, so the one-GPU validation job never counts against this threshold.
    batch = backend == "batch"
    return AcceleratorMetrics(
        backend=backend,
        accelerator=accelerator,
        namespace=TRAINING_METRICS_NAMESPACE,
        utilization=HOST_UTILIZATION,
        memory=None,
        # Batch hosts' EFA counters come from the CloudWatch agent; SageMaker publishes none.
        efa_namespace=CWAGENT if batch else None,
        efa_rx_bytes="efa_rx_bytes" if batch else "",
        efa_tx_bytes="efa_tx_bytes" if batch else "",
        node_dimension=HOST_DIMENSION,
        scope=(ENVIRONMENT_DIMENSION, environment),
        schema=(ENVIRONMENT_DIMENSION, HOST_DIMENSION),
    )
