"""The dev app's pipeline executed in moto (tests/sfn_emulator.py): a contract that spans stacks (the state machine
reads the Batch stack's queues and job definitions, the storage stack's bucket, the alerts stack's topic), so it
runs on the synthesized app."""

import contextlib

import pytest
from moto import mock_aws

from tests.pipeline.runs import APPROVED_MODEL_PARAMETER, MOTO_CONFIG
from tests.sfn_emulator import Emulator


@pytest.fixture(scope="module")
def world(synth):
    """One emulated account per module: moto, the resolved state machine and an SQS queue on the alerts topic."""
    synthesized = synth()
    with (
        mock_aws(config=MOTO_CONFIG),
        Emulator(template=synthesized.raw("pipeline"), templates=synthesized.templates) as emulator,
    ):
        topic = next(v["Ref"] for v in emulator.physical.values() if v["type"] == "AWS::SNS::Topic")
        emulator.alerts = emulator.subscribe_queue(topic)
        yield emulator


@pytest.fixture
def emulator(world):
    """The shared emulator, reset: no job plan, no recorded jobs or sleeps, no approval, no messages."""
    world.reset()
    world.sqs.purge_queue(QueueUrl=world.alerts)
    with contextlib.suppress(world.ssm.exceptions.ParameterNotFound):
        world.ssm.delete_parameter(Name=APPROVED_MODEL_PARAMETER)
    for listed in world.s3.list_objects_v2(Bucket=world.bucket).get("Contents", []):
        world.s3.delete_object(Bucket=world.bucket, Key=listed["Key"])
    return world
