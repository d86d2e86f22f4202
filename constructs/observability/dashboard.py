"""One CloudWatch dashboard per environment: accelerators, EFA, FSx, jobs, pipeline and the training metrics.

Training metrics are EMF lines from train.py (namespace EfaTraining, dimensions Environment and RunId).
Run ids are new for every run, so those graphs are SEARCH expressions: each run appears as its own line
without a redeploy.
"""

from collections.abc import Mapping

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch
import aws_cdk.aws_stepfunctions as sfn

from config import Accelerator
from config.layout import RUN_ACTUAL_METRIC, RUN_QUOTED_METRIC, TRAINING_METRICS_NAMESPACE
from constructs import Construct
from constructs.escape_hatch import cfn
from constructs.observability.accelerator_metrics import AcceleratorMetrics
from constructs.observability.job_state_metrics import METRIC_NAME as JOB_STATE_METRIC

TRAINING_NAMESPACE = TRAINING_METRICS_NAMESPACE
TRAINING_METRICS = ("Loss", "TokensPerSecond", "StepTimeSeconds", "MFU")
# The parameter-server strategy's (training_image/efa_training/workloads/ctr_ps/): one line per worker and step, so each
# graph says which
# statistic combines the workers.
PS_METRICS = {
    "SamplesPerSecond": "Average",
    "PullLatencyMs": "p90",
    "PushLatencyMs": "p90",
    "StalenessSteps": "Maximum",
    "RowsTouched": "Average",
}
PS_GRAPHS = {  # title: the metrics it draws
    "Samples per second per worker (ps)": ("SamplesPerSecond",),
    "Pull and push latency p90 (ms, ps)": ("PullLatencyMs", "PushLatencyMs"),
    "Staleness observed, max (steps, ps)": ("StalenessSteps",),
    "Embedding rows per step (ps)": ("RowsTouched",),
}
NON_FINITE_LOSS_METRIC = "NonFiniteLoss"
# The built-in trainer's straggler figures (training_image .../runtime/stragglers.py), one graph each.
STRAGGLER_METRIC = "StragglerRatio"
# How long the same rank has stayed the slowest at STRAGGLER_RATIO (runtime/stragglers.py): the straggler alarm's.
STRAGGLER_PERSIST_METRIC = "StragglerPersistSeconds"
STRAGGLER_GRAPHS = {
    "Straggler ratio (slowest device over the median) by run": STRAGGLER_METRIC,
    "Longest wait for input between metrics lines (s) by run": "DataWaitSeconds",
}
PROGRESS_METRIC = "ProgressLines"  # 1 per progress line of any workload (training_image .../runtime/metrics.py)
# 1 a minute from a node up but not training (training_image .../runtime/launch/stage_heartbeat.py; metrics.py)
NOT_TRAINING_METRIC = "NotTraining"
_FIVE_MINUTES = cdk.Duration.minutes(5)
_WIDE, _HALF, _THIRD = 24, 12, 8


def training_search(metric_name: str, environment: str, statistic: str = "Average") -> cloudwatch.MathExpression:
    """Every run of this environment: one line per RunId of one EMF metric."""
    return cloudwatch.MathExpression(
        expression=f'SEARCH(\'{{{TRAINING_NAMESPACE},Environment,RunId}} Environment="{environment}" '
        f"MetricName=\"{metric_name}\"', '{statistic}', 60)",
        label=metric_name,
        period=cdk.Duration.minutes(1),
        using_metrics={},
    )


