"""Observability and cost control: the environment's dashboard, its alarms and its monthly budget.

The compute backend says where its hosts publish accelerator metrics and which job queues it has; the pipeline
gives the state machine and its execution logs.
"""

import aws_cdk as cdk
import aws_cdk.aws_budgets as budgets

from config import EnvironmentConfig
from config.layout import dashboard_name
from config.regions import NO_BUDGETS
from constructs import Construct
from constructs.compute.backend import ComputeBackend
from constructs.observability.alarms import TrainingAlarms
from constructs.observability.cost_budget import CostBudget
from constructs.observability.dashboard import TrainingDashboard
from constructs.observability.job_state_metrics import JobStateMetrics
from stacks.alerts_stack import AlertsStack
from stacks.pipeline_stack import PipelineStack
from stacks.policies import data_removal_policy, log_retention
from stacks.storage_stack import StorageStack

# The app tags every resource with Environment=<env name>; the budget filters costs on it.
COST_TAG_KEY = "Environment"


class ObservabilityStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        config: EnvironmentConfig,
        storage: StorageStack,
        alerts: AlertsStack,
        compute: ComputeBackend,
        pipeline: PipelineStack,
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        state_machine = pipeline.state_machine
        file_system_id = storage.file_system.file_system_id
        accelerators = compute.accelerator_metrics
        queue_arns = [
            self.format_arn(service="batch", resource="job-queue", resource_name=q) for q in compute.job_queue_names
        ]
        self.job_states = None
        if queue_arns:
            self.job_states = JobStateMetrics(
                self,
                "JobStates",
                job_queue_arns=queue_arns,
                namespace=f"EfaTraining/{config.name}/Batch",
                retention=log_retention(config),
                removal_policy=data_removal_policy(config),
            )

        alarms = TrainingAlarms(
            self,
            "Alarms",
            topic=alerts.topic,
            accelerators=accelerators,
            alarm_prefix=config.stack_prefix,
            file_system_id=file_system_id,
            file_system_revision=storage.file_system_revision,
            fsx_storage_gib=config.fsx_storage_gib,
            fsx_free_percent=config.fsx_free_capacity_alarm_percent,
            idle_threshold_percent=config.gpu_idle_threshold_percent,
            idle_minutes=config.gpu_idle_minutes,
            state_machine=state_machine,
            execution_log_group=pipeline.log_group,
            pipeline_namespace=f"EfaTraining/{config.name}/Pipeline",
            environment=config.name,
        )
        self.alarms = alarms.alarms
        self.dashboard = TrainingDashboard(
            self,
            "Dashboard",
            dashboard_name=dashboard_name(config.name),
            accelerators=accelerators,
            file_system_id=file_system_id,
            state_machine=state_machine,
            pipeline_outcomes=alarms.pipeline_metrics,
            job_state_namespace=self.job_states.namespace if self.job_states else None,
            environment=config.name,
        ).dashboard
        self.budget = self._budget(config, alerts)
        cdk.CfnOutput(self, "DashboardName", value=self.dashboard.dashboard_name)

    def _budget(self, config: EnvironmentConfig, alerts: AlertsStack) -> budgets.CfnBudget | None:
        """The environment's monthly budget, or a warning where the region has no AWS::Budgets::Budget."""
        if config.region in NO_BUDGETS:
            # The Region's resource provider schemas lack the type (config/regions.py), so CloudFormation there
            # cannot create it. AWS Budgets has one global endpoint for every Region (AWS General Reference, "AWS
            # Billing and Cost Management endpoints and quotas") and this budget filters on a tag, not a Region:
            # one made in the console or from a stack elsewhere covers the environment alike.
            cdk.Annotations.of(self).add_warning_v2(
                "efa-training:budget-omitted",
                f"no monthly budget: AWS::Budgets::Budget does not exist in {config.region}; create the budget "
                f"{config.budget_name} (the name the pipeline reads; cost filter user:{COST_TAG_KEY}${config.name}) "
                "in the Billing console or from a stack in a region that has the type, such as us-east-1",
            )
            return None
        return CostBudget(
            self,
            "Budget",
            # CloudFormation cannot replace a resource under the same custom name: config.budget_name says why "-2".
            budget_name=config.budget_name,
            monthly_limit_usd=config.budget_monthly_usd,
            tag_key=COST_TAG_KEY,
            tag_value=config.name,
            topic=alerts.topic,
        ).budget
