"""Both strategies train a real model on 2 CPU processes and the loss falls."""

from pathlib import Path

import pytest

from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes


@pytest.fixture(scope="module")
def fsdp_run(dataset, tmp_path_factory) -> th.Run:
    # Named the way the Batch job definition does it: roots plus names, --batch-size, --expected-nodes.
    def build(root: Path) -> th.Run:
        args = th.train_args(dataset, root / "unused", strategy="fsdp")
        for flag in ("--data", "--checkpoint-dir"):
            del args[args.index(flag) : args.index(flag) + 2]
        args = [a if a != "--micro-batch-size" else "--batch-size" for a in args]
        run = th.torchrun(
            "train.py",
            [
                *args,
                "--datasets-root",
                str(dataset.parent),
                "--dataset",
                dataset.name,
                "--checkpoints-root",
                str(root),
                "--run-id",
                "fsdp-run",
                "--expected-nodes",
                "1",
            ],
        )
        assert run.returncode == 0, run.stderr[-3000:]
        run.checkpoint_dir = root / "fsdp-run"
        return run

    return th.shared(tmp_path_factory, "fsdp_run", build)


def _falls(losses: list[float]) -> bool:
    head, tail = losses[:3], losses[-3:]
    return sum(tail) / 3 < 0.7 * sum(head) / 3


def test_ddp_loss_falls(ddp_reference):
    assert _falls(ddp_reference.losses()), ddp_reference.losses()


def test_ddp_replicas_end_with_identical_parameters(ddp_reference):
    # Gradients were all-reduced: both ranks' parameter checksums are equal (rank 1 alone would drift).
    checksums = ddp_reference.summary()["replica_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1], checksums


def test_fsdp_loss_falls(fsdp_run):
    assert _falls(fsdp_run.losses()), fsdp_run.losses()


def test_fsdp_dcp_checkpoint_loads_into_a_plain_model(fsdp_run, dataset):
    from efa_training.workloads.gpt import saved_model

    newest = th.checkpoint_steps(fsdp_run.checkpoint_dir)[-1]
    model, meta, _ = saved_model.find_and_load(fsdp_run.checkpoint_dir)
    assert meta["format"] == "dcp" and meta["step"] == newest == th.TRAIN_STEPS


def test_training_emits_emf_lines_and_a_summary(ddp_reference):
    assert len(ddp_reference.emf()) == 30 and ddp_reference.summary()["steps"] == 30
