"""Incremental training on CPU with 2 processes: train.py --init-from starts a run from another run's weights.

The pipeline passes an approved model's run id (constructs/pipeline/initial_model.py); the image finds its folder next
to the run's own (--checkpoints-root/<id>) and loads its newest loadable checkpoint's weights, not its optimizer,
schedule, step or data position.
"""

import pytest

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

STEPS = 4


@pytest.fixture(scope="module")
def warm_started(dataset, ddp_reference, tmp_path_factory) -> th.Run:
    """A new run from the reference run's final weights (its checkpoint folder's newest step)."""

    def build(ckpt):
        args = th.train_args(dataset, ckpt, steps=STEPS, every=STEPS) + [
            "--init-from",
            str(ddp_reference.checkpoint_dir),
        ]
        run = th.torchrun("train.py", args, nproc=2)
        assert run.returncode == 0, run.stderr[-3000:]
        run.checkpoint_dir = ckpt
        return run

    return th.shared(tmp_path_factory, "warm_started", build)


def test_a_warm_started_run_begins_where_the_initial_model_ended(warm_started, ddp_reference):
    # Its first loss is the initial model's last, up to the noise of a different batch: the reference's last five
    # steps vary by about 5% around their mean, so 10% bounds it; a fresh model starts near ln(257) = 5.55.
    final, first = ddp_reference.losses()[-1], warm_started.losses()[0]
    assert abs(first - final) < 0.10 * final, (first, final)
    assert first < 0.8 * ddp_reference.losses()[0]


def test_a_warm_start_says_where_it_started_and_counts_its_own_steps(warm_started, ddp_reference):
    assert f"starting from the weights of {ddp_reference.checkpoint_dir}" in warm_started.stderr
    assert warm_started.summary()["start_step"] == 0 and warm_started.summary()["steps"] == STEPS


def test_a_runs_own_checkpoint_wins_over_its_initial_model(dataset, warm_started, ddp_reference):
    # A retried attempt of an incremental run resumes its own progress, not the initial model.
    args = th.train_args(dataset, warm_started.checkpoint_dir, steps=STEPS + 2, every=STEPS) + [
        "--init-from",
        str(ddp_reference.checkpoint_dir),
    ]
    run = th.torchrun("train.py", args, nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"resumed from {warm_started.checkpoint_dir}" in run.stderr and run.summary()["start_step"] == STEPS


def test_a_model_of_another_size_is_refused_with_one_line(dataset, ddp_reference, tmp_path):
    args = th.train_args(dataset, tmp_path / "ckpt", steps=2) + ["--init-from", str(ddp_reference.checkpoint_dir)]
    args[args.index("--model") + 1] = "mini"
    run = th.single_process("train.py", args)  # one process: its exit code is the job's (torchrun would say 1)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "--init-from" in run.stderr and "not this run's mini" in run.stderr


def test_a_run_id_is_looked_up_next_to_the_runs_own_folder(dataset, ddp_reference, tmp_path):
    # The pipeline's layout: --checkpoints-root /fsx/checkpoints --run-id B --init-from A reads /fsx/checkpoints/A.
    from efa_training import train_config

    args = train_config.build_parser().parse_args(
        ["--data", str(dataset), "--checkpoints-root", "/fsx/checkpoints", "--run-id", "b", "--max-steps", "1"]
        + ["--init-from", "a"]
    )
    assert str(train_config.from_args(args).initial_model_dir()) == "/fsx/checkpoints/a"
