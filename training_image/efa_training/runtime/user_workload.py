"""Your own training code under the platform (docs/workloads.md): what it is given, how each launch mode starts it,
the metrics read from its log lines, and the validation gate over the metrics file it writes.

The declaration arrives as JSON in the WORKLOAD environment variable (contracts/workload.py `Workload.as_json`,
checked at synth; read again here, since the image cannot import the CDK side). Standard library only.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch.rendezvous import LaunchPlan
from efa_training.runtime.launch.watchdog import DEFAULT_FLOOR_SECONDS
from efa_training.runtime.metrics import NAMESPACE, PROGRESS_METRIC
from efa_training.runtime.report import PREFIX as REPORT_PREFIX
from efa_training.runtime.run_paths import flag_value

WORKLOAD_VARIABLE = "WORKLOAD"
LAUNCHES = ("torchrun", "per-node", "one-process")  # contracts/workload.py LAUNCHES (a test holds them equal)
METRICS_FILE = "metrics.json"  # what the validate command writes in MODEL_DIR
HYPERPARAMETERS_FILE = "hyperparameters.json"


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

    @classmethod
    def from_json(cls, text: str) -> UserWorkload:
        try:
            raw = json.loads(text)
            workload = cls(
                name=str(raw["name"]),
                launch=raw["launch"],
                train=tuple(raw["train"]),
                validate=tuple(raw["validate"]),
                metric=raw["metric"]["name"],
                direction=raw["metric"]["direction"],
                metrics={name: re.compile(regex) for name, regex in raw.get("metrics", {}).items()},
                hang_timeout_seconds=float(raw.get("hang_timeout_seconds", DEFAULT_FLOOR_SECONDS)),
            )
        except (ValueError, KeyError, TypeError, re.error) as error:
            raise UsageError(WORKLOAD_VARIABLE, text[:60], f"not a workload declaration ({error})") from None
        if workload.launch not in LAUNCHES or workload.direction not in ("lower", "higher"):
            raise UsageError(WORKLOAD_VARIABLE, text[:60], "launch or metric direction unknown", ", ".join(LAUNCHES))
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
        **{f"HP_{name.upper()}": value if isinstance(value, str) else json.dumps(value) for name, value in
           hyperparameters.items()},
    }  # fmt: skip


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


def train_command(workload: UserWorkload, plan: LaunchPlan) -> list[str]:
    """torchrun: the platform's torchrun (its rendezvous) runs the declared command in every worker, behind the exit
    relay (its own exit code, not torchrun's 1, decides whether the pipeline retries); the other modes run the
    command once on this node."""
    if workload.launch != "torchrun":
        return list(workload.train)
    relay = ["-m", "efa_training.runtime.exit_relay", "--command"]
    return [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args(), *relay, *workload.train]


class LogMetrics:
    """Each log line the declared regexes match becomes one EMF line (namespace EfaTraining, dimensions Environment
    and RunId, as the built-in workloads' metrics): the same CloudWatch metrics from any code that prints them."""

    def __init__(
        self, workload: UserWorkload, run_id: str, environment: str = "", emit: Callable[[str], None] = print
    ) -> None:
        self.patterns, self.run_id, self.environment, self.emit = workload.metrics, run_id, environment, emit

    def feed(self, line: str) -> dict[str, float]:
        values = self._reported(line)
        for name, pattern in self.patterns.items():
            found = pattern.search(line)
            if found:
                try:
                    value = float(found.group(1))
                except ValueError:
                    continue
                if math.isfinite(value):  # NaN/Infinity are not JSON: CloudWatch would drop the whole line
                    values[name] = value
        if values:
            self.emit(json.dumps(self._record(values)))
        return values

    @staticmethod
    def _reported(line: str) -> dict[str, float]:
        """A line from efa_training.runtime.report.report_metrics: its numbers, whatever the declaration's regexes."""
        if not line.startswith(REPORT_PREFIX):
            return {}
        try:
            reported = json.loads(line[len(REPORT_PREFIX) :])
        except ValueError:
            return {}
        if not isinstance(reported, dict):
            return {}
        numbers = {k: float(v) for k, v in reported.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return {k: v for k, v in numbers.items() if isinstance(k, str) and math.isfinite(v)}

    def _record(self, values: dict[str, float]) -> dict:
        """The EMF document of one line's values, with ProgressLines 1 (metrics.py UNITS: the NoProgress alarm's)."""
        values = {**values, PROGRESS_METRIC: 1.0}
        dimensions = ["Environment", "RunId"] if self.environment else ["RunId"]
        metadata = {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {"Namespace": NAMESPACE, "Dimensions": [dimensions], "Metrics": [{"Name": n} for n in values]}
            ],
        }
        scope = {"Environment": self.environment} if self.environment else {}
        return {"_aws": metadata, **scope, "RunId": self.run_id, **values}


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
