"""Hang detection: a training that stops making progress ends its attempt within minutes, with evidence, instead of
holding every accelerator until the job's timeout (a hung collective keeps a GPU at 100%: NVIDIA/nccl#968).

Progress is a metrics line on the main node: a declared regex's match, or a line from runtime/report.py. Warm-up
(rendezvous, compilation, data staging) takes as long as it takes: the watch starts after the first WARMUP_LINES
lines. From then on the attempt is hung when no progress came for max(floor, FACTOR x the median interval between
progress lines so far): the floor is the declaration's `hang_timeout_seconds` (default 1800: long enough for a slow
checkpoint save), or the job's HANG_TIMEOUT_SECONDS. Then every worker's Python stacks go to the
job's log (SIGABRT with faulthandler on: PYTHONFAULTHANDLER=1 in the workers' environment, Python's "Dumping the
traceback"), one line `{"hang": {...}}` names the last step and the wait, and the launcher ends torchrun and exits
EXIT_HUNG, an attempt failure the pipeline retries (the next attempt resumes from the last checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

FLOOR_VARIABLE = "HANG_TIMEOUT_SECONDS"
DEFAULT_FLOOR_SECONDS = 1800.0  # contracts/workload.py HANG_TIMEOUT_DEFAULT
FACTOR = 10.0  # a step may take this many times the usual interval between progress lines before it counts as hung
WARMUP_LINES = 2
STACK_DUMP_SECONDS = 10.0  # how long each worker gets to write its stacks, and torchrun to stop


class Watchdog:
    """Fed each progress line (`watch` wraps a line handler that returns what it read); `guard(proc)` ends `proc`'s
    process tree when progress stops. `hang` is the summary once it did."""

    def __init__(self, floor: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.floor, self.clock = floor, clock
        self.times: list[float] = []
        self.hang: dict | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str], declared: float = DEFAULT_FLOOR_SECONDS) -> Watchdog:
        """The floor the workload declared (`hang_timeout_seconds`), unless the job's HANG_TIMEOUT_SECONDS sets it."""
        try:
            floor = float(env.get(FLOOR_VARIABLE) or declared)
        except ValueError:
            floor = declared
        return cls(max(floor, 1.0))

    def watch(self, handler: Callable[[str], object]) -> Callable[[str], object]:
        def fed(line: str) -> object:
            read = handler(line)
            if read:
                self.progress()
            return read

        return fed

    def progress(self) -> None:
        with self._lock:
            self.times.append(self.clock())

    def limit(self) -> float | None:
        """Seconds without progress that count as a hang; None during warm-up."""
        with self._lock:
            times = list(self.times)
        if len(times) < WARMUP_LINES:
            return None
        intervals = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        return max(self.floor, FACTOR * statistics.median(intervals)) if intervals else self.floor

    def overdue(self) -> dict | None:
        """The summary of a hang, if there is one now."""
        limit = self.limit()
        if limit is None:
            return None
        waited = self.clock() - self.times[-1]
        if waited <= limit:
            return None
        return {"seconds_without_progress": round(waited, 1), "limit_seconds": round(limit, 1),
                "progress_lines": len(self.times)}  # fmt: skip

    def guard(self, proc: subprocess.Popen, poll: float = 1.0) -> threading.Thread:
        """A daemon thread that ends `proc` and its workers when progress stops, until `proc` ends."""

        def run() -> None:
            while proc.poll() is None:
                hang = self.overdue()
                if hang is not None:
                    self.hang = hang
                    print(json.dumps({"hang": hang}), file=sys.stderr, flush=True)
                    stop_tree(proc)
                    return
                time.sleep(poll)

        thread = threading.Thread(target=run, name="hang-watchdog", daemon=True)
        thread.start()
        return thread


def _children() -> dict[int, list[int]]:
    """Each process's children, from /proc (Linux, as in every image of the platform)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def workers(root: int) -> list[int]:
    """The processes at the bottom of `root`'s tree: the training processes (below torchrun and the exit relays)."""
    children, found, pending = _children(), [], [root]
    while pending:
        pid = pending.pop()
        below = children.get(pid, [])
        found += [pid] if not below and pid != root else []
        pending += below
    return sorted(found)


def stop_tree(proc: subprocess.Popen) -> None:
    """Each worker's stacks to the log, one worker at a time so that they do not interleave (SIGABRT under
    faulthandler), then torchrun stopped (SIGTERM, then SIGKILL). torchrun is paused meanwhile: it would otherwise
    stop the other workers (SIGTERM, no stacks) as soon as the first one ends."""
    _signal(proc.pid, signal.SIGSTOP)
    try:
        for pid in workers(proc.pid):
            _signal(pid, signal.SIGABRT)
            deadline = time.monotonic() + STACK_DUMP_SECONDS
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and not _zombie(pid):
                time.sleep(0.05)
    finally:  # never leave torchrun paused: it would hold the job until its timeout
        _signal(proc.pid, signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(timeout=STACK_DUMP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # ended already, or not ours
        os.kill(pid, signum)
