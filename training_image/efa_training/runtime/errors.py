"""User-facing errors and the image's exit codes: one line, no traceback.

Every entry point catches `UsageError` at the top of `main()` and prints it as a
single line on stderr with exit code 2, so a Batch/EKS job log shows the cause
without a traceback to scroll through. `RunRefused` is the same for a run that
must not go on for a reason other than a flag (diverged, folder held by another job).

Exit codes (launch.py passes them through torchrun, which would turn them all into 1). The pipeline stops a
training run at 2, 4 and 5 (contracts/run.py REFUSED_EXIT_CODES, tested equal to these) and retries any other
failure on new hosts:
  0    success
  1    a failure of the infrastructure or an unexpected error: worth a retry on other hosts
  2    EXIT_USAGE: bad flag, data or checkpoint folder; a retry fails the same way
  3    sanity_check.py only: the checks passed but the report was not written (EXIT_REPORT_NOT_WRITTEN)
  4    EXIT_DIVERGED: the loss or the gradient norm stopped being finite, or exploded; a failure
       of the run (its hyperparameters or data), not of the hosts: no retry
  5    EXIT_FOLDER_LOCKED: another live job writes to the same checkpoint folder; no retry
  6    EXIT_HUNG: the launcher's watchdog ended a training that stopped making progress (retried)
  7    EXIT_WINDOW_ENDED: the launcher stopped the training before its reservation ends (runtime/launch/stop_by.py),
       after a checkpoint: resumable in the next window, not retried
  143  train.py stopped on SIGTERM/SIGINT after writing a checkpoint (the scheduler asked)

On SageMaker, launch.py also writes the code and its meaning to the job's failure file (`failure_reason`), which
DescribeTrainingJob returns as FailureReason: the pipeline tells a refused run from a failed attempt by matching
FAILURE_REASON_MARKER followed by the code (contracts/run.py holds the same marker; a test holds them equal).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_DIVERGED = 4
EXIT_FOLDER_LOCKED = 5
EXIT_REPORT_NOT_WRITTEN = 3  # sanity_check.py: the checks passed, the report was not written
EXIT_HUNG = 6  # runtime/launch/watchdog.py: no progress past the limit; the stacks are in the log (retried)
EXIT_WINDOW_ENDED = 7  # runtime/launch/stop_by.py: stopped before the reservation ends, checkpoint saved
EXIT_HOST_UNPREPARED = 8  # runtime/launch/cli.py: this host's preparation failed; named bad, not run on (retried)
EXIT_STOPPED = 143  # 128 + SIGTERM: train.py stopped cleanly on request (SIGINT too), after a final checkpoint

FAILURE_REASON_MARKER = "efa-training exit code "
EXIT_MEANINGS = {
    1: "a crash, a lost worker or an infrastructure fault (worth a retry on other hosts)",
    EXIT_USAGE: "usage: a bad flag, environment, dataset or checkpoint folder (a retry fails the same way)",
    EXIT_REPORT_NOT_WRITTEN: "sanity report not written (the checks passed)",
    EXIT_DIVERGED: "diverged: the loss or gradient norm stopped being finite, or exploded",
    EXIT_FOLDER_LOCKED: "checkpoint folder locked by another live job",
    EXIT_HUNG: "hung: no progress past the watchdog's limit (every worker's stacks are in the log)",
    EXIT_WINDOW_ENDED: "the reservation's window ends: stopped after a checkpoint, resumable in the next window",
    EXIT_HOST_UNPREPARED: "this host's preparation failed: named bad for the pipeline to replace, nothing run on it",
    EXIT_STOPPED: "stopped (143) on SIGTERM after writing a final checkpoint",
}


class UsageError(Exception):
    """A problem the user can fix: bad flag, missing data, wrong file format."""

    def __init__(self, field: str, value: Any, problem: str, allowed: str = "") -> None:
        self.field, self.value, self.problem, self.allowed = field, value, problem, allowed
        text = f"{field}={value!r}: {problem}"
        if allowed:
            text += f"; allowed: {allowed}"
        super().__init__(text)


class RunRefused(Exception):
    """The run stops (or does not start) with its own exit code; `message` is empty on ranks that stay quiet."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code, self.message = code, message
        super().__init__(message)


def failure_reason(code: int, stage: str = "", detail: str = "") -> str:
    """One line for SageMaker's failure file: the marker, the exit code, what it means, then any detail."""
    meaning = EXIT_MEANINGS.get(code, "killed by a signal" if code > 128 else "an unexpected exit code")
    text = f"{FAILURE_REASON_MARKER}{code}: {meaning}"
    if stage:
        text += f" ({stage})"
    if detail:
        text += f": {detail}"
    return " ".join(text.split())


RELAYED = "EXIT_RELAY_RUNNING"  # set by exit_relay.py around the script it runs


def exit_process(code: int) -> NoReturn:
    """End a distributed script (train.py, sanity_check.py) without interpreter finalization, where gloo's worker
    threads can abort the process after its work is done (SIGABRT, "terminate called without an active exception":
    an FSDP worker here, 1 whole test run in 6; the teardown problem discussed in pytorch/pytorch#179291). Its files
    are fsynced and its process group destroyed before this. Under exit_relay.py the code is raised for the relay to
    record, and the relay leaves the same way."""
    if os.environ.get(RELAYED):
        raise SystemExit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_with_usage_error(prog: str, err: UsageError) -> NoReturn:
    # One line, no traceback: the message is the whole diagnosis.
    print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


def exit_refused(prog: str, err: RunRefused) -> NoReturn:
    if err.message:
        print(f"{prog}: error: {err.message}", file=sys.stderr, flush=True)
    sys.exit(err.code)
