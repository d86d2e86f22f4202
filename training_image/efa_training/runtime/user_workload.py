"""Your own training code under the platform (docs/workloads.md): what it is given, how each launch mode starts it,
and the validation gate over the metrics file it writes (the metrics read from its log lines: workload_metrics.py).

The declaration arrives as JSON in the WORKLOAD environment variable (contracts/workload.py `Workload.as_json`,
checked at synth; read again here, since the image cannot import the CDK side). Standard library only.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from efa_training.runtime.errors import EXIT_STOPPED, UsageError
from efa_training.runtime.launch.rendezvous import LaunchPlan
from efa_training.runtime.launch.watchdog import DEFAULT_FLOOR_SECONDS
from efa_training.runtime.run_paths import flag_value

WORKLOAD_VARIABLE = "WORKLOAD"
LAUNCHES = ("torchrun", "per-node", "one-process")  # contracts/workload.py LAUNCHES (a test holds them equal)
METRICS_FILE = "metrics.json"  # what the validate command writes in MODEL_DIR
HYPERPARAMETERS_FILE = "hyperparameters.json"
HYPERPARAMETERS_AS = ("file", "flags")  # contracts/workload.py HYPERPARAMETERS_AS (a test holds them equal)


@dataclass(frozen=True)
class UserWorkload:
    name: str
    launch: str
    train: tuple[str, ...]
    validate: tuple[str, ...]
    metric: str
    direction: str  # "lower" or "higher": which way the metric is better
    metrics: Mapping[str, re.Pattern]
    hang_timeout_seconds: float = DEFAULT_FLOOR_SECONDS  # contracts/workload.py HANG_TIMEOUT_DEFAULT (tests: equal)
    hyperparameters_as: str = HYPERPARAMETERS_AS[0]

    @classmethod
    def from_json(cls, text: str) -> UserWorkload:
        """The job's WORKLOAD (contracts/workload.py `as_json`), or a declaration as cdk.json writes it (no name,
        launch defaulted, fields the image does not read): what a person running the launcher by hand pastes."""
        try:
            raw = json.loads(text)
            workload = cls(
                name=str(raw.get("name", "local")),
                launch=raw.get("launch", LAUNCHES[0]),
                train=tuple(raw["train"]),
                validate=tuple(raw["validate"]),
                metric=raw["metric"]["name"],
                direction=raw["metric"]["direction"],
                metrics={name: re.compile(regex) for name, regex in raw.get("metrics", {}).items()},
                hang_timeout_seconds=float(raw.get("hang_timeout_seconds", DEFAULT_FLOOR_SECONDS)),
                hyperparameters_as=raw.get("hyperparameters_as", HYPERPARAMETERS_AS[0]),
            )
        except (ValueError, KeyError, TypeError, AttributeError, re.error) as error:
            raise UsageError(WORKLOAD_VARIABLE, text[:60], f"not a workload declaration ({error!r})") from None
        known = (workload.launch in LAUNCHES, workload.direction in ("lower", "higher"))
        if not all(known) or workload.hyperparameters_as not in HYPERPARAMETERS_AS:
            raise UsageError(
                WORKLOAD_VARIABLE, text[:60], "launch, metric direction or hyperparameters_as unknown",
                f"launch {' | '.join(LAUNCHES)}, direction lower | higher, hyperparameters_as file | flags",
            )  # fmt: skip
        return workload


def contract_environment(
    *,
    run_id: str,
    hyperparameters: Mapping,
    run_dir: Path,
    checkpoint_dir: Path,
    data_dir: Path,
    model_dir: Path | None = None,
) -> dict[str, str]:
    """The variables every launch mode gives the code; writes the hyperparameters file into `run_dir`, and gives each
    hyperparameter as HP_<NAME> too (its JSON text; a string as it is). The model goes to `model_dir` (default:
    `run_dir`/model; on SageMaker /opt/ml/model, which it uploads)."""
    model_dir = model_dir or run_dir / "model"
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    hyperparameters_file = run_dir / HYPERPARAMETERS_FILE
    hyperparameters_file.write_text(json.dumps(dict(hyperparameters), sort_keys=True))
    return {
        "RUN_ID": run_id,
        "HYPERPARAMETERS_FILE": str(hyperparameters_file),
        "CHECKPOINT_DIR": str(checkpoint_dir),
        "DATA_DIR": str(data_dir),
        "MODEL_DIR": str(model_dir),
        **{f"HP_{name.upper()}": as_text(value) for name, value in hyperparameters.items()},
    }


def as_text(value: object) -> str:
    """A hyperparameter as a variable or flag carries it: its JSON text, a string as it is (`true`, `adamw`)."""
    return value if isinstance(value, str) else json.dumps(value)


def hyperparameter_flags(workload: UserWorkload, hyperparameters: Mapping) -> list[str]:
    """`--<name> <value>` per hyperparameter where the declaration asks for flags (SageMaker's entry-point form: the
    name as declared, so argparse reads `--max_steps`); none otherwise."""
    if workload.hyperparameters_as != "flags":
        return []
    return [item for name, value in hyperparameters.items() for item in (f"--{name}", as_text(value))]


def prepare_run(args: list[str], env: Mapping[str, str]) -> tuple[UserWorkload, str, dict[str, str]]:
    """The declaration (WORKLOAD), the run id and the contract's environment from the job's flags: --run-id,
    --hyperparameters (a JSON object), --data/--dataset, --checkpoint-dir, --run-dir, --model-dir (else the FSx
    layout)."""
    workload = UserWorkload.from_json(env.get(WORKLOAD_VARIABLE, ""))
    run_id = flag_value(args, "--run-id") or env.get("RUN_ID")
    if not run_id:
        raise UsageError("--run-id", None, "a declared workload's run needs its id", "--run-id <run id>")
    text = flag_value(args, "--hyperparameters") or "{}"
    try:
        hyperparameters = json.loads(text)
    except ValueError:
        hyperparameters = None
    if not isinstance(hyperparameters, dict):
        raise UsageError("--hyperparameters", text[:60], "not a JSON object", '{"lr": 0.001}')
    fsx = Path(env.get("FSX_MOUNT", "/fsx"))
    dataset = (flag_value(args, "--dataset") or "").strip("/").removeprefix("datasets/")

    def folder(flag: str, default: Path) -> Path:
        return Path(flag_value(args, flag) or default)

    contract = contract_environment(
        run_id=run_id,
        hyperparameters=hyperparameters,
        run_dir=folder("--run-dir", fsx / "runs" / run_id),
        checkpoint_dir=folder("--checkpoint-dir", fsx / "checkpoints" / run_id),
        data_dir=folder("--data", fsx / "datasets" / dataset),
        model_dir=folder("--model-dir", Path()) if flag_value(args, "--model-dir") else None,
    )
    return workload, run_id, contract


def node_environment(workload: UserWorkload, plan: LaunchPlan) -> dict[str, str]:
    """What a launcher other than the platform's torchrun needs: the node's place and the rendezvous address."""
    if workload.launch == "torchrun":
        return {}  # torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT for each worker
    host, _, port = plan.rdzv_endpoint.rpartition(":")
    nodes = plan.nnodes.split(":")[-1]
    env = {"MASTER_ADDR": host, "MASTER_PORT": port, "NODE_RANK": str(plan.node_rank), "NNODES": nodes}
    if workload.launch == "one-process":
        env |= {"RANK": str(plan.node_rank), "WORLD_SIZE": nodes, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    else:
        env["NPROC_PER_NODE"] = str(plan.nproc_per_node)
    return env


def train_command(workload: UserWorkload, plan: LaunchPlan, hyperparameters: Mapping | None = None) -> list[str]:
    """torchrun: the platform's torchrun (its rendezvous) runs the declared command in every worker, behind the exit
    relay (its own exit code, not torchrun's 1, decides whether the pipeline retries); the other modes run the
    command once on this node. The hyperparameters follow the command as flags where the declaration says so."""
    command = [*workload.train, *hyperparameter_flags(workload, hyperparameters or {})]
    if workload.launch != "torchrun":
        return command
    relay = ["-m", "efa_training.runtime.exit_relay", "--command"]
    return [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args(), *relay, *command]


def stop_codes(workload: UserWorkload) -> frozenset[int]:
    """The train command's exit codes that, after a stop request, say it stopped cleanly where no worker's own code
    was recorded (runtime/launch/process.py run_torchrun): the process itself under one-process (0, or 143 from
    SIGTERM's default action); a per-node launcher also ends 1 after it passed SIGTERM on, whatever its workers did
    (torchrun's SignalException, which `accelerate launch` raises too). torchrun: none, the relay records each
    worker's code."""
    own = {"one-process": {0, EXIT_STOPPED}, "per-node": {0, 1, EXIT_STOPPED}}
    return frozenset(own.get(workload.launch, ()))


def gate(workload: UserWorkload, model_dir: Path, baseline: float | None, tolerance: float) -> dict:
    """The verdict on the metric the validate command wrote: within `tolerance` (relative) of the baseline in the
    declared direction. A missing file is a usage error naming it; a missing, NaN or infinite metric never passes.
    With no baseline, the run's own value becomes it (the pipeline's first run of an environment)."""
    path = model_dir / METRICS_FILE
    if not path.is_file():
        raise UsageError(str(path), "missing", f"the validate command of '{workload.name}' wrote no metrics file")
    try:
        written = json.loads(path.read_text())
    except ValueError:
        written = None
    value = written.get(workload.metric) if isinstance(written, dict) else None
    usable = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not usable:
        return {"metric": workload.metric, "value": None, "baseline": baseline, "tolerance": tolerance,
                "passed": False, "reason": f"{path} has no finite {workload.metric!r}"}  # fmt: skip
    measured = float(value)  # type: ignore[arg-type]  # a finite int or float: `usable`
    if baseline is None:
        baseline = measured
    allowed = abs(baseline) * tolerance
    passed = measured <= baseline + allowed if workload.direction == "lower" else measured >= baseline - allowed
    relative = (measured - baseline) / abs(baseline) if baseline else 0.0
    return {
        "metric": workload.metric,
        "direction": workload.direction,
        "value": measured,
        "baseline": baseline,
        "delta": measured - baseline,
        "relative_delta": relative,
        "tolerance": tolerance,
        "passed": bool(passed),
    }
