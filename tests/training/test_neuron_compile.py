"""`launch.py compile`: ahead-of-time compilation for Trainium, checked without Trainium.

neuron_parallel_compile exists only in the Neuron image, so these tests check what the launcher asks of it (Neuron
docs, "PyTorch NeuronX neuron_parallel_compile CLI": `neuron_parallel_compile <torchrun command of a short run>`,
the cache in NEURON_COMPILE_CACHE_URL) and run main() against a stand-in of the tool that records its call.
"""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from config.environment import DEFAULT_NEURON_CC_FLAGS
from config.layout import NEURON_CACHE_PREFIX
from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import cli, neuron_compile
from efa_training.runtime.launch import command as launch_command

RUN_FLAGS = [
    "--checkpoints-root",
    "/fsx/checkpoints",
    "--run-id",
    "run-7",
    "--max-steps",
    "5000",
    "--checkpoint-every",
    "0",
    "--model",
    "125m",
    "--strategy",
    "ddp",
    "--batch-size",
    "4",
    "--seed",
    "1",
]


def _env(tmp_path: Path, **extra: str) -> dict:
    return {"ACCELERATOR_KIND": "neuron", "ACCELERATORS_PER_NODE": "32", "FSX_MOUNT": str(tmp_path), **extra}


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_compile_wraps_a_short_torchrun_of_the_runs_training_in_neuron_parallel_compile(tmp_path):
    prepared = launch_command.prepare("compile", RUN_FLAGS, _env(tmp_path))
    command = prepared.command
    assert command[:3] == ["neuron_parallel_compile", sys.executable, "-m"] and "torch.distributed.run" in command
    args = command[command.index("efa_training.train") + 1 :]
    assert _flag(args, "--max-steps") == str(neuron_compile.COMPILE_STEPS)
    assert (_flag(args, "--model"), _flag(args, "--batch-size"), _flag(args, "--strategy")) == ("125m", "4", "ddp")


def test_the_trial_run_never_touches_the_runs_checkpoints_or_metrics(tmp_path):
    # Neuron docs: the trial run's outputs are invalid; a checkpoint of it in the run's folder would be resumed.
    args = launch_command.prepare("compile", RUN_FLAGS, _env(tmp_path)).command
    assert "--checkpoints-root" not in args and args.count("--run-id") == 1 and args.count("--max-steps") == 1
    assert _flag(args, "--run-id") == "run-7-compile"
    assert Path(_flag(args, "--checkpoint-dir")).is_relative_to(tmp_path / "neuron-cache" / "scratch")
    assert int(_flag(args, "--checkpoint-every")) > neuron_compile.COMPILE_STEPS


def test_compile_and_train_read_the_same_cache_on_the_shared_file_system(tmp_path):
    for mode in ("compile", "train"):
        env = launch_command.prepare(mode, RUN_FLAGS, _env(tmp_path)).env
        assert env["NEURON_COMPILE_CACHE_URL"] == str(tmp_path / "neuron-cache")


def test_sagemakers_file_system_channel_can_hold_the_cache(tmp_path):
    env = launch_command.prepare(
        "compile", RUN_FLAGS, _env(tmp_path, NEURON_CACHE_ROOT="/opt/ml/input/data/fsx/cache")
    ).env
    assert env["NEURON_COMPILE_CACHE_URL"] == "/opt/ml/input/data/fsx/cache"


def test_only_trainium_compiles_ahead_of_time(tmp_path):
    with pytest.raises(UsageError, match="only Trainium"):
        launch_command.prepare("compile", RUN_FLAGS, {**_env(tmp_path), "ACCELERATOR_KIND": "gpu"})


def _key(args: list[str], env: dict, nodes: str = "2", workers: int = 32) -> str:
    return neuron_compile.shape_key(neuron_compile.shape(args, env, nodes, workers))


def _with(flag: str, value: str) -> list[str]:
    args = list(RUN_FLAGS)
    args[args.index(flag) + 1] = value
    return args


def test_a_changed_model_shape_or_compiler_flags_compiles_afresh():
    env = {"NEURON_CC_FLAGS": DEFAULT_NEURON_CC_FLAGS}
    key = _key(RUN_FLAGS, env)
    assert _key(_with("--model", "350m"), env) != key
    assert _key(_with("--batch-size", "8"), env) != key
    assert _key(RUN_FLAGS, {"NEURON_CC_FLAGS": "--model-type=transformer -O2"}) != key
    assert _key(RUN_FLAGS, env, nodes="4") != key and _key(RUN_FLAGS, env, workers=64) != key


def test_what_does_not_change_a_graph_reuses_the_cache():
    env = {"NEURON_CC_FLAGS": DEFAULT_NEURON_CC_FLAGS}
    key = _key(RUN_FLAGS, env)
    for flag, value in (("--seed", "2"), ("--max-steps", "9"), ("--run-id", "run-8"), ("--checkpoint-every", "50")):
        assert _key(_with(flag, value), env) == key, flag


@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    """A stand-in neuron_parallel_compile on PATH: records its arguments and the cache it was given."""
    folder = tmp_path / "bin"
    folder.mkdir()
    calls = tmp_path / "calls.jsonl"
    tool = folder / "neuron_parallel_compile"
    tool.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], "
        "'cache': os.environ.get('NEURON_COMPILE_CACHE_URL')}) + '\\n')\n"
        "sys.exit(int(os.environ.get('FAKE_COMPILE_EXIT', '0')))\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    for name, value in _env(tmp_path).items():
        monkeypatch.setenv(name, value)
    return calls


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_successful_compile_marks_the_run_shape_ready_and_the_next_one_skips(fake_tool, tmp_path):
    assert cli.main(["compile", *RUN_FLAGS]) == 0
    (call,) = _calls(fake_tool)
    assert call["cache"] == str(tmp_path / "neuron-cache")
    markers = list((tmp_path / "neuron-cache" / "ready").glob("*.json"))
    assert len(markers) == 1 and json.loads(markers[0].read_text())["flags"]["--model"] == "125m"
    assert cli.main(["compile", *RUN_FLAGS]) == 0
    assert len(_calls(fake_tool)) == 1  # the second compile job found the cache ready and ran nothing


def test_a_failed_compile_leaves_no_marker_and_fails_the_job(fake_tool, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_COMPILE_EXIT", "7")
    assert cli.main(["compile", *RUN_FLAGS]) == 7
    assert not (tmp_path / "neuron-cache" / "ready").exists()


def test_the_image_keeps_its_cache_where_the_layout_says():
    assert neuron_compile.CACHE_DIR_NAME + "/" == NEURON_CACHE_PREFIX
