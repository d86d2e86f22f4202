"""After warm-up the process group's timeout sits above the hang watchdog's limit (runtime/distributed.py
collective_timeout_after_warm_up; torchtitan sets its own after the first step the same way, `set_pg_timeouts`), so
the watchdog takes every rank's stacks before any collective times out (test_hang_watchdog.py runs it for real)."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from efa_training.runtime.distributed import EVIDENCE_MARGIN_SECONDS, Runtime, collective_timeout_after_warm_up
from efa_training.runtime.launch.watchdog import FACTOR

CPU = Runtime("cpu", torch.device("cpu"), 0, 0, 1, None)


@pytest.fixture
def group():
    """A one-process gloo group with the built-in trainer's 30-minute timeout; its backend's options."""
    if dist.is_initialized():
        pytest.skip("a process group of another test is up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=1800))
    yield dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options
    dist.destroy_process_group()


def test_a_lower_hang_floor_lowers_the_collective_timeout_to_above_it(group):
    assert collective_timeout_after_warm_up(CPU, {"HANG_TIMEOUT_SECONDS": "300"}) == 300 + EVIDENCE_MARGIN_SECONDS
    assert group._timeout == timedelta(seconds=300 + EVIDENCE_MARGIN_SECONDS)


def test_the_default_floor_raises_the_timeout_above_it(group):
    # The floor's default (1800 s) is the timeout the group started with: equal, the collective would time out as
    # the watchdog came.
    assert collective_timeout_after_warm_up(CPU, {}) == 1800 + EVIDENCE_MARGIN_SECONDS
    assert group._timeout == timedelta(seconds=1800 + EVIDENCE_MARGIN_SECONDS)


def test_slow_progress_lines_raise_the_timeout_with_the_watchdogs_limit(group):
    # 60 s between progress lines: the watchdog waits FACTOR x 60 s, beyond a 300 s floor.
    got = collective_timeout_after_warm_up(CPU, {"HANG_TIMEOUT_SECONDS": "300"}, progress_every_s=60.0)
    assert got == FACTOR * 60 + EVIDENCE_MARGIN_SECONDS
    assert group._timeout == timedelta(seconds=got)


def test_a_floor_that_is_not_a_number_is_the_default_as_for_the_watchdog(group):
    assert collective_timeout_after_warm_up(CPU, {"HANG_TIMEOUT_SECONDS": "soon"}) == 1800 + EVIDENCE_MARGIN_SECONDS


def test_without_a_process_group_nothing_changes():
    if dist.is_initialized():
        pytest.skip("a process group of another test is up in this process")
    assert collective_timeout_after_warm_up(CPU, {"HANG_TIMEOUT_SECONDS": "300"}) is None
