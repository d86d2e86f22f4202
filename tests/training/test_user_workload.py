"""Your own code under the platform (efa_training/runtime/user_workload.py): the declaration the image reads is the
one synth checked, the environment each launch mode gives, the metrics read from log lines, and the validation gate.
One real run: the platform's torchrun starts a plain script (no torch import) on 2 processes; its exit code 2 (bad
input: not retried) comes back through the relay as 2, not torchrun's 1."""

import json
import math
import subprocess
from pathlib import Path

import pytest

from contracts.workload import LAUNCHES as DECLARED_LAUNCHES
from contracts.workload import parse_workload
from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import rendezvous
from efa_training.runtime.metrics import parse_emf_lines
from efa_training.runtime.report import report_metrics
from efa_training.runtime.user_workload import (
    LAUNCHES,
    UserWorkload,
    contract_environment,
    gate,
    node_environment,
    train_command,
)
from efa_training.runtime.workload_metrics import LogMetrics
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

DECLARATION = {
    "image": {"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v1"},
    "train": ["python", "train.py", "--fast"],
    "validate": ["python", "evaluate.py"],
    "metric": {"name": "eval_loss", "direction": "lower"},
    "metrics": {"loss": r"loss=([-0-9.eE+naif]+)", "tokens_per_s": r"tok/s=([0-9.]+)"},
}


def _workload(launch: str = "torchrun", direction: str = "lower") -> UserWorkload:
    declared = parse_workload(
        "my-llm", {**DECLARATION, "launch": launch, "metric": {"name": "eval_loss", "direction": direction}}, Path(".")
    )
    return UserWorkload.from_json(json.dumps(declared.as_json()))


def _plan(
    nodes: int = 2, rank: int = 1, nproc: int = 2, port: int = 29500, master: str = "10.0.0.5"
) -> rendezvous.LaunchPlan:
    env = {
        "ACCELERATORS_PER_NODE": str(nproc),
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "PET_NNODES": str(nodes),
        "PET_NODE_RANK": str(rank),
        "RUN_ID": "byoc",
        "MAX_RESTARTS": "0",
    }
    return rendezvous.plan_launch("train", env, own_address="127.0.0.1")


# The image reads what synth checked: the declaration's JSON round-trips, and both sides know the same launch modes.
def test_the_image_reads_the_declaration_synth_checked():
    workload = _workload()
    assert LAUNCHES == DECLARED_LAUNCHES
    assert (workload.train, workload.metric, workload.direction) == (
        ("python", "train.py", "--fast"),
        "eval_loss",
        "lower",
    )
    with pytest.raises(UsageError, match="WORKLOAD"):
        UserWorkload.from_json('{"name": "x"}')


# The hang watchdog's floor: the declaration's, else the one default both sides know.
def test_the_declared_hang_timeout_reaches_the_watchdog():
    from contracts.workload import HANG_TIMEOUT_DEFAULT
    from efa_training.runtime.launch.watchdog import DEFAULT_FLOOR_SECONDS, Watchdog

    assert _workload().hang_timeout_seconds == HANG_TIMEOUT_DEFAULT == DEFAULT_FLOOR_SECONDS
    declared = parse_workload("slow-saves", {**DECLARATION, "hang_timeout_seconds": 7200}, Path("."))
    assert Watchdog.from_env({}, UserWorkload.from_json(declared.variable).hang_timeout_seconds).floor == 7200
    assert Watchdog.from_env({"HANG_TIMEOUT_SECONDS": "3"}, 7200).floor == 3  # the job's own setting wins


