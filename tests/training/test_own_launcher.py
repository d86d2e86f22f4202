"""A declared workload's clean stop ends the same whatever its launch mode (runtime/launch/process.py run_torchrun,
user_workload.stop_codes): 143 after a SIGTERM, 7 after the launcher's own stop before the reservation ends
(runtime/launch/stop_by.py). For real through launch.py: a tiny script that saves on SIGTERM and exits 0, under the
platform's torchrun (2 workers), under `accelerate launch` as its own per-node launcher (2 workers: accelerate's
torchrun, which ends 1 after passing the signal on), and as one process. And what a per-node launcher is given:
the node's place, from which `accelerate launch` sets each worker's ranks."""

import json
import signal
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts.stage_timing import WINDOW_ENDED_EXIT_CODE
from contracts.workload import parse_workload
from efa_training.runtime.errors import EXIT_STOPPED
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

# Saves on SIGTERM. Rank 0 prints its steps only once every rank's handler is in place (a file per rank), so the
# stop never finds a rank without one. SLOW_SAVE: rank 0 reports a long checkpoint save at its first step, which
# moves the launcher's stop-by margin past now (3 x the save): the reservation stop comes at once.
SCRIPT = """
import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
rank, world, folder = os.environ["RANK"], int(os.environ["WORLD_SIZE"]), os.environ["CHECKPOINT_DIR"]
open(os.path.join(folder, f"ready-rank{rank}"), "w").close()
step = 0
while not stop:
    if rank == "0" and sum(n.startswith("ready-") for n in os.listdir(folder)) == world:
        step += 1
        report = 'efa-training-metrics {"CheckpointSaveSeconds": 10000}\\n' if os.environ.get("SLOW_SAVE") else ""
        sys.stdout.write(f"step={step} loss=1.0\\n" + (report if step == 1 else ""))
        sys.stdout.flush()
    time.sleep(0.05)
open(os.path.join(folder, f"saved-rank{rank}"), "w").write(str(step))
sys.exit(int(os.environ.get("EXIT_AFTER_STOP", "0")))
"""
LAUNCHES = {
    "torchrun": lambda script: [th.PYTHON, script],
    "per-node": lambda script: [th.PYTHON, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", script],
    "one-process": lambda script: [th.PYTHON, script],
}  # fmt: skip
WORKERS = {"torchrun": 2, "per-node": 2, "one-process": 1}


def _declared(tmp_path: Path, launch: str) -> str:
    """The job's WORKLOAD: the script under `launch`, as synth checks it."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    declaration = {"image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/w:v1"}, "launch": launch,
                   "train": LAUNCHES[launch](str(script)), "validate": ["python", "evaluate.py"],
                   "metric": {"name": "loss", "direction": "lower"},
                   "metrics": {"loss": r"loss=([0-9.]+)"}}  # fmt: skip
    return json.dumps(parse_workload("w", declaration, Path(".")).as_json())


def _train(tmp_path: Path, launch: str, stop: str, **env: str) -> tuple[int, Path]:
    """launch.py train of the script under `launch`, stopped by `stop` ("sigterm": the test sends it once rank 0
    prints a step; "reservation": the launcher's stop-by); the exit code and the checkpoint folder."""
    ckpt = tmp_path / "c"
    args = ["--run-id", "stop", "--data", str(tmp_path), "--checkpoint-dir", str(ckpt), "--run-dir", str(tmp_path)]
    if stop == "reservation":  # far enough that the job starts; the reported save brings the stop forward
        args += ["--stop-by", (datetime.now(UTC) + timedelta(hours=1)).isoformat()]
        env = {**env, "SLOW_SAVE": "1", "STOP_MARGIN_SECONDS": "1"}
    job_env = th.env(WORKLOAD=_declared(tmp_path, launch),
                     ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port()), MAX_RESTARTS="0", **env)  # fmt: skip
    proc = subprocess.Popen(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", *args],
        env=job_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = threading.Timer(240, proc.kill)  # a stop that never comes fails the test, never hangs it
    deadline.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if stop == "sigterm" and line.startswith("step="):
                proc.send_signal(signal.SIGTERM)
                stop = "sent"
        return proc.wait(), ckpt
    finally:
        deadline.cancel()
        proc.kill()


def _saved(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.glob("saved-rank*"))


# SIGTERM (Batch and EKS before the kill, SageMaker's StopTrainingJob): every worker saves and exits 0, and the job
# ends as stopped, 143, whichever launcher ran them.
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_a_clean_stop_on_sigterm_ends_143_in_every_launch_mode(tmp_path, launch):
    code, ckpt = _train(tmp_path, launch, "sigterm")
    assert code == EXIT_STOPPED
    assert _saved(ckpt) == [f"saved-rank{r}" for r in range(WORKERS[launch])]


# The launcher's own stop before the reservation ends: every worker saves, and the job ends 7 (ReservationEnded,
# resumable in the next window), whichever launcher ran them.
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_a_clean_stop_before_the_reservation_ends_ends_7_in_every_launch_mode(tmp_path, launch):
    code, ckpt = _train(tmp_path, launch, "reservation")
    assert code == WINDOW_ENDED_EXIT_CODE
    assert _saved(ckpt) == [f"saved-rank{r}" for r in range(WORKERS[launch])]


# A process that fails while it stops is not a clean stop: its own code stays the job's (here 3, an attempt failure).
@pytest.mark.parametrize("stop", ["sigterm", "reservation"])
def test_one_process_that_fails_while_stopping_keeps_its_code(tmp_path, stop):
    code, _ = _train(tmp_path, "one-process", stop, EXIT_AFTER_STOP="3")
    assert code == 3


# The per-node launcher's recipe (docs/workloads.md, the contract's ranks): the platform gives each node its place
# and the rendezvous address, NODE_RANK, NNODES, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT; `accelerate launch`,
# given them, sets each worker's RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE itself, as torchrun does.
ENV_SCRIPT = """
import json, os, sys
names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "NNODES", "NPROC_PER_NODE"]
sys.stdout.write("ranks " + json.dumps({n: os.environ.get(n) for n in names}) + "\\n")
"""
ACCELERATE = (
    'exec "$PYTHON" -m accelerate.commands.launch --multi_gpu --num_machines "$NNODES" --machine_rank "$NODE_RANK"'
    ' --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
    ' --num_processes "$((NNODES * NPROC_PER_NODE))" --mixed_precision no --dynamo_backend no "$SCRIPT"'
)


def test_a_per_node_launcher_gets_the_nodes_place_and_sets_each_workers_ranks(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(ENV_SCRIPT)
    declaration = {"image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/w:v1"}, "launch": "per-node",
                   "train": ["bash", "-c", ACCELERATE], "validate": ["python", "evaluate.py"],
                   "metric": {"name": "loss", "direction": "lower"}}  # fmt: skip
    job_env = th.env(WORKLOAD=json.dumps(parse_workload("w", declaration, Path(".")).as_json()), PYTHON=th.PYTHON,
                     SCRIPT=str(script), ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port()))  # fmt: skip
    args = ["--run-id", "ranks", "--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c")]
    done = subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", *args, "--run-dir", str(tmp_path)],
        env=job_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = [json.loads(line.removeprefix("ranks ")) for line in done.stdout.splitlines() if line.startswith("ranks ")]
    node = {"NODE_RANK": "0", "NNODES": "1", "NPROC_PER_NODE": "2"}  # the platform's, for this one node
    ranks = [{"RANK": r, "LOCAL_RANK": r, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"} for r in ("0", "1")]
    assert sorted(seen, key=lambda e: e["RANK"]) == [{**r, **node} for r in ranks]  # ranks: accelerate's
