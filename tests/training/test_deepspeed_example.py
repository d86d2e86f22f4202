"""examples/deepspeed_zero, a DeepSpeed ZeRO stage-2 script that imports nothing of the platform, runs through the
contract on CPU with real processes (DeepSpeed's CPU accelerator, gloo): declared (the declaration synth checks),
trained by the platform's launcher and torchrun on 2 processes, resumed by a second run from its own checkpoint, and
validated through the gate in one process from the ZeRO shards. One first run serves the three tests; the resume
runs on a copy of its checkpoints. GPU runs (NCCL, DeepSpeed's CUDA accelerator) are not exercised here. (Its save
on SIGTERM is in train.py but not tested here: the DDP example's SIGTERM test through launch.py, torchrun and the
relay failed under CI load, see test_example_workloads.py.)"""

import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from efa_training.runtime.metrics import parse_emf_lines
from tests.training import example_runs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "deepspeed_zero"
FIRST_STEPS, RESUMED_STEPS = 30, 40
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example-deepspeed")]


def _launch(folder: Path, mode: str, *args: str) -> list[str]:
    return example_runs.launch(folder, mode, *args)


def _env() -> dict:
    return example_runs.job_env("deepspeed-zero", 2, CUDA_VISIBLE_DEVICES="")


@dataclass(frozen=True)
class Run:
    folder: Path  # --data; checkpoints in c/, the run's folder in run/
    done: subprocess.CompletedProcess


def _train(folder: Path, hyperparameters: dict) -> Run:
    command = _launch(folder, "train", "--hyperparameters", json.dumps(hyperparameters))
    done = subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return Run(folder, done)


def _latest(run: Run) -> str:
    return (run.folder / "c" / "latest").read_text()


def _losses(run: Run) -> list[float]:
    return [record["loss"] for record in parse_emf_lines(run.done.stdout.splitlines())]


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Run:
    """ZeRO stage 2 (the declaration's default) for 30 steps, a checkpoint every 10."""
    return _train(tmp_path_factory.mktemp("deepspeed-first"), {"max_steps": FIRST_STEPS, "checkpoint_every": 10})


# Trained for real on 2 processes through the launcher: each wrote its own ZeRO shard of the optimizer state, and
# its printed loss (every 10 steps) became metrics that fall.
def test_the_deepspeed_example_trains_with_zero_2_on_two_processes(first):
    assert _latest(first) == f"step_{FIRST_STEPS}"
    shards = sorted(p.name for p in (first.folder / "c" / f"step_{FIRST_STEPS}").glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    losses = _losses(first)
    assert len(losses) == FIRST_STEPS // 10 and losses[-1] < losses[0]


# A second run with more steps (a later attempt, or the run extended) resumes from the first's checkpoint: it
# trains only the steps after it and ends at its own max_steps.
def test_the_deepspeed_example_resumes_from_its_own_checkpoint(first, tmp_path):
    shutil.copytree(first.folder / "c", tmp_path / "c")  # the first run's checkpoints stay as the other tests read them
    second = _train(tmp_path, {"max_steps": RESUMED_STEPS, "checkpoint_every": 10})
    assert f"resumed from step={FIRST_STEPS}" in second.done.stdout
    assert len(_losses(second)) == (RESUMED_STEPS - FIRST_STEPS) // 10  # steps 31-40 only
    assert _latest(second) == f"step_{RESUMED_STEPS}"


# Validated through the gate, in one process and without a DeepSpeed engine: the model rebuilt from the 2 ranks'
# ZeRO shards, its eval_loss finite, the first run of an environment (no baseline) accepted.
def test_the_deepspeed_example_is_validated_from_its_zero_shards(first):
    verdict = first.folder / "verdict.json"
    command = _launch(first.folder, "validate", "--baseline", "none", "--verdict", str(verdict))
    done = subprocess.run(command, cwd=EXAMPLE, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(verdict.read_text())
    assert result["metric"] == "eval_loss" and math.isfinite(result["value"]) and result["passed"] is True
    model = torch.load(first.folder / "run" / "model" / "model.pt")  # a plain state dict: the whole MLP
    assert {name: tuple(t.shape) for name, t in model.items()} == {
        "0.weight": (64, 8),
        "0.bias": (64,),
        "2.weight": (1, 64),
        "2.bias": (1,),
    }
