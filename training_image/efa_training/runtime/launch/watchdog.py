"""Hang detection: a training that stops making progress ends its attempt within minutes, with evidence, instead of
holding every accelerator until the job's timeout (a hung collective keeps a GPU at 100%: NVIDIA/nccl#968).

Progress is a metrics line: a declared regex's match, or a line from runtime/report.py. Every node's launcher runs
a watchdog, and the one that sees progress (the node hosting global rank 0, whichever node torchrun's c10d
rendezvous put it on: it orders nodes by address, not by node rank) is the one that finds a hang; it asks the other
nodes for their workers' stacks through the shared run folder (hang_evidence.ask_peers), and they answer. Warm-up
(rendezvous, compilation, data staging) takes as long as it takes: the watch starts after the first WARMUP_LINES
lines. From then on the attempt is hung when no progress came for max(floor, FACTOR x the median interval between
progress lines so far): the floor is the declaration's `hang_timeout_seconds` (default 1800: long enough for a slow
checkpoint save), or the job's HANG_TIMEOUT_SECONDS. Then every worker's Python stacks go to the
job's log and to the run's folder (SIGABRT with faulthandler on: PYTHONFAULTHANDLER=1 in the workers' environment,
Python's "Dumping the traceback"; hang_evidence.py), one line `{"hang": {...}}` names the wait, the rank that stopped
first and where the evidence is, and the launcher ends torchrun and exits EXIT_HUNG, an attempt failure the pipeline
retries (the next attempt resumes from the last checkpoint).
"""

from __future__ import annotations

import contextlib
import functools
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

from efa_training.runtime import bad_hosts
from efa_training.runtime.exit_relay import COMMAND
from efa_training.runtime.launch.hang_evidence import (
    ask_peers,
    asked,
    attempt_folder,
    describe,
    environ,
    keep,
    peers_stacks,
    stopped_first,
)
from efa_training.runtime.launch.modes import EXIT_RELAY

FLOOR_VARIABLE = "HANG_TIMEOUT_SECONDS"
DEFAULT_FLOOR_SECONDS = 1800.0  # contracts/workload.py HANG_TIMEOUT_DEFAULT
FACTOR = 10.0  # a step may take this many times the usual interval between progress lines before it counts as hung
WARMUP_LINES = 2
STACK_DUMP_SECONDS = 10.0  # how long each worker gets to write its stacks, and torchrun to stop
PIPE_QUIET_SECONDS = 0.5  # a dead worker's stacks have passed the launcher's stderr pipe once it is this long quiet