# Every mode gets the run id, the hyperparameters as a JSON file, and the checkpoint, data and model folders.
def test_the_contract_environment_names_the_runs_files_and_folders(tmp_path):
    env = contract_environment(
        run_id="run-1",
        hyperparameters={"lr": 0.001, "max_steps": 10},
        run_dir=tmp_path / "run",
        checkpoint_dir=tmp_path / "ckpt",
        data_dir=tmp_path / "data",
    )
    assert json.loads(Path(env["HYPERPARAMETERS_FILE"]).read_text()) == {"lr": 0.001, "max_steps": 10}
    assert env["RUN_ID"] == "run-1" and Path(env["CHECKPOINT_DIR"]).is_dir() and Path(env["MODEL_DIR"]).is_dir()
    assert (env["HP_LR"], env["HP_MAX_STEPS"]) == ("0.001", "10")  # each one as a variable too (its JSON text)


def test_each_hyperparameter_is_a_variable_a_string_as_it_is(tmp_path):
    folders = {"run_dir": tmp_path / "r", "checkpoint_dir": tmp_path / "c", "data_dir": tmp_path / "d"}
    env = contract_environment(run_id="r", hyperparameters={"optimizer": "adamw", "fused": True}, **folders)
    assert (env["HP_OPTIMIZER"], env["HP_FUSED"]) == ("adamw", "true")


# torchrun gives each worker its ranks; a per-node launcher gets the node's place and the address; one process per
# node is rank = node rank.
def test_each_launch_mode_gets_the_ranks_it_needs():
    plan = _plan(nodes=2, rank=1, nproc=8)
    assert node_environment(_workload("torchrun"), plan) == {}
    per_node = node_environment(_workload("per-node"), plan)
    assert per_node == {
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "NNODES": "2",
        "NPROC_PER_NODE": "8",
    }
    one = node_environment(_workload("one-process"), plan)
    assert (one["RANK"], one["WORLD_SIZE"], one["LOCAL_RANK"]) == ("1", "2", "0")


# torchrun runs the declared command in every worker behind the exit relay, with the platform's rendezvous (is_host by
# node rank).
def test_torchrun_runs_the_declared_command_with_the_platforms_rendezvous():
    plan = _plan()
    command = train_command(_workload(), plan)
    assert command[-6:] == ["-m", "efa_training.runtime.exit_relay", "--command", "python", "train.py", "--fast"]
    assert command[command.index("--rdzv-conf") + 1].startswith("is_host=false")
    assert train_command(_workload("per-node"), plan) == ["python", "train.py", "--fast"]


# A matched log line becomes an EMF line with the environment and run id; a NaN is left out, never sent.
def test_log_lines_become_metrics():
    lines: list[str] = []
    metrics = LogMetrics(_workload(), "run-1", "dev", emit=lines.append)
    assert metrics.feed("step 10 loss=2.5 tok/s=1234.5") == {"loss": 2.5, "tokens_per_s": 1234.5}
    assert metrics.feed("step 11 loss=nan") == {} and metrics.feed("nothing here") == {}
    (record,) = parse_emf_lines(lines)
    assert (record["Environment"], record["RunId"], record["loss"]) == ("dev", "run-1", 2.5)
    assert record["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Environment", "RunId"]]


# Code that reports its own metrics (efa_training.runtime.report) needs no regex: the launcher reads the helper's line
# into the same metrics; a NaN is left out, a bad name or a value that is not a number is the caller's error at once.
def test_metrics_reported_through_the_helper_become_metrics_without_a_regex(capsys):
    report_metrics(step=20, loss=1.25, grad_norm=math.nan)
    line = capsys.readouterr().out
    assert line == 'efa-training-metrics {"step": 20.0, "loss": 1.25}\n'
    lines: list[str] = []
    bare = UserWorkload.from_json(parse_workload("bare", {**DECLARATION, "metrics": {}}, Path(".")).variable)
    assert LogMetrics(bare, "run-1", "dev", emit=lines.append).feed(line) == {"loss": 1.25}
    (record,) = parse_emf_lines(lines)
    assert record["loss"] == 1.25 and record["RunId"] == "run-1" and record["Step"] == 20
    with pytest.raises(ValueError, match="metric name 'a b'"):
        report_metrics(**{"a b": 1.0})
    with pytest.raises(TypeError, match="loss='x' is not a number"):
        report_metrics(loss="x")  # type: ignore[arg-type]


