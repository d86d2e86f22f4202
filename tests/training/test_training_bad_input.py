"""Bad input: one line on stderr naming the problem, exit code 2, no traceback.

The cases run train.main() in-process (a subprocess per case would add ~2 s of torch import
each); one case runs the real command line to show the same holds for `python train.py`.
"""

import subprocess

import numpy as np
import pytest

from efa_training import train
from tests.training import training_helpers as th


def _wrong_dtype_data(tmp_path):
    from efa_training.workloads.gpt import data

    d = tmp_path / "wrong_dtype"
    d.mkdir()
    tokens = np.arange(1000, dtype=np.uint32)
    with open(d / "train_000000.bin", "wb") as f:
        f.write(data.HEADER.pack(data.MAGIC, data.VERSION, 4, tokens.size) + tokens.tobytes())
    return d


def _empty_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    return tmp_path / "f"


def _checkpoints_of(tmp_path, strategy: str, model_name: str = "tiny"):
    """A checkpoint dir whose newest checkpoint's meta.json is what train.py writes for this strategy/model."""
    import json
    from dataclasses import asdict

    from efa_training.workloads.gpt import model

    d = tmp_path / "ckpt"
    (d / "step_000000004").mkdir(parents=True)
    meta = {
        "step": 4,
        "format": {"ddp": "full", "fsdp": "dcp"}[strategy],
        "world_size": 2,
        "files": {},
        "config": {
            "train": {"strategy": strategy, "model": model_name},
            "model": asdict(model.model_config(model_name)),
        },
    }
    # A manifest naming every file the format needs: the pre-flight reads only metas the damage check passes.
    from efa_training.checkpointing.format import required_files

    meta["files"] = {name: {"bytes": 0, "crc32": 0} for name in required_files(meta)}
    (d / "step_000000004" / "meta.json").write_text(json.dumps(meta))
    return d


def _shard_with_token(tmp_path, token: int, length: int = 1000):
    from efa_training.workloads.gpt import data

    d = tmp_path / f"token_{token}"
    d.mkdir()
    tokens = np.full(length, 7, dtype=np.uint16)
    tokens[length // 2] = token
    data.write_shard(d / "train_000000.bin", tokens)
    return d


CASES = {
    "missing data dir": (lambda tmp, ds: ["--data", str(tmp / "nope")], "--data="),
    "empty data dir": (lambda tmp, ds: ["--data", str(_empty_dir(tmp))], "no train_*.bin"),
    "wrong shard dtype": (lambda tmp, ds: ["--data", str(_wrong_dtype_data(tmp))], "uint16"),
    "unknown strategy": (lambda tmp, ds: ["--data", str(ds), "--strategy", "zero3"], "--strategy='zero3'"),
    "checkpoint dir is a file": (
        lambda tmp, ds: ["--data", str(ds), "--checkpoint-dir", str(_a_file(tmp))],
        "is a file",
    ),
    "zero max steps": (lambda tmp, ds: ["--data", str(ds), "--max-steps", "0"], "--max-steps=0"),
    "ddp checkpoints, fsdp run": (
        lambda tmp, ds: ["--data", str(ds), "--checkpoint-dir", str(_checkpoints_of(tmp, "ddp")), "--strategy", "fsdp"],
        "holds checkpoints of --strategy ddp",
    ),
    "fsdp checkpoints, ddp run": (
        lambda tmp, ds: ["--data", str(ds), "--checkpoint-dir", str(_checkpoints_of(tmp, "fsdp")), "--strategy", "ddp"],
        "holds checkpoints of --strategy fsdp",
    ),
    "tiny checkpoints, mini run": (
        lambda tmp, ds: [
            "--data",
            str(ds),
            "--checkpoint-dir",
            str(_checkpoints_of(tmp, "ddp", "tiny")),
            "--model",
            "mini",
        ],
        "holds checkpoints of --model tiny",
    ),
    "checkpoint dir not writable": (
        lambda tmp, ds: ["--data", str(ds), "--checkpoint-dir", str(_a_file(tmp) / "ckpt")],
        "not writable",
    ),
    "xla without torch_xla": (lambda tmp, ds: ["--data", str(ds), "--device", "xla"], "torch_xla"),
    "infinite lr": (lambda tmp, ds: ["--data", str(ds), "--lr", "inf"], "--lr=inf: not finite or out of range"),
    "nan weight decay": (lambda tmp, ds: ["--data", str(ds), "--weight-decay", "nan"], "--weight-decay=nan"),
    "nan grad clip": (lambda tmp, ds: ["--data", str(ds), "--grad-clip", "nan"], "--grad-clip=nan"),
    "seq len beyond the model's context": (
        lambda tmp, ds: ["--data", str(ds), "--seq-len", "100000"],
        "--seq-len=100000: outside the tiny model's context of 64",
    ),
    "seq len beyond the data": (
        lambda tmp, ds: ["--data", str(_shard_with_token(tmp, 7, length=40))],
        "only 40 tokens",
    ),
    "token id beyond the vocabulary": (
        lambda tmp, ds: ["--data", str(_shard_with_token(tmp, 400))],
        "train_000000.bin': holds token id 400, beyond the model's vocabulary",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_input_is_one_line_naming_the_problem(case, tmp_path, dataset, capsys):
    make_args, expected = CASES[case]
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--checkpoint-dir", str(tmp_path / "ckpt"), "--max-steps", "5", *make_args(tmp_path, dataset)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and expected in lines[0], lines


@pytest.mark.slow
def test_command_line_bad_input_has_no_traceback(tmp_path):
    p = subprocess.run(
        [
            th.PYTHON,
            *th.script_args("train.py"),
            "--data",
            str(tmp_path / "nope"),
            "--checkpoint-dir",
            str(tmp_path / "c"),
            "--max-steps",
            "5",
        ],
        env=th.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stderr.count("\n"), "Traceback" in p.stderr) == (2, 1, False), p.stderr
