"""Where each compute backend publishes accelerator and EFA metrics: one table, read by the dashboard and the alarms.

Batch hosts run the CloudWatch agent (namespace CWAgent): `nvidia_gpu` gives nvidia_smi_* (dimensions index,
name, host), `efa` gives efa_rx_bytes/efa_tx_bytes (dimensions device, port, eniId). EKS nodes get Container
Insights from the amazon-cloudwatch-observability add-on (namespace ContainerInsights, dimension ClusterName).
Node metrics carry several dimension sets, so graphs use SEARCH (any dimension set) and alarms use
CloudWatch Metrics Insights queries, the form of query an alarm accepts over many time series.
"""

from dataclasses import dataclass

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch

from config import Accelerator

CWAGENT = "CWAgent"
CONTAINER_INSIGHTS = "ContainerInsights"
# Batch Neuron hosts: the CloudWatch agent has no Neuron collector outside Container Insights, so the Batch
# hosts must publish NeuronCore utilisation themselves (neuron-monitor piped to a publisher) under these names.
BATCH_NEURON_NAMESPACE = "EfaTraining/Neuron"


@dataclass(frozen=True)
class AcceleratorMetrics:
    backend: str
    accelerator: Accelerator
    namespace: str
    utilization: str  # percent busy, per GPU or NeuronCore
    memory: str | None  # accelerator memory in use
    efa_namespace: str
    efa_rx_bytes: str
    efa_tx_bytes: str
    cluster_name: str | None = None  # EKS only: narrows every query to this environment's cluster

    def _scope(self) -> str:
        return f' ClusterName="{self.cluster_name}"' if self.cluster_name else ""

    def search(self, metric_name: str, statistic: str, label: str, *, namespace: str | None = None,
               period: cdk.Duration = cdk.Duration.minutes(1)) -> cloudwatch.MathExpression:
        """One line per time series of `metric_name`, whatever its dimensions."""
        ns = namespace or self.namespace
        query = f'Namespace="{ns}" MetricName="{metric_name}"{self._scope()}'
        return cloudwatch.MathExpression(
            expression=f"SEARCH('{query}', '{statistic}', {int(period.to_seconds())})",
            label=label, period=period, using_metrics={},
        )

    def insights_average(self, metric_name: str) -> str:
        """Metrics Insights query averaging `metric_name` over every host/node of this environment."""
        where = f" WHERE ClusterName = '{self.cluster_name}'" if self.cluster_name else ""
        source = f"SCHEMA({self.namespace}, ClusterName)" if self.cluster_name else self.namespace
        return f"SELECT AVG({metric_name}) FROM {source}{where}"


def accelerator_metrics(backend: str, accelerator: Accelerator, cluster_name: str | None = None) -> AcceleratorMetrics:
    if backend == "eks":
        nvidia = accelerator is Accelerator.NVIDIA
        return AcceleratorMetrics(
            backend=backend, accelerator=accelerator, namespace=CONTAINER_INSIGHTS,
            utilization="node_gpu_utilization" if nvidia else "node_neuroncore_utilization",
            memory="node_gpu_memory_utilization" if nvidia else "node_neuroncore_memory_usage_total",
            efa_namespace=CONTAINER_INSIGHTS, efa_rx_bytes="node_efa_rx_bytes", efa_tx_bytes="node_efa_tx_bytes",
            cluster_name=cluster_name,
        )
    if accelerator is Accelerator.NVIDIA:
        return AcceleratorMetrics(
            backend=backend, accelerator=accelerator, namespace=CWAGENT,
            utilization="nvidia_smi_utilization_gpu", memory="nvidia_smi_memory_used",
            efa_namespace=CWAGENT, efa_rx_bytes="efa_rx_bytes", efa_tx_bytes="efa_tx_bytes",
        )
    return AcceleratorMetrics(
        backend=backend, accelerator=accelerator, namespace=BATCH_NEURON_NAMESPACE,
        utilization="neuroncore_utilization", memory="neuron_runtime_memory_used_bytes",
        efa_namespace=CWAGENT, efa_rx_bytes="efa_rx_bytes", efa_tx_bytes="efa_tx_bytes",
    )
