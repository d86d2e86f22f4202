"""Observability and cost control: the environment's dashboard, its alarms and its monthly budget.

Takes the compute backend and the pipeline when they exist (`compute=None`, `pipeline=None` otherwise), so
the stack synthesizes at every stage of the app and gains widgets and alarms as those stacks land.
"""

import aws_cdk as cdk
from constructs import Construct

from config import EnvironmentConfig
from constructs.accelerator_metrics import accelerator_metrics
from constructs.cost_budget import CostBudget
from constructs.job_state_metrics import JobStateMetrics
from constructs.training_alarms import TrainingAlarms
from constructs.training_dashboard import TrainingDashboard
from stacks.alerts_stack import AlertsStack
from stacks.policies import data_removal_policy, log_retention
from stacks.storage_stack import StorageStack

# The app tags every resource with Environment=<env name>; the budget filters costs on it.
COST_TAG_KEY = "Environment"


def _job_queue_arns(compute: cdk.Stack | None) -> list[str]:
    """The Batch stack's job queues (multi-node and single-node), when the backend is Batch."""
    queues = [getattr(compute, name, None) for name in ("multi_node_queue", "single_node_queue")]
    return [queue.job_queue_arn for queue in queues if queue is not None]


def _cluster_name(compute: cdk.Stack | None) -> str | None:
    cluster = getattr(compute, "cluster", None)
    return cluster.cluster_name if cluster is not None else None


class ObservabilityStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, storage: StorageStack,
                 alerts: AlertsStack, compute: cdk.Stack | None = None, pipeline: cdk.Stack | None = None,
                 **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        state_machine = getattr(pipeline, "state_machine", None)
        file_system_id = storage.file_system.file_system_id
        accelerators = accelerator_metrics(config.compute, config.instance.accelerator, environment=config.name,
                                           cluster_name=_cluster_name(compute) if config.compute == "eks" else None)

        queue_arns = _job_queue_arns(compute) if config.compute == "batch" else []
        self.job_states = None
        if queue_arns:
            self.job_states = JobStateMetrics(
                self, "JobStates", job_queue_arns=queue_arns, namespace=f"EfaTraining/{config.name}/Batch",
                retention=log_retention(config), removal_policy=data_removal_policy(config))

        alarms = TrainingAlarms(
            self, "Alarms", topic=alerts.topic, accelerators=accelerators, alarm_prefix=config.stack_prefix,
            file_system_id=file_system_id, fsx_storage_gib=config.fsx_storage_gib,
            fsx_free_percent=config.fsx_free_capacity_alarm_percent,
            idle_threshold_percent=config.gpu_idle_threshold_percent, idle_minutes=config.gpu_idle_minutes,
            state_machine=state_machine, execution_log_group=getattr(pipeline, "log_group", None),
            pipeline_namespace=f"EfaTraining/{config.name}/Pipeline", environment=config.name,
        )
        self.alarms = alarms.alarms
        self.dashboard = TrainingDashboard(
            self, "Dashboard", dashboard_name=f"{config.stack_prefix}-training",
            accelerators=accelerators, file_system_id=file_system_id, state_machine=state_machine,
            pipeline_outcomes=alarms.pipeline_metrics,
            job_state_namespace=self.job_states.namespace if self.job_states else None, environment=config.name,
        ).dashboard
        self.budget = CostBudget(
            self, "Budget", budget_name=f"{config.stack_prefix}-monthly", monthly_limit_usd=config.budget_monthly_usd,
            tag_key=COST_TAG_KEY, tag_value=config.name, topic=alerts.topic,
        ).budget
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name)
