"""The EKS node reconciler: what no pipeline state can catch (an execution timed out or aborted, a lost release).

A state machine run every RECONCILE_EVERY and on every ended execution of the pipeline releases a lease whose holder
is no longer RUNNING, then brings each node group to 0 while no execution holds the lease (EksNodeScaling.reconcile,
node_scaling.py). Its own failures page: a reconciler that fails leaves idle nodes up at their hourly price.
"""

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch
import aws_cdk.aws_cloudwatch_actions as cw_actions
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.compute.eks.node_scaling import EksNodeScaling
from constructs.nag import acknowledge, acknowledge_iam, acknowledge_log_group_encryption, shown_arn

RECONCILE_EVERY = cdk.Duration.minutes(5)


class EksNodeReconciler(Construct):
    """Releases a lease whose holder no longer runs and brings the node groups to 0 while no execution of `pipeline`
    (a state machine with a fixed name) holds the lease: every RECONCILE_EVERY, and at once when an execution ends
    (best effort: the schedule is the guarantee)."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        scaling: EksNodeScaling,
        pipeline: sfn.StateMachine,
        log_retention: logs.RetentionDays,
        alerts: sns.ITopic | None = None,
        alarm_name: str | None = None,
    ) -> None:
        super().__init__(scope, id_)
        stack, name = cdk.Stack.of(self), pipeline._physical_name  # the name given at synth (jsii: protected)
        if cdk.Token.is_unresolved(name):
            raise ValueError(f"{pipeline.node.path}: the reconciler needs the pipeline's fixed state machine name")
        executions = f"execution:{name}:*"  # the lease's holder, described (is it running?)
        release = scaling.reconcile(
            self,
            "ReleaseNodes",
            execution_arns=stack.format_arn(
                service="states",
                resource="execution",
                resource_name=f"{name}:*",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            ),
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(release),
            comment="Releases a stale EKS node lease; sets the node groups to 0 while no pipeline execution holds it",
            timeout=cdk.Duration.hours(1),
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self._log_group(name, log_retention), level=sfn.LogLevel.ALL),
        )
        acknowledge_log_group_encryption(self.node.find_child("Logs"))
        if alerts is not None:
            self._alarm(alerts, alarm_name)
        # EventBridge starts it with a role this account's rules only may assume (EventBridge user guide,
        # "Cross-service confused deputy prevention": aws:SourceAccount; the rules' ARNs would make a cycle).
        starter = iam.Role(
            self,
            "StartRole",
            assumed_by=iam.ServicePrincipal(
                "events.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": stack.account}}
            ),
        )
        target = targets.SfnStateMachine(self.state_machine, role=starter)
        events.Rule(
            self,
            "Every5Minutes",
            description="Node groups to 0 while no training pipeline execution runs",
            schedule=events.Schedule.rate(RECONCILE_EVERY),
            targets=[target],
        )
        events.Rule(
            self,
            "OnPipelineExecutionEnded",
            description="A training pipeline execution ended: node groups to 0 unless another runs",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "stateMachineArn": [pipeline.state_machine_arn],
                    "status": ["SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"],
                },
            ),
            targets=[target],
        )
        acknowledge(
            self.state_machine.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray (PutTraceSegments, PutTelemetryRecords, GetSampling*) and CloudWatch Logs delivery "
            "(logs:CreateLogDelivery ...) allow no resource-level permissions",
        )
        acknowledge(
            self.state_machine.role,
            f"AwsSolutions-IAM5[Resource::{shown_arn(stack, 'states', executions)}]",
            "The lease's holder is described (is it still running?); execution names are chosen at start, so only "
            "the pipeline's prefix is fixed",
        )
        acknowledge_iam(
            self.state_machine.role,
            "RESOURCE_MISMATCH",
            "states:DescribeExecution",
            "the reference lists execution and express as DescribeExecution's resource types, one per workflow "
            "type; the pipeline is a Standard state machine, whose executions are `execution` ARNs, which the grant "
            "names",
            formats=("arn:*:states:*:*:express:*:*:*",),
        )

    def _log_group(self, pipeline_name: str, retention: logs.RetentionDays) -> logs.LogGroup:
        """Under /aws/vendedlogs/, as the pipeline's (Step Functions developer guide, "Avoiding CloudWatch Logs
        resource policy size restrictions"), with the stack's id: a new name, so a redeploy replaces the group."""
        stack_id = cdk.Fn.select(2, cdk.Fn.split("/", cdk.Stack.of(self).stack_id))
        return logs.LogGroup(
            self,
            "Logs",
            log_group_name=cdk.Fn.join("", [f"/aws/vendedlogs/states/{pipeline_name}-reconciler-", stack_id]),
            retention=retention,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

    def _alarm(self, alerts: sns.ITopic, name: str | None) -> None:
        """The reconciler failing, timing out or aborted in 15 minutes pages: it is what brings idle nodes to 0
        (Step Functions' ExecutionsFailed, ExecutionsTimedOut, ExecutionsAborted by StateMachineArn: Step Functions
        developer guide, "Monitoring Step Functions metrics using Amazon CloudWatch")."""
        period = cdk.Duration.minutes(15)
        machine = self.state_machine
        failing = cloudwatch.MathExpression(
            expression="FILL(failed, 0) + FILL(timedOut, 0) + FILL(aborted, 0)",
            label="reconciler executions failed",
            period=period,
            using_metrics={
                "failed": machine.metric_failed(period=period, statistic="Sum"),
                "timedOut": machine.metric_timed_out(period=period, statistic="Sum"),
                "aborted": machine.metric_aborted(period=period, statistic="Sum"),
            },
        )
        alarm = cloudwatch.Alarm(
            self,
            "Failing",
            metric=failing,
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_name=name,
            alarm_description="The EKS node reconciler failed: node groups may stay up with no run (each node at "
            "its hourly price). Its execution log under /aws/vendedlogs/states/ says why.",
        )
        alarm.add_alarm_action(cw_actions.SnsAction(alerts))
