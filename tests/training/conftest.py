"""Fixtures for the training image tests: a small corpus, free ports, torchrun runs.

The training code ships alone in the container as the efa_training package, so its folder goes on sys.path for the
unit tests (and on PYTHONPATH for the processes they start: training_helpers.env).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TRAINING_IMAGE = Path(__file__).resolve().parents[2] / "training_image"
sys.path.insert(0, str(TRAINING_IMAGE))

from tests.training import layouts  # noqa: E402  (tests/conftest.py put the repository on sys.path)
from tests.training import training_helpers as th  # noqa: E402


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """prepare_data.py output for a seeded synthetic corpus (~126k train tokens)."""

    def build(root: Path) -> Path:
        th.make_dataset(root / "corpus", root / "data")
        return root / "data"

    return th.shared(tmp_path_factory, "dataset", build)


@pytest.fixture(scope="session")
def ddp_reference(dataset, tmp_path_factory) -> th.Run:
    """One uninterrupted 2-process DDP run, shared by the loss, resume and validation tests."""

    def build(ckpt: Path) -> th.Run:
        run = th.torchrun("train.py", th.train_args(dataset, ckpt), nproc=2)
        assert run.returncode == 0, run.stderr[-3000:]
        run.checkpoint_dir = ckpt
        return run

    return th.shared(tmp_path_factory, "ddp_reference", build)


# ---- the GPT's layouts (tests/training/layouts.py): the references the tensor- and pipeline-parallel tests share


@pytest.fixture(scope="session")
def fsdp_single(dataset, tmp_path_factory) -> th.Run:
    """One process: FSDP over one rank, the reference arithmetic."""
    return th.shared(tmp_path_factory, "layout-single", lambda root: layouts.train(dataset, root / "ckpt", 1))


@pytest.fixture(scope="session")
def fsdp_dp2(dataset, tmp_path_factory) -> th.Run:
    """FSDP over 2 replicas: what a layout with 2 data-parallel replicas must match."""
    return th.shared(tmp_path_factory, "layout-dp2", lambda root: layouts.train(dataset, root / "ckpt", 2))


@pytest.fixture(scope="session")
def fsdp_dp2_resumed(fsdp_dp2, dataset, tmp_path_factory) -> th.Run:
    """The FSDP run continued to step 9 in its own layout: where a resume in another layout must arrive."""
    return th.shared(
        tmp_path_factory, "layout-dp2-resumed", lambda root: layouts.resumed(fsdp_dp2, root / "ckpt", 2, dataset)
    )
