"""A declaration's hyperparameters as command-line flags (`"hyperparameters_as": "flags"`, SageMaker's entry-point
form), and the launcher run by hand with a declaration pasted as cdk.json writes it (docs/workloads.md)."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from contracts.workload import HYPERPARAMETERS_AS as DECLARED_AS
from contracts.workload import WorkloadError, parse_workload
from efa_training.runtime.launch import rendezvous
from efa_training.runtime.user_workload import HYPERPARAMETERS_AS, UserWorkload, train_command
from tests.training import training_helpers as th

ROOT = Path(__file__).resolve().parents[2]
DECLARATION = {
    "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v1"},
    "train": ["python", "train.py"],
    "validate": ["python", "evaluate.py"],
    "metric": {"name": "eval_loss", "direction": "lower"},
}
HYPERPARAMETERS = {"lr": 0.001, "max_steps": 10, "optimizer": "adamw", "fused": True}
FLAGS = ["--lr", "0.001", "--max_steps", "10", "--optimizer", "adamw", "--fused", "true"]


def _workload(launch: str, given_as: str | None) -> UserWorkload:
    raw = {**DECLARATION, "launch": launch, **({"hyperparameters_as": given_as} if given_as else {})}
    return UserWorkload.from_json(parse_workload("argv", raw, Path(".")).variable)


def _plan() -> rendezvous.LaunchPlan:
    env = {"ACCELERATORS_PER_NODE": "2", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "PET_NNODES": "2",
           "PET_NODE_RANK": "0", "RUN_ID": "argv", "MAX_RESTARTS": "0"}  # fmt: skip
    return rendezvous.plan_launch("train", env, own_address="127.0.0.1")


def test_both_sides_know_the_same_ways_to_pass_hyperparameters():
    assert HYPERPARAMETERS_AS == DECLARED_AS


# The flags follow the declared command, under the platform's torchrun and the workload's own launcher alike.
@pytest.mark.parametrize("launch", ["torchrun", "per-node", "one-process"])
def test_flags_follow_the_train_command_in_every_launch_mode(launch):
    command = train_command(_workload(launch, "flags"), _plan(), HYPERPARAMETERS)
    assert command[-10:] == ["python", "train.py", *FLAGS]


def test_without_flags_the_command_is_as_declared():
    assert train_command(_workload("per-node", None), _plan(), HYPERPARAMETERS) == ["python", "train.py"]


def test_an_unknown_way_is_refused_at_synth_in_one_line():
    with pytest.raises(WorkloadError) as refused:
        parse_workload("argv", {**DECLARATION, "hyperparameters_as": "argv"}, Path("."))
    assert str(refused.value) == "workloads.argv.hyperparameters_as='argv' is not valid; expected file or flags"


ARGPARSE_SCRIPT = """
import argparse
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--max_steps", type=int, required=True)
args = p.parse_args()
print(f"lr={args.lr} max_steps={args.max_steps}", flush=True)
"""


# For real, through launch.py: an argparse script (no wrapper) reads the run's hyperparameters as its own flags; the
# declaration is pasted as cdk.json writes it (no name, launch defaulted), as the docs' recipe says.
def test_an_argparse_script_reads_the_runs_hyperparameters_as_flags(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ARGPARSE_SCRIPT)
    pasted = {**DECLARATION, "launch": "one-process", "train": [th.PYTHON, str(script)], "hyperparameters_as": "flags"}
    folders = ["--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", "--run-id", "run-1", *folders]
        + ["--hyperparameters", json.dumps({"lr": 0.5, "max_steps": 3})],
        env=th.env(WORKLOAD=json.dumps(pasted), ACCELERATORS_PER_NODE="1", MASTER_PORT=str(th.free_port())),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lr=0.5 max_steps=3" in done.stdout.splitlines()


# docs/workloads.md's declaration example, pasted into WORKLOAD for the launcher as its recipe says, is read.
def test_the_docs_declaration_is_what_the_launcher_recipe_reads():
    text = (ROOT / "docs" / "workloads.md").read_text()
    block = re.search(r"## Declaring a workload.*?```json\n(.*?)```", text, re.S)
    assert block
    declared = json.loads("{" + block.group(1) + "}")["workloads"]["my-llm"]
    workload = UserWorkload.from_json(json.dumps(declared))
    assert (workload.launch, workload.train, workload.metric) == ("torchrun", ("python", "train.py"), "eval_loss")