class TrainingDashboard(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        dashboard_name: str,
        accelerators: AcceleratorMetrics,
        file_system_id: str,
        state_machine: sfn.IStateMachine | None = None,
        pipeline_outcomes: Mapping[str, cloudwatch.Metric] | None = None,
        job_state_namespace: str | None = None,
        environment: str = "",
    ) -> None:
        super().__init__(scope, id_)
        self.dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=dashboard_name, default_interval=cdk.Duration.hours(6)
        )
        # aws-cdk-lib tags dashboards, but cfn-lint 1.51's resource schema has no Tags on AWS::CloudWatch::Dashboard
        # (E3002); a dashboard costs a flat $3 a month, so it drops out of cost allocation without loss.
        cfn(self.dashboard).add_property_deletion_override("Tags")
        self.dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown=f"# {dashboard_name}\nBackend **{accelerators.backend}**, accelerator "
                f"**{accelerators.accelerator.value}**. Lines per host/node and per training run (RunId).",
                width=_WIDE,
                height=2,
            )
        )
        self.dashboard.add_widgets(*self._accelerator_widgets(accelerators))
        self.dashboard.add_widgets(*self._training_widgets(environment))
        self.dashboard.add_widgets(
            *(
                cloudwatch.GraphWidget(title=title, width=_HALF, left=[training_search(name, environment)])
                for title, name in STRAGGLER_GRAPHS.items()
            )
        )
        self.dashboard.add_widgets(*self._parameter_server_widgets(environment))
        self.dashboard.add_widgets(self._run_cost_widget(environment))
        self.dashboard.add_widgets(*self._fsx_widgets(file_system_id))
        row = []
        if job_state_namespace:
            row.append(self._job_state_widget(job_state_namespace))
        if state_machine is not None:
            row.extend(self._pipeline_widgets(state_machine, pipeline_outcomes or {}))
        if row:
            self.dashboard.add_widgets(*row)

    @staticmethod
    def _accelerator_widgets(m: AcceleratorMetrics) -> list[cloudwatch.IWidget]:
        kind = "GPU" if m.accelerator is Accelerator.NVIDIA else "NeuronCore"
        widgets: list[cloudwatch.IWidget] = [
            cloudwatch.GraphWidget(
                title=f"{kind} utilisation (%)",
                width=_THIRD,
                left=[m.search(m.utilization, "Average", f"{kind} %")],
                left_y_axis=cloudwatch.YAxisProps(min=0, max=100),
            )
        ]
        if m.memory:
            widgets.append(
                cloudwatch.GraphWidget(
                    title=f"{kind} memory in use", width=_THIRD, left=[m.search(m.memory, "Average", "memory")]
                )
            )
        if m.efa_namespace is None:
            widgets.append(
                cloudwatch.TextWidget(
                    markdown="**EFA**: this backend publishes no EFA counters. The sanity check inside each "
                    "training job proves the EFA devices and the collectives' bandwidth before training "
                    "(its report: `runs/<run_id>/` in the data bucket).",
                    width=_THIRD,
                    height=6,
                )
            )
            return widgets
        widgets.append(
            cloudwatch.GraphWidget(
                title="EFA bytes in / out (per 5 min)",
                width=_THIRD,
                left=[
                    m.search(
                        m.efa_rx_bytes,
                        "Sum",
                        "rx",
                        namespace=m.efa_namespace,
                        period=_FIVE_MINUTES,
                        scoped=m.efa_scoped,
                    )
                ],
                right=[
                    m.search(
                        m.efa_tx_bytes,
                        "Sum",
                        "tx",
                        namespace=m.efa_namespace,
                        period=_FIVE_MINUTES,
                        scoped=m.efa_scoped,
                    )
                ],
            )
        )
        return widgets

    @staticmethod
    def _training_widgets(environment: str) -> list[cloudwatch.IWidget]:
        titles = {
            "Loss": "Loss",
            "TokensPerSecond": "Tokens per second",
            "StepTimeSeconds": "Step time (s)",
            "MFU": "Model FLOPs utilisation (%)",
        }
        return [
            cloudwatch.GraphWidget(title=f"{titles[name]} by run", width=6, left=[training_search(name, environment)])
            for name in TRAINING_METRICS
        ]

    @staticmethod
    def _run_cost_widget(environment: str) -> cloudwatch.IWidget:
        """A row per validated run and figure: its quote, and what its jobs cost at most (constructs/pipeline/
        run_cost.py puts both once, as the run's validation ends), so the next quote can be held against them."""
        return cloudwatch.TableWidget(
            title="Run cost by run: quoted, and actual at most (USD)",
            width=_WIDE,
            metrics=[training_search(name, environment, "Maximum") for name in (RUN_QUOTED_METRIC, RUN_ACTUAL_METRIC)],
            summary=cloudwatch.TableSummaryProps(
                columns=[cloudwatch.TableSummaryColumn.MAXIMUM], hide_non_summary_columns=True
            ),
        )

    @staticmethod
    def _parameter_server_widgets(environment: str) -> list[cloudwatch.IWidget]:
        return [
            cloudwatch.GraphWidget(
                title=f"{title} by run",
                width=_WIDE // len(PS_GRAPHS),
                left=[training_search(name, environment, PS_METRICS[name]) for name in names],
            )
            for title, names in PS_GRAPHS.items()
        ]

    @staticmethod
    def _fsx_widgets(file_system_id: str) -> list[cloudwatch.IWidget]:
        def fsx(metric_name: str, statistic: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace="AWS/FSx",
                metric_name=metric_name,
                statistic=statistic,
                dimensions_map={"FileSystemId": file_system_id},
                period=_FIVE_MINUTES,
            )

        # Bytes per period divided by the period's seconds: throughput in bytes per second.
        throughput = [
            cloudwatch.MathExpression(
                expression=f"{var}/PERIOD({var})",
                label=label,
                period=_FIVE_MINUTES,
                using_metrics={var: fsx(metric, "Sum")},
            )
            for var, metric, label in (("r", "DataReadBytes", "read B/s"), ("w", "DataWriteBytes", "write B/s"))
        ]
        # FreeDataStorageCapacity: Sum = the file system's free bytes, Minimum = the fullest storage target's
        # (FSx for Lustre user guide, fs-metrics.html); one-minute periods hold one sample per target.
        free = [
            cloudwatch.Metric(
                namespace="AWS/FSx",
                metric_name="FreeDataStorageCapacity",
                statistic=statistic,
                dimensions_map={"FileSystemId": file_system_id},
                period=cdk.Duration.minutes(1),
                label=label,
            )
            for statistic, label in (("Sum", "file system"), ("Minimum", "fullest storage target"))
        ]
        return [
            cloudwatch.GraphWidget(title="FSx throughput (bytes/s)", width=_HALF, left=throughput),
            cloudwatch.GraphWidget(title="FSx free capacity (bytes)", width=_HALF, left=free),
        ]

    @staticmethod
    def _job_state_widget(namespace: str) -> cloudwatch.IWidget:
        # One line per (queue, state) that occurred: SUBMITTED, RUNNABLE, RUNNING, SUCCEEDED, FAILED, ...
        return cloudwatch.GraphWidget(
            title="Batch jobs entering each state (per 5 min)",
            width=_THIRD,
            left=[
                cloudwatch.MathExpression(
                    expression=f"SEARCH('{{{namespace},JobQueue,Status}} "
                    f"MetricName=\"{JOB_STATE_METRIC}\"', 'Sum', 300)",
                    label="",
                    period=_FIVE_MINUTES,
                    using_metrics={},
                )
            ],
        )

    @staticmethod
    def _pipeline_widgets(
        state_machine: sfn.IStateMachine, outcomes: Mapping[str, cloudwatch.Metric]
    ) -> list[cloudwatch.IWidget]:
        # Failed executions split into broken runs and rejected models where the execution log is counted.
        failed = (
            [metric.with_(label=name) for name, metric in outcomes.items()]
            if outcomes
            else [state_machine.metric_failed(period=_FIVE_MINUTES, label="failed")]
        )
        return [
            cloudwatch.GraphWidget(
                title="Pipeline executions",
                width=_THIRD,
                left=[
                    state_machine.metric_started(period=_FIVE_MINUTES, label="started"),
                    state_machine.metric_succeeded(period=_FIVE_MINUTES, label="succeeded"),
                    *failed,
                    state_machine.metric_timed_out(period=_FIVE_MINUTES, label="timed out"),
                    state_machine.metric_aborted(period=_FIVE_MINUTES, label="aborted"),
                ],
            ),
            cloudwatch.GraphWidget(
                title="Pipeline execution time (ms)",
                width=_THIRD,
                left=[state_machine.metric_time(period=_FIVE_MINUTES, label="execution time")],
            ),
        ]
