"""Two SageMaker instances on this machine: launch.py reads each one's resourceconfig.json and hyperparameters.json,
checks the hosts (sanity_check.py) before training, writes node-local checkpoints, stops on SIGTERM with a final
checkpoint and a failure file; then resumes from what SageMaker restores (the union of the nodes' folders) bit for bit.

SageMaker's behaviour simulated here: each instance's /opt/ml/checkpoints is uploaded to one S3 prefix and the whole
prefix is restored to every instance of the next job ("Checkpoints in Amazon SageMaker AI",
https://docs.aws.amazon.com/sagemaker/latest/dg/model-checkpoints.html); StopTrainingJob sends SIGTERM and waits
120 s (https://docs.aws.amazon.com/sagemaker/latest/dg/API_StopTrainingJob.html).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

HOSTS = ["127.0.0.1", "localhost"]  # two names of this machine: one instance each
DELAY = "0.05"  # seconds per micro-batch (slow_train.py), so SIGTERM lands between two checkpoints
RUN_HYPERPARAMETERS = {"model": "tiny", "strategy": "ddp", "max_steps": th.TRAIN_STEPS,
                       "checkpoint_every": th.CHECKPOINT_EVERY, "seed": 7, "lr": 3e-3, "batch_size": 8}  # fmt: skip
HYPERPARAMETERS = {  # what the pipeline passes (contracts/run.py JOB_PARAMETERS["train"] + expected_nodes)
    "run_id": "sm-run",
    "dataset": "datasets/synthetic/",  # dropped: the training channel is --data
    "hyperparameters": json.dumps(RUN_HYPERPARAMETERS),  # one JSON text, which launch.py turns into train.py's flags
    "expected_nodes": "2",
}


def _slow_image(folder: Path) -> Path:
    """A copy of the image whose train.py runs with slow_train.py's delays, so SIGTERM can land mid-run."""
    for source in th.TRAINING_IMAGE.glob("*.py"):
        shutil.copy(source, folder / source.name)
    shutil.copytree(
        th.TRAINING_IMAGE / "efa_training", folder / "efa_training", ignore=shutil.ignore_patterns("__pycache__")
    )
    train = folder / "efa_training" / "train.py"
    slow = th.TESTS / "slow_train.py"
    main = 'if __name__ == "__main__":\n'
    delays = f"    __import__('runpy').run_path({str(slow)!r}, run_name='slow_train')['slow_down']()\n"
    assert train.read_text().count(main) == 1
    train.write_text(train.read_text().replace(main, main + delays))
    return folder


