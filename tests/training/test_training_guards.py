"""What protects a run's good state: divergence stops before any save, one writer per checkpoint folder,
and the exit codes that tell the pipeline "do not retry" survive torchrun."""

import json
import subprocess
import threading

import pytest

from efa_training.checkpointing import format as checkpoint_format
from efa_training.checkpointing import lock as checkpoint_lock
from efa_training.runtime import errors
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes


def _worker_tracebacks(run) -> int:
    # torchrun itself prints one traceback (its ChildFailedError report) whenever a worker fails.
    return run.stderr.count("Traceback (most recent call last)") - run.stderr.count("errors.ChildFailedError: ")


@pytest.fixture(scope="module")
def diverged(dataset, tmp_path_factory):
    # Checkpoints every 2 steps, 2 kept; every loss is NaN from micro-batch 19 on (2 per step: step 10),
    # so without protection the NaN step-10 checkpoint would rotate out step 6 and later saves the rest. Metrics
    # every 3 steps: step 10 is not one of them.
    def build(ckpt):
        args = [*th.train_args(dataset, ckpt, steps=20, every=2), "--keep-last", "2", "--log-every", "3"]
        run = th.launched("slow_train.py", args, TRAIN_TEST_NAN_FROM_BATCH="19")
        again = th.launched("train.py", args)
        return ckpt, run, again

    return th.shared(tmp_path_factory, "diverged", build)


def test_nan_loss_stops_the_run_with_its_own_exit_code_and_one_line(diverged):
    _, run, _ = diverged
    lines = th.error_lines(run.stderr, "train.py")
    assert run.returncode == errors.EXIT_DIVERGED == 4, run.stderr[-3000:]
    assert len(lines) == 1 and "diverged at step 10: loss nan" in lines[0] and _worker_tracebacks(run) == 0, lines


def test_checkpoints_from_before_the_divergence_survive(diverged):
    ckpt, _, _ = diverged
    assert th.checkpoint_steps(ckpt) == [6, 8]
    assert all(checkpoint_format.verify(ckpt / f"step_{s:09d}", "full")["step"] == s for s in (6, 8))


def test_the_nan_step_is_still_reported_to_the_metrics(diverged):
    # The NonFiniteLoss alarm needs the diverged step's EMF line, also when the step is not one that logs.
    _, run, _ = diverged
    assert [r["Step"] for r in run.emf() if r.get("NonFiniteLoss")] == [10]


def test_rerun_with_the_same_settings_is_refused_at_once(diverged):
    # torchrun restarts and pipeline retries would otherwise each retrain to the same NaN.
    _, _, again = diverged
    lines = th.error_lines(again.stderr, "train.py")
    assert again.returncode == 4 and lines and "diverged before with the same settings" in lines[0], again.stderr[
        -2000:
    ]
    assert not again.emf()


@pytest.fixture(scope="module")
def two_jobs(dataset, tmp_path_factory):
    # The first job is held mid-run (after its step-5 checkpoint) while the same run is submitted again
    # through launch.py; then it is let go and must finish.
    def build(workdir):
        ckpt, hold = workdir / "ckpt", workdir / "hold-first-job"
        first = th.Background(
            "slow_train.py",
            th.train_args(dataset, ckpt, steps=30, every=5),
            workdir,
            TRAIN_TEST_BATCH_DELAY_S="0.02",
            TRAIN_TEST_HOLD_WHILE=str(hold),
        )
        first.wait_for(lambda: 5 in th.checkpoint_steps(ckpt))
        hold.touch()
        second = subprocess.run(
            [
                th.PYTHON,
                str(th.TRAINING_IMAGE / "launch.py"),
                "train",
                *th.train_args(dataset, ckpt, steps=30, every=5),
            ],
            # The same run id: it waits for the holder, bounded; 2 s here instead of 300.
            env=th.env(ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port()), CHECKPOINT_LOCK_WAIT_SECONDS="2"),
            capture_output=True,
            text=True,
            # A hang guard, not a speed claim: the refusal goes through torchrun's 3 restarts (each a fresh
            # `import torch`), which took over 120 s once in CI with both xdist workers training.
            timeout=360,
        )
        steps_when_refused = th.checkpoint_steps(ckpt)
        hold.unlink()
        return ckpt, first.finish(), second, steps_when_refused

    return th.shared(tmp_path_factory, "two_jobs", build)


def test_second_job_on_a_folder_is_refused_naming_the_holder(two_jobs):
    _, first, second, _ = two_jobs
    lines = th.error_lines(second.stderr, "train.py")
    assert second.returncode == errors.EXIT_FOLDER_LOCKED == 5, second.stderr[-3000:]
    assert len(lines) == 1 and "is in use by another job (holder: {" in lines[0] and '"run_id": "test"' in lines[0]
    assert _worker_tracebacks(second) == 0, second.stderr[-3000:]