def _written(tmp_path: Path, value) -> Path:
    (tmp_path / "metrics.json").write_text(
        json.dumps({"eval_loss": value}) if value != "raw-nan" else '{"eval_loss": NaN}'
    )
    return tmp_path


# The gate compares in the declared direction within the relative tolerance.
@pytest.mark.parametrize(
    ("direction", "value", "passed"),
    [("lower", 3.2032, True), ("lower", 3.21, False), ("higher", 3.1968, True), ("higher", 3.19, False)],
)
def test_the_gate_compares_in_the_declared_direction(tmp_path, direction, value, passed):
    verdict = gate(_workload(direction=direction), _written(tmp_path, value), baseline=3.2, tolerance=0.001)
    assert verdict["passed"] is passed and verdict["direction"] == direction


# A metric that is missing, NaN or not a number never passes; a missing file is one line naming it.
@pytest.mark.parametrize("value", [None, "raw-nan", "3.1", True])
def test_a_missing_or_non_finite_metric_never_passes(tmp_path, value):
    verdict = gate(_workload(), _written(tmp_path, value), baseline=3.2, tolerance=0.5)
    assert verdict["passed"] is False and "eval_loss" in verdict["reason"]


def test_no_metrics_file_is_a_usage_error_naming_it(tmp_path):
    with pytest.raises(UsageError, match=r"metrics\.json.*wrote no metrics file"):
        gate(_workload(), tmp_path, baseline=3.2, tolerance=0.001)


# With no baseline the run's own value becomes it (an environment's first run).
def test_without_a_baseline_the_value_becomes_it(tmp_path):
    verdict = gate(_workload(), _written(tmp_path, 2.75), baseline=None, tolerance=0.001)
    assert verdict["passed"] and math.isclose(verdict["baseline"], 2.75)


USER_SCRIPT = """
import json, os, sys
hyper = json.load(open(os.environ["HYPERPARAMETERS_FILE"]))
# One write per line: the two workers share one pipe, and unbuffered print writes the text and its newline apart.
sys.stdout.write(f"rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} run={os.environ['RUN_ID']} "
                 f"lr={hyper['lr']} ckpt={os.path.isdir(os.environ['CHECKPOINT_DIR'])} loss=1.5\\n")
sys.stdout.flush()
sys.exit(2 if hyper.get("refuse") else 0)
"""


def _run_plain(tmp_path: Path, hyperparameters: dict) -> subprocess.CompletedProcess:
    """`launch.py train` as the job runs it, with the declaration in WORKLOAD: 2 processes on this node."""
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    declared = parse_workload("plain", {**DECLARATION, "train": [th.PYTHON, str(script)]}, Path("."))
    folders = ["--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "run")]
    return subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "train", "--run-id", "run-1", *folders]
        + ["--hyperparameters", json.dumps(hyperparameters)],
        env=th.env(
            WORKLOAD=json.dumps(declared.as_json()),
            ACCELERATORS_PER_NODE="2",
            MASTER_PORT=str(th.free_port()),
            MAX_RESTARTS="0",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )


# For real, through launch.py: the platform's torchrun starts a plain script (not Python code of ours) on 2 processes
# with the contract's environment; each worker sees its rank, the world size, the run id and the hyperparameters file,
# and the loss it prints becomes a metric.
def test_the_platforms_torchrun_runs_a_plain_script_with_the_contract(tmp_path):
    done = _run_plain(tmp_path, {"lr": 0.001})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = sorted(line.split(" loss=")[0] for line in done.stdout.splitlines() if line.startswith("rank="))
    assert seen == [f"rank={r} world=2 run=run-1 lr=0.001 ckpt=True" for r in (0, 1)]
    # The declared regex read the printed loss: one EMF line per matching line, with the run id.
    records = parse_emf_lines(done.stdout.splitlines())
    assert [(r["RunId"], r["loss"]) for r in records] == [("run-1", 1.5), ("run-1", 1.5)]


