"""train.py with each micro-batch delayed, and optionally a NaN loss from some micro-batch on (test-only).

The delay lets a test signal or kill the job between two steps; it lives here, not in the production loop.
  TRAIN_TEST_BATCH_DELAY_S  seconds before every micro-batch (default 0)
  TRAIN_TEST_NAN_FROM_BATCH every rank's loss is NaN from this micro-batch on (1-based, counted per process)
  TRAIN_TEST_HOLD_WHILE     a path: before each micro-batch, wait while it exists (the test holds the job mid-run)
Run as a script (`python slow_train.py <train.py flags>`), or `slow_down()` patches the efa_training package already
imported (a copy of the image whose train.py calls it first: test_training_sagemaker.py).
"""

import os
import sys
import time
from pathlib import Path

DELAY_S = float(os.environ.get("TRAIN_TEST_BATCH_DELAY_S", "0"))
NAN_FROM = int(os.environ.get("TRAIN_TEST_NAN_FROM_BATCH", "0"))
HOLD_WHILE = os.environ.get("TRAIN_TEST_HOLD_WHILE", "")
fetched = 0


def slow_down() -> None:
    """Test-only fault injection: replacing the two methods is this file's purpose."""
    from efa_training.workloads.gpt import data, model

    _next, _forward = data.SequenceBatches.__next__, model.GPT.forward

    def slow_next(self):
        global fetched
        fetched += 1
        time.sleep(DELAY_S)
        while HOLD_WHILE and os.path.exists(HOLD_WHILE):
            time.sleep(0.05)
        return _next(self)

    def poisoned_forward(self, idx, targets=None):
        out = _forward(self, idx, targets)
        return out * float("nan") if NAN_FROM and fetched >= NAN_FROM else out

    data.SequenceBatches.__next__ = slow_next  # type: ignore[method-assign]
    model.GPT.forward = poisoned_forward  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "training_image"))
    slow_down()
    from efa_training import train

    sys.exit(train.main())
