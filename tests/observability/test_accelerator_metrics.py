"""Where accelerator metrics come from, per backend (constructs/observability/accelerator_metrics.py), and what
the training pods are told about the metrics agent."""

import contracts.eks.job_spec as spec
from config import CATALOGUE, Accelerator
from constructs.observability.accelerator_metrics import accelerator_metrics
from tests.observability.metrics import NVIDIA


def test_idle_alarm_on_batch_neuron_reads_the_environments_own_namespace():
    # neuron-monitor's publisher takes no extra dimension: the namespace itself names the environment. A namespace
    # with '/' is double-quoted ("Metrics Insights query components and syntax": "Metric namespaces that include /
    # or any other character that is not a letter, number, or underscore must be surrounded with double quotes").
    metrics = accelerator_metrics("batch", Accelerator.NEURON, environment="prod")
    assert metrics.insights_lowest_node(metrics.utilization) == (
        'SELECT AVG(neuroncore_utilization) FROM "EfaTraining/prod/Neuron" GROUP BY InstanceId ORDER BY AVG() ASC'
    )


def test_a_plain_namespace_stays_unquoted():
    metrics = accelerator_metrics("batch", Accelerator.NVIDIA, environment="prod")
    assert " FROM CWAgent WHERE " in metrics.insights_lowest_node(metrics.utilization)


def test_idle_alarm_on_sagemaker_watches_each_host_of_the_training_jobs():
    # SageMaker's training-job metrics: namespace /aws/sagemaker/TrainingJobs, one Host per instance of a job
    # (SageMaker developer guide, "Amazon SageMaker AI metrics in Amazon CloudWatch").
    metrics = accelerator_metrics("sagemaker", Accelerator.NVIDIA, environment="prod")
    assert metrics.insights_lowest_node(metrics.utilization) == (
        'SELECT AVG(GPUUtilization) FROM "/aws/sagemaker/TrainingJobs" GROUP BY Host ORDER BY AVG() ASC'
    )
    assert metrics.efa_namespace is None  # SageMaker publishes no EFA counters


def test_eks_training_pods_send_metrics_to_the_node_agent():
    # Every training container names the agent's node-local Service on the EMF port and the metrics log group.
    pod = spec.pod_spec(CATALOGUE[NVIDIA], image="i", phase="train", nodes=2)
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["AWS_EMF_AGENT_ENDPOINT"] == "tcp://cloudwatch-agent.amazon-cloudwatch:25888"
    assert env["AWS_EMF_LOG_GROUP_NAME"] == spec.EMF_LOG_GROUP
