"""A run whose loss or gradient norm stops being finite, or whose loss explodes, stops at once and is not repeated.

Every rank holds the same all-reduced loss and norm, so all stop at the same step, before any save: weights updated
from a bad gradient never reach a checkpoint and --keep-last never rotates away the good ones. Rank 0 writes
`diverged.json` (step, reason, settings) to the checkpoint folder; a run with the same settings is then refused
before it starts (exit 4), so torchrun's restarts and the pipeline's retries do not retrain to the same NaN.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Protocol

from efa_training.runtime.errors import EXIT_DIVERGED, RunRefused

DIVERGED_MARKER = "diverged.json"  # in the checkpoint folder: why the run stopped, so restarts do not repeat it


class RunSettings(Protocol):
    """A run's settings dataclass (the train command's TrainConfig): the guard records all of it, reads these two."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    checkpoint_dir: str
    loss_spike_factor: float


def diverged_config(cfg: RunSettings) -> dict:
    """The settings that decide whether a run diverges again (not its name or logging)."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("run_id", "log_every")}


def check_not_diverged(cfg: RunSettings) -> None:
    """Refuse to repeat a run that diverged with the same settings: it would diverge again (training is
    deterministic), and torchrun's restarts and the pipeline's retries would each pay for it."""
    marker = Path(cfg.checkpoint_dir) / DIVERGED_MARKER
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and record.get("config") == diverged_config(cfg):
        raise RunRefused(
            EXIT_DIVERGED,
            f"this run diverged before with the same settings ({record.get('reason')}); "
            f"change them (e.g. --lr, --seed, --data) or delete {marker} to retry",
        )


def why_diverged(loss: float, grad_norm: float, lowest: float, spike_factor: float) -> str | None:
    """Why this step counts as diverged, or None."""
    if not math.isfinite(loss):
        return f"loss {loss}"
    if not math.isfinite(grad_norm):
        return f"gradient norm {grad_norm}"
    if spike_factor and math.isfinite(lowest) and loss > spike_factor * max(lowest, 1e-3):
        return f"loss {loss:.4g} is more than {spike_factor:g} times its lowest value {lowest:.4g}"
    return None


class DivergenceGuard:
    """Watches the agreed loss and gradient norm of every step; the lowest loss is this process's run only."""

    def __init__(self, cfg: RunSettings, is_main: bool) -> None:
        self.cfg, self.is_main = cfg, is_main
        self.lowest_loss = math.inf

    def check(self, step: int, loss: float, grad_norm: float, last_saved: int) -> None:
        """Raise RunRefused (exit 4) if this step diverged; rank 0 records why first."""
        reason = why_diverged(loss, grad_norm, self.lowest_loss, self.cfg.loss_spike_factor)
        if reason:
            self._refuse(step, reason, last_saved)
        self.lowest_loss = min(self.lowest_loss, loss)

    def _refuse(self, step: int, reason: str, last_saved: int) -> None:
        resume = f"step {last_saved}" if last_saved >= 0 else "no checkpoint"
        if self.is_main:
            marker = Path(self.cfg.checkpoint_dir) / DIVERGED_MARKER
            record = {
                "step": step,
                "reason": reason,
                "last_checkpoint_step": last_saved,
                "config": diverged_config(self.cfg),
            }
            tmp = marker.with_name(f".{marker.name}.tmp")
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(tmp, marker)
        raise RunRefused(
            EXIT_DIVERGED,
            f"diverged at step {step}: {reason}; stopped without saving, the newest "
            f"checkpoint is {resume} (from before the divergence)"
            if self.is_main
            else "",
        )
