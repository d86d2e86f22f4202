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
    return Tracker.from_env(env, run_id, params)


def feeding(track: Tracker | None, handler: Callable[[str], T]) -> Callable[[str], T]:
    """`handler`, whose lines also reach the tracker (unchanged where there is none)."""
    if track is None:
        return handler

    def fed(line: str) -> T:
        track.feed(line)
        return handler(line)

    return fed
