"""Where accelerator metrics come from, per backend (constructs/observability/accelerator_metrics.py), and what
the training pods are told about the metrics agent."""

import pytest

import contracts.eks.job_spec as spec
from config import CATALOGUE, Accelerator
from constructs.observability.accelerator_metrics import accelerator_metrics
from tests.observability.metrics import NVIDIA


def test_idle_alarm_on_batch_neuron_reads_the_hosts_own_utilisation_of_this_environment():
    # Batch Trainium hosts publish host_metrics.py's AcceleratorUtilization (Environment, Host): one series per host,
    # exactly that dimension set, this environment's only.
    metrics = accelerator_metrics("batch", Accelerator.NEURON, environment="prod")
    assert metrics.insights_lowest_node(metrics.utilization) == (
        "SELECT AVG(AcceleratorUtilization) FROM SCHEMA(EfaTraining, Environment, Host) "
        "WHERE Environment = 'prod' GROUP BY Host ORDER BY AVG() ASC"
    )


def test_a_plain_namespace_stays_unquoted():
    metrics = accelerator_metrics("batch", Accelerator.NVIDIA, environment="prod")
    assert " FROM CWAgent WHERE " in metrics.insights_lowest_node(metrics.utilization)


@pytest.mark.parametrize("accelerator", [Accelerator.NVIDIA, Accelerator.NEURON])
def test_idle_alarm_on_sagemaker_watches_each_host_of_this_environments_training_jobs(accelerator):
    # SageMaker's own instance metrics carry only Host (<job>/algo-N), so no query can keep other environments' jobs
    # out; the jobs publish their own per-host utilisation with the environment
    # (training_image/efa_training/runtime/host_metrics.py).
    metrics = accelerator_metrics("sagemaker", accelerator, environment="prod")
    assert metrics.insights_lowest_node(metrics.utilization) == (
        "SELECT AVG(AcceleratorUtilization) FROM SCHEMA(EfaTraining, Environment, Host) "
        "WHERE Environment = 'prod' GROUP BY Host ORDER BY AVG() ASC"
    )
    assert metrics.efa_namespace is None  # SageMaker publishes no EFA counters


def test_eks_training_pods_send_metrics_to_the_node_agent():
    # Every training container names the agent's node-local Service on the EMF port and the metrics log group.
    pod = spec.pod_spec(CATALOGUE[NVIDIA], image="i", phase="train", nodes=2)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["AWS_EMF_AGENT_ENDPOINT"] == "tcp://cloudwatch-agent.amazon-cloudwatch:25888"
    assert env["AWS_EMF_LOG_GROUP_NAME"] == spec.EMF_LOG_GROUP
