"""A damaged newest checkpoint: every rank drops it together, sets it aside and resumes from the previous one.

One job per strategy writes a checkpoint at every step 1..STEPS; each later step is then damaged a different way
(DAMAGE: every kind of file a checkpoint has: meta.json garbage or incomplete, the state or a DCP shard, a rank's
own file, the manifest, DCP's .metadata), and the resumed job must come back from step 1, having named every
problem and set every damaged folder aside, without hanging (the subprocess timeout would fail the test: a rank
entering DCP's collective load alone waits forever). Nothing before the resume's damage check may stop at a damaged
checkpoint: the pre-flight's checks read only meta.json that passed it (test_damaged_checkpoints.py, in-process).
"""

import json
import shutil

import pytest

from efa_training.checkpointing import format as checkpoint_format
from efa_training.checkpointing.format import step_of
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

STEPS = 13


def _shard(step_dir, strategy, rank):
    return step_dir / ("state.pt" if strategy == "ddp" else f"__{rank}_0.distcp")


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def _drop_meta_field(step_dir, field):
    meta = json.loads((step_dir / "meta.json").read_text())
    del meta[field]
    (step_dir / "meta.json").write_text(json.dumps(meta))


def _rewrite_manifest(step_dir, change):
    meta = json.loads((step_dir / "meta.json").read_text())
    change(meta["files"])
    (step_dir / "meta.json").write_text(json.dumps(meta))


def _own_file(strategy):  # the format's own file besides the shards: DDP's state, DCP's .metadata
    return "state.pt" if strategy == "ddp" else ".metadata"


def _damage_behind_the_manifest(step_dir, strategy):
    # Truncated, and the manifest rewritten to match: verification passes, the load itself fails (on DCP,
    # with a CheckpointException, which is a BaseException in torch 2.13), and every rank must agree on it.
    shard = _shard(step_dir, strategy, 1)
    _truncate(shard)
    meta = json.loads((step_dir / "meta.json").read_text())
    meta["files"][shard.name].update(checkpoint_format.file_record(shard))
    (step_dir / "meta.json").write_text(json.dumps(meta))


# kind: (damage, words the warning must contain, or those words by strategy)
DAMAGE = {
    "shard truncated": (lambda d, s: _truncate(_shard(d, s, 0)), "bytes, the manifest says"),
    "shard deleted": (lambda d, s: _shard(d, s, 1).unlink(), "No such file or directory"),
    "metadata deleted": (
        lambda d, s: (d / ("meta.json" if s == "ddp" else ".metadata")).unlink(),
        {"ddp": "meta.json is missing", "fsdp": ".metadata: No such file or directory"},
    ),
    "rank 1's own file damaged": (lambda d, s: _flip_bit(d / "rng_rank1.pt"), "rank 1: "),
    "bit flip": (lambda d, s: _flip_bit(_shard(d, s, 0)), "CRC-32 mismatch"),
    "incomplete meta.json": (lambda d, s: _drop_meta_field(d, "world_size"), "meta.json lacks or mistypes world_size"),
    "damaged behind the manifest": (_damage_behind_the_manifest, "loading failed: "),
    # The release 0.10.0 pre-flight read these before the resume's check: a traceback, or refused as release 0.8.0's.
    "garbage meta.json": (lambda d, s: (d / "meta.json").write_text("{not json!!"), "meta.json unreadable"),
    "meta.json of a step only": (
        lambda d, s: (d / "meta.json").write_text(json.dumps({"step": step_of(d)})),
        "meta.json lacks or mistypes format, world_size, config, files",
    ),
    "manifest lacks the own file": (
        lambda d, s: _rewrite_manifest(d, lambda files: files.pop(_own_file(s))),
        {"ddp": "incomplete: the manifest lacks state.pt", "fsdp": "incomplete: the manifest lacks .metadata"},
    ),
    "manifest's CRC changed": (
        lambda d, s: _rewrite_manifest(d, lambda files: files[_shard(d, s, 0).name].update(crc32=1)),
        "CRC-32 mismatch",
    ),
    "metadata damaged": (  # DCP's .metadata; DDP's metadata is meta.json itself
        lambda d, s: _flip_bit(d / ".metadata") if s == "fsdp" else _truncate(d / "meta.json"),
        {"ddp": "meta.json unreadable", "fsdp": ".metadata: CRC-32 mismatch"},
    ),
}
STEP_OF_KIND = {kind: STEPS - i for i, kind in enumerate(DAMAGE)}  # STEPS, STEPS - 1, ..., 2


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def trained(request, dataset, tmp_path_factory):
    def build(ckpt):
        run = th.torchrun(
            "train.py",
            [*th.train_args(dataset, ckpt, steps=STEPS, every=1, strategy=request.param), "--keep-last", str(STEPS)],
        )
        assert run.returncode == 0 and th.checkpoint_steps(ckpt) == list(range(1, STEPS + 1)), run.stderr[-3000:]
        return request.param, ckpt

    return th.shared(tmp_path_factory, f"damage-{request.param}", build)


