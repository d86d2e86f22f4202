"""The dev app's pipeline executed in moto (tests/sfn_emulator.py): a contract that spans stacks (the state machine
reads the Batch stack's queues and job definitions, the storage stack's bucket, the alerts stack's topic), so it
runs on the synthesized app."""

import pytest

from tests.pipeline.runs import cleared, emulated_account


@pytest.fixture(scope="module")
def world(synth):
    """One emulated account per module: moto, the resolved state machine and an SQS queue on the alerts topic."""
    with emulated_account(synth()) as emulator:
        yield emulator


@pytest.fixture
def emulator(world):
    """The shared emulator, reset: no job plan, no recorded jobs or sleeps, no approval, no messages."""
    return cleared(world)
