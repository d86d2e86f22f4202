"""Alarms that page the environment's alerts topic: broken pipeline, non-finite loss, an idle node, a full FSx, no
training progress while accelerator hosts are up.

Loss itself cannot reveal NaN: NaN is not valid JSON, so CloudWatch drops an EMF line that carries it, and
metrics have no NaN. The training code therefore emits `NonFiniteLoss` (1 when the step's loss is NaN/inf,
else 0) in namespace EfaTraining, dimensions Environment and RunId; a Metrics Insights query alarms on any
run's value in this environment (WHERE Environment = ...), never on another environment's runs.

A rejected model is not a broken pipeline: the pipeline ends such a run in its `ValidationFailed` state, which
Step Functions counts in ExecutionsFailed like any failure. A metric filter on the pipeline's execution log
(level ALL) therefore counts failures by error name: `PipelineFailures` (every error but ValidationFailed)
pages with ExecutionsTimedOut and ExecutionsAborted; `ModelsRejected` is graphed, and the rejection's own,
lower-severity notification is the pipeline's "validation failed" message with the verdict.

NoProgress backs up the hang watchdog in the image (training_image/efa_training/runtime/launch/watchdog.py), which ends
a training without progress within its floor (default 30 minutes) on the main node. If the watchdog is gone (the
main node frozen, the launcher wedged), accelerator hosts stay up with no progress reported: a composite alarm of
"hosts report utilisation" and "no ProgressLines (missing data breaches)" for NO_PROGRESS_MINUTES (CloudWatch user
guide, Create_Composite_Alarm.html: a rule of other alarms' states; its two children page nobody).
"""

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch
import aws_cdk.aws_cloudwatch_actions as cw_actions
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.observability.accelerator_metrics import AcceleratorMetrics
from constructs.observability.dashboard import (
    NON_FINITE_LOSS_METRIC,
    NOT_TRAINING_METRIC,
    PROGRESS_METRIC,
    STRAGGLER_PERSIST_METRIC,
    TRAINING_NAMESPACE,
)
from constructs.pipeline.job_stages import CAPACITY_UNAVAILABLE, RESERVATION_ENDED
from constructs.pipeline.reservation_end import ENDS_TOO_SOON, ZONE_MISMATCH
from constructs.pipeline.reservation_end import OVER as RESERVATION_OVER
from constructs.pipeline.run_quote import OVER_BUDGET
from contracts.workload import HANG_TIMEOUT_DEFAULT

GIB = 1024**3
IDLE_PERIOD = cdk.Duration.minutes(5)
# FSx publishes FreeDataStorageCapacity once a minute per storage target: a one-minute Minimum is the fullest
# target's free bytes, SampleCount the number of targets (FSx for Lustre user guide, fs-metrics.html).
FSX_PERIOD = cdk.Duration.minutes(1)
PIPELINE_PERIOD = cdk.Duration.minutes(5)
# Twice the hang watchdog's default floor (30 minutes): by then the watchdog has ended any attempt it still watches.
# A Trainium compile stage or a validation longer than this, on accelerator hosts, raises it too.
NO_PROGRESS_MINUTES = 2 * HANG_TIMEOUT_DEFAULT // 60
PROGRESS_PERIOD = cdk.Duration.minutes(5)
# A run's slowest device at 1.5 times the median's time, on average over each of 3 five-minute periods: one noisy
# metrics line does not raise it, a device that stays slow does. The line names the rank and host (SlowestHost).
STRAGGLER_RATIO, STRAGGLER_PERIODS = 1.5, 3
# The error of the pipeline's Fail state for a model that did not pass validation (TrainingPipeline).
MODEL_REJECTED_ERROR = "ValidationFailed"
# A refused input (malformed, or a run id already taken) is the caller's mistake, told to the caller by the
# execution's own error; it ran nothing, so it does not page as a broken pipeline.
INPUT_REFUSED_ERROR = "InvalidInput"
# Endings the pipeline designed and already mailed, with what to do (its failure path's notification): capacity that
# never came, a reservation's end (resumable), a run over budget, a reservation that cannot serve the run. Nothing is
# broken, so they page nobody; the execution's own error still says which.
DESIGNED_ENDINGS = (
    CAPACITY_UNAVAILABLE,
    RESERVATION_ENDED,
    OVER_BUDGET,
    ENDS_TOO_SOON,
    RESERVATION_OVER,
    ZONE_MISMATCH,
)
PIPELINE_FAILURES_METRIC = "PipelineFailures"
MODELS_REJECTED_METRIC = "ModelsRejected"


