"""When to save: which steps are save steps, and the Young/Daly interval (pure: no torch, no clock, no collective).

  * every K steps (--checkpoint-every K); with K = 0 (the default), at step FIRST_AUTO_SAVE, where the save's stall
    C is measured, and from then on every Young/Daly interval sqrt(2 x C x MTBF) (Young 1974; Daly 2006);
  * at the last step;
  * at the step where a stop was requested (SIGTERM/SIGINT on any rank, agreed by the step's all-reduce).
manager.py measures the stall and agrees the interval across ranks.
"""

from __future__ import annotations

import math

FIRST_AUTO_SAVE = 20  # --checkpoint-every 0: the first save, where the save time is measured


class SaveSchedule:
    """Which steps are save steps (pure: no clock, no collective)."""

    def __init__(self, every: int, max_steps: int) -> None:
        self.measured = every > 0  # a fixed interval needs no measurement
        self.every = every or FIRST_AUTO_SAVE  # auto: replaced after the first save
        self.max_steps = max_steps

    def due(self, step: int, stopping: bool) -> bool:
        return step % self.every == 0 or step == self.max_steps or stopping

    def measures_at(self, step: int, stopping: bool, saves_so_far: int) -> bool:
        """Whether this save sets the Young/Daly interval: the first save of this process, unless it is the last.

        Not after the final save: its barrier stays the last collective before teardown (a collective right
        before destroy_process_group made gloo abort at exit, 3 runs in 8)."""
        return not self.measured and saves_so_far == 0 and not stopping and step < self.max_steps


def young_daly_steps(save_s: float, step_s: float, mtbf_hours: float) -> tuple[int, float]:
    """(steps, seconds) between checkpoints that minimise the expected lost time: sqrt(2 * C * MTBF)."""
    seconds = math.sqrt(2 * save_s * mtbf_hours * 3600)
    return max(1, round(seconds / step_s)), seconds
