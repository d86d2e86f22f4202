"""What each of the launcher's modes runs, and where the package is for the processes it starts.

sanity, train and compile run under torchrun, each worker behind exit_relay.py (or, for a parameter-server run, under
the workload's own supervisor: workloads.runner); validate and prepare-data run as one plain process. Every process
runs an entry point of the package as `python -m`, with the package's folder first on its PYTHONPATH.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DISTRIBUTED_MODES = {
    "sanity": "efa_training.runtime.sanity",
    "train": "efa_training.train",
    "compile": "efa_training.train",
}
SINGLE_MODES = {"validate": "efa_training.validate", "prepare-data": "efa_training.prepare_data"}
EXIT_RELAY = "efa_training.runtime.exit_relay"
# The folder that holds the package (/opt/training in the image, training_image/ here): the children's PYTHONPATH,
# and where the release's version.py is.
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
VERSION_FILE = PACKAGE_ROOT / "version.py"  # the platform's release, beside the package (the CLI reads it too)


def python_path(env: Mapping[str, str]) -> str:
    """The children's PYTHONPATH: the package's folder first, so `python -m efa_training...` finds it wherever the
    job's working directory is."""
    others = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(PACKAGE_ROOT)]
    return os.pathsep.join([str(PACKAGE_ROOT), *others])
