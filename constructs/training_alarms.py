"""Alarms that page the environment's alerts topic: failed pipeline, non-finite loss, idle accelerators, full FSx.

Loss itself cannot reveal NaN: NaN is not valid JSON, so CloudWatch drops an EMF line that carries it, and
metrics have no NaN. The training code therefore emits `NonFiniteLoss` (1 when the step's loss is NaN/inf,
else 0) in namespace EfaTraining, dimension RunId; a Metrics Insights query alarms on any run's value.
"""

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch
import aws_cdk.aws_cloudwatch_actions as cw_actions
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
from constructs import Construct

from constructs.accelerator_metrics import AcceleratorMetrics
from constructs.training_dashboard import NON_FINITE_LOSS_METRIC, TRAINING_NAMESPACE

GIB = 1024 ** 3
IDLE_PERIOD = cdk.Duration.minutes(5)


class TrainingAlarms(Construct):
    def __init__(self, scope: Construct, id_: str, *, topic: sns.ITopic, accelerators: AcceleratorMetrics,
                 file_system_id: str, fsx_storage_gib: int, fsx_free_percent: float,
                 idle_threshold_percent: float, idle_minutes: int, state_machine: sfn.IStateMachine | None = None,
                 alarm_prefix: str) -> None:
        super().__init__(scope, id_)
        self._action = cw_actions.SnsAction(topic)
        self.alarms: dict[str, cloudwatch.Alarm] = {}

        if state_machine is not None:
            self._add("PipelineFailed", state_machine.metric_failed(period=cdk.Duration.minutes(5), statistic="Sum"),
                      threshold=1, operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                      description="A training pipeline execution failed, timed out or was aborted.",
                      name=f"{alarm_prefix}-pipeline-failed")

        self._add("NonFiniteLoss", cloudwatch.MathExpression(
            expression=f"SELECT MAX({NON_FINITE_LOSS_METRIC}) FROM SCHEMA({TRAINING_NAMESPACE}, RunId)",
            label="runs with a non-finite loss", period=cdk.Duration.minutes(1), using_metrics={}),
            threshold=1, operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description="A training run reported a NaN or infinite loss; its checkpoints since then are suspect.",
            name=f"{alarm_prefix}-non-finite-loss")

        # No accelerator hosts running means no data, which is not idleness: missing data does not breach.
        kind = "GPU" if accelerators.accelerator.value == "nvidia" else "NeuronCore"
        self._add("AcceleratorsIdle", cloudwatch.MathExpression(
            expression=accelerators.insights_average(accelerators.utilization),
            label=f"average {kind} utilisation", period=IDLE_PERIOD, using_metrics={}),
            threshold=idle_threshold_percent, operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=idle_minutes // int(IDLE_PERIOD.to_minutes()),
            description=f"{kind}s averaged under {idle_threshold_percent:g}% for {idle_minutes} minutes while "
                        "hosts were up: a stalled job, or instances left running without work.",
            name=f"{alarm_prefix}-accelerators-idle")

        free_bytes = fsx_storage_gib * GIB * fsx_free_percent / 100
        self._add("FsxFreeCapacityLow", cloudwatch.Metric(
            namespace="AWS/FSx", metric_name="FreeDataStorageCapacity", statistic="Minimum",
            dimensions_map={"FileSystemId": file_system_id}, period=cdk.Duration.minutes(5)),
            threshold=free_bytes, operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description=f"FSx for Lustre has under {fsx_free_percent:g}% of its {fsx_storage_gib} GiB free; "
                        "checkpoints will start failing when it is full.",
            name=f"{alarm_prefix}-fsx-free-capacity-low")

    def _add(self, id_: str, metric: cloudwatch.IMetric, *, threshold: float,
             operator: cloudwatch.ComparisonOperator, description: str, name: str,
             evaluation_periods: int = 1) -> None:
        alarm = cloudwatch.Alarm(
            self, id_, metric=metric, threshold=threshold, comparison_operator=operator,
            evaluation_periods=evaluation_periods, datapoints_to_alarm=evaluation_periods,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description, alarm_name=name)
        alarm.add_alarm_action(self._action)
        self.alarms[id_] = alarm
