"""What rank 0 does to the checkpoint folder: renames into place, keep-last pruning, setting checkpoints aside.

Only the job holding the folder's writer lock (lock.py) does any of it, so no other save is in flight.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from efa_training.checkpointing.format import (
    ABANDONED_PREFIX,
    PREFIX,
    REPLACED_PREFIX,
    TMP_PREFIX,
    fsync_path,
    step_dirs,
    step_name,
    step_of,
)
from efa_training.runtime.console import log


def move_into_place(tmp: Path, final: Path) -> None:
    """Rename a finished save into place; a step saved again keeps its old copy until the new one is there."""
    root = final.parent
    if final.exists():  # the same step saved again (e.g. SIGTERM right after a resume)
        # Two renames; between them step_dirs() finds the old copy under its .replaced- name.
        replaced = root / f"{REPLACED_PREFIX}{final.name}"
        shutil.rmtree(replaced, ignore_errors=True)
        os.replace(final, replaced)
        os.replace(tmp, final)
        fsync_path(root)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_path(root)


def prune(root: Path, saved_step: int, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints up to the one just saved; newer ones are an abandoned timeline.

    Keeping those by step number would delete the live checkpoints instead and let them shadow the live ones at
    the next start: they are moved aside."""
    live = []
    for path in step_dirs(root):
        if step_of(path) > saved_step:
            aside = set_aside(path, ABANDONED_PREFIX)
            log(
                f"checkpoint: WARNING moved {path.name}, newer than the step {saved_step} just saved "
                f"(skipped when this run resumed), aside to {aside}"
            )
        else:
            live.append(path)
    for old in live[keep_last:]:
        shutil.rmtree(old, ignore_errors=True)
    # Saves killed half-way, and old copies of re-saved steps whose new copy is in place.
    for leftover in root.glob(f"{TMP_PREFIX}{PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for replaced in root.glob(f"{REPLACED_PREFIX}{PREFIX}*"):
        if (root / replaced.name[len(REPLACED_PREFIX) :]).is_dir():
            shutil.rmtree(replaced, ignore_errors=True)


def set_aside(path: Path, prefix: str) -> Path:
    """Rename a checkpoint to `<prefix>step_N`: kept for inspection, never loaded."""
    aside = path.parent / f"{prefix}{step_name(step_of(path))}"
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(path, aside)
    return aside