class Watchdog:
    """Fed each progress line (`watch` wraps a line handler that returns what it read); `guard(proc)` ends `proc`'s
    process tree when progress stops, keeping the evidence under `run` (hang_evidence.py). `hang` is the summary once
    it did. The launcher passes the children's stderr through `stderr_line`, where the workers' stacks arrive.
    `bad_host(why, evidence)` is told of the worker that stopped first: it ran on this node (bad_hosts.record)."""

    def __init__(
        self,
        floor: float,
        clock: Callable[[], float] = time.monotonic,
        run: Path | None = None,
        bad_host: Callable[..., object] | None = None,
        peers: int = 0,
        node: str = "0",
        identity: dict | None = None,
    ) -> None:
        self.floor, self.clock, self.run, self.bad_host = floor, clock, run, bad_host
        # The other nodes sharing the run's folder: asked for their stacks by the node that finds a hang, and asking
        # this one for its own when another finds it. `node` names this one; `identity` is its host's.
        self.peers, self.node, self.identity, self.since = peers, node, identity, time.time()
        self.times: list[float] = []
        self.hang: dict | None = None
        self._lock = threading.Lock()
        self._captured: list[str] | None = None  # stderr lines while one worker writes its stacks
        self._line_at = 0.0  # when the last of them came
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        declared: float = DEFAULT_FLOOR_SECONDS,
        run: Path | None = None,
        run_id: str | None = None,
        peers: int = 0,
        node: str = "0",
    ) -> Watchdog:
        """The floor the workload declared (`hang_timeout_seconds`), unless the job's HANG_TIMEOUT_SECONDS sets it; the
        host that hung first recorded under `run_id` for quarantine (nothing without it or REPORT_PREFIX); `peers`:
        the other nodes sharing the run's folder, whose stacks are asked for."""
        record = functools.partial(bad_hosts.record, env, run_id)
        identity = bad_hosts.host_identity(env)
        return cls(floor_from(env, declared), run=run, bad_host=record, peers=peers, node=node, identity=identity)

    def stderr_line(self, line: str) -> None:
        captured = self._captured
        if captured is not None:
            captured.append(line)
            self._line_at = time.monotonic()

    def stacks_of(self, pid: int) -> str:
        """A stopped worker's Python stacks (SIGABRT under faulthandler), read off stderr: resumed, it handles the
        signal before it runs any more of its code, so the stacks are where it stopped."""
        captured: list[str] = []
        self._captured = captured
        _signal(pid, signal.SIGABRT)
        _signal(pid, signal.SIGCONT)
        deadline = time.monotonic() + STACK_DUMP_SECONDS
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and not _zombie(pid):
            time.sleep(0.05)
        # Its last lines may still be in the pipe: wait until they came and the pipe went quiet (bounded).
        settled = time.monotonic() + STACK_DUMP_SECONDS
        while time.monotonic() < settled and (not captured or time.monotonic() - self._line_at < PIPE_QUIET_SECONDS):
            time.sleep(0.05)
        self._captured = None
        return "".join(captured)

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
                    self.hang = hang  # first: the launcher's exit code is EXIT_HUNG however this ends
                    self._end(proc, hang)
                    return
                folder = asked(self.run, self.since) if self.peers else None
                if folder is not None:  # another node found the training hung
                    self.hang = {"asked_by": "another node's watchdog", "evidence": str(folder)}
                    self._give_stacks(proc, self.hang)
                    return
                time.sleep(poll)

        self._thread = threading.Thread(target=run, name="hang-watchdog", daemon=True)
        self._thread.start()
        return self._thread

    def _end(self, proc: subprocess.Popen, hang: dict) -> None:
        print(f"launch.py: no progress for {hang['seconds_without_progress']} s (limit {hang['limit_seconds']} s): "
              "each worker's stacks follow, then the attempt ends", file=sys.stderr, flush=True)  # fmt: skip
        folder = attempt_folder(self.run)
        if self.peers:
            ask_peers(self.run, folder)  # first: the other nodes take their stacks while this one takes its own
        others: list[dict] = []
        try:
            found = stop_tree(proc, self, before_end=lambda: others.extend(peers_stacks(folder, self.peers)))
            everyone = found + others
            hang["stopped_first"] = stopped_first(everyone)
            hang["workers"] = [{key: w.get(key) for key in ("rank", "node", "state", "host", "pid")} for w in everyone]
            kept = keep(folder, hang, found)
            hang["evidence"] = str(kept) if kept else None
            self._tell_bad_host(hang["stopped_first"], everyone, kept)
        finally:  # the summary line whatever failed in gathering the evidence
            print(json.dumps({"hang": hang}, default=str), file=sys.stderr, flush=True)

    def _give_stacks(self, proc: subprocess.Popen, hang: dict) -> None:
        """Asked by the node that found the hang: this node's workers' stacks into its folder, then torchrun ended."""
        print(f"launch.py: node {self.node}: another node found the training hung: each worker's stacks follow, then "
              "the attempt ends", file=sys.stderr, flush=True)  # fmt: skip
        try:
            found = stop_tree(proc, self)
            hang["workers"] = [{key: w.get(key) for key in ("rank", "node", "state", "host", "pid")} for w in found]
            keep(Path(hang["evidence"]), None, found, node=self.node, identity=self.identity)
        finally:
            print(json.dumps({"hang": hang}, default=str), file=sys.stderr, flush=True)

    def _tell_bad_host(self, stopped: dict | None, everyone: list[dict], kept: Path | None) -> None:
        """The host of the worker that stopped first, recorded bad: this node's, or another's by its identity."""
        if stopped is None or self.bad_host is None or stopped.get("host_fault") is False:
            return
        worker = next((w for w in everyone if w["pid"] == stopped["pid"] and w.get("node") == stopped.get("node")), {})
        evidence = [f"rank {stopped['rank']} pid {stopped['pid']}", f"evidence: {kept}"]
        self.bad_host(f"hung first: {stopped['why']}", evidence, identity=worker.get("identity"))

    def join(self, timeout: float = 4 * STACK_DUMP_SECONDS) -> None:
        """Wait for a hang's evidence and summary to be written (the launcher exits after them)."""
        if self._thread is not None and self.hang is not None:
            self._thread.join(timeout)