def test_first_job_finishes_unharmed(two_jobs):
    ckpt, first, _, steps_when_refused = two_jobs
    assert first.returncode == 0 and first.summary()["steps"] == 30, first.stderr[-3000:]
    assert th.checkpoint_steps(ckpt)[-1] == 30 and steps_when_refused[-1] < 30
    assert checkpoint_format.verify(ckpt / f"step_{30:09d}", "full")["step"] == 30


def _hold_lock(folder, holder: dict, seconds: float) -> subprocess.Popen:
    """Another process that takes the folder's lock as `holder` and keeps it for `seconds` (or until killed)."""
    code = (
        "import json, pathlib, sys, time; sys.path.insert(0, sys.argv[1]); "
        "from efa_training.checkpointing import lock as checkpoint_lock; "
        "f = checkpoint_lock.lock_folder(pathlib.Path(sys.argv[2]), json.loads(sys.argv[3])); "
        "print('locked', flush=True); time.sleep(float(sys.argv[4]))"
    )
    process = subprocess.Popen(
        [th.PYTHON, "-c", code, str(th.TRAINING_IMAGE), str(folder), json.dumps(holder), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "locked"
    return process


def test_lock_of_a_killed_job_is_released(tmp_path):
    # flock belongs to the process: SIGKILL (no clean-up code runs) frees the folder for the next job.
    holder = _hold_lock(tmp_path, {"who": "first"}, seconds=120)
    assert checkpoint_lock.lock_folder(tmp_path, {"who": "second"}) == '{"who": "first"}'
    holder.kill()
    holder.wait(30)
    lock = checkpoint_lock.lock_folder(tmp_path, {"who": "second"})
    assert not isinstance(lock, str)
    lock.close()


def test_launcher_keeps_the_sanity_checks_report_not_written_code(tmp_path):
    # Rank 0 exits 3 (checks passed, report lost); torchrun alone would say 1.
    (tmp_path / "f").write_text("x")
    p = subprocess.run(
        [
            th.PYTHON,
            str(th.TRAINING_IMAGE / "launch.py"),
            "sanity",
            "--sizes",
            "4K",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--report",
            str(tmp_path / "f" / "sanity.json"),
        ],
        env=th.env(ACCELERATOR_KIND="cpu", ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port())),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 3, p.stderr[-3000:]


def test_launcher_keeps_a_usage_error_code():
    p = subprocess.run(
        [
            th.PYTHON,
            str(th.TRAINING_IMAGE / "launch.py"),
            "train",
            "--data",
            "/nonexistent",
            "--checkpoint-dir",
            "/tmp/unused",
            "--max-steps",
            "1",
        ],
        env=th.env(ACCELERATORS_PER_NODE="2", MASTER_PORT=str(th.free_port())),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == errors.EXIT_USAGE, p.stderr[-2000:]


def test_an_earlier_attempt_of_the_same_run_is_waited_for_and_another_run_is_not(tmp_path, monkeypatch):
    # A dead host's Lustre lock lasts until the file system evicts that client: a retried attempt of the same
    # run waits for it (bounded); a different run is refused at once. The earlier attempt's lock is held through
    # a file of its own in this process (flock conflicts between open files, test_checkpoint_lock.py) and let go
    # after 3 s; a process would only add a torch import (the killed-holder test above needs one).
    held = checkpoint_lock.lock_folder(tmp_path, {"run_id": "r1"})
    assert not isinstance(held, str)
    released = threading.Event()  # set just before the holder lets go: a lock got later must have waited for it

    def evict() -> None:
        released.set()
        held.close()

    evicted = threading.Timer(3, evict)
    monkeypatch.setenv("CHECKPOINT_LOCK_WAIT_SECONDS", "60")
    monkeypatch.setattr(checkpoint_lock, "LOCK_POLL_SECONDS", 0.2)
    evicted.start()
    assert checkpoint_lock.lock_folder_waiting(tmp_path, {"run_id": "r2"}) == '{"run_id": "r1"}'  # another run
    assert not released.is_set()  # refused while the holder still held it: no wait
    lock = checkpoint_lock.lock_folder_waiting(tmp_path, {"run_id": "r1"})  # the same run: waits for the holder
    assert not isinstance(lock, str) and released.is_set()
    lock.close()
    evicted.join(timeout=30)


def test_a_lock_wait_that_is_not_a_number_is_one_usage_error(tmp_path, monkeypatch):
    from efa_training.runtime.errors import UsageError

    monkeypatch.setenv("CHECKPOINT_LOCK_WAIT_SECONDS", "five minutes")
    with pytest.raises(UsageError, match="CHECKPOINT_LOCK_WAIT_SECONDS"):
        checkpoint_lock.lock_folder_waiting(tmp_path, {"run_id": "r1"})
