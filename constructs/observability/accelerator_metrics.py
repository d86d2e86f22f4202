"""Where each compute backend publishes accelerator and EFA metrics: one table, read by the dashboard and the alarms.

Batch hosts run the CloudWatch agent (namespace CWAgent): `nvidia_gpu` gives nvidia_smi_* (dimensions index,
name, host, plus the Environment dimension the agent appends, see host_user_data), `efa` gives efa_rx_bytes/
efa_tx_bytes (dimensions device, port, eniId; the agent's `efa` section takes no extra dimensions). EKS nodes
get Container Insights from the amazon-cloudwatch-observability add-on (namespace ContainerInsights, dimension
ClusterName). Node metrics carry several dimension sets, so graphs use SEARCH (any dimension set) and alarms
use CloudWatch Metrics Insights queries, the form of query an alarm accepts over many time series.
"""

import re
from dataclasses import dataclass

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch

from config import Accelerator

CWAGENT = "CWAgent"
CONTAINER_INSIGHTS = "ContainerInsights"
SAGEMAKER_TRAINING = "/aws/sagemaker/TrainingJobs"
# The dimension the CloudWatch agent on Batch hosts appends to its GPU, memory and disk metrics.
ENVIRONMENT_DIMENSION = "Environment"


def batch_neuron_namespace(environment: str) -> str:
    """Batch Neuron hosts publish NeuronCore utilisation themselves (neuron-monitor piped to its CloudWatch
    publisher, which takes a namespace and no extra dimension), so the namespace carries the environment."""
    return f"EfaTraining/{environment}/Neuron"


@dataclass(frozen=True)
class AcceleratorMetrics:
    backend: str
    accelerator: Accelerator
    namespace: str
    utilization: str  # percent busy, per GPU or NeuronCore
    memory: str | None  # accelerator memory in use
    node_dimension: str  # one value per host/node: the idle alarm's GROUP BY
    # Where EFA byte counters are published; None where the backend publishes none (SageMaker).
    efa_namespace: str | None = None
    efa_rx_bytes: str = ""
    efa_tx_bytes: str = ""
    scope: tuple[str, str] | None = None  # (dimension, value) naming this environment's series, where they have one
    schema: tuple[str, ...] = ()  # the node-level dimension set, for Metrics Insights SCHEMA(...)
    efa_scoped: bool = False  # whether the EFA series carry the scope dimension too
    # What `utilization` reads for one host whose accelerators are all busy, over 100: 1 where it is a per-device
    # or average percentage, the device count where it is summed over the host's devices (SageMaker).
    utilization_scale: int = 1

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
        # Metrics Insights: a namespace with characters other than letters, digits and '_' is double-quoted
        # (CloudWatch user guide, "Metrics Insights query components and syntax").
        namespace = self.namespace if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.namespace) else f'"{self.namespace}"'
        source = f"SCHEMA({namespace}, {', '.join(self.schema)})" if self.schema else namespace
        where = f" WHERE {self.scope[0]} = '{self.scope[1]}'" if self.scope else ""
        return f"SELECT AVG({metric_name}) FROM {source}{where} GROUP BY {self.node_dimension} ORDER BY AVG() ASC"


def accelerator_metrics(
    backend: str,
    accelerator: Accelerator,
    *,
    environment: str,
    cluster_name: str | None = None,
    accelerators_per_host: int = 1,
) -> AcceleratorMetrics:
    nvidia = accelerator is Accelerator.NVIDIA
    if backend == "sagemaker":
        # SageMaker's instance metrics of training jobs (SageMaker developer guide, "Amazon SageMaker AI metrics in
        # Amazon CloudWatch", training job metrics): namespace /aws/sagemaker/TrainingJobs, dimension Host
        # (<job name>/algo-N), GPUUtilization and GPUMemoryUtilization from 0 to 100 x the instance's GPUs (as its
        # CPUUtilization is 0 to 100 x its CPUs; the page could not be read from this machine to confirm it). They
        # carry no environment: the graphs and the idle alarm cover every training job of the account and region.
        # No EFA counters.
        return AcceleratorMetrics(
            backend=backend,
            accelerator=accelerator,
            namespace=SAGEMAKER_TRAINING,
            utilization="GPUUtilization" if nvidia else "NeuronCoreUtilization",
            memory="GPUMemoryUtilization" if nvidia else "NeuronMemoryUtilization",
            node_dimension="Host",
            utilization_scale=accelerators_per_host,
        )
    if backend == "eks":
        # Container Insights (enhanced) node GPU/NeuronCore metrics: dimension set ClusterName, InstanceId, NodeName.
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
    if nvidia:
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
    return AcceleratorMetrics(
        backend=backend,
        accelerator=accelerator,
        namespace=batch_neuron_namespace(environment),
        utilization="neuroncore_utilization",
        memory="neuron_runtime_memory_used_bytes",
        efa_namespace=CWAGENT,
        efa_rx_bytes="efa_rx_bytes",
        efa_tx_bytes="efa_tx_bytes",
        node_dimension="InstanceId",
    )
