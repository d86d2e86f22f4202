"""Stragglers named, during training: which rank holds the others back, and whether by its device or its input.

In synchronous training every rank waits for the slowest at each collective, so step times are the same on every
rank and name nobody. What differs is what a rank does alone. At each metrics line, every rank measures two things:
- its device: a fixed matmul, timed with the device synchronised (the sanity check's compute check, repeated, so a
  device that throttles in the middle of a run shows);
- its input: the seconds it spent waiting for batches since the last line.
One small all-gather brings both to rank 0. Rank 0 reports `StragglerRatio` (the slowest device's time over the
median) and `DataWaitSeconds` (the longest input wait), with the slowest rank and its host as properties of the line.
`StragglerPersistSeconds` says how long the same rank has stayed the slowest at PERSIST_RATIO x the median, which
the `<prefix>-straggler` alarm watches. Not on the XLA device: there every new operation is a graph to
compile (the no-recompilation check in tests/training/test_xla_path.py).

A rank that stays the slowest at PERSIST_RATIO x the median for PERSIST_SECONDS (what the alarm waits for) is
recorded as a bad host (runtime/bad_hosts.py, once per rank and run): the run goes on, and the pipeline takes the
host out before the run's next attempt, should there be one.

Test-only fault injection: STRAGGLER_TEST_SLOW_RANK=R:MS makes rank R's device probe take MS milliseconds longer;
STRAGGLER_PERSIST_SECONDS shortens the persistence.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from efa_training.runtime import bad_hosts
from efa_training.runtime.distributed import Runtime

# The <prefix>-straggler alarm's threshold and how long it waits (constructs/observability/alarms.py STRAGGLER_RATIO,
# STRAGGLER_PERIODS of 5 minutes; tests hold them equal).
PERSIST_RATIO, PERSIST_SECONDS = 1.5, 15 * 60
PERSIST_VARIABLE = "STRAGGLER_PERSIST_SECONDS"
PROBE_SIZE = {"cuda": 4096, "cpu": 128}  # about a millisecond on a GPU, at every metrics line: above timing noise
PROBE_MATMULS = 4


class Stragglers:
    """Every rank calls `measure` at the same steps (the metrics lines); rank 0 gets the figures."""

    def __init__(self, rt: Runtime, run_id: str | None = None) -> None:
        self.rt, self.run_id = rt, run_id
        self.data_wait = 0.0  # seconds waiting for batches since the last measure; the trainer adds to it
        identities: list[object] = [None] * rt.world_size
        dist.all_gather_object(identities, bad_hosts.host_identity(os.environ))
        self.identities = [dict(i) if isinstance(i, dict) else {} for i in identities]
        self.hosts = [str(i.get("hostname", "")) for i in self.identities]
        self.persistent = Persistent(float(os.environ.get(PERSIST_VARIABLE) or PERSIST_SECONDS))
        n = PROBE_SIZE.get(rt.device_type, PROBE_SIZE["cpu"])
        dtype = torch.bfloat16 if rt.device_type == "cuda" else torch.float32
        self._a = torch.ones(n, n, device=rt.device, dtype=dtype)  # no random numbers: the run's RNG is untouched
        self._delay = _test_delay_seconds(rt.rank)

    @staticmethod
    def enabled(rt: Runtime) -> bool:
        return rt.device_type != "xla" and rt.world_size > 1

    def measure(self) -> tuple[dict[str, float], dict[str, object]]:
        """(metrics, properties) for rank 0's line; every rank must call it at the same step."""
        probe = self._probe()
        mine = torch.tensor([probe, self.data_wait], dtype=torch.float64, device=self.rt.device)
        everyone = [torch.empty_like(mine) for _ in range(self.rt.world_size)]
        dist.all_gather(everyone, mine)
        self.data_wait = 0.0
        probes, waits = [float(t[0]) for t in everyone], [float(t[1]) for t in everyone]
        slowest = max(range(len(probes)), key=probes.__getitem__)
        ratio = probes[slowest] / max(statistics.median(probes), 1e-9)
        told = self.rt.is_main and self.persistent.observe(slowest, ratio)
        # How long this slowest rank has stayed so (rank 0's count): the <prefix>-straggler alarm pages at
        # PERSIST_SECONDS, the moment the same rank is recorded bad, not on a ratio averaged over many ranks' noise.
        metrics = {
            "StragglerRatio": round(ratio, 3),
            "DataWaitSeconds": max(waits),
            "StragglerPersistSeconds": round(self.persistent.held_seconds(), 1),
        }
        if told:
            bad_hosts.record(
                os.environ,
                self.run_id,
                f"a straggler: its device probe took {ratio:.2f} x the median for {self.persistent.seconds:g} s",
                [f"rank {slowest} on {self.hosts[slowest]}", "StragglerRatio on the run's metrics lines"],
                identity=self.identities[slowest],
            )
        return metrics, {"SlowestRank": slowest, "SlowestHost": self.hosts[slowest]}

    def _probe(self) -> float:
        self._sync()
        start = time.perf_counter()
        for _ in range(PROBE_MATMULS):
            self._a @ self._a
        self._sync()
        time.sleep(self._delay)
        return time.perf_counter() - start

    def _sync(self) -> None:
        if self.rt.device_type == "cuda":
            torch.cuda.synchronize(self.rt.device)


class Persistent:
    """Whether the same rank has stayed the slowest at PERSIST_RATIO or more for `seconds`; each rank told once."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self.since: tuple[int, float] | None = None  # the rank slowest above the ratio, since when
        self.told: set[int] = set()

    def observe(self, slowest: int, ratio: float) -> bool:
        now = self.clock()
        if ratio < PERSIST_RATIO:
            self.since = None
            return False
        if self.since is None or self.since[0] != slowest:
            self.since = (slowest, now)
        if now - self.since[1] < self.seconds or slowest in self.told:
            return False
        self.told.add(slowest)
        return True

    def held_seconds(self) -> float:
        """How long the rank slowest at PERSIST_RATIO or more has stayed so; 0 while none is."""
        return self.clock() - self.since[1] if self.since is not None else 0.0


def _test_delay_seconds(rank: int) -> float:
    slow, _, ms = os.environ.get("STRAGGLER_TEST_SLOW_RANK", "").partition(":")
    return float(ms) / 1000 if slow == str(rank) and ms else 0.0
