"""One writer per checkpoint folder: the folder's writer lock, taken by global rank 0 before it loads anything.

flock(2) is released by the kernel when its process dies, so a killed job never holds the folder. FSx for Lustre
honours it across nodes when mounted with `-o flock` ("full flock support, coherent across all client nodes":
mount.lustre(8); FSx mounts with `relatime,flock`:
https://docs.aws.amazon.com/fsx/latest/LustreGuide/mounting-ec2-instance.html).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

import torch
import torch.distributed as dist

from efa_training.runtime.console import log
from efa_training.runtime.distributed import Runtime
from efa_training.runtime.errors import EXIT_FOLDER_LOCKED, RunRefused, UsageError

LOCK_NAME = ".writer.lock"
# A lock whose holder is this same run (an earlier attempt whose host died) is waited for this long: a dead
# node's Lustre locks go only when the file system evicts that client, which takes minutes, not seconds.
# CHECKPOINT_LOCK_WAIT_SECONDS changes it; it stays well inside the process group's timeout (ranks wait meanwhile).
SAME_RUN_LOCK_WAIT_SECONDS = 300
LOCK_POLL_SECONDS = 5.0


def take_folder(root: Path, rt: Runtime, node_local: bool = False, *, run_id: str) -> IO | str | None:
    """Global rank 0 takes the lock (with node-local folders, every node's local rank 0 takes its own node's) and
    every rank learns the outcome; the lock is held until the process ends. `run_id`: the trainer's one run id
    (TrainConfig.named_run_id: --run-id on Batch and EKS, env RUN_ID on SageMaker; "" for a run given none).

    Held by the rank-0 worker process, so the kernel releases it when that worker dies; torchrun's restart
    takes it again. Another job on the same folder is refused with the holder's name and exit code 5, at once when
    it is another run, after a bounded wait when it is this run's own earlier attempt (its host may have died)."""
    holds = rt.local_rank == 0 if node_local else rt.is_main
    got = lock_folder_waiting(root, lock_holder(run_id)) if holds else None
    refused = torch.tensor([int(isinstance(got, str))], dtype=torch.int32, device=rt.device)
    dist.all_reduce(refused)  # any holder refused: every rank stops
    if int(refused.item()):
        raise RunRefused(
            EXIT_FOLDER_LOCKED,
            f"--checkpoint-dir={str(root)!r} is in use by another job (holder: {got}); one writer per checkpoint folder"
            if isinstance(got, str)
            else "",
        )
    return got


def lock_folder_waiting(root: Path, holder: dict) -> IO | str:
    """`lock_folder`, but a lock held under this run's own id is retried for a bounded time before giving up."""
    text = os.environ.get("CHECKPOINT_LOCK_WAIT_SECONDS", "").strip()
    if text and not (text.isascii() and text.replace(".", "", 1).isdigit()):
        raise UsageError("CHECKPOINT_LOCK_WAIT_SECONDS", text, "not a number of seconds", "e.g. 300, or unset")
    wait = float(text) if text else SAME_RUN_LOCK_WAIT_SECONDS
    deadline = time.monotonic() + wait
    while True:
        got = lock_folder(root, holder)
        if not isinstance(got, str) or time.monotonic() >= deadline or not _same_run(got, holder):
            return got
        log(
            f"checkpoint folder held by an earlier attempt of this run ({got}); waiting up to {wait:.0f} s "
            "for its lock to be released"
        )
        time.sleep(LOCK_POLL_SECONDS)


def _same_run(held: str, holder: dict) -> bool:
    try:
        previous = json.loads(held)
    except ValueError:
        return False
    return isinstance(previous, dict) and bool(holder.get("run_id")) and previous.get("run_id") == holder["run_id"]


def lock_folder(root: Path, holder: dict) -> IO | str:
    """Take the folder's writer lock: the open lock file on success, else the holder's description."""
    f = open(root / LOCK_NAME, "a+")  # noqa: SIM115  the open file is the lock: it must outlive this function
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        text = f.read().strip()
        f.close()
        return text or "another process (it has not written its name yet)"
    f.seek(0)
    f.truncate()
    f.write(json.dumps(holder, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())
    return f


def lock_holder(run_id: str) -> dict:
    """Who holds a checkpoint folder: enough to find the job (Batch job id or pod) and the process, and the run
    whose earlier attempt a retry waits for (the caller's run id: Batch and EKS pass it as --run-id, not as RUN_ID)."""
    holder: dict = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "run_id": run_id,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for name in ("AWS_BATCH_JOB_ID", "HOSTNAME"):  # HOSTNAME is the pod name on Kubernetes
        if os.environ.get(name):
            holder[name.lower()] = os.environ[name]
    return holder
