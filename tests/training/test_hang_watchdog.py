"""Hang detection (efa_training/runtime/launch/watchdog.py): the limit follows the measured interval between progress
lines with a floor, nothing counts during warm-up, and for real through launch.py a training that stops printing
progress is ended within seconds of the limit: every worker's stacks in the log, one summary line, exit code 6 (an
attempt failure the pipeline retries), instead of holding its hosts until the job's timeout."""

import json
import subprocess
import time
from pathlib import Path

import pytest

from contracts.run import REFUSED_EXIT_CODES
from contracts.workload import parse_workload
from efa_training.runtime.errors import EXIT_HUNG
from efa_training.runtime.launch.hang_evidence import stopped_first
from efa_training.runtime.launch.rank_zero import RankZeroLines
from efa_training.runtime.launch.watchdog import FACTOR, Watchdog
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes


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


# Two ranks under gloo; at step 4 rank 1 stops: SIGSTOP (a stopped rank), or a loop outside any collective (a rank
# stuck in its own code). Either way rank 0 then waits inside all_reduce, and no progress line comes.
HANGING_SCRIPT = """
import os, signal, time
import torch
import torch.distributed as dist

def stuck_outside_any_collective():
    while True:
        time.sleep(1)

def stopped_by_a_signal():
    os.kill(os.getpid(), signal.SIGSTOP)
    stuck_outside_any_collective()

dist.init_process_group("gloo")
rank, total = dist.get_rank(), torch.ones(1)
for step in range(1, 100):
    if step == 4 and rank == 1:
        stopped_by_a_signal() if os.environ["HANG"] == "stopped" else stuck_outside_any_collective()
    dist.all_reduce(total)
    if rank == 0:
        print(f"step={step} loss={1.0 / step}", flush=True)
    time.sleep(0.1)
"""


def _hanging_run(tmp_path: Path, hang: str) -> subprocess.CompletedProcess:
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
        HANG=hang,
    )
    return subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", "--run-id", "run-1", *folders],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# For real, through launch.py on 2 processes: three progress lines, then nothing. With a 3 s floor the attempt ends
# a few seconds after its last line, not at the job's timeout, with exit code 6 (retried), the rank that stopped
# first named in the summary line, and each rank's stacks in the log and under runs/<run_id>/hang/.
@pytest.mark.parametrize(
    ("hang", "why", "rank_1_was"),
    [
        ("stopped", "process state T", "in stopped_by_a_signal"),
        ("stuck", "outside any collective", "in stuck_outside_any_collective"),
    ],
)
def test_a_hung_rank_is_named_and_every_ranks_stacks_are_kept(tmp_path, hang, why, rank_1_was):
    done = _hanging_run(tmp_path, hang)
    assert done.returncode == EXIT_HUNG, done.stderr[-3000:]
    (summary,) = [json.loads(line)["hang"] for line in done.stderr.splitlines() if line.startswith('{"hang"')]
    assert summary["progress_lines"] == 3 and summary["limit_seconds"] >= 3.0  # the floor, or 10 x a slow step
    # Ended by the watchdog's own limit, far below the job's (the run's 120 s timeout would have raised): the limit the
    # launcher judged by, not a wall clock read after the run, which a loaded machine stretches.
    assert summary["limit_seconds"] < 60, summary
    assert summary["stopped_first"]["rank"] == 1 and why in summary["stopped_first"]["why"], summary
    evidence = Path(summary["evidence"])
    assert evidence.parent == tmp_path / "run" / "hang"
    assert json.loads((evidence / "summary.json").read_text())["stopped_first"] == summary["stopped_first"]
    # Rank 0 waited inside the collective; rank 1's stack shows where it stopped. Both are in the job's log too.
    assert " in all_reduce" in (evidence / "stacks-rank0.txt").read_text()
    assert rank_1_was in (evidence / "stacks-rank1.txt").read_text()
    assert done.stderr.count(" in all_reduce") >= 1 and rank_1_was in done.stderr
    assert (evidence.parent / "flight-recorder").is_dir()  # where NCCL's traces go (none on gloo)


