"""Which node runs global rank 0: where a declared workload's log lines become metrics, once per step however many
nodes print them. torchrun's c10d rendezvous orders nodes by address, then process id (torch's dynamic_rendezvous:
ranks go to `sorted(participants)`), not by node rank: rank 0 is not always on the main node.

A node knows by its processes: torchrun puts RANK in each worker's environment, readable in /proc while it runs
(watchdog.environ). A short worker may be gone before its lines are read, so a thread looks from the launcher's start
(every POLL_SECONDS) and lines wait until it is known, then pass on at once, in order; a node that never finds rank 0
never passes them on. A job of one node runs rank 0 by definition: nothing waits there.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

from efa_training.runtime.launch.hang_evidence import environ
from efa_training.runtime.launch.watchdog import descendants

POLL_SECONDS = 0.05  # torchrun's workers carry RANK from their first instruction: found long before a line is read
SLOW_POLL_SECONDS, SLOW_AFTER_SECONDS = 1.0, 120.0  # a node without rank 0 looks more rarely once training runs
HELD_LINES = 10_000


class RankZeroLines:
    """`handler` for each line, on the node that runs rank 0 only; lines before that is known are held."""

    def __init__(self, handler: Callable[[str], object], root: int | None = None, only_node: bool = False) -> None:
        """`only_node`: the job's one node, which runs rank 0 whatever its processes show."""
        self.handler, self.root = handler, root or os.getpid()
        self.found = threading.Event()
        self._held: collections.deque[str] = collections.deque(maxlen=HELD_LINES)
        self._lock = threading.Lock()  # held while a line is handled: lines pass on in the order they were read
        if only_node:
            self.found.set()
        else:
            threading.Thread(target=self._look, name="rank-zero", daemon=True).start()

    def __call__(self, line: str) -> object:
        with self._lock:
            if not self.found.is_set():
                self._held.append(line)
                return None
            return self.handler(line)

    def _release(self) -> None:
        """Rank 0 is here: the lines held so far pass on now, not at the next line (there may be none)."""
        with self._lock:
            self.found.set()
            held, self._held = list(self._held), collections.deque(maxlen=HELD_LINES)
            for line in held:
                self.handler(line)

    def _look(self) -> None:
        started = time.monotonic()
        while not self.found.is_set():
            if any(environ(pid).get("RANK") == "0" for pid in descendants(self.root)):
                self._release()
                return
            slow = time.monotonic() - started > SLOW_AFTER_SECONDS
            time.sleep(SLOW_POLL_SECONDS if slow else POLL_SECONDS)