@pytest.fixture(scope="module")
def resumed(trained, dataset, tmp_path_factory):
    strategy, clean = trained

    def build(workdir):
        ckpt = workdir / "ckpt"
        shutil.copytree(clean, ckpt)
        for kind, (damage, _) in DAMAGE.items():
            damage(ckpt / f"step_{STEP_OF_KIND[kind]:09d}", strategy)
        run = th.torchrun("train.py", th.train_args(dataset, ckpt, steps=2, every=1, strategy=strategy), timeout=180)
        return strategy, ckpt, run

    return th.shared(tmp_path_factory, f"damaged-{strategy}", build)


def test_resume_falls_back_past_every_damaged_checkpoint_without_hanging(resumed):
    _, ckpt, run = resumed
    assert run.returncode == 0 and f"resumed from {ckpt}/step_{1:09d}" in run.stderr, run.stderr[-4000:]


@pytest.mark.parametrize("kind", DAMAGE)
def test_each_damage_is_named_and_the_checkpoint_set_aside(resumed, kind):
    strategy, ckpt, run = resumed
    name = f"step_{STEP_OF_KIND[kind]:09d}"
    words = DAMAGE[kind][1]
    expected = words[strategy] if isinstance(words, dict) else words
    warnings = [line for line in run.stderr.splitlines() if f"{name} is damaged: " in line]
    assert warnings and expected in warnings[0], (kind, warnings, run.stderr[-3000:])
    assert (ckpt / f".damaged-{name}").is_dir()


def test_training_continues_into_a_complete_checkpoint(resumed):
    # The damaged step 2 was set aside, so the step saved after the resume takes its place, complete.
    strategy, ckpt, _ = resumed
    meta = checkpoint_format.verify(ckpt / f"step_{2:09d}", "full" if strategy == "ddp" else "dcp")
    assert meta["step"] == 2 and sorted(p.name for p in ckpt.glob("step_*")) == [f"step_{1:09d}", f"step_{2:09d}"]


def test_validation_skips_a_damaged_newest_checkpoint(trained, tmp_path, capsys):
    # Validation applies the same verification: a bit flip in the newest is skipped with a warning.
    from efa_training.workloads.gpt import saved_model

    _, clean = trained
    ckpt = tmp_path / "ckpt"
    shutil.copytree(clean, ckpt)
    _flip_bit(_shard(ckpt / f"step_{STEPS:09d}", trained[0], 0))
    _, meta, path = saved_model.find_and_load(ckpt)
    assert meta["step"] == STEPS - 1 and "CRC-32 mismatch" in capsys.readouterr().err


def test_validation_of_a_damaged_checkpoint_named_directly_is_an_error(trained, tmp_path):
    from efa_training.workloads.gpt import saved_model

    _, clean = trained
    step_dir = tmp_path / f"step_{STEPS:09d}"
    shutil.copytree(clean / step_dir.name, step_dir)
    (step_dir / "rng_rank1.pt").unlink()
    with pytest.raises(RuntimeError, match="is damaged: rng_rank1.pt: No such file"):
        saved_model.find_and_load(step_dir)
