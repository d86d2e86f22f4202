"""After warm-up the process group's timeout comes down to the hang watchdog's floor (runtime/distributed.py
lower_collective_timeout; torchtitan lowers its own after the first step the same way, `set_pg_timeouts`)."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from efa_training.runtime import distributed
from efa_training.runtime.distributed import Runtime, lower_collective_timeout
from efa_training.runtime.launch import watchdog

CPU = Runtime("cpu", torch.device("cpu"), 0, 0, 1, None)


@pytest.fixture
def group():
    """A one-process gloo group with the built-in trainer's 30-minute timeout; its backend's options."""
    if dist.is_initialized():
        pytest.skip("a process group of another test is up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=1800))
    yield dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options
    dist.destroy_process_group()


def test_a_lower_hang_floor_lowers_the_collective_timeout(group):
    assert lower_collective_timeout(CPU, {"HANG_TIMEOUT_SECONDS": "300"}) == 300
    assert group._timeout == timedelta(seconds=300)


def test_the_default_floor_leaves_the_timeout_as_it_was(group):
    assert lower_collective_timeout(CPU, {}) is None
    assert group._timeout == timedelta(seconds=1800)


def test_a_floor_that_is_not_a_number_changes_nothing(group):
    assert lower_collective_timeout(CPU, {"HANG_TIMEOUT_SECONDS": "soon"}) is None
    assert group._timeout == timedelta(seconds=1800)


def test_the_floor_is_the_watchdogs():
    assert distributed.HANG_FLOOR_VARIABLE == watchdog.FLOOR_VARIABLE
    assert distributed.HANG_FLOOR_DEFAULT_SECONDS == watchdog.DEFAULT_FLOOR_SECONDS
