"""What every workload's `train` refuses before any process group exists, each with one line and exit code 2.

Every rank runs the same checks on the same inputs, so all ranks reach the same verdict without a collective, and a
wrong flag costs seconds instead of a failed step on every node. Each workload adds its own (its data, its
checkpoint folder's compatibility) in its preflight.py.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from efa_training.runtime.distributed import resolve_device
from efa_training.runtime.errors import UsageError
from efa_training.runtime.run_paths import expected_nodes_error


def check_platform(expected_nodes: int | None, device: str) -> None:
    """The node count torchrun (or the supervisor) gave, against --expected-nodes; a device this image can use."""
    nodes_problem = expected_nodes_error(expected_nodes)
    if nodes_problem:
        raise UsageError("--expected-nodes", expected_nodes, nodes_problem, "the job's node count")
    resolve_device(device)


def probe_writable(root: Path) -> None:
    """Create the directory and write+delete a file in it, so a read-only or unmounted volume is a
    one-line usage error at start-up, not a traceback at the first save."""
    probe = root / f".write-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            "--checkpoint-dir",
            str(root),
            f"not writable ({type(exc).__name__}: {exc.strerror or exc})",
            "a writable directory (is the shared file system mounted?)",
        ) from None
