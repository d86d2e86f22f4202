"""The launcher's children: torchrun (or one plain process) with the scheduler's stop signals passed on, ending with
the workers' own exit code; on SageMaker, the sanity check first and the failure file after them."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from efa_training.runtime import bad_hosts, host_metrics
from efa_training.runtime.errors import (
    EXIT_DIVERGED,
    EXIT_FOLDER_LOCKED,
    EXIT_HUNG,
    EXIT_STOPPED,
    EXIT_USAGE,
    EXIT_WINDOW_ENDED,
)
from efa_training.runtime.exit_relay import EXIT_CODE_DIR, relayed_exit_code
from efa_training.runtime.launch.sagemaker import write_failure
from efa_training.runtime.run_paths import flag_value

if TYPE_CHECKING:
    from efa_training.runtime.launch.command import Launch
    from efa_training.runtime.launch.stop_by import StopBy
    from efa_training.runtime.launch.watchdog import Watchdog

_signals_received: list[int] = []
PASS_ON_SECONDS = 5.0


def run_forwarding(
    cmd: list[str],
    env: dict,
    on_line: Callable[[str], object] | None = None,
    watchdog: Watchdog | None = None,
    stop_by: StopBy | None = None,
) -> int:
    """`cmd` as a child with the scheduler's stop signals passed on (StopTrainingJob sends SIGTERM and waits 120 s:
    https://docs.aws.amazon.com/sagemaker/latest/dg/API_StopTrainingJob.html); its exit code, 128+N if killed.
    `on_line`: each line the child prints, after it is passed on to this process's stdout (a workload's metrics).
    `watchdog`: ends the child's process tree when its progress stops (runtime/launch/watchdog.py). `stop_by`: asks
    the child to stop before the reservation ends (runtime/launch/stop_by.py)."""
    # Lines as text; a byte that is not UTF-8 is replaced rather than ending the launcher. Under a watchdog stderr
    # passes through it too: the workers' stacks arrive there when they hang.
    stdout = subprocess.PIPE if on_line else None
    stderr = subprocess.PIPE if watchdog is not None else None
    piped = stdout is not None or stderr is not None
    proc = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, text=piped, errors="replace" if piped else None)
    passing = None
    if watchdog is not None and proc.stderr is not None:
        passing = threading.Thread(target=_pass_on, args=(proc.stderr, watchdog.stderr_line), daemon=True)
        passing.start()
        watchdog.guard(proc)
    if stop_by is not None:
        stop_by.guard(proc)

    def forward(signum: int, frame: object) -> None:
        _signals_received.append(signum)
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    if on_line is not None and proc.stdout is not None:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            on_line(line)
    code = proc.wait()
    if watchdog is not None:
        watchdog.join()
    if passing is not None:
        passing.join(PASS_ON_SECONDS)  # a descendant that outlives torchrun may hold the pipe open
    return code if code >= 0 else 128 - code


def _pass_on(stream: TextIO, also: Callable[[str], None]) -> None:
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        also(line)


def run_torchrun(
    cmd: list[str],
    env: dict,
    on_line: Callable[[str], object] | None = None,
    watchdog: Watchdog | None = None,
    stop_by: StopBy | None = None,
    stop_codes: frozenset[int] = frozenset(),
) -> int:
    """torchrun as a child, with the scheduler's stop signals passed on, ending with the workers' own exit code;
    EXIT_HUNG where the watchdog ended a training that stopped making progress; EXIT_WINDOW_ENDED where the training
    stopped cleanly because its reservation ends. `stop_codes`: for a declared workload's own launcher or process
    (user_workload.stop_codes), its exit codes that mean it stopped cleanly, where no worker's code was recorded:
    after a stop request they end as torchrun's clean stop does (EXIT_STOPPED, or EXIT_WINDOW_ENDED)."""
    with tempfile.TemporaryDirectory(prefix="launch-exit-codes-") as folder:
        code = run_forwarding(cmd, {**env, EXIT_CODE_DIR: folder}, on_line, watchdog, stop_by)
        if watchdog is not None and watchdog.hang is not None:
            return EXIT_HUNG
        asked = stop_by is not None and stop_by.fired
        stopped = asked or bool(_signals_received)
        if stopped and code in stop_codes and not any(Path(folder).iterdir()):
            code = EXIT_STOPPED
        code = relayed_exit_code(Path(folder), code, stop_requested=stopped)
        return EXIT_WINDOW_ENDED if asked and code in (0, EXIT_STOPPED) else code


# Exit codes that say nothing about the hosts: done, refused (usage, diverged, folder locked), stopped on request or
# for the reservation's end. After any other failure of training, each node checks its own health.
NOT_THE_HOSTS = frozenset({0, EXIT_USAGE, EXIT_DIVERGED, EXIT_FOLDER_LOCKED, EXIT_WINDOW_ENDED, EXIT_STOPPED})


def health_after_failure(mode: str, code: int, env: dict, host: str | None = None, run_id: str | None = None) -> int:
    """After a failed training attempt (a crash, a hang), this node's deep health checks (sanity/health.py), each
    finding in the job's log, so that an attempt lost to a failing GPU names it, and a node with findings recorded
    for quarantine (bad_hosts.py) under `run_id` (the script's --run-id), else env RUN_ID; the exit code stays the
    attempt's."""
    if mode != "train" or code in NOT_THE_HOSTS:
        return code
    from efa_training.runtime.sanity import health  # only after a failure

    found = health.check_node(env.get("ACCELERATOR_KIND", "cpu"))
    report = found.report(host or socket.gethostname())
    lines = report["failures"] or [f"health: {report['host']}: no finding"]
    for line in lines + [f"health: not run: {why}" for why in report["not_run"]]:
        print(f"launch.py: after the failed attempt (exit {code}): {line}", file=sys.stderr, flush=True)
    if report["failures"]:
        why = f"failed the health check after a failed attempt (exit {code})"
        bad_hosts.record(env, run_id or env.get("RUN_ID"), why, report["failures"])
    return code


def run_on_sagemaker(mode: str, launch: Launch) -> int:
    """The job's processes as children (so the failure file can be written after them), sanity first if asked."""
    assert launch.ml_root is not None
    host_metrics.start_beside(mode, launch.env, launch.ml_root)  # this instance's utilisation, for the idle alarm
    stage, code = mode, 0
    if launch.sanity_first:
        stage = "sanity check before training"
        print(f"launch.py: {stage}: {' '.join(launch.sanity_first)}", file=sys.stderr, flush=True)
        code = run_torchrun(launch.sanity_first, launch.env)
        if code == 0 and _signals_received:
            code = EXIT_STOPPED  # stopped between the check and the training: nothing to train or save yet
    if code == 0:
        stage = mode
        if launch.plan:
            code = run_torchrun(
                launch.command, launch.env, launch.on_line, launch.watchdog, launch.stop_by, launch.stop_codes
            )
            health_after_failure(mode, code, launch.env, run_id=flag_value(launch.command, "--run-id"))
        else:
            code = run_forwarding(launch.command, launch.env)
    if code != 0:
        write_failure(launch.ml_root, code, stage)
    return code
