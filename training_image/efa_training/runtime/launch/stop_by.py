"""A reservation's end: the training is asked to stop early enough to save before the instances go.

The pipeline reads the end of the environment's Capacity Block or training plan and passes the moment the provider
takes the capacity away (the end less the provider's lead, 30 or 40 minutes: constructs/pipeline/reservation_end.py)
as the train job's `--stop-by` (ISO-8601 UTC); the launcher knows only that one time. At it minus a margin the
launcher sends SIGTERM to torchrun (or the workload's own launcher), as a Spot reclaim or StopTrainingJob would:
every workload saves and exits on it (docs/workloads.md, "What your code must do"). The margin is
max(MARGIN_FLOOR_SECONDS, SAVE_FACTOR x the longest checkpoint save the training reported so far:
CheckpointSaveSeconds on a metrics line), so a slow save moves the stop earlier. The attempt then ends
EXIT_WINDOW_ENDED, which the pipeline reports as ReservationEnded: resumable, not retried (a new execution with
`resume: true`, in the next window, continues from that checkpoint). A job that starts with less than the margin
left ends at once the same way, before it spends anything.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from efa_training.runtime.errors import UsageError
from efa_training.runtime.report import PREFIX as REPORT_PREFIX

FLAG = "--stop-by"
STOP_BY_VARIABLE = "STOP_BY"  # the same time in the job's environment, ISO-8601 UTC (what the workload may read)
NOT_SET = "none"  # the job parameter's value when the environment has no reservation with an end
MARGIN_FLOOR_SECONDS = 300.0  # a save and the exit: at least five minutes before the end
MARGIN_VARIABLE = "STOP_MARGIN_SECONDS"  # the job's own floor instead (tests use seconds)
SAVE_FACTOR = 3.0
SAVE_METRIC = "CheckpointSaveSeconds"


def pop_stop_by(script_args: list[str]) -> tuple[list[str], float | None]:
    """`--stop-by <ISO time|none>` taken out of the script's arguments (the launcher's flag, not the script's)."""
    args, deadline = list(script_args), None
    while FLAG in args:
        at = args.index(FLAG)
        value = args[at + 1] if at + 1 < len(args) else ""
        del args[at : at + 2]
        deadline = None if value == NOT_SET else parse_time(value)
    return args, deadline


def parse_time(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise UsageError(FLAG, text, "not a time with its zone", "an ISO-8601 time like 2026-12-03T11:30:00Z, or none")
    return moment.timestamp()


class StopBy:
    """`guard(proc)` sends SIGTERM to `proc` when the end minus the margin comes; `fired` says it did. Fed each line
    the training prints (`saw`), it keeps the longest checkpoint save reported."""

    def __init__(
        self, deadline: float, clock: Callable[[], float] = time.time, floor: float = MARGIN_FLOOR_SECONDS
    ) -> None:
        self.deadline, self.clock, self.floor = deadline, clock, floor
        self.longest_save = 0.0
        self.fired = False
        self._thread: threading.Thread | None = None

    def margin(self) -> float:
        return max(self.floor, SAVE_FACTOR * self.longest_save)

    def seconds_left(self) -> float:
        """Until the training must be asked to stop."""
        return self.deadline - self.margin() - self.clock()

    def saw(self, line: str) -> None:
        save = _reported(line).get(SAVE_METRIC)
        if isinstance(save, (int, float)) and not isinstance(save, bool) and save > self.longest_save:
            self.longest_save = float(save)

    def watch(self, handler: Callable[[str], object] | None) -> Callable[[str], object]:
        def fed(line: str) -> object:
            self.saw(line)
            return handler(line) if handler else None

        return fed

    def guard(self, proc: subprocess.Popen, poll: float = 1.0) -> None:
        def run() -> None:
            while proc.poll() is None:
                if self.seconds_left() <= 0:
                    self.fired = True
                    print(self.summary(), file=sys.stderr, flush=True)
                    proc.send_signal(signal.SIGTERM)
                    return
                time.sleep(poll)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def summary(self) -> str:
        """The end, the margin and when it was said (`said_at`: the SIGTERM's moment where the guard fired)."""
        ends, now = (datetime.fromtimestamp(t).astimezone().isoformat() for t in (self.deadline, self.clock()))
        margin, save = round(self.margin(), 1), round(self.longest_save, 1)
        return json.dumps(
            {
                "stop_by": {
                    "reservation_ends": ends,
                    "margin_seconds": margin,
                    "longest_save_seconds": save,
                    "said_at": now,
                }
            }
        )


def margin_floor(env: Mapping[str, str]) -> float:
    try:
        return max(float(env.get(MARGIN_VARIABLE) or MARGIN_FLOOR_SECONDS), 0.0)
    except ValueError:
        raise UsageError(MARGIN_VARIABLE, env.get(MARGIN_VARIABLE), "not a number of seconds", "300") from None


def _reported(line: str) -> dict:
    """The numbers of an EMF metrics line (runtime/metrics.py) or a report line (runtime/report.py)."""
    text = line[len(REPORT_PREFIX) :] if line.startswith(REPORT_PREFIX) else line
    if not text.startswith("{"):
        return {}
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def take_stop_by(args: list[str], env: dict) -> list[str]:
    """The launcher's own `--stop-by` out of the script's flags, into the environment (STOP_BY, which the workload
    reads too: docs/workloads.md); `none` clears it."""
    rest, deadline = pop_stop_by(args)
    if len(rest) != len(args):
        env.pop(STOP_BY_VARIABLE, None)
        if deadline is not None:
            env[STOP_BY_VARIABLE] = datetime.fromtimestamp(deadline, UTC).isoformat()
    return rest