# A script that exits 2 (its input is wrong) ends the job with 2, which the pipeline does not retry; torchrun alone
# would have said 1, an attempt failure.
def test_a_scripts_own_refusal_reaches_the_job_as_its_code(tmp_path):
    done = _run_plain(tmp_path, {"lr": 0.001, "refuse": True})
    assert done.returncode == 2, done.stderr[-2000:]


EVALUATE_SCRIPT = """
import json, os, sys
hyper = json.load(open(os.environ["HYPERPARAMETERS_FILE"]))
if hyper.get("write", True):
    with open(os.path.join(os.environ["MODEL_DIR"], "metrics.json"), "w") as f:
        f.write('{"eval_loss": %s}' % hyper["eval_loss"])
"""


def _validate(tmp_path: Path, hyperparameters: dict, baseline: str = "3.2", **env: str) -> subprocess.CompletedProcess:
    """`launch.py validate` with a declared workload whose evaluate script writes what `hyperparameters` say."""
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATE_SCRIPT)
    declared = parse_workload("plain", {**DECLARATION, "validate": [th.PYTHON, str(script)]}, Path("."))
    folders = ["--data", str(tmp_path), "--checkpoint-dir", str(tmp_path / "c"), "--run-dir", str(tmp_path / "run")]
    return subprocess.run(
        [th.PYTHON, str(th.TRAINING_IMAGE / "launch.py"), "validate", "--run-id", "run-1", *folders]
        + ["--hyperparameters", json.dumps(hyperparameters), "--baseline", baseline, "--tolerance", "0.001"]
        + ["--verdict", str(tmp_path / "verdict.json")],
        env=th.env(WORKLOAD=json.dumps(declared.as_json()), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


# In a deployed environment the validation runs as the launcher's child, the launcher saying meanwhile that its node
# is up but not training (runtime/launch/stage_heartbeat.py: the idle alarm does not page during a validation); the
# verdict and the exit code are the same as without it.
def test_a_validation_in_a_deployed_environment_says_its_node_is_not_training(tmp_path):
    done = _validate(tmp_path, {"eval_loss": "3.25"}, TRAINING_ENVIRONMENT="dev")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "verdict.json").read_text())["passed"] is False
    (beat,) = [r for r in parse_emf_lines(done.stdout.splitlines()) if "NotTraining" in r]
    assert (beat["NotTraining"], beat["Stage"], beat["Environment"]) == (1, "validate", "dev")


# launch.py validate runs the declared command, then the gate, and writes the verdict where the pipeline reads it.
@pytest.mark.parametrize(("value", "passed"), [("3.2031", True), ("3.25", False), ("NaN", False)])
def test_launch_validate_runs_the_command_and_the_gate(tmp_path, value, passed):
    done = _validate(tmp_path, {"eval_loss": value})
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["passed"] is passed and verdict["metric"] == "eval_loss"


# A validate command that writes no metrics file fails validation with one line naming the file it expected.
def test_launch_validate_without_a_metrics_file_names_it(tmp_path):
    done = _validate(tmp_path, {"write": False})
    assert done.returncode == 2 and str(tmp_path / "run" / "model" / "metrics.json") in done.stderr
    assert not (tmp_path / "verdict.json").exists()


# A metrics file left in MODEL_DIR by an earlier run or attempt is not this validation's: the gate never judges it
# (here it would pass, 3.2 against 3.2, while this validation wrote nothing).
def test_a_metrics_file_an_earlier_validation_left_is_never_judged(tmp_path):
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "metrics.json").write_text('{"eval_loss": 3.2}')
    done = _validate(tmp_path, {"write": False})
    assert done.returncode == 2 and "wrote no metrics file" in done.stderr
    assert not (tmp_path / "verdict.json").exists()
