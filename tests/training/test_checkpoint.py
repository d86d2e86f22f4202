"""checkpointing's store (store.py) and checks (format.py), in one process: atomic saves, agreed loads, pruning."""

import json
import os
import random

import numpy as np
import pytest
import torch

from efa_training.checkpointing import format as checkpoint_format
from efa_training.checkpointing import store as checkpoint
from efa_training.checkpointing.reuse import check_reusable
from efa_training.checkpointing.state import TrainerState
from efa_training.workloads.gpt.model import GPT, model_config


def _tiny_trainer():
    """Model, optimizer and scheduler of the tiny size, as train.py builds them (world of one, no DDP)."""
    torch.manual_seed(0)
    model = GPT(model_config("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def _store(root, fmt="full", keep_last=3):
    return checkpoint.CheckpointStore(root, fmt, keep_last=keep_last, rank=0, world_size=1)


def _save(store, trainer, step: int):
    return store.save(*trainer, TrainerState(step=step), {"train": {"model": "tiny"}})


def _load(store, trainer):
    return store.load_latest(*trainer, torch.device("cpu"))


def test_interrupted_save_leaves_previous_checkpoints_loadable(tmp_path, monkeypatch):
    # A save that fails part-way (here: at the rename into place) leaves the previous checkpoint the newest.
    trainer = _tiny_trainer()
    store = _store(tmp_path)
    _save(store, trainer, 10)

    def failing_replace(src, dst):
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="injected"):
        _save(store, trainer, 20)
    monkeypatch.undo()
    assert (tmp_path / ".tmp-step_000000020" / "meta.json").exists()  # the half-done save is really there
    assert [p.name for p in checkpoint_format.step_dirs(tmp_path)] == ["step_000000010"]
    state, path = _load(store, trainer)
    assert (state.step, path.name) == (10, "step_000000010")


def test_save_after_skipping_a_corrupt_newer_checkpoint_keeps_the_live_one(tmp_path, capsys):
    # The corrupt newer checkpoint is set aside when the run resumes, so pruning counts only the live ones.
    trainer = _tiny_trainer()
    store = _store(tmp_path, keep_last=1)
    for step in (2, 4, 6):
        _save(_store(tmp_path), trainer, step)
    state_file = tmp_path / "step_000000006" / "state.pt"
    state_file.write_bytes(state_file.read_bytes()[: state_file.stat().st_size // 2])
    assert _load(store, trainer)[0].step == 4
    assert (tmp_path / ".damaged-step_000000006" / "meta.json").exists()
    assert "step_000000006 is damaged: state.pt: " in capsys.readouterr().err
    _save(store, trainer, 5)
    assert [p.name for p in checkpoint_format.step_dirs(tmp_path)] == ["step_000000005"]
    assert _load(store, trainer)[0].step == 5


def test_save_older_than_an_existing_checkpoint_moves_the_newer_aside(tmp_path, capsys):
    # A checkpoint newer than the one just saved belongs to an abandoned timeline: moved aside, not pruned by number.
    trainer = _tiny_trainer()
    store = _store(tmp_path, keep_last=1)
    for step in (6, 5):
        _save(store, trainer, step)
    assert [p.name for p in checkpoint_format.step_dirs(tmp_path)] == ["step_000000005"]
    assert (tmp_path / ".abandoned-step_000000006" / "meta.json").exists()
    assert "moved step_000000006" in capsys.readouterr().err


def test_checkpoint_of_another_format_is_skipped_without_claiming_a_partial_load(tmp_path):
    # A DDP ("full") checkpoint read by an FSDP ("dcp") store is skipped before DCP touches the model.
    trainer = _tiny_trainer()
    _save(_store(tmp_path), trainer, 3)
    assert _load(_store(tmp_path, "dcp"), trainer) is None


def test_checkpoint_of_another_model_is_not_applied_silently(tmp_path):
    # A size mismatch while applying a checkpoint is a skip, and then an error (the model was touched).
    _save(_store(tmp_path), _tiny_trainer(), 3)
    mini = GPT(model_config("mini"))
    optimizer = torch.optim.AdamW(mini.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(RuntimeError, match="no checkpoint .* could be loaded"):
        _load(_store(tmp_path), (mini, optimizer, scheduler))


def test_resaving_a_step_has_no_moment_without_that_step(tmp_path, monkeypatch):
    # Killed between the two renames of a re-save: the old copy (.replaced-) is still found and loads.
    trainer = _tiny_trainer()
    store = _store(tmp_path)
    _save(store, trainer, 10)
    real_replace, calls = os.replace, []

    def replace_then_die(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(5, "killed between the renames (injected)")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(OSError, match="injected"):
        _save(store, trainer, 10)
    monkeypatch.undo()
    assert [p.name for p in checkpoint_format.step_dirs(tmp_path)] == [".replaced-step_000000010"]
    assert _load(store, trainer)[0].step == 10
    _save(store, trainer, 10)  # the next save of that step cleans up
    assert sorted(p.name for p in tmp_path.iterdir() if "step_" in p.name) == ["step_000000010"]


def test_rng_state_is_restored_from_a_weights_only_file(tmp_path):
    _save(_store(tmp_path), _tiny_trainer(), 1)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    checkpoint_format.set_rng_state(torch.load(tmp_path / "step_000000001" / "rng_rank0.pt", weights_only=True))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_checkpoint_missing_a_ranks_state_is_incomplete(tmp_path):
    _save(_store(tmp_path), _tiny_trainer(), 1)
    meta_file = tmp_path / "step_000000001" / "meta.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "world_size": 2}))  # rank 1 wrote nothing
    with pytest.raises(checkpoint_format.CheckpointDamaged, match="incomplete: the manifest lacks rng_rank1.pt"):
        checkpoint_format.verify(tmp_path / "step_000000001", "full")


def test_incomplete_meta_json_does_not_block_start_up(tmp_path):
    # check_reusable reads the newest *complete* meta.json; a broken one is set aside later, not a usage error.
    (tmp_path / "step_000000009").mkdir()
    (tmp_path / "step_000000009" / "meta.json").write_text('{"step": 9}')
    check_reusable(tmp_path, "fsdp", "tiny", {})