class Instance:
    """One SageMaker instance: its ml root (resourceconfig.json, hyperparameters.json, checkpoints, output/failure)."""

    def __init__(self, root: Path, host: str) -> None:
        self.root, self.checkpoints = root, root / "checkpoints"
        config = root / "input" / "config"
        config.mkdir(parents=True, exist_ok=True)
        resource = {"current_host": host, "hosts": HOSTS, "network_interface_name": "lo"}
        (config / "resourceconfig.json").write_text(json.dumps(resource))
        (config / "hyperparameters.json").write_text(json.dumps(HYPERPARAMETERS))

    def start(self, image: Path, data: Path, port: int, **env: str) -> subprocess.Popen:
        # The container arguments the pipeline gives train (MODE and static flags), then what the test fixes.
        args = ["train", "--data", str(data), "--checkpoint-dir", str(self.checkpoints)]
        args += ["--warmup-steps", "3", "--grad-accum-steps", "2"]  # the reference run's, not hyperparameters
        out = open(self.root / "stdout.txt", "w")  # noqa: SIM115  the child keeps its own copy
        err = open(self.root / "stderr.txt", "w")  # noqa: SIM115
        with out, err:
            return subprocess.Popen(
                [th.PYTHON, str(image / "launch.py"), *args],
                env=th.env(
                    SAGEMAKER_ML_ROOT=str(self.root),
                    TRAINING_JOB_NAME="sm-run-train-1",
                    ACCELERATORS_PER_NODE="1",
                    ACCELERATOR_KIND="cpu",
                    CHECKPOINT_NODE_LOCAL="1",
                    MASTER_PORT=str(port),
                    **env,
                ),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return (self.root / "stderr.txt").read_text()

    def failure(self) -> str | None:
        path = self.root / "output" / "failure"
        return path.read_text() if path.exists() else None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _run(procs: list[subprocess.Popen], until=lambda: False, timeout: float = 150) -> None:
    """Wait for the launchers to end (or for `until`), killing every process they started on a timeout."""
    deadline = time.monotonic() + timeout
    while not until() and any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            for p in procs:
                for pid in [p.pid, *_descendants(p.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            raise AssertionError("timed out")
        time.sleep(0.02)


def _union(folders: list[Path], into: Path, leave_out: Path | None = None) -> Path:
    """What SageMaker restores to every instance: every node's files under one prefix (`leave_out`: never uploaded)."""
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not (leave_out and path.is_relative_to(leave_out)):
                target = into / path.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return into


@pytest.fixture(scope="module")
def stopped(dataset, tmp_path_factory):
    """Both instances check the hosts, train, and are stopped with SIGTERM after their step-10 checkpoints."""

    def build(workdir: Path):
        image = workdir / "image"
        image.mkdir()
        _slow_image(image)
        nodes = [Instance(workdir / f"node{i}", host) for i, host in enumerate(HOSTS)]
        port = th.free_port()
        procs = [
            n.start(
                image,
                dataset,
                port,
                TRAIN_TEST_BATCH_DELAY_S=DELAY,
                SANITY_BEFORE_TRAINING="1",
                REPORT_PREFIX=f"{workdir}/runs/",
            )
            for n in nodes
        ]
        _run(procs, until=lambda: all(th.checkpoint_steps(n.checkpoints) == [10] for n in nodes))
        for p in procs:
            p.send_signal(signal.SIGTERM)  # SageMaker stops every instance's container
        _run(procs)
        return nodes, [p.returncode for p in procs], json.loads((workdir / "runs/sm-run/sanity.json").read_text())

    return th.shared(tmp_path_factory, "sagemaker-stopped", build)


def _resume(workdir: Path, dataset: Path, stopped_nodes: list[Instance], leave_out_newest_of: int | None = None):
    """A new job on fresh instances, each restored with the union of the stopped job's node folders."""
    leave_out = None
    if leave_out_newest_of is not None:
        own = stopped_nodes[leave_out_newest_of].checkpoints
        leave_out = own / f"step_{th.checkpoint_steps(own)[-1]:09d}"
    nodes = [Instance(workdir / f"node{i}", host) for i, host in enumerate(HOSTS)]
    for node in nodes:
        _union([n.checkpoints for n in stopped_nodes], node.checkpoints, leave_out)
    port = th.free_port()  # one rendezvous for both instances
    procs = [n.start(th.TRAINING_IMAGE, dataset, port) for n in nodes]
    _run(procs)
    return nodes, [p.returncode for p in procs]


@pytest.fixture(scope="module")
def resumed(dataset, stopped, tmp_path_factory):
    return th.shared(tmp_path_factory, "sagemaker-resumed", lambda workdir: _resume(workdir, dataset, stopped[0]))


@pytest.fixture(scope="module")
def fell_back(dataset, stopped, tmp_path_factory):
    # Node 1's files of the newest step never reached S3: the restored union lacks its share of that step.
    return th.shared(tmp_path_factory, "sagemaker-fell-back", lambda workdir: _resume(workdir, dataset, stopped[0], 1))


def _final_state(nodes: list[Instance], into: Path) -> dict:
    return th.final_model_state(_union([n.checkpoints for n in nodes], into))


def test_the_hosts_are_checked_before_training(stopped):
    nodes, _, report = stopped
    assert report["passed"] and report["nodes"] == 2, report
    assert "sanity_check: PASS" in "".join(n.stderr() for n in nodes)  # rank 0's verdict line
    for node in nodes:  # each instance ran the check (on its own rendezvous) before training
        log = node.stderr()
        assert "launch.py: sanity check before training:" in log and th.checkpoint_steps(node.checkpoints), log[-3000:]


def test_sigterm_stops_every_instance_with_a_final_checkpoint_and_says_so(stopped):
    nodes, codes, _ = stopped
    steps = [th.checkpoint_steps(n.checkpoints) for n in nodes]
    assert codes == [143, 143] and steps[0] == steps[1] and steps[0][-1] > 10, (codes, steps, nodes[0].stderr()[-3000:])
    assert all((n.failure() or "").startswith("efa-training exit code 143: stopped") for n in nodes)


def test_each_node_folder_holds_complete_steps_of_its_own_files(stopped):
    # Every node writes the same meta.json; the model state and each rank's RNG file are on one node only.
    nodes, _, _ = stopped
    newest = [n.checkpoints / f"step_{th.checkpoint_steps(n.checkpoints)[-1]:09d}" for n in nodes]
    metas = [(folder / "meta.json").read_text() for folder in newest]
    files = [{p.name for p in folder.iterdir()} - {"meta.json"} for folder in newest]
    assert metas[0] == metas[1] and not files[0] & files[1], files
    assert files[0] | files[1] == set(json.loads(metas[0])["files"]), files


def _resumed_step(nodes: list[Instance]) -> int:
    """The step the new job resumed from (rank 0's log line "train: resumed from <dir>/step_N at step N")."""
    line = next(line for n in nodes for line in n.stderr().splitlines() if "train: resumed from" in line)
    return int(line.rsplit(" at step ", 1)[1].split(";")[0])


def test_resumed_from_the_restored_union_equals_an_uninterrupted_run_bit_for_bit(
    resumed, stopped, ddp_reference, tmp_path
):
    nodes, codes = resumed
    assert codes == [0, 0] and all(n.failure() is None for n in nodes), nodes[0].stderr()[-3000:]
    assert _resumed_step(nodes) == th.checkpoint_steps(stopped[0][0].checkpoints)[-1]  # the SIGTERM checkpoint
    final, reference = _final_state(nodes, tmp_path / "union"), th.final_model_state(ddp_reference.checkpoint_dir)
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in reference)


def test_a_union_missing_one_nodes_newest_files_resumes_from_the_step_before(fell_back, ddp_reference, tmp_path):
    nodes, codes = fell_back
    log = "".join(n.stderr() for n in nodes)
    assert codes == [0, 0] and "WARNING skipping" in log and _resumed_step(nodes) == 10, log[-3000:]
    final, reference = _final_state(nodes, tmp_path / "union"), th.final_model_state(ddp_reference.checkpoint_dir)
    assert all(torch.equal(final[k], reference[k]) for k in reference)
