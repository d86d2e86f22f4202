"""`pipeline_cli watch` (and `start --watch`): an execution followed until it ends, one line per phase, retry and
failure, with elapsed time and progress, then the run's result.
"""

import time
from datetime import UTC, datetime

from tools.pipeline_session import RESULT_CODES, STAGES, Pipeline, call


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _is_job(event: dict) -> bool:
    """A job submission (`...sync`: Batch, EKS, SageMaker), not one of the calls around it (the quarantine's)."""
    return str(event.get("taskScheduledEventDetails", {}).get("resource", "")).endswith(".sync")


def _progress(done: int, total: int) -> str:
    return "[" + "#" * done + "-" * (total - done) + f"] {done}/{total}"


class _Progress:
    """What `watch` prints for each history event: the phases, where the run ends, retries and failures."""

    def __init__(self, out, phases: tuple[str, ...] = STAGES) -> None:
        self.out, self.phases = out, phases
        self.attempts: dict[str | None, int] = {}
        self.done: set[str] = set()
        self.start = None
        self.phase: str | None = None
        self.task: str | None = None

    def show(self, event: dict) -> None:
        self.start = self.start or event["timestamp"]
        elapsed = _elapsed((event["timestamp"] - self.start).total_seconds())
        kind = event["type"]
        if kind.endswith("StateEntered"):
            self._entered(elapsed, kind, event["stateEnteredEventDetails"]["name"])
        elif kind == "TaskScheduled" and self.task and _is_job(event):
            self.attempts[self.task] = self.attempts.get(self.task, 0) + 1
            if self.attempts[self.task] > 1:
                self._print(elapsed, f"{self.task} attempt {self.attempts[self.task]}")
        elif kind in ("TaskFailed", "TaskTimedOut"):
            details = event.get("taskFailedEventDetails") or event.get("taskTimedOutEventDetails") or {}
            print(
                f"{elapsed}  {' ' * len(_progress(len(self.phases), len(self.phases)))}  {self.task} attempt "
                f"{self.attempts.get(self.task, 1)} failed: {details.get('error', '')}",
                file=self.out,
            )

    def _entered(self, elapsed: str, kind: str, name: str) -> None:
        # The phases of the run, and where it ends; the checks and reshaping states in between are quiet, and so
        # are the states inside a phase (Train's job and its failure kinds, Validate's Spot and on-demand
        # submissions): their attempts count for the phase.
        inside = bool(self.phase) and name != self.phase and name.startswith(self.phase or "")
        self.task = self.phase if inside else name
        if name in self.phases:
            self.phase = self.task = name
            self.done.add(name)
            self._print(elapsed, name)
        elif kind in ("SucceedStateEntered", "FailStateEntered") and not inside:
            self._print(elapsed, name)

    def _print(self, elapsed: str, text: str) -> None:
        print(f"{elapsed}  {_progress(len(self.done), len(self.phases))}  {text}", file=self.out)


def _final_line(described: dict) -> str:
    stop = described.get("stopDate") or datetime.now(UTC)
    line = f"{described['status']} after {_elapsed((stop - described['startDate']).total_seconds())}"
    if described.get("error"):
        line += f": {described['error']}: {described.get('cause', '')[:300]}"
    return line


def watch(pipeline: Pipeline, execution_arn: str, out, interval: float = 10.0) -> int:
    """Print states as they pass, with attempts, elapsed time and progress; return the run's exit code."""
    progress, last_id = _Progress(out, pipeline.phases), 0
    while True:
        # Status first, then history: every event before a final status is in the history read after it.
        described = call(pipeline.sfn.describe_execution, executionArn=execution_arn)
        # History has no "since" parameter: page through it and skip the events already shown.
        events = [event for event in pipeline.all_history(execution_arn) if event["id"] > last_id]
        last_id = events[-1]["id"] if events else last_id
        for event in events:
            progress.show(event)
        if described["status"] != "RUNNING":
            print(_final_line(described), file=out)
            return RESULT_CODES.get(described["status"], 1)
        time.sleep(interval)
