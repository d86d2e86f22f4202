"""A training's MLflow tracking (runtime/tracking.py), set up by the launcher on every node where it is on
(MLFLOW_TRACKING_URI): the metric lines it sees are fed to the run's tracker. Only the node where global rank 0 runs
sees them, so only that node ever connects (the tracker connects at its first line)."""

from __future__ import annotations

import json
import runpy
from collections.abc import Callable, Mapping
from typing import TypeVar

from efa_training.runtime.launch.modes import VERSION_FILE
from efa_training.runtime.launch.rendezvous import LaunchPlan
from efa_training.runtime.storage import read_json, under_prefix
from efa_training.runtime.tracking import Tracker

T = TypeVar("T")


def tracker(
    env: Mapping[str, str], plan: LaunchPlan, run_id: str, workload: str, given: Mapping[str, object]
) -> Tracker | None:
    """The run's tracker (None where tracking is off), with what the run is as its parameters: the hyperparameters
    as given, the workload, where (the plan's scheduler) and on how many nodes it runs, and the platform's release."""
    if not env.get("MLFLOW_TRACKING_URI"):
        return None
    params = {
        **{name: value if isinstance(value, str) else json.dumps(value) for name, value in given.items()},
        "workload": workload,
        "scheduler": plan.scheduler,
        "nodes": plan.nnodes,
        "accelerators_per_node": plan.nproc_per_node,
        "accelerator_kind": env.get("ACCELERATOR_KIND", ""),
        "platform_release": runpy.run_path(str(VERSION_FILE))["VERSION"],
    }
    track = Tracker.from_env(env, run_id, params)
    if track is not None and env.get("REPORT_PREFIX"):
        track.context = lambda: run_record(env["REPORT_PREFIX"], run_id)
    return track


def run_record(report_prefix: str, run_id: str) -> tuple[dict[str, str], dict[str, float]]:
    """Tags and metrics from the pipeline's record of the run (`<REPORT_PREFIX><run_id>/run.json`, WriteRunRecord,
    docs/pipeline.md: {"run", "execution", "since"}, the run holding its quote): the Step Functions execution that runs
    it and its console page, where the run's cost will be (`cost.json`, written after validation), and the quote as
    `quote_usd` and `quote_hours`. A run started by hand has no record: nothing is added."""
    record = read_json(under_prefix(report_prefix, run_id, "run.json")) or {}
    tags = {"efa_training.cost": under_prefix(report_prefix, run_id, "cost.json")} if record else {}
    execution = record.get("execution")
    if isinstance(execution, str) and execution.startswith("arn:"):
        region = execution.split(":")[3]
        tags["efa_training.execution"] = execution
        tags["efa_training.execution_console"] = (  # the Step Functions console's execution page
            f"https://{region}.console.aws.amazon.com/states/home?region={region}#/v2/executions/details/{execution}"
        )
    quote = (record.get("run") or {}).get("quote") or {}
    values = {f"quote_{k}": float(v) for k, v in quote.items() if k in ("usd", "hours") and isinstance(v, (int, float))}
    return tags, values


def feeding(track: Tracker | None, handler: Callable[[str], T]) -> Callable[[str], T]:
    """`handler`, whose lines also reach the tracker (unchanged where there is none)."""
    if track is None:
        return handler

    def fed(line: str) -> T:
        track.feed(line)
        return handler(line)

    return fed
