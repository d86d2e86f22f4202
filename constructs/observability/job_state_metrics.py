"""Batch jobs by state as CloudWatch metrics: Batch publishes no per-queue job-count metrics.

EventBridge receives a "Batch Job State Change" event each time a job of ours changes state; a rule sends
them to a log group, and a metric filter counts them with the new status (and queue) as dimensions.
The result is state *transitions* per period (jobs that became RUNNING, FAILED, ...), not a gauge of
jobs currently in each state. No Lambda is involved.
"""

from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_events as events
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import jsii

from constructs import Construct
from constructs.nag import acknowledge_log_group_encryption

METRIC_NAME = "JobStateChanges"


@jsii.implements(events.IRuleTarget)
class _LogGroupTarget:
    """A log group as the rule's target. The L2 `targets.CloudWatchLogGroup` writes the log group's resource
    policy through a Lambda-backed custom resource; here the native AWS::Logs::ResourcePolicy does it."""

    def __init__(self, log_group: logs.ILogGroup) -> None:
        self._log_group = log_group

    def bind(self, _rule: events.IRule, _id: str | None = None) -> events.RuleTargetConfig:
        # The target ARN names the log group without the ":*" suffix that LogGroup.log_group_arn carries.
        stack = cdk.Stack.of(self._log_group)
        return events.RuleTargetConfig(
            arn=stack.format_arn(
                service="logs",
                resource="log-group",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                resource_name=self._log_group.log_group_name,
            )
        )


class JobStateMetrics(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        job_queue_arns: list[str],
        namespace: str,
        retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id_)
        self.namespace = namespace
        # EventBridge requires a log group name starting with /aws/events/.
        self.log_group = logs.LogGroup(
            self,
            "Events",
            log_group_name=f"/aws/events/{cdk.Stack.of(self).stack_name}/batch-job-states",
            retention=retention,
            removal_policy=removal_policy,
        )
        acknowledge_log_group_encryption(self.log_group)
        self.log_group.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[
                    iam.ServicePrincipal("events.amazonaws.com"),
                    iam.ServicePrincipal("delivery.logs.amazonaws.com"),
                ],
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[self.log_group.log_group_arn],
                # This account's deliveries only (EventBridge user guide, "CloudWatch Logs permissions"; CloudWatch
                # Logs user guide, "Cross-service confused deputy prevention": aws:SourceAccount).
                conditions={"StringEquals": {"aws:SourceAccount": cdk.Stack.of(self).account}},
            )
        )
        self.rule = events.Rule(
            self,
            "JobStateChange",
            description="Batch job state changes of this environment's queues, counted by a metric filter",
            event_pattern=events.EventPattern(
                source=["aws.batch"],
                detail_type=["Batch Job State Change"],
                detail={"jobQueue": job_queue_arns},
            ),
        )
        # jsii.implements makes the class an IRuleTarget at run time; mypy cannot see the decorator's effect.
        self.rule.add_target(cast(events.IRuleTarget, _LogGroupTarget(self.log_group)))
        self.metric_filter = logs.MetricFilter(
            self,
            "ByState",
            log_group=self.log_group,
            filter_pattern=logs.FilterPattern.exists("$.detail.status"),
            metric_namespace=namespace,
            metric_name=METRIC_NAME,
            metric_value="1",
            dimensions={"Status": "$.detail.status", "JobQueue": "$.detail.jobQueue"},
        )
