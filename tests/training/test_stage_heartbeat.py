"""A node up but not training says so once a minute (efa_training/runtime/launch/stage_heartbeat.py): the sanity
check, compile and validation throughout, a training only in its warm-up (until its first progress line, at most
WARMUP_SECONDS), so that the accelerators-idle alarm does not page through a Trainium compile of hours."""

import io
import json

import pytest

from efa_training.runtime.launch import stage_heartbeat
from efa_training.runtime.launch.stage_heartbeat import StageHeartbeat


def _beats(heartbeat: StageHeartbeat) -> list[dict]:
    heartbeat.metrics.stream = stream = io.StringIO()
    heartbeat.beat()
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize("mode", ["sanity", "compile", "validate"])
def test_a_stage_without_training_says_so_throughout(mode):
    now = [0.0]
    heartbeat = StageHeartbeat(mode, {"TRAINING_ENVIRONMENT": "dev"}, "run-1", clock=lambda: now[0])
    now[0] = 10 * 3600.0  # hours later: a long compile is still not training
    (line,) = _beats(heartbeat)
    assert (line["NotTraining"], line["Stage"], line["RunId"]) == (1, mode, "run-1")
    assert line["_aws"]["CloudWatchMetrics"][0]["Metrics"] == [{"Name": "NotTraining", "Unit": "Count"}]


def test_a_training_says_so_until_its_first_progress_line():
    progressed = [False]
    heartbeat = StageHeartbeat("train", {}, "run-1", progressed=lambda: progressed[0])
    assert len(_beats(heartbeat)) == 1
    progressed[0] = True
    assert _beats(heartbeat) == []


def test_a_node_that_sees_no_progress_stops_saying_so_after_the_warm_up():
    # The other nodes of a training never see rank 0's progress lines: they stop after WARMUP_SECONDS.
    now = [0.0]
    heartbeat = StageHeartbeat("train", {}, "run-1", progressed=lambda: False, clock=lambda: now[0])
    now[0] = stage_heartbeat.WARMUP_SECONDS - 1
    assert len(_beats(heartbeat)) == 1
    now[0] = stage_heartbeat.WARMUP_SECONDS
    assert _beats(heartbeat) == []


@pytest.mark.parametrize(("mode", "environment"), [("validate", ""), ("prepare-data", "dev")])
def test_no_heartbeat_outside_a_deployed_environment_or_for_data_preparation(mode, environment):
    from efa_training.runtime.launch import cli
    from efa_training.runtime.launch.command import Launch

    launch = Launch(["true"], None, {"TRAINING_ENVIRONMENT": environment} if environment else {})
    assert cli._heartbeat(mode, launch, []) is None
