"""Run one training-image entry point as a torchrun worker and leave its exit code where launch.py finds it.

    python -m efa_training.runtime.exit_relay efa_training.train --data ...    (the launcher puts it in front)

The entry point is a module of the image (run as `python -m` runs it); a path ending in .py is run as a script
(a test's wrapper of train.py); `--command ARGV...` runs any program as a child (a declared workload's command,
runtime/user_workload.py), passing SIGTERM on, and relays its code the same way.

torchrun reports any failed worker group as exit code 1 (its ChildFailedError), which hides the scripts'
own codes (errors.py: 2 usage, 4 diverged, 5 folder locked, which the pipeline does not retry; sanity_check.py:
3 report not written). Each worker writes its code to $LAUNCH_EXIT_CODE_DIR/restart<N>-rank<R>, and launch.py
exits with the code of the newest restart (`relayed_exit_code`). Without that variable it only runs
the script.

torchrun restarts the worker group after any failure (--max-restarts), also after one that a restart
cannot change: a usage error, a diverged run, a checkpoint folder held by another job. A worker whose
previous attempt ended that way ends the same way at once, without running the script again, so the
job's log holds the one-line reason once and the restarts cost seconds.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from efa_training.runtime.errors import (
    EXIT_DIVERGED,
    EXIT_FOLDER_LOCKED,
    EXIT_STOPPED,
    EXIT_USAGE,
    RELAYED,
    exit_process,
)

EXIT_CODE_DIR = "LAUNCH_EXIT_CODE_DIR"
_KEPT: list[BaseException] = []  # the script's exception, never freed: see _run_script
FINAL = {EXIT_USAGE, EXIT_DIVERGED, EXIT_FOLDER_LOCKED}  # a restart would end the same way
COMMAND = "--command"


def _run_child(argv: list[str]) -> int:
    """A program of the user's, with SIGTERM/SIGINT passed on (it saves and exits within the grace period); its
    exit code, 128+N when a signal killed it."""
    if not argv:
        return EXIT_USAGE
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    return code if code >= 0 else 128 - code


def _attempt() -> tuple[int, str]:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), os.environ.get("RANK", "0")


def previous_final_code() -> int | None:
    """This rank's code in the previous restart, if it was one that no restart changes."""
    folder = os.environ.get(EXIT_CODE_DIR)
    restart, rank = _attempt()
    if not folder or restart == 0:
        return None
    try:
        code = int(Path(folder, f"restart{restart - 1}-rank{rank}").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return code if code in FINAL else None


def record(code: int) -> None:
    folder = os.environ.get(EXIT_CODE_DIR)
    if folder:
        restart, rank = _attempt()
        Path(folder, f"restart{restart}-rank{rank}").write_text(f"{code} {time.time()}")


def relayed_exit_code(folder: Path, torchrun_code: int, stop_requested: bool = False) -> int:
    """The exit code a job should end with: that of the first worker of torchrun's last restart to fail
    (torchrun's "root cause"), when it chose one; else torchrun's. Workers that torchrun stopped after that
    failure exit later and do not count, so a crash (1) is not reported as their 143. After a stop signal
    (`stop_requested`) that every worker answered by ending cleanly: EXIT_STOPPED."""
    if torchrun_code == 0:
        return 0
    exits: dict[int, list[tuple[float, int, int]]] = {}
    for path in folder.glob("restart*-rank*"):
        restart, _, rank = path.name[len("restart") :].partition("-rank")
        try:
            code, when = path.read_text().split()
            exits.setdefault(int(restart), []).append((float(when), int(rank), int(code)))
        except ValueError:
            continue
    last = exits.get(max(exits, default=-1), [])
    failures = sorted(e for e in last if e[2] != 0)
    if stop_requested and last and all(code in (0, EXIT_STOPPED) for _, _, code in last):
        # Every worker saved and ended on the stop signal (a user's script may exit 0 then, as the contract lets it);
        # torchrun reports its own SIGTERM as 1, which would read as a crash.
        return EXIT_STOPPED
    return failures[0][2] if failures and failures[0][2] != 1 else torchrun_code


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: exit_relay.py MODULE|SCRIPT [args...]")
    final = previous_final_code()
    if final is not None:
        record(final)
        sys.exit(final)
    target = sys.argv[1]
    if target == COMMAND:
        code = _run_child(sys.argv[2:])
        record(code)
        sys.exit(code)
    sys.argv = sys.argv[1:]
    code = _run_script(target)
    record(code)
    os.environ.pop(RELAYED)  # the relay itself leaves without finalization
    exit_process(code)


def _run_script(target: str) -> int:
    """The script's exit code: its SystemExit's, 0 if it returns, 1 (its traceback printed) if an exception escapes.

    The exception is kept until the process leaves (os._exit frees nothing): its traceback holds the script's frames
    and with them its DDP model, whose Reducer, freed after the script destroyed its process group, would be the
    group's last owner, and gloo's destructor joins its worker threads holding the GIL that a worker still needs
    (a diverged run deadlocked so, 1 in about 15 here, until torchrun's SIGKILL or forever when every rank did)."""
    os.environ[RELAYED] = "1"  # the script raises its code for us (errors.exit_process)
    try:
        if target.endswith(".py"):
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        _KEPT.append(exc)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - printed as the interpreter would, and relayed as a crash
        _KEPT.append(exc)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    main()
