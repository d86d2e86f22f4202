"""What the example workloads' tests share: an example's declaration as its job's WORKLOAD holds it (the one synth
checks), the launcher's command for a mode with the contract's folders in one scratch folder, and the job's
environment (`python` in the declared commands is the test's; in the image, the image's)."""

import json
import os
from pathlib import Path

from contracts.workload import parse_workload
from tests.training import training_helpers as th

ROOT = Path(__file__).resolve().parents[2]


def declared(name: str) -> str:
    """examples/<name with '_'>/workload.json, parsed as synth parses it, as the job's WORKLOAD variable."""
    declaration = json.loads((ROOT / "examples" / name.replace("-", "_") / "workload.json").read_text())
    return parse_workload(name, declaration, ROOT).variable


def launch(folder: Path, mode: str, *args: str) -> list[str]:
    """`launch.py <mode>` with the run's data, checkpoints and run folder under `folder`."""
    folders = ["--data", str(folder), "--checkpoint-dir", str(folder / "c"), "--run-dir", str(folder / "run")]
    return [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), mode, "--run-id", "demo", *folders, *args]


def job_env(name: str, processes: int = 2, **extra: str) -> dict:
    """One node of `processes` workers running example `name`, on its own rendezvous port, no restarts."""
    path = f"{Path(th.PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return th.env(
        WORKLOAD=declared(name),
        ACCELERATORS_PER_NODE=str(processes),
        MASTER_PORT=str(th.free_port()),
        MAX_RESTARTS="0",
        PATH=path,
        **extra,
    )
