"""While a node is up but not training, its launcher says so once a minute: the accelerators-idle alarm pages only
when no node of the environment says so (constructs/observability/alarms.py), so a Trainium compile of hours, a long
validation or a training's data staging is not taken for an idle node.

Not training: the sanity check, the compile job, validation, and a training's first WARMUP_SECONDS or until its
first progress line (rendezvous, data staging, compilation), whichever ends first. The other nodes of a training see
no progress lines (rank 0's are read where rank 0 runs), so each stops after WARMUP_SECONDS: an idle alarm cannot
page in a training attempt's first WARMUP_SECONDS. The signal is the metric NOT_TRAINING = 1 in namespace
EfaTraining (runtime/metrics.py; dimensions Environment and RunId), sent only in a deployed environment
(TRAINING_ENVIRONMENT set).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from efa_training.runtime.metrics import NOT_TRAINING_METRIC, MetricsLogger

INTERVAL_SECONDS = 60.0
WARMUP_SECONDS = 20 * 60.0


class StageHeartbeat:
    """`progressed()`: whether a training saw its first progress line (None for the other modes)."""

    def __init__(
        self,
        mode: str,
        env: Mapping[str, str],
        run_id: str,
        progressed: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode, self.progressed, self.clock, self.started = mode, progressed, clock, clock()
        self.metrics = MetricsLogger(run_id, enabled=True, environ=env)
        self._stop = threading.Event()

    def active(self) -> bool:
        if self.mode != "train":
            return True
        warming = self.clock() - self.started < WARMUP_SECONDS
        return warming and not (self.progressed is not None and self.progressed())

    def beat(self) -> bool:
        """One metrics line if the node is not training now; whether it sent one."""
        if not self.active():
            return False
        self.metrics.record(0, {NOT_TRAINING_METRIC: 1}, Stage=self.mode)
        return True

    def start(self, interval: float = INTERVAL_SECONDS) -> StageHeartbeat:
        def run() -> None:
            while not self._stop.is_set():
                self.beat()
                self._stop.wait(interval)

        threading.Thread(target=run, name="stage-heartbeat", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
