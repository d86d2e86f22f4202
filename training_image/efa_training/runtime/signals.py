"""The scheduler's stop request as a flag the training loop reads between steps."""

from __future__ import annotations

import signal
from typing import Any


class StopFlag:
    """SIGTERM (Spot/Batch termination, kubectl delete, torchrun shutdown) or SIGINT (Ctrl-C) asks for a final
    checkpoint at the end of the current step."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
