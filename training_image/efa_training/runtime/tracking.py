"""Every run an MLflow run: the training's metric lines and the verdict, tracked where MLFLOW_TRACKING_URI points.

The launcher feeds it the same lines CloudWatch reads (the embedded-metric-format lines the built-in trainers print,
or those a declared workload's regexes made), on the node where global rank 0 runs, so there is one writer per run
whatever the workload. The experiment is the environment (TRAINING_ENVIRONMENT, else "local"), the run is named by
the run id, so a retried attempt, a resume and the validation job all add to the same MLflow run; its parameters are
the run's hyperparameters and where it ran.

A tracking server that is slow or down never slows or fails training: lines go into a bounded queue that a
background thread drains in batches (`MlflowClient.log_batch`); when the queue is full, lines are dropped and
counted; the first failure and the recovery are each logged once, and the thread keeps retrying with a backoff. At the
end the launcher waits at most CLOSE_SECONDS for what is queued to a server (close_seconds: a local store is waited for
longer). Without MLFLOW_TRACKING_URI nothing is imported.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

URI_VARIABLE = "MLFLOW_TRACKING_URI"
QUEUE_LINES = 10_000  # about a day of one line per 10 s step; a dropped line is counted, never waited for
BATCH_METRICS = 1000  # MLflow's log_batch takes at most 1000 metrics per call (REST API reference, LogBatch)
CLOSE_SECONDS = 10.0
# A store on this machine (SQLite, a folder): nothing there is down, its writes only queue behind the machine's load.
LOCAL_CLOSE_SECONDS = 120.0
BACKOFF_SECONDS = (1.0, 30.0)
# CloudWatch's bookkeeping (the idle and no-progress alarms' counts, runtime/metrics.py), not the run's metrics.
NOT_TRACKED = frozenset({"ProgressLines", "NotTraining"})


def _say(line: str) -> None:
    print(f"launch.py: tracking: {line}", file=sys.stderr, flush=True)


def metrics_of(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, metric values) of one embedded-metric-format line (runtime/metrics.py emf_record), else None."""
    if not line.startswith("{") or '"_aws"' not in line:
        return None
    try:
        record = json.loads(line)
        names = {m["Name"] for d in record["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    except (ValueError, KeyError, TypeError):
        return None
    values = {
        n: float(record[n])
        for n in names - NOT_TRACKED
        if isinstance(record.get(n), (int, float)) and not isinstance(record.get(n), bool) and math.isfinite(record[n])
    }
    step = record.get("Step")
    return (step if isinstance(step, int) else 0), values


class Tracker:
    """One run's MLflow writer (see the module's docstring); `feed` never blocks."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        params: Mapping[str, object],
        tags: Mapping[str, str] | None = None,
        context: Callable[[], tuple[Mapping[str, str], Mapping[str, float]]] | None = None,
    ) -> None:
        """`context`: more tags and step-0 metrics, read once in the background thread when the run is found (the
        pipeline's record of the run: its execution and quote, runtime/launch/tracked.py); its failure is one line."""
        self.uri, self.experiment, self.run_name = uri, experiment, run_name
        self.context = context
        self.params = {k: str(v)[:6000] for k, v in params.items()}  # MLflow's limit on a param value
        self.tags = dict(tags or {})  # set on the run when it is found: the stage's job, where its logs are
        self.lines: queue.Queue[tuple[int, dict[str, float], int]] = queue.Queue(QUEUE_LINES)
        self.dropped = 0
        self.failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None  # an MlflowClient, made in the thread at the first line
        self._run_id: str | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], run_id: str, params: Mapping[str, object], stage: str = "train"
    ) -> Tracker | None:
        """The run's tracker where MLFLOW_TRACKING_URI is set, tagged with the job this `stage` runs in."""
        uri = env.get(URI_VARIABLE, "").strip()
        if not uri:
            return None
        return cls(uri, env.get("TRAINING_ENVIRONMENT") or "local", run_id, params, job_tags(env, stage))

    def feed(self, line: str) -> None:
        """A line of the training's output: its metrics are queued."""
        found = metrics_of(line)
        if found is not None and found[1]:
            self.add(*found)

    def add(self, step: int, values: dict[str, float]) -> None:
        """Metric values at a step, queued; the thread that sends them starts with the first."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="mlflow-tracking", daemon=True)
            self._thread.start()
        try:
            self.lines.put_nowait((step, values, int(time.time() * 1000)))
        except queue.Full:
            self.dropped += 1

    def close(self, status: str = "FINISHED", timeout: float | None = None) -> None:
        """What is queued, then the run's status, waited for at most `timeout` seconds (default: close_seconds)."""
        if self._thread is None:
            return
        timeout = close_seconds(self.uri) if timeout is None else timeout
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            _say(f"{self.lines.qsize()} metric lines not sent in {timeout:g} s (tracking server slow or down)")
        elif self._client is not None and self._run_id is not None:
            self._try(lambda: self._client.set_terminated(self._run_id, status))
        if self.dropped:
            _say(f"{self.dropped} metric lines dropped: the queue of {QUEUE_LINES} was full")

    def _drain(self) -> None:
        delay = BACKOFF_SECONDS[0]
        pending: list = []
        while True:
            stopping = self._stop.is_set()
            while len(pending) < BATCH_METRICS:
                try:
                    pending.append(self.lines.get(timeout=0 if (pending or stopping) else 1.0))
                except queue.Empty:
                    break
            if not pending and stopping:
                return
            if pending and self._try(lambda batch=pending: self._send(batch)):
                pending, delay = [], BACKOFF_SECONDS[0]
            elif pending:
                if stopping:
                    return  # the launcher's wait is bounded; what is left is reported by close()
                time.sleep(delay)
                delay = min(2 * delay, BACKOFF_SECONDS[1])

    def _send(self, pending: list) -> None:
        from mlflow.entities import Metric

        if self._run_id is None:
            self._run_id = run_of(self._connect(), self.experiment, self.run_name, self.params)
            for key, value in self.tags.items():
                self._connect().set_tag(self._run_id, key, value)
            self._add_context()
        metrics = [Metric(name, value, at, step) for step, values, at in pending for name, value in values.items()]
        for start in range(0, len(metrics), BATCH_METRICS):
            self._connect().log_batch(self._run_id, metrics=metrics[start : start + BATCH_METRICS])

    def _add_context(self) -> None:
        from mlflow.entities import Metric

        try:
            tags, values = self.context() if self.context is not None else ({}, {})
        except Exception as error:  # the record is unreadable: the run is tracked without it
            _say(f"the run's context not tracked ({type(error).__name__}: {str(error)[:200]})")
            return
        for key, value in tags.items():
            self._connect().set_tag(self._run_id, key, value)
        now = int(time.time() * 1000)
        if values:
            self._connect().log_batch(self._run_id, metrics=[Metric(k, v, now, 0) for k, v in values.items()])

    def _connect(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _try(self, call) -> bool:
        """The call's success; its first failure logged once, and the recovery after it."""
        try:
            call()
        except Exception as error:  # any client or network error: tracking never ends the training
            if not self.failing:
                _say(f"{self.uri} failed ({type(error).__name__}: {str(error)[:200]}); training goes on, retrying")
            self.failing = True
            return False
        if self.failing:
            _say(f"{self.uri} reachable again")
        self.failing = False
        return True


def run_of(client, experiment: str, run_name: str, params: Mapping[str, str]) -> str:
    """The MLflow run named `run_name` in `experiment` (both made if missing), with those of `params` it does not
    hold yet logged (an earlier stage may have made it without them; a parameter keeps its first value)."""
    from mlflow.entities import Param

    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    runs = client.search_runs([experiment_id], filter_string=f"attributes.run_name = '{run_name}'", max_results=1)
    if runs:
        run_id, held = runs[0].info.run_id, runs[0].data.params
        client.update_run(run_id, status="RUNNING")
    else:
        run_id, held = (
            client.create_run(experiment_id, run_name=run_name, tags={"efa_training.run_id": run_name}).info.run_id,
            {},
        )
    items = [Param(k, v) for k, v in params.items() if k not in held]
    for start in range(0, len(items), 100):  # LogBatch: at most 100 params per call
        client.log_batch(run_id, params=items[start : start + 100])
    return run_id


def job_tags(env: Mapping[str, str], stage: str) -> dict[str, str]:
    """The job a stage runs in, whose logs are named after it: Batch's job id (its log stream), SageMaker's training
    job name (its log group's streams), a Kubernetes pod's name (HOSTNAME). Batch user guide, "Compute environment
    variables": AWS_BATCH_JOB_ID; SageMaker developer guide, "How Amazon SageMaker AI provides training information":
    TRAINING_JOB_NAME; Kubernetes docs, "Container Environment": "The hostname of a Container is the name of the Pod"
    (KUBERNETES_SERVICE_HOST: every pod of a cluster with a default service, "Service" environment variables)."""
    for variable, kind in (
        ("AWS_BATCH_JOB_ID", "batch_job"),
        ("TRAINING_JOB_NAME", "sagemaker_job"),
        ("HOSTNAME", "pod"),
    ):
        if env.get(variable) and (kind != "pod" or env.get("KUBERNETES_SERVICE_HOST")):
            return {f"efa_training.{stage}.{kind}": env[variable]}
    return {}


def record(env: Mapping[str, str], run_id: str, step: int, values: Mapping[str, float], stage: str) -> None:
    """Values of a stage that is not the training (the sanity check, the validation) into the run's MLflow run, where
    tracking is on. Waited for at most CLOSE_SECONDS; a failure is one line, never the job's."""
    tracker = Tracker.from_env(env, run_id, {}, stage)
    if tracker is not None and values:
        tracker.add(step, {k: float(v) for k, v in values.items() if math.isfinite(v)})
        tracker.close()


def close_seconds(uri: str) -> float:
    """How long a stage's end waits for tracking: CLOSE_SECONDS for a server, which may be slow or down and must not
    hold a GPU job; LOCAL_CLOSE_SECONDS for a local store (a short local run's metrics were all dropped at 10 s on a
    loaded machine: "0 metric lines not sent", issue 48)."""
    local = uri.startswith(("sqlite:", "file:", "/", ".")) or ":" not in uri  # a path; not a URL, nor a server's ARN
    return LOCAL_CLOSE_SECONDS if local else CLOSE_SECONDS


def record_verdict(env: Mapping[str, str], run_id: str, verdict: Mapping[str, object]) -> None:
    """The validation's verdict: its value, baseline, relative delta and tolerance, and whether it passed (1 or 0)."""
    values = {
        f"verdict_{k}": float(v)
        for k, v in verdict.items()
        if k in ("value", "baseline", "relative_delta", "tolerance") and isinstance(v, (int, float))
    }
    step = verdict.get("step")
    passed = float(bool(verdict.get("passed")))
    record(env, run_id, step if isinstance(step, int) else 0, {**values, "verdict_passed": passed}, "validate")
    from efa_training.runtime.registered_model import register  # it builds on this module

    register(env, run_id, verdict)  # a passing model in MLflow's registry too


def record_sanity(env: Mapping[str, str], run_id: str, report: Mapping[str, object]) -> None:
    """The sanity check's report: whether it passed, the bus bandwidth it measured and the gate's threshold."""
    values = {
        f"sanity_{k}": float(v)
        for k, v in report.items()
        if k in ("measured_busbw_gbps", "threshold_busbw_gbps") and isinstance(v, (int, float))
    }
    record(env, run_id, 0, {**values, "sanity_passed": float(bool(report.get("passed")))}, "sanity")