def execution_failed_filter(error_is_rejection: bool) -> logs.IFilterPattern:
    """Step Functions' ExecutionFailed log event ({"type": "ExecutionFailed", "details": {"error": ...}}, Step
    Functions developer guide, cw-logs.html), split on whether the error is a rejected model; a refused input and a
    designed ending (DESIGNED_ENDINGS) count as neither."""
    failed = logs.FilterPattern.string_value("$.type", "=", "ExecutionFailed")
    if error_is_rejection:
        return logs.FilterPattern.all(
            failed, logs.FilterPattern.string_value("$.details.error", "=", MODEL_REJECTED_ERROR)
        )
    return logs.FilterPattern.all(
        failed,
        *(
            logs.FilterPattern.string_value("$.details.error", "!=", error)
            for error in (MODEL_REJECTED_ERROR, INPUT_REFUSED_ERROR, *DESIGNED_ENDINGS)
        ),
    )


def _fullest_target_free_percent(file_system_id: str, storage_gib: int) -> cloudwatch.MathExpression:
    """The fullest storage target's free share, in percent: FreeDataStorageCapacity's Minimum is the fullest OST's
    free bytes and its SampleCount the number of OSTs, each an equal share of the file system (FSx for Lustre user
    guide, fs-metrics.html, storage capacity metrics). Lustre stripes a file over few targets (one by default), so a
    full target fails writes while the file system's sum still looks free (AWS re:Post, "FSx for Lustre
    performance": a nearly full OST can hang reads and writes)."""

    def free(statistic: str) -> cloudwatch.Metric:
        return cloudwatch.Metric(
            namespace="AWS/FSx",
            metric_name="FreeDataStorageCapacity",
            statistic=statistic,
            dimensions_map={"FileSystemId": file_system_id},
            period=FSX_PERIOD,
        )

    return cloudwatch.MathExpression(
        expression=f"100 * fullest * targets / {storage_gib * GIB}",
        label="free on the fullest storage target (%)",
        period=FSX_PERIOD,
        using_metrics={"fullest": free("Minimum"), "targets": free("SampleCount")},
    )


