"""The GPT's parallel layouts trained for real (torchrun, gloo, CPU), shared by the tensor- and pipeline-parallel
tests: one short FSDP run per layout, checkpointed every EVERY steps, and the helpers that compare their losses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from efa_training.checkpointing.format import step_name
from efa_training.train_config import TrainConfig
from tests.training import training_helpers as th

STEPS, EVERY, MORE = 6, 3, 9
# Losses of the same run in two layouts: the arithmetic differs only in the order of the sums (a row-parallel layer
# adds its ranks' partial products, a pipeline adds the shared embedding's two gradients), so they agree to float32
# rounding, not always bit for bit.
REL = 1e-5


def train(dataset: Path, ckpt: Path, nproc: int, *flags: str, steps: int = STEPS) -> th.Run:
    """A tiny GPT trained with FSDP2 (and `flags`) on `nproc` processes, 2 micro-batches a step."""
    args = [*th.train_args(dataset, ckpt, steps=steps, every=EVERY, strategy="fsdp"), *flags]
    run = th.torchrun("train.py", args, nproc=nproc)
    assert run.returncode == 0, run.stderr[-3000:]
    run.checkpoint_dir = ckpt
    return run


def layout_fixture(name: str, nproc: int, *flags: str):
    """A module fixture: the run of `train` in this layout, trained once per test session (training_helpers.shared)."""

    @pytest.fixture(scope="module")
    def fixture(dataset, tmp_path_factory) -> th.Run:
        return th.shared(tmp_path_factory, name, lambda root: train(dataset, root / "ckpt", nproc, *flags))

    return fixture


def resumed(run: th.Run, into: Path, nproc: int, dataset: Path, *flags: str) -> th.Run:
    """`run`'s checkpoints copied to `into` and trained on to step MORE in the layout `flags` give."""
    assert run.checkpoint_dir is not None
    shutil.copytree(run.checkpoint_dir, into)
    return train(dataset, into, nproc, *flags, steps=MORE)


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) > 0 and all(abs(x - y) <= REL * abs(y) for x, y in zip(a, b, strict=True))


def damaged_newest(run: th.Run, into: Path) -> Path:
    """`run`'s checkpoints copied to `into`, one shard of the newest (step STEPS) with a byte flipped."""
    assert run.checkpoint_dir is not None
    shutil.copytree(run.checkpoint_dir, into)
    shard = sorted((into / step_name(STEPS)).glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return into


def config(folder: Path, **values: object) -> TrainConfig:
    """train.py's settings for one step on `folder` (its checks run as the dataclass is built)."""
    return TrainConfig(data=str(folder), checkpoint_dir=str(folder / "c"), max_steps=1, **values)  # type: ignore[arg-type]
