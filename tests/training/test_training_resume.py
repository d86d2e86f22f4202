"""Fault tolerance: SIGKILL of the whole job, loss of one worker, SIGTERM, a corrupt checkpoint."""

import shutil
import signal

import pytest
import torch

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

DELAY = "0.05"  # seconds per micro-batch (2 per step), so the test can act between two steps (slow_train.py)


@pytest.fixture(scope="module")
def faults(dataset, tmp_path_factory):
    """The reference job, hit twice: one worker SIGKILLed after the step-10 checkpoint (torchrun,
    --max-restarts 1, restarts the group), then every process SIGKILLed after the step-20
    checkpoint; then the same command again. One scenario, so the suite pays for 2 launches."""

    def build(workdir):
        ckpt = workdir / "ckpt"
        job = th.Background(
            "slow_train.py", th.train_args(dataset, ckpt), workdir, max_restarts=1, TRAIN_TEST_BATCH_DELAY_S=DELAY
        )
        job.wait_for(lambda: th.checkpoint_steps(ckpt) == [10] and len(job.workers()) == 2)
        th.os.kill(job.workers()[-1], signal.SIGKILL)
        job.wait_for(lambda: 20 in th.checkpoint_steps(ckpt))
        job.kill_group()
        first_job = job.finish()
        steps_at_kill = th.checkpoint_steps(ckpt)
        resumed = th.torchrun("train.py", th.train_args(dataset, ckpt))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        return ckpt, first_job, steps_at_kill, resumed

    return th.shared(tmp_path_factory, "faults", build)


def test_killed_worker_is_restarted_and_resumes_from_last_checkpoint(faults):
    ckpt, first_job, _, _ = faults
    assert "restart=1" in first_job.stderr and f"resumed from {ckpt}/step_{10:09d}" in first_job.stderr, (
        first_job.stderr[-3000:]
    )


def test_sigkilled_job_resumes_from_its_checkpoint(faults):
    ckpt, _, steps_at_kill, resumed = faults
    assert steps_at_kill[-1] < th.TRAIN_STEPS
    assert f"resumed from {ckpt}/step_{steps_at_kill[-1]:09d}" in resumed.stderr


def test_resumed_parameters_equal_uninterrupted_run_bit_for_bit(faults, ddp_reference):
    ckpt = faults[0]
    resumed, reference = th.final_model_state(ckpt), th.final_model_state(ddp_reference.checkpoint_dir)
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


@pytest.fixture(scope="module")
def sigtermed(dataset, tmp_path_factory):
    def build(workdir):
        ckpt = workdir / "ckpt"
        job = th.Background(
            "slow_train.py", th.train_args(dataset, ckpt, steps=1000), workdir, TRAIN_TEST_BATCH_DELAY_S=DELAY
        )
        job.wait_for(lambda: '"Step": 13,' in job.out.read_text())
        # To rank 1 only: rank 0, which writes the checkpoint's meta and the summary, learns of it through the
        # per-step collective. (Batch/Kubernetes signal torchrun, which forwards to every worker: the easier case.)
        th.os.kill(job.worker_of_rank(1), signal.SIGTERM)
        return ckpt, job.finish()

    return th.shared(tmp_path_factory, "sigtermed", build)


def test_sigterm_writes_a_checkpoint_before_exit(sigtermed):
    ckpt, run = sigtermed
    steps = th.checkpoint_steps(ckpt)
    assert steps[-1] > 13 and steps[-1] % th.CHECKPOINT_EVERY != 0, (steps, run.stderr[-2000:])


def test_sigterm_on_one_rank_is_reported_by_the_summary(sigtermed):
    # The summary (rank 0) reports the collective stop, not rank 0's own flag, and names the saved step.
    ckpt, run = sigtermed
    summary = run.summary()
    assert (
        summary["stopped_by_sigterm"] is True
        and summary["last_checkpoint_step"] == summary["steps"] == th.checkpoint_steps(ckpt)[-1]
    ), (summary, run.stderr[-2000:])


def test_truncated_newest_checkpoint_is_skipped_for_the_previous_one(sigtermed, dataset, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sigtermed[0], ckpt)  # the other tests read the original, maybe on another xdist worker
    *_, previous, newest = th.checkpoint_steps(ckpt)
    state = ckpt / f"step_{newest:09d}" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    run = th.single_process("train.py", th.train_args(dataset, ckpt, steps=previous + 1))
    assert (
        run.returncode == 0
        and "WARNING skipping" in run.stderr
        and f"resumed from {ckpt}/step_{previous:09d}" in run.stderr
    ), run.stderr[-3000:]
