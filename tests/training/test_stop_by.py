"""A reservation's end (efa_training/runtime/launch/stop_by.py): the launcher asks the training to stop early enough
to save, with a margin that grows with the measured save time; the attempt ends 7 (resumable, not retried), and the
next run continues from that checkpoint. For real through launch.py on 2 processes with a stop-by seconds ahead."""

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from contracts.run import REFUSED_EXIT_CODES, STOP_BY_NONE, WINDOW_ENDED_EXIT_CODE
from efa_training.runtime.errors import EXIT_WINDOW_ENDED, UsageError
from efa_training.runtime.launch.stop_by import MARGIN_FLOOR_SECONDS, NOT_SET, SAVE_FACTOR, StopBy, pop_stop_by
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes


def test_the_flag_is_the_launchers_not_the_scripts():
    args, deadline = pop_stop_by(["--run-id", "r", "--stop-by", "2026-12-03T11:30:00Z", "--max-steps", "9"])
    assert args == ["--run-id", "r", "--max-steps", "9"]
    assert deadline == datetime(2026, 12, 3, 11, 30, tzinfo=UTC).timestamp()
    assert pop_stop_by(["--stop-by", "none"]) == ([], None)  # an environment without a reservation's end
    with pytest.raises(UsageError, match="--stop-by='2026-12-03 11:30'.*with its zone"):
        pop_stop_by(["--stop-by", "2026-12-03 11:30"])


def test_the_margin_is_the_floor_or_three_times_the_longest_save_reported():
    now = [1000.0]
    stop_by = StopBy(2000.0, clock=lambda: now[0])
    assert stop_by.margin() == MARGIN_FLOOR_SECONDS and stop_by.seconds_left() == 700.0
    metrics = {"_aws": {}, "RunId": "r", "Loss": 2.0, "CheckpointSaveSeconds": 150.0}
    stop_by.watch(None)(json.dumps(metrics))
    stop_by.saw("step=10 loss=2.0")  # not a metrics line
    assert stop_by.margin() == SAVE_FACTOR * 150.0 and stop_by.seconds_left() == 550.0
    stop_by.saw('{"CheckpointSaveSeconds": 20.0}')  # a shorter save never shrinks it
    assert stop_by.longest_save == 150.0


def test_a_window_that_ended_is_neither_a_refusal_nor_an_attempt_failure():
    assert EXIT_WINDOW_ENDED == WINDOW_ENDED_EXIT_CODE and EXIT_WINDOW_ENDED not in REFUSED_EXIT_CODES
    assert NOT_SET == STOP_BY_NONE  # what the pipeline sends without a reservation's end, as the launcher reads it


# No periodic checkpoint within any window a test gives (a fast CPU trains the tiny model past 1,000 steps in 30 s):
# the only checkpoint before the last step is the stop's own.
EVERY = 10_000_000


def _launch_train(data, ckpt, steps: int, *extra: str, **env: str) -> subprocess.CompletedProcess:
    env = th.env(ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port()), MAX_RESTARTS="0", **env)
    args = ["--run-id", "window", *th.train_args(data, ckpt, steps=steps, every=EVERY), *extra]
    return subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


# The built-in trainer on 2 processes, far from its last step: at the stop-by time less the margin the launcher
# sends SIGTERM, every rank saves at the same step, and the job ends 7; the next run resumes from that step.
def test_a_training_stops_and_saves_before_its_reservation_ends_and_the_next_window_resumes(dataset, tmp_path):
    ckpt = tmp_path / "ckpt"
    # The margin is what a save and the exit may take (300 s by default): 8 s, so a loaded machine's slower save still
    # ends inside the window, as the production margin's 3 x the longest save is meant to.
    ends = datetime.now(UTC) + timedelta(seconds=40)
    done = _launch_train(dataset, ckpt, 100_000, "--stop-by", ends.isoformat(), STOP_MARGIN_SECONDS="8")
    assert done.returncode == EXIT_WINDOW_ENDED, done.stderr[-3000:]
    (summary,) = [json.loads(line)["stop_by"] for line in done.stderr.splitlines() if line.startswith('{"stop_by"')]
    assert summary["margin_seconds"] >= 8.0
    # SIGTERM went at the end less the margin, never earlier, and before the end: the launcher's own moment, not a
    # clock read after the job (how long the save and exit take on a loaded machine is the margin's business).
    said = datetime.fromisoformat(summary["said_at"])
    assert ends - timedelta(seconds=summary["margin_seconds"] + 0.05) <= said < ends  # the margin rounded to 0.1 s
    (stopped_at,) = th.checkpoint_steps(ckpt)  # only the stop's own checkpoint (EVERY)
    assert 0 < stopped_at < 100_000
    again = _launch_train(dataset, ckpt, stopped_at + 2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(rf"resum\w* .*step {stopped_at}\b", again.stdout + again.stderr), again.stderr[-2000:]
    assert max(th.checkpoint_steps(ckpt)) == stopped_at + 2


def test_a_job_that_starts_too_close_to_the_end_spends_nothing(dataset, tmp_path):
    soon = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()  # inside the default 300 s margin
    done = _launch_train(dataset, tmp_path / "ckpt", 10, "--stop-by", soon)
    assert done.returncode == EXIT_WINDOW_ENDED
    assert "the reservation ends too soon to train and save" in done.stderr
    assert "Loss" not in done.stdout + done.stderr  # refused before any worker started: no step trained
    assert not (tmp_path / "ckpt").exists() or th.checkpoint_steps(tmp_path / "ckpt") == []
