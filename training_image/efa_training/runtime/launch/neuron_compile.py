"""Ahead-of-time compilation for Trainium: `launch.py compile` fills the Neuron persistent cache before training.

Neuron docs, "PyTorch NeuronX neuron_parallel_compile CLI": `neuron_parallel_compile <run command>` extracts the
graphs of a trial run "limited to a few steps (eg. 10-15)", compiles them in parallel and populates the Neuron
Persistent Cache; the trial run's outputs are invalid (graph extraction only). So the compile job runs train.py for
COMPILE_STEPS steps with everything the run owns moved aside: its checkpoints go to a scratch folder (never the run's
own, which a bogus checkpoint would poison) and its metrics to the RunId `<run id>-compile`.

The cache lives on the shared file system (`NEURON_COMPILE_CACHE_URL`, Neuron docs "Neuron Persistent Cache"), so
every node and every later run reads it. Neuron keys each compiled graph by its HLO and compiler flags itself
(`neuronxcc-<version>/MODULE_<graph hash>+<flags hash>/`), so a changed model or flags always compiles afresh. On
top, a ready marker per *run shape* (`ready/<key>.json`) lets a later compile job of the same shape skip the trial
run altogether: the key covers the model, strategy, micro-batch, sequence length, node and worker counts, the
compiler flags (NEURON_CC_FLAGS), the framework versions in the image and the image's own code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from efa_training.runtime.launch.modes import PACKAGE_ROOT
from efa_training.runtime.run_paths import flag_value

if TYPE_CHECKING:
    from efa_training.runtime.launch.command import Launch

COMPILE_STEPS = 10  # Neuron docs: "a few steps (eg. 10-15), enough ... to extract the different graphs"
CACHE_DIR_NAME = "neuron-cache"  # config/layout.py NEURON_CACHE_PREFIX (tests hold them equal)
READY_DIR = "ready"
SCRATCH_DIR = "scratch"
# What the graphs depend on in train.py's flags (the rest, e.g. the seed or the data, does not change a graph).
SHAPE_FLAGS = ("--model", "--strategy", "--batch-size", "--micro-batch-size", "--seq-len", "--grad-accum-steps")
FRAMEWORKS = ("torch", "torch-xla", "torch-neuronx", "neuronx-cc")
# Flags the compile run replaces: it must not train long, resume or write the run's checkpoints.
REPLACED_FLAGS = ("--max-steps", "--checkpoint-dir", "--checkpoints-root", "--checkpoint-every", "--run-id")


def cache_root(env: Mapping[str, str]) -> Path:
    """NEURON_CACHE_ROOT where the backend sets it (SageMaker's file-system channel), else <FSX_MOUNT>/neuron-cache."""
    explicit = env.get("NEURON_CACHE_ROOT", "").strip()
    return Path(explicit) if explicit else Path(env.get("FSX_MOUNT", "/fsx")) / CACHE_DIR_NAME


def _code_digest() -> str:
    """The image's own training code (every module of the package): a changed model or loop is a new set of graphs."""
    digest = hashlib.sha256()
    for path in sorted((PACKAGE_ROOT / "efa_training").rglob("*.py")):
        digest.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def shape(script_args: list[str], env: Mapping[str, str], nodes: str, workers_per_node: int) -> dict:
    """Everything the compiled graphs of one run depend on."""
    return {
        "flags": {flag: flag_value(script_args, flag) for flag in SHAPE_FLAGS},
        "nodes": nodes,
        "workers_per_node": workers_per_node,
        "neuron_cc_flags": env.get("NEURON_CC_FLAGS", ""),
        "frameworks": {package: _version(package) for package in FRAMEWORKS},
        "code": _code_digest(),
    }


def shape_key(run_shape: dict) -> str:
    return hashlib.sha256(json.dumps(run_shape, sort_keys=True).encode()).hexdigest()[:24]


def ready_marker(env: Mapping[str, str], key: str) -> Path:
    return cache_root(env) / READY_DIR / f"{key}.json"


def compile_args(script_args: list[str], run_id: str, scratch: Path, steps: int) -> list[str]:
    """train.py's flags for the trial run: the run's own shape, a few steps, checkpoints and metrics moved aside."""
    kept: list[str] = []
    skip = False
    for arg in script_args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in REPLACED_FLAGS:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return [
        *kept,
        "--max-steps",
        str(steps),
        "--checkpoint-every",
        str(steps + 1),
        "--checkpoint-dir",
        str(scratch),
        "--run-id",
        f"{run_id}-compile",
    ]


def compile_steps(env: Mapping[str, str]) -> int:
    text = env.get("NEURON_COMPILE_STEPS", "").strip()
    return int(text) if text.isdigit() and int(text) >= 1 else COMPILE_STEPS


def write_ready(marker: Path, run_shape: dict) -> None:
    """Atomically: a marker is either absent or whole (a reader never sees half of one)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_name(f".{marker.name}.{os.getpid()}")
    partial.write_text(json.dumps({**run_shape, "compiled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    partial.replace(marker)


def mark_compiled(launch: Launch, code: int) -> int:
    """After its compilation succeeded, the main node marks the run shape ready (the ranks of a data-parallel run trace
    the same graphs, so its own cache entries are every node's) and drops the trial run's throwaway checkpoints."""
    if code == 0 and launch.ready_marker is not None and launch.run_shape is not None:
        write_ready(launch.ready_marker, launch.run_shape)
        print(f"launch.py: compile cache ready: {launch.ready_marker}", file=sys.stderr, flush=True)
        if launch.scratch is not None:
            shutil.rmtree(launch.scratch, ignore_errors=True)
    return code