# The built-in trainer (train.py), with rank 1 hung at its 7th micro-batch (step 4, 2 micro-steps a step): stopped by
# SIGSTOP, or spinning in its own Python code. Test-only, as slow_train.py: the fault is patched in from outside.
HUNG_TRAINER = """
import os, signal, sys
from efa_training.workloads.gpt import data

fetched, next_batch = 0, data.SequenceBatches.__next__

def spinning_in_python():
    while True:
        pass

def hung_next(self):
    global fetched
    fetched += 1
    if fetched == 7 and os.environ["RANK"] == "1":
        if os.environ["HANG"] == "stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        spinning_in_python()
    return next_batch(self)

data.SequenceBatches.__next__ = hung_next
from efa_training import train
sys.exit(train.main())
"""


def _hung_trainer(tmp_path: Path, dataset: Path, hang: str) -> subprocess.CompletedProcess:
    """The built-in trainer through launch.py on 2 processes, declared as a workload so that the fault can be patched
    in; its EMF lines (rank 0's Loss) are the progress, as for the built-in trainer."""
    script = tmp_path / "hung_train.py"
    script.write_text(HUNG_TRAINER)
    train = [th.PYTHON, str(script), *th.train_args(dataset, tmp_path / "c", steps=1000, every=0), "--run-id", "r-3"]
    declared = parse_workload(
        "hung-trainer",
        {"image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/hangs:v1"}, "train": train,
         "validate": train, "metric": {"name": "loss", "direction": "lower"},
         "metrics": {"loss": r'"Loss": ([0-9.]+)'}},
        Path("."),
    )  # fmt: skip
    folders = ["--data", str(dataset), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "run")]
    env = th.env(WORKLOAD=declared.variable, ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port()),
                 MAX_RESTARTS="0", HANG_TIMEOUT_SECONDS="3", HANG=hang)  # fmt: skip
    command = [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", "--run-id", "r-3", *folders]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)


# The trainer sets its collective timeout from the hang floor after its first step (runtime/distributed.py): above
# the watchdog's limit, so that no rank has died of a timed-out collective before its stacks are taken. Every rank's
# stacks are kept, and the hung rank is named whether the kernel holds it stopped or it spins in its own code.
@pytest.mark.parametrize(
    ("hang", "why", "rank_1_was"),
    [("stopped", "process state T", "in hung_next"), ("spinning", "running", "in spinning_in_python")],
)
def test_the_built_in_trainer_keeps_every_ranks_stacks_of_a_hang(tmp_path, dataset, hang, why, rank_1_was):
    done = _hung_trainer(tmp_path, dataset, hang)
    assert done.returncode == EXIT_HUNG, done.stderr[-3000:]
    (summary,) = [json.loads(line)["hang"] for line in done.stderr.splitlines() if line.startswith('{"hang"')]
    assert (summary["stopped_first"] or {}).get("rank") == 1 and why in summary["stopped_first"]["why"], summary
    evidence = Path(summary["evidence"])
    stacks = {rank: (evidence / f"stacks-rank{rank}.txt").read_text() for rank in (0, 1)}
    assert "in train_step" in stacks[0], stacks[0]  # rank 0 alive in its step, waiting for rank 1
    assert rank_1_was in stacks[1], stacks[1]
    assert "Timed out" not in done.stderr and "timed out" not in done.stderr, done.stderr[-3000:]


def _two_node_run(tmp_path: Path) -> list[subprocess.CompletedProcess]:
    """The hanging script on two "nodes" (two launch.py, one process each, sharing the run's folder as FSx is shared):
    rank 1, on node 1, stops itself at step 4."""
    script = tmp_path / "train.py"
    script.write_text(HANGING_SCRIPT)
    declared = parse_workload(
        "hangs",
        {"image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/hangs:v1"}, "train": [th.PYTHON, str(script)],
         "validate": [th.PYTHON, str(script)], "metric": {"name": "loss", "direction": "lower"},
         "metrics": {"loss": "loss=([0-9.]+)"}},
        Path("."),
    )  # fmt: skip
    port, nodes = str(th.free_port()), []
    for node in ("0", "1"):
        folders = ["--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "run")]
        env = th.env(WORKLOAD=declared.variable, ACCELERATORS_PER_NODE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                     PET_NNODES="2", PET_NODE_RANK=node, GLOO_SOCKET_IFNAME="lo", MAX_RESTARTS="0",
                     HANG_TIMEOUT_SECONDS="3", HANG="stopped", NODE_NAME=f"n-{node}",
                     REPORT_PREFIX=str(tmp_path / "runs"))  # fmt: skip
        command = [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", "--run-id", "run-2", *folders]
        # Files, not pipes: a node blocked on a full pipe while the other is read would hang the test.
        out, err = (open(tmp_path / f"node{node}.{kind}", "w+") for kind in ("out", "err"))  # noqa: SIM115
        nodes.append((subprocess.Popen(command, env=env, stdout=out, stderr=err, text=True), out, err))
    done = []
    for proc, out, err in nodes:
        code = proc.wait(timeout=120)
        for stream in (out, err):
            stream.seek(0)
        done.append(subprocess.CompletedProcess(proc.args, code, out.read(), err.read()))
        for stream in (out, err):
            stream.close()
    return done


def test_on_two_nodes_the_rank_that_stopped_on_the_other_node_is_named_with_its_stacks(tmp_path):
    # Rank 0 (whose progress lines start the watch) and rank 1 run on different nodes, on either (torchrun's c10d
    # rendezvous orders nodes by address, then process id). The node that sees the progress finds the hang and asks
    # the other for its stacks (hang/request.json); the other takes them into the attempt's folder with
    # node-<N>.json, so rank 1 is named with its stacks, and its node's host is recorded bad (NODE_NAME n-<N>).
    nodes = _two_node_run(tmp_path)
    assert [n.returncode for n in nodes] == [EXIT_HUNG, EXIT_HUNG], [n.stderr[-2000:] for n in nodes]
    (summary,) = [json.loads(line)["hang"] for n in nodes for line in n.stderr.splitlines()
                  if line.startswith('{"hang"') and "stopped_first" in line]  # fmt: skip
    assert summary["stopped_first"]["rank"] == 1 and "process state T" in summary["stopped_first"]["why"], summary
    evidence = Path(summary["evidence"])
    (answered,) = evidence.glob("node-*.json")  # the node that was asked: rank 1's
    assert {"stacks-rank0.txt", "stacks-rank1.txt", "summary.json"} <= {f.name for f in evidence.iterdir()}
    assert "in stopped_by_a_signal" in (evidence / "stacks-rank1.txt").read_text()
    (recorded,) = (tmp_path / "runs/run-2/bad-hosts/pending").iterdir()
    assert recorded.name == "n-" + answered.stem.removeprefix("node-")
    assert json.loads(recorded.read_text())["why"].startswith("hung first")


def _worker(worker_id: int, rank: int, state: str, stacks: str) -> dict:
    return {"rank": rank, "state": state, "host": "h", "pid": worker_id, "stacks": stacks}


IN_ALL_REDUCE = 'File "/usr/lib/python3/torch/distributed/distributed_c10d.py", line 2810 in all_reduce'


def test_without_a_stopped_rank_the_one_outside_a_collective_is_named():
    waiting, elsewhere = _worker(1, 0, "S", IN_ALL_REDUCE), _worker(2, 1, "S", 'File "t.py", line 3 in load')
    assert (stopped_first([waiting, elsewhere]) or {}).get("rank") == 1
    assert (stopped_first([_worker(1, 0, "S", ""), _worker(2, 1, "T", IN_ALL_REDUCE)]) or {}).get("rank") == 1
    # Every rank waits in a collective: the network or NCCL; the Flight Recorder's traces tell, not the stacks.
    assert stopped_first([waiting, _worker(2, 1, "S", IN_ALL_REDUCE)]) is None


# DDP waits for its gradients inside backward, in C++: no stack shows a collective there, so a rank spinning in its own
# code is told by its state, the one running while the others sleep.
IN_BACKWARD = 'File "/usr/lib/python3/torch/autograd/graph.py", line 979 in _engine_run_backward'


def test_the_one_rank_running_while_the_others_sleep_is_named():
    spinning = _worker(3, 2, "R", 'File "t.py", line 3 in spin')
    sleeping = [_worker(1, 0, "S", IN_BACKWARD), _worker(2, 1, "S", IN_BACKWARD)]
    named = stopped_first([*sleeping, spinning]) or {}
    assert named.get("rank") == 2 and "process state R" in named["why"]
    # Two running (a GPU rank may spin in its device sync) or one in D (I/O): the states do not single one out.
    assert stopped_first([sleeping[0], _worker(2, 1, "R", IN_BACKWARD), spinning]) is None
    assert stopped_first([sleeping[0], _worker(2, 1, "D", IN_BACKWARD), spinning]) is None
    # Running inside a collective is waiting, not spinning in its own code.
    assert stopped_first([_worker(1, 0, "S", IN_ALL_REDUCE), _worker(3, 2, "R", IN_ALL_REDUCE)]) is None


def test_a_rank_spinning_in_its_own_code_does_not_mark_its_host_bad():
    # A loop is the code's fault, and on GPUs a rank waiting for its device may spin too: only a stopped rank's host
    # (or one outside any collective) is recorded bad.
    recorded: list[tuple] = []
    watchdog = Watchdog(60.0, bad_host=lambda *args, **kwargs: recorded.append(args))
    sleeping, spinning = _worker(1, 0, "S", IN_BACKWARD), _worker(2, 1, "R", 'File "t.py", line 3 in spin')
    watchdog._tell_bad_host(stopped_first([sleeping, spinning]), [sleeping, spinning], None)
    assert recorded == []
    stopped = _worker(2, 1, "T", 'File "t.py", line 3 in spin')
    watchdog._tell_bad_host(stopped_first([sleeping, stopped]), [sleeping, stopped], None)
    assert len(recorded) == 1


# The processes the watchdog takes stacks from: one per rank (RANK from torchrun), not a rank's data loader workers
# (they share its RANK), and where an exit relay runs a declared command, the command's process, not the relay.
def test_the_watched_workers_are_the_ranks_own_processes():
    from efa_training.runtime.exit_relay import COMMAND
    from efa_training.runtime.launch.watchdog import workers

    sleeper = [th.PYTHON, "-c", "import time; time.sleep(60)"]
    spawn = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(60)"
    relay = [th.PYTHON, "-m", "efa_training.runtime.exit_relay", COMMAND, *sleeper]
    root = subprocess.Popen([th.PYTHON, "-c", (
        "import os, subprocess, sys, time\n"
        f"a = subprocess.Popen({[th.PYTHON, '-c', spawn, *sleeper]!r}, env=dict(os.environ, RANK='0'))\n"
        f"b = subprocess.Popen({relay!r}, env=dict(os.environ, RANK='1'))\n"
        "time.sleep(60)")], env=th.env())  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(found := workers(root.pid)) < 2:
            time.sleep(0.1)
        time.sleep(1.0)
        found = workers(root.pid)
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in found]
        assert len(found) == 2, commands
        assert [argv[2].decode()[:24] for argv in commands] == [spawn[:24], "import time; time.sleep("]
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(root.pid)], check=False)
        root.kill()


