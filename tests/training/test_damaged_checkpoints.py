"""The pre-flight and a damaged checkpoint, in one process: nothing before the resume's damage check stops at one.

The pre-flight's checkpoint checks (check_reusable, check_not_fused) run before any process group and read only
meta.json, and only one that passes the resume's own check of it (format.check_meta); a checkpoint that fails it
is the resume's to set aside and fall back from (the whole matrix on DDP and FSDP, with real processes:
test_training_damage.py). Release 0.10.0 read every meta.json first: a garbage one ended the start in a traceback,
an incomplete one was refused as release 0.8.0's.
"""

import json

import pytest

from efa_training.checkpointing.format import CheckpointDamaged, check_meta, sound_metas
from efa_training.checkpointing.reuse import check_reusable
from efa_training.runtime.errors import UsageError
from efa_training.workloads.gpt import preflight

MODEL = {"n_layer": 2}  # the model config both the checkpoints and the run name
TRAIN = {"model": "tiny", "strategy": "ddp", "tensor_parallel": 1}  # tensor_parallel: written by 0.9.0 and later


def _write(root, step: int, meta: dict | str) -> None:
    folder = root / f"step_{step:09d}"
    folder.mkdir()
    (folder / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))


def _meta(step: int, train: dict = TRAIN) -> dict:
    files = {name: {"bytes": 1, "crc32": 0, "rank": 0} for name in ("state.pt", "rng_rank0.pt")}
    return {"step": step, "format": "full", "world_size": 1, "config": {"train": train, "model": MODEL}, "files": files}


def _without_state(step: int) -> dict:
    meta = _meta(step)
    del meta["files"]["state.pt"]
    return meta


# kind: the damaged meta.json of step 2 (step 1 is sound)
DAMAGED_META: dict[str, dict | str] = {
    "garbage": "{not json!!",
    "a step only": {"step": 2},
    "not an object": "[2]",
    "another step's": _meta(3),
    "manifest lacks the state": _without_state(2),
    "manifest entry not an object": {**_meta(2), "files": {**_meta(2)["files"], "state.pt": 7}},
}
CHECKS = {
    "check_reusable": lambda root: check_reusable(root, "ddp", "tiny", MODEL),
    "check_not_fused": preflight.check_not_fused,
}


@pytest.mark.parametrize("kind", DAMAGED_META)
@pytest.mark.parametrize("check", CHECKS)
def test_the_preflight_passes_over_a_damaged_meta_json(tmp_path, check, kind):
    _write(tmp_path, 1, _meta(1))
    _write(tmp_path, 2, DAMAGED_META[kind])
    CHECKS[check](tmp_path)  # neither raises: the resume sets step 2 aside and loads step 1


@pytest.mark.parametrize("kind", DAMAGED_META)
def test_only_checkpoints_whose_meta_passes_the_damage_check_are_read(tmp_path, kind):
    _write(tmp_path, 1, _meta(1))
    _write(tmp_path, 2, DAMAGED_META[kind])
    assert [(path.name, meta) for path, meta in sound_metas(tmp_path)] == [("step_000000001", _meta(1))]


def test_a_release_080_checkpoint_behind_a_damaged_one_is_still_refused(tmp_path):
    # Passing over the damaged newest one must not pass over the rest: 0.8.0's (no tensor_parallel) is refused.
    _write(tmp_path, 1, _meta(1, {"model": "tiny", "strategy": "ddp"}))
    _write(tmp_path, 2, DAMAGED_META["garbage"])
    with pytest.raises(UsageError, match="holds step_000000001, written by release 0.8.0 or earlier"):
        preflight.check_not_fused(tmp_path)


def test_another_strategys_checkpoint_behind_a_damaged_one_is_still_refused(tmp_path):
    _write(tmp_path, 1, {**_meta(1), "format": "dcp", "files": {".metadata": {}, "extra.pt": {}, "rng_rank0.pt": {}}})
    _write(tmp_path, 2, DAMAGED_META["a step only"])
    with pytest.raises(UsageError, match=r"holds checkpoints of --strategy fsdp \(newest: step_000000001\)"):
        check_reusable(tmp_path, "ddp", "tiny", MODEL)


def test_the_damage_check_names_what_is_wrong_with_the_meta_json(tmp_path):
    _write(tmp_path, 2, DAMAGED_META["a step only"])
    with pytest.raises(CheckpointDamaged, match="meta.json lacks or mistypes format, world_size, config, files"):
        check_meta(tmp_path / "step_000000002")
