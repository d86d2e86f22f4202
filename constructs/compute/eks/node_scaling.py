"""EKS node-group scaling driven by the pipeline's executions.

Accelerator nodes scale from 0 and nothing in the cluster scales them on demand (no Cluster Autoscaler: it cannot
predict `vpc.amazonaws.com/efa` on a node group at zero). An EventBridge rule on the pipeline's execution status
changes starts a small state machine that sets the node group's desired size to the run's `nodes` (default: the
environment's maximum) when an execution starts, and to 0 when it ends, however it ends (success, failure,
timeout, abort; "Step Functions execution status change" events, EventBridge). Pods wait in Pending while the
nodes join. One pipeline execution at a time: the node group belongs to the running execution.
"""

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_logs as logs
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct
from constructs.nag import acknowledge


class EksNodeScaling(Construct):
    """Node group desired size: the run's nodes while an execution of `pipeline` runs, 0 once it has ended."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.ICluster,
        nodegroup: eks.Nodegroup,
        max_nodes: int,
        pipeline: sfn.IStateMachine,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, id_)
        self._cluster, self._nodegroup, self._max_nodes = cluster, nodegroup, max_nodes
        run_nodes = "$.input.nodes"
        read_input = sfn.Pass(
            self,
            "ReadExecutionInput",
            parameters={"status.$": "$.detail.status", "input.$": "States.StringToJson($.detail.input)"},
        )
        started = sfn.Condition.string_equals("$.status", "RUNNING")
        choice = (
            sfn.Choice(self, "StartedOrEnded")
            .when(
                sfn.Condition.and_(started, sfn.Condition.is_present(run_nodes), sfn.Condition.is_numeric(run_nodes)),
                self._scale("ScaleToRunNodes", sfn.JsonPath.number_at(run_nodes)),
            )
            .when(started, self._scale("ScaleToMaxNodes", max_nodes))
            .otherwise(self._scale("ScaleToZero", 0))
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(read_input.next(choice)),
            comment="Sizes the EKS accelerator node group for the training pipeline's running execution",
            timeout=cdk.Duration.hours(1),
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=logs.LogGroup(
                    self, "Logs", retention=log_retention, removal_policy=cdk.RemovalPolicy.DESTROY
                ),
                level=sfn.LogLevel.ALL,
            ),
        )
        events.Rule(
            self,
            "OnPipelineExecutionStatus",
            description="Training pipeline execution started or ended: size the accelerator node group",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "stateMachineArn": [pipeline.state_machine_arn],
                    "status": ["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"],
                },
            ),
            targets=[targets.SfnStateMachine(self.state_machine)],
        )
        acknowledge(
            self.state_machine.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray (PutTraceSegments, PutTelemetryRecords, GetSampling*) and CloudWatch Logs delivery "
            "(logs:CreateLogDelivery ...) allow no resource-level permissions",
        )

    def _scale(self, id_: str, desired: float) -> tasks.CallAwsService:
        task = tasks.CallAwsService(
            self,
            id_,
            service="eks",
            action="updateNodegroupConfig",
            parameters={
                "ClusterName": self._cluster.cluster_name,
                "NodegroupName": self._nodegroup.nodegroup_name,
                "ScalingConfig": {"MinSize": 0, "MaxSize": self._max_nodes, "DesiredSize": desired},
            },
            iam_resources=[self._nodegroup.nodegroup_arn],
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(cdk.Duration.minutes(2)),
        )
        # One update at a time per node group: wait for the previous one (UpdateNodegroupConfig, ResourceInUse).
        task.add_retry(
            errors=["Eks.ResourceInUseException"], interval=cdk.Duration.seconds(30), max_attempts=20, backoff_rate=1
        )
        return task