def floor_from(env: Mapping[str, str], declared: float = DEFAULT_FLOOR_SECONDS) -> float:
    """The floor: the job's HANG_TIMEOUT_SECONDS, else the declared one; at least a second. The built-in trainer
    reads it too, to keep its collective timeout above it (runtime/distributed.py collective_timeout_after_warm_up)."""
    try:
        floor = float(env.get(FLOOR_VARIABLE) or declared)
    except ValueError:
        floor = declared
    return max(floor, 1.0)


def _tree() -> dict[int, int]:
    """Each process's parent, from /proc (Linux, as in every image of the platform)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def descendants(root: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below `root` (`parents`: _tree()'s map, read afresh when not given)."""
    parents = _tree() if parents is None else parents
    below, pending = [], [root]
    while pending:
        pid = pending.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        below += children
        pending += children
    return below


def workers(root: int) -> list[int]:
    """The training processes below `root` (torchrun): each rank's own process, found by the RANK that torchrun puts
    in its environment. Not its children (data loader workers share its RANK), not the exit relay that runs a
    declared command (its child is the rank's process). Without any RANK (a process of its own): the leaves."""
    parents = _tree()
    below = descendants(root, parents)
    ranks = {pid: environ(pid).get("RANK") for pid in below}
    relays = {pid for pid in below if _relays_a_command(pid)}
    found = [
        pid for pid in below
        if ranks[pid] is not None and pid not in relays
        and (ranks.get(parents[pid]) != ranks[pid] or parents[pid] in relays)
    ]  # fmt: skip
    if found:
        return sorted(found)
    return sorted(pid for pid in below if pid not in parents.values())


def _relays_a_command(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return EXIT_RELAY.encode() in argv and COMMAND.encode() in argv


def stop_tree(proc: subprocess.Popen, watchdog: Watchdog, before_end: Callable[[], object] | None = None) -> list[dict]:
    """Each worker described and its stacks taken, one worker at a time so that they do not interleave, then torchrun
    stopped (SIGTERM, then SIGKILL). torchrun and the workers are paused meanwhile: torchrun would otherwise stop the
    other workers (SIGTERM, no stacks) as soon as the first one ends, and a worker would fail its collective.
    The workers as hang_evidence.describe gives them, with their stacks."""
    _signal(proc.pid, signal.SIGSTOP)
    found: list[dict] = []
    described: list[dict] = []
    try:
        described = [describe(pid) for pid in workers(proc.pid)]  # states before any signal of ours
        for worker in described:  # frozen, so that none reacts to another's end (a peer gone fails a collective)
            _signal(worker["pid"], signal.SIGSTOP)
        for worker in described:
            worker["stacks"] = watchdog.stacks_of(worker["pid"])
            found.append(worker)
        if before_end is not None:
            before_end()  # the other nodes' stacks, while this node's store is still up
    finally:  # never leave torchrun or a worker paused, nor torchrun running: it would hold the job until its timeout
        for pid in [proc.pid, *(worker["pid"] for worker in described)]:
            _signal(pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=STACK_DUMP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # ended already, or not ours
        os.kill(pid, signum)
