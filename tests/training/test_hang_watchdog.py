"""Hang detection (efa_training/runtime/launch/watchdog.py): the limit follows the measured interval between progress
lines with a floor, nothing counts during warm-up, and for real through launch.py a training that stops printing
progress is ended within seconds of the limit: every worker's stacks in the log, one summary line, exit code 6 (an
attempt failure the pipeline retries), instead of holding its hosts until the job's timeout."""

import json
import subprocess
import time
from pathlib import Path

from contracts.run import REFUSED_EXIT_CODES
from contracts.workload import parse_workload
from efa_training.runtime.errors import EXIT_HUNG
from efa_training.runtime.launch.watchdog import FACTOR, Watchdog
from tests.training import training_helpers as th


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fed(times: list[float], floor: float = 60.0) -> tuple[Watchdog, Clock]:
    clock = Clock()
    watchdog = Watchdog(floor, clock=clock)
    for t in times:
        clock.now = t
        watchdog.progress()
    return watchdog, clock


def test_warm_up_has_no_limit_however_long_it_takes():
    watchdog, clock = _fed([])
    clock.now = 10_000.0
    assert watchdog.limit() is None and watchdog.overdue() is None
    watchdog.progress()  # one line: still warming up (the first step may include compilation)
    clock.now = 20_000.0
    assert watchdog.overdue() is None


def test_the_limit_is_the_floor_or_ten_times_the_usual_interval():
    fast, _ = _fed([0, 1, 2, 3])
    assert fast.limit() == 60.0  # 10 x 1 s is under the floor
    slow, clock = _fed([0, 30, 60, 90])
    assert slow.limit() == FACTOR * 30
    clock.now = 90 + FACTOR * 30  # exactly at the limit: not yet
    assert slow.overdue() is None
    clock.now += 0.5
    hang = slow.overdue()
    assert hang is not None and hang["seconds_without_progress"] == 300.5 and hang["limit_seconds"] == 300.0


def test_only_lines_that_carried_metrics_count_as_progress():
    watchdog, _ = _fed([])
    fed = watchdog.watch(lambda line: {"loss": 1.0} if "loss=" in line else {})
    fed("loading shards...")
    fed("step=10 loss=2.0")
    assert len(watchdog.times) == 1


def test_a_hang_is_retried_as_an_attempt_failure_not_refused():
    assert EXIT_HUNG not in REFUSED_EXIT_CODES


HANGING_SCRIPT = """
import os, sys, time
def wait_for_a_collective_that_never_ends():
    while True:
        time.sleep(1)
for step in range(1, 4):
    if os.environ["RANK"] == "0":
        print(f"step={step} loss={1.0 / step}", flush=True)
    time.sleep(0.3)
wait_for_a_collective_that_never_ends()
"""


# For real, through launch.py on 2 processes: three progress lines, then nothing. With a 3 s floor the attempt ends
# a few seconds after its last line, not at the job's timeout.
def test_a_training_that_stops_making_progress_is_ended_with_its_stacks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HANGING_SCRIPT)
    declared = parse_workload(
        "hangs",
        {
            "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/hangs:v1"},
            "train": [th.PYTHON, str(script)],
            "validate": [th.PYTHON, str(script)],
            "metric": {"name": "loss", "direction": "lower"},
            "metrics": {"loss": "loss=([0-9.]+)"},
        },
        Path("."),
    )
    folders = ["--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "run")]
    env = th.env(
        WORKLOAD=declared.variable,
        ACCELERATORS_PER_NODE="2",
        MASTER_PORT=str(th.free_port()),
        MAX_RESTARTS="0",
        HANG_TIMEOUT_SECONDS="3",
    )
    started = time.monotonic()
    done = subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", "--run-id", "run-1", *folders],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert done.returncode == EXIT_HUNG, done.stderr[-3000:]
    (summary,) = [json.loads(line)["hang"] for line in done.stderr.splitlines() if line.startswith('{"hang"')]
    assert summary["progress_lines"] == 3 and summary["limit_seconds"] == 3.0
    # Each worker's Python stack, from faulthandler on SIGABRT: where it waited.
    assert done.stderr.count("in wait_for_a_collective_that_never_ends") >= 2, done.stderr[-3000:]
    assert took < 60, took


# The built-in trainer is watched the same way: its EMF lines are its progress, on the main node only.
def test_the_built_in_trainer_is_watched_on_the_main_node_by_its_metrics_lines():
    from efa_training.runtime.launch import command

    env = th.env(ACCELERATORS_PER_NODE="2", MASTER_PORT="29555", MAX_RESTARTS="0")
    main = command.prepare("train", ["--data", "d", "--checkpoint-dir", "c"], env)
    assert main.watchdog is not None and main.env["PYTHONFAULTHANDLER"] == "1" and main.on_line is not None
    main.on_line("step 10 loading")
    main.on_line('{"_aws": {"CloudWatchMetrics": []}, "Loss": 2.0}')
    assert len(main.watchdog.times) == 1
    worker = command.prepare("train", ["--data", "d"], {**env, "PET_NNODES": "2", "PET_NODE_RANK": "1",
                                                        "MASTER_ADDR": "10.0.0.5"})  # fmt: skip
    assert worker.watchdog is None and worker.on_line is None
    assert command.prepare("sanity", [], env).watchdog is None


# On SageMaker the training runs behind the sanity check (run_on_sagemaker): the metrics reader and the watchdog are
# passed on to it as on Batch and EKS (they were not, once: a workload's log lines reached no metric there).
def test_on_sagemaker_the_training_gets_the_metrics_reader_and_the_watchdog(tmp_path, monkeypatch):
    from efa_training.runtime.launch import command, process
    from efa_training.runtime.launch.rendezvous import plan_launch

    calls: list[tuple] = []

    def run_torchrun(*args: object) -> int:
        calls.append(args)
        return 0

    monkeypatch.setattr(process, "run_torchrun", run_torchrun)
    monkeypatch.setattr(process.host_metrics, "start_beside", lambda *args: None)
    plan = plan_launch("train", {"ACCELERATORS_PER_NODE": "1", "MASTER_PORT": "29500"}, "127.0.0.1")
    watchdog = Watchdog(60.0)
    launch = command.Launch(["torchrun"], plan, {}, ml_root=tmp_path, on_line=print, watchdog=watchdog)
    assert process.run_on_sagemaker("train", launch) == 0
    assert calls == [(["torchrun"], {}, print, watchdog)]