# The built-in trainer is watched the same way: its EMF lines (rank 0's, on whichever node) are its progress.
def test_the_built_in_trainer_is_watched_on_every_node_by_its_metrics_lines():
    from efa_training.runtime.launch import command

    env = th.env(ACCELERATORS_PER_NODE="2", MASTER_PORT="29555", MAX_RESTARTS="0")
    main = command.prepare("train", ["--data", "d", "--checkpoint-dir", "c"], env)
    assert main.watchdog is not None and main.env["PYTHONFAULTHANDLER"] == "1" and main.on_line is not None
    main.on_line("step 10 loading")
    main.on_line('{"_aws": {"CloudWatchMetrics": []}, "Loss": 2.0}')
    assert len(main.watchdog.times) == 1
    worker = command.prepare("train", ["--data", "d"], {**env, "PET_NNODES": "2", "PET_NODE_RANK": "1",
                                                        "MASTER_ADDR": "10.0.0.5"})  # fmt: skip
    # Node 1 watches too (rank 0 may run there) and answers the node that finds a hang (its one peer).
    assert worker.watchdog is not None and worker.watchdog.peers == 1 and worker.watchdog.node == "1"
    assert command.prepare("sanity", [], env).watchdog is None


# On NCCL a collective that times out dumps PyTorch's Flight Recorder traces (the collectives each rank issued) into
# the run's folder, on every node (PyTorch's Flight Recorder tutorial names the variables).
def test_nccl_flight_recorder_dumps_into_the_runs_folder_on_every_node(tmp_path):
    from efa_training.runtime.launch import command

    env = th.env(
        ACCELERATORS_PER_NODE="2", MASTER_PORT="29555", MAX_RESTARTS="0", FSX_MOUNT=str(tmp_path), RUN_ID="r-1"
    )
    prefix = tmp_path / "runs/r-1/hang/flight-recorder/rank_"
    for node in ({}, {"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "10.0.0.5"}):
        launch = command.prepare("train", ["--data", "d"], {**env, **node})
        assert launch.env["TORCH_FR_DUMP_TEMP_FILE"] == str(prefix) and prefix.parent.is_dir()
        assert int(launch.env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0 and launch.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


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
    # No stop-by (no reservation's end), and no stop codes of a workload's own launcher (torchrun relays the codes).
    assert calls == [(["torchrun"], {}, print, watchdog, None, frozenset())]


# Whatever fails while the stacks are taken, torchrun is resumed and ended: a paused or running torchrun would hold the
# job's hosts until its timeout.
def test_torchrun_is_ended_even_when_taking_the_stacks_fails(monkeypatch):
    from efa_training.runtime.launch import watchdog

    def lost(pid: int) -> str:
        raise RuntimeError("the stacks were lost")

    torchrun = subprocess.Popen([th.PYTHON, "-c", "import time; time.sleep(60)"])
    watch = Watchdog(60.0)
    monkeypatch.setattr(watch, "stacks_of", lost)
    monkeypatch.setattr(watchdog, "workers", lambda root: [root])
    with pytest.raises(RuntimeError):
        watchdog.stop_tree(torchrun, watch)
    assert torchrun.wait(timeout=5) is not None


@pytest.mark.parametrize(("rank", "passed"), [("0", ["loss=1", "loss=2"]), ("1", [])])
def test_a_workloads_lines_become_metrics_only_on_the_node_that_runs_rank_zero(rank, passed):
    # Where torchrun put global rank 0 (RANK in a worker's environment); a line read before that was known waits.
    seen: list[str] = []
    lines = RankZeroLines(seen.append)
    lines("loss=1")  # before the worker exists: held
    worker = subprocess.Popen([th.PYTHON, "-c", "import time; time.sleep(30)"], env={**th.env(), "RANK": rank})
    try:
        lines.found.wait(timeout=5)
        lines("loss=2")
    finally:
        worker.kill()
        worker.wait()
    assert seen == passed


def test_lines_held_until_rank_zero_is_found_pass_on_then_without_another_line():
    # A short script may print its last line before its worker is seen: the held lines must not wait for a next one.
    seen: list[str] = []
    lines = RankZeroLines(seen.append)
    lines("loss=1")
    worker = subprocess.Popen([th.PYTHON, "-c", "import time; time.sleep(30)"], env={**th.env(), "RANK": "0"})
    try:
        assert lines.found.wait(timeout=5)
    finally:
        worker.kill()
        worker.wait()
    assert seen == ["loss=1"]


def test_a_jobs_only_node_runs_rank_zero_and_holds_nothing():
    seen: list[str] = []
    RankZeroLines(seen.append, root=1, only_node=True)("loss=1")  # no worker to find: one node has rank 0
    assert seen == ["loss=1"]