class TrainingAlarms(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        topic: sns.ITopic,
        accelerators: AcceleratorMetrics,
        file_system_id: str,
        fsx_storage_gib: int,
        fsx_free_percent: float,
        idle_threshold_percent: float,
        idle_minutes: int,
        state_machine: sfn.IStateMachine | None = None,
        execution_log_group: logs.ILogGroup | None = None,
        pipeline_namespace: str = "",
        alarm_prefix: str,
        environment: str,
        file_system_revision: str = "",
    ) -> None:
        super().__init__(scope, id_)
        self._action = cw_actions.SnsAction(topic)
        self.alarms: dict[str, cloudwatch.AlarmBase] = {}
        self.pipeline_metrics: dict[str, cloudwatch.Metric] = {}

        if state_machine is not None and execution_log_group is not None:
            self._pipeline_alarm(state_machine, execution_log_group, pipeline_namespace, alarm_prefix)

        self._add(
            "NonFiniteLoss",
            cloudwatch.MathExpression(
                expression=f"SELECT MAX({NON_FINITE_LOSS_METRIC}) "
                f"FROM SCHEMA({TRAINING_NAMESPACE}, Environment, RunId) "
                f"WHERE Environment = '{environment}'",
                label="runs with a non-finite loss",
                period=cdk.Duration.minutes(1),
                using_metrics={},
            ),
            threshold=1,
            operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description="A training run reported a NaN or infinite loss; its checkpoints since then are suspect.",
            name=f"{alarm_prefix}-non-finite-loss",
        )

        # One contributor per host/node: the alarm fires when any one of them averages under the threshold. Every
        # backend's utilisation is a per-device percentage or the host's mean (accelerator_metrics), so the threshold
        # is per host, whatever its accelerator count. No accelerator hosts running means no data, which is not
        # idleness: missing data does not breach.
        kind = "GPU" if accelerators.accelerator.value == "nvidia" else "NeuronCore"
        not_training = self._not_training(environment, alarm_prefix)
        idle = self._add(
            "AcceleratorsIdle",
            cloudwatch.MathExpression(
                expression=accelerators.insights_lowest_node(accelerators.utilization),
                label=f"{kind} utilisation per node",
                period=IDLE_PERIOD,
                using_metrics={},
            ),
            threshold=idle_threshold_percent,
            operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=idle_minutes // int(IDLE_PERIOD.to_minutes()),
            description=f"A node's {kind}s averaged under {idle_threshold_percent:g}% for {idle_minutes} minutes "
            "while it was up: a stalled job or node, or an instance left running without work.",
            name=f"{alarm_prefix}-accelerators-idle",
            page=False,
        )
        # Pages only while no node says it is up but not training (a compile, a validation, a training's warm-up).
        self._composite(
            "AcceleratorsIdleAlert",
            f"{alarm_prefix}-accelerators-idle-alert",
            [idle],
            not_training,
            f"A node's {kind}s averaged under {idle_threshold_percent:g}% for {idle_minutes} minutes while no node "
            "of the environment was in a stage without training (sanity check, compile, validation, a training's "
            "warm-up): a stalled job or node, or an instance left running without work.",
        )
        self._no_progress(accelerators, environment, alarm_prefix, kind, not_training)
        # The same rank the slowest at STRAGGLER_RATIO for the whole STRAGGLER_PERIODS (rank 0's count, the bad-host
        # rule's: runtime/stragglers.py), not a ratio averaged over a run's lines, which one rank's noise at 32 ranks
        # can lift.
        self._add(
            "Straggler",
            cloudwatch.MathExpression(
                expression=f"SELECT MAX({STRAGGLER_PERSIST_METRIC}) FROM SCHEMA({TRAINING_NAMESPACE}, Environment, "
                f"RunId) WHERE Environment = '{environment}' GROUP BY RunId",
                label="seconds the same rank has been the slowest, per run",
                period=PROGRESS_PERIOD,
                using_metrics={},
            ),
            threshold=STRAGGLER_PERIODS * PROGRESS_PERIOD.to_seconds(),
            operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description=f"The same {kind} of a run took {STRAGGLER_RATIO:g} times the median's time on the "
            f"platform's device probe for {STRAGGLER_PERIODS * 5} minutes: the run recorded its host bad (the "
            "pipeline replaces it before the next attempt); its metrics lines name it (SlowestRank, SlowestHost).",
            name=f"{alarm_prefix}-straggler",
        )

        self._add(
            "FsxFreeCapacityLow",
            _fullest_target_free_percent(file_system_id, fsx_storage_gib),
            threshold=fsx_free_percent,
            operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            # The file system's revision (stacks/storage_stack.py): a replaced file system changes this stack's
            # template, so the deploy that replaces it also re-resolves its id here and in the dashboard.
            description=f"The fullest storage target of FSx for Lustre ({fsx_storage_gib} GiB) has under "
            f"{fsx_free_percent:g}% free; writes to it (a checkpoint's shard) fail or hang when it is full, whatever "
            f"the others hold (file system revision {file_system_revision or '-'}).",
            name=f"{alarm_prefix}-fsx-free-capacity-low",
        )

    def _pipeline_alarm(
        self, state_machine: sfn.IStateMachine, log_group: logs.ILogGroup, namespace: str, prefix: str
    ) -> None:
        for id_, metric_name, is_rejection in (
            ("Failures", PIPELINE_FAILURES_METRIC, False),
            ("Rejections", MODELS_REJECTED_METRIC, True),
        ):
            log_filter = logs.MetricFilter(
                self,
                id_,
                log_group=log_group,
                filter_pattern=execution_failed_filter(is_rejection),
                metric_namespace=namespace,
                metric_name=metric_name,
                metric_value="1",
                default_value=0,
            )
            self.pipeline_metrics[metric_name] = log_filter.metric(statistic="Sum", period=PIPELINE_PERIOD)
        # Broken = failed for any reason but a rejected model, timed out (the state machine's 7 days), or aborted.
        broken = cloudwatch.MathExpression(
            expression="FILL(failed, 0) + FILL(timedOut, 0) + FILL(aborted, 0)",
            label="broken executions",
            period=PIPELINE_PERIOD,
            using_metrics={
                "failed": self.pipeline_metrics[PIPELINE_FAILURES_METRIC],
                "timedOut": state_machine.metric_timed_out(period=PIPELINE_PERIOD, statistic="Sum"),
                "aborted": state_machine.metric_aborted(period=PIPELINE_PERIOD, statistic="Sum"),
            },
        )
        self._add(
            "PipelineBroken",
            broken,
            threshold=1,
            operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            description="A training pipeline execution failed (for a reason other than a rejected model), "
            "timed out or was aborted.",
            name=f"{prefix}-pipeline-broken",
        )

    def _not_training(self, environment: str, prefix: str) -> cloudwatch.Alarm:
        """Some node of the environment said, in the last 5 minutes, that it is up but not training (the training
        image's launcher, launch/stage_heartbeat.py): the idle and NoProgress alarms hold their page meanwhile."""
        return cloudwatch.Alarm(
            self,
            "NotTraining",
            metric=cloudwatch.MathExpression(
                expression=f"SELECT MAX({NOT_TRAINING_METRIC}) FROM SCHEMA({TRAINING_NAMESPACE}, Environment, RunId) "
                f"WHERE Environment = '{environment}'",
                label="nodes up but not training",
                period=PROGRESS_PERIOD,
                using_metrics={},
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="Part of the idle and NoProgress alarms, paging nobody by itself: a node said it is up "
            "but not training (sanity check, compile, validation, a training's warm-up).",
            alarm_name=f"{prefix}-not-training",
        )

    def _no_progress(
        self, accelerators: AcceleratorMetrics, environment: str, prefix: str, kind: str, not_training: cloudwatch.Alarm
    ) -> None:
        progress = (
            f"SELECT SUM({PROGRESS_METRIC}) FROM SCHEMA({TRAINING_NAMESPACE}, Environment, RunId) "
            f"WHERE Environment = '{environment}'"
        )
        hosts_up = self._child(
            "HostsUp", accelerators.insights_reported(accelerators.utilization), f"{kind} utilisation values reported",
            name=f"{prefix}-accelerator-hosts-up", above=True, missing=cloudwatch.TreatMissingData.NOT_BREACHING,
        )  # fmt: skip
        silent = self._child(
            "ProgressSilent", progress, "progress lines of this environment's runs",
            name=f"{prefix}-progress-silent", above=False, missing=cloudwatch.TreatMissingData.BREACHING,
        )  # fmt: skip
        self._composite(
            "NoProgress",
            f"{prefix}-no-progress",
            [hosts_up, silent],
            not_training,
            f"Accelerator hosts were up for {NO_PROGRESS_MINUTES} minutes, no run reported progress, and no node "
            "said it was in a stage without training (a compile, a validation): a hang the launcher's watchdog did "
            "not end (its node or its launcher gone).",
        )

    def _composite(
        self, id_: str, name: str, parts: list[cloudwatch.Alarm], held_by: cloudwatch.Alarm, description: str
    ) -> None:
        """A paging composite: every one of `parts` in ALARM, and `held_by` not (the parts page nobody)."""
        state = cloudwatch.AlarmState.ALARM
        rule = cloudwatch.AlarmRule.all_of(
            *(cloudwatch.AlarmRule.from_alarm(part, state) for part in parts),
            cloudwatch.AlarmRule.not_(cloudwatch.AlarmRule.from_alarm(held_by, state)),
        )
        composite = cloudwatch.CompositeAlarm(
            self, id_, composite_alarm_name=name, alarm_rule=rule, alarm_description=description
        )
        composite.add_alarm_action(self._action)
        self.alarms[id_] = composite

    def _child(
        self, id_: str, query: str, label: str, *, name: str, above: bool, missing: cloudwatch.TreatMissingData
    ) -> cloudwatch.Alarm:
        """A part of NoProgress over its whole window: above 0, or under 1; it pages nobody by itself."""
        periods = NO_PROGRESS_MINUTES // int(PROGRESS_PERIOD.to_minutes())
        operator = cloudwatch.ComparisonOperator
        return cloudwatch.Alarm(
            self,
            id_,
            metric=cloudwatch.MathExpression(expression=query, label=label, period=PROGRESS_PERIOD, using_metrics={}),
            threshold=0 if above else 1,
            comparison_operator=operator.GREATER_THAN_THRESHOLD if above else operator.LESS_THAN_THRESHOLD,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            treat_missing_data=missing,
            alarm_description=f"One half of the NoProgress alarm, paging nobody by itself: {label}.",
            alarm_name=name,
        )

    def _add(
        self,
        id_: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        operator: cloudwatch.ComparisonOperator,
        description: str,
        name: str,
        evaluation_periods: int = 1,
        page: bool = True,
    ) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self,
            id_,
            metric=metric,
            threshold=threshold,
            comparison_operator=operator,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=evaluation_periods,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
            alarm_name=name,
        )
        if page:
            alarm.add_alarm_action(self._action)
        self.alarms[id_] = alarm
        return alarm
