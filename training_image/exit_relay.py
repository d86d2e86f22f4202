"""Run one training-image script as a torchrun worker and leave its exit code where launch.py finds it.

    python exit_relay.py train.py --data ...       (launch.py puts it in front of the script)

torchrun reports any failed worker group as exit code 1 (its ChildFailedError), which hides the codes
the pipeline branches on (errors.py: 2 usage, 4 diverged, 5 folder locked; sanity_check.py: 3 report
not written). Each worker writes its code to $LAUNCH_EXIT_CODE_DIR/restart<N>-rank<R>, and launch.py
exits with the code of the newest restart (`relayed_exit_code`). Without that variable it only runs
the script.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

EXIT_CODE_DIR = "LAUNCH_EXIT_CODE_DIR"


def record(code: int) -> None:
    folder = os.environ.get(EXIT_CODE_DIR)
    if folder:
        name = f"restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-rank{os.environ.get('RANK', '0')}"
        Path(folder, name).write_text(str(code))


def relayed_exit_code(folder: Path, torchrun_code: int) -> int:
    """The exit code a job should end with: torchrun's, unless a worker of its last restart chose its own."""
    if torchrun_code == 0:
        return 0
    newest: dict[int, int] = {}
    latest = -1
    for path in folder.glob("restart*-rank*"):
        restart, _, rank = path.name[len("restart"):].partition("-rank")
        try:
            restart_n, rank_n, code = int(restart), int(rank), int(path.read_text())
        except ValueError:
            continue
        if restart_n > latest:
            latest, newest = restart_n, {}
        if restart_n == latest:
            newest[rank_n] = code
    chosen = [code for _, code in sorted(newest.items()) if code not in (0, 1)]  # the lowest rank's own code
    return chosen[0] if chosen else torchrun_code


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: exit_relay.py SCRIPT [args...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    code = 1  # an exception escaping the script
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    finally:
        record(code)


if __name__ == "__main__":
    main()
