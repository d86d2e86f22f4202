"""Container entry point: `launch.py {sanity|train|compile|validate|prepare-data} [script args...]`.

sanity, train and compile (Trainium only: neuron_parallel_compile around a short train.py run that fills the
persistent compile cache; neuron_compile.py) run under torchrun, with its arguments derived from the scheduler's
environment; validate and prepare-data run as one plain process. The mapping is a pure
function (`plan_launch`) so it is unit-tested without a cluster.

AWS Batch multi-node parallel job (one container per node):
  AWS_BATCH_JOB_NUM_NODES              -> --nnodes
  AWS_BATCH_JOB_NODE_INDEX / _MAIN_NODE_INDEX decide whether this is the main node
  AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS (child nodes only) -> --rdzv-endpoint host;
                                          the main node uses its own address (or localhost)
  AWS_BATCH_JOB_ID (without "#index") + AWS_BATCH_JOB_ATTEMPT -> --rdzv-id
Kubernetes (PyTorchJob, Kubeflow Trainer TrainJob or an Indexed Job; one pod per node):
  MASTER_ADDR, MASTER_PORT (or PET_MASTER_ADDR, PET_MASTER_PORT) -> --rdzv-endpoint
  PET_NNODES, else WORLD_SIZE (= nodes with torchrun) -> --nnodes
  RANK / PET_NODE_RANK                 -> logged only: c10d assigns ranks itself
Amazon SageMaker training job (one container per instance; chosen when <ml root>/input/config/resourceconfig.json
exists, ml root = SAGEMAKER_ML_ROOT or /opt/ml, and no AWS_BATCH_JOB_NUM_NODES):
  resourceconfig.json hosts            -> --nnodes len(hosts); this node's rank = hosts.index(current_host)
  hosts[0] (one host: localhost)       -> --rdzv-endpoint host
  network_interface_name               -> --local-addr (its IPv4); NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME unless set
  TRAINING_JOB_NAME (set by SageMaker), else RUN_ID -> --rdzv-id
  hyperparameters.json {"max_steps": "30", ...} -> --max-steps 30 ... after the container arguments ("dataset" is
                                          dropped: the `training` channel is --data)
  SANITY_BEFORE_TRAINING=1 (train)     -> sanity_check.py first, on the same hosts; train only if it passed
  a nonzero exit                       -> <ml root>/output/failure: errors.failure_reason (the job's FailureReason)
Both:
  ACCELERATORS_PER_NODE (required for sanity/train; must agree with PET_NPROC_PER_NODE if that is set)
                                       -> --nproc-per-node
  ELASTIC_MIN_NODES (optional)         -> --nnodes MIN:MAX (elastic)
  MAX_RESTARTS (default 3 for train, 0 for sanity) -> --max-restarts
  MASTER_PORT (default 29500)          -> rendezvous port on the main node
  RDZV_TIMEOUT (seconds, default 1800) -> --rdzv-conf join_timeout and read_timeout: how long nodes may start apart
  node rank 0                          -> --rdzv-conf is_host=true (every other rank is_host=false)
  RUN_ID                               -> --rdzv-id when no Batch job id; RunId metric dimension
WORKLOAD (a declared workload's JSON; train, outside SageMaker) -> the declared command instead of the GPT/ps trainer,
                                          with the contract's environment (runtime/user_workload.py, docs/workloads.md)
Set LAUNCH_DRY_RUN=1 to print the command as JSON instead of running it.
Exit codes: torchrun turns every worker failure into 1, so each worker runs behind exit_relay.py, which
records its own exit code, and launch.py ends with the code of torchrun's last restart (errors.py lists
them: 2 usage, 4 diverged, 5 checkpoint folder locked; sanity_check.py's 3, report not written).
launch.py stays the container's main process and forwards SIGTERM/SIGINT to torchrun.

Sanity inside the training job (SANITY_BEFORE_TRAINING=1): every attempt of a SageMaker job, and every Spot restart,
runs on fresh instances, so only a check inside the job proves the instances that train; it uses its own
rendezvous (MASTER_PORT + 1, rdzv id + "-sanity"), so a node that starts training first never joins a sanity store.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from dataclasses import asdict

from efa_training.runtime import bad_hosts
from efa_training.runtime.errors import (
    EXIT_HOST_UNPREPARED,
    EXIT_USAGE,
    EXIT_WINDOW_ENDED,
    UsageError,
    exit_with_usage_error,
)
from efa_training.runtime.launch.command import Launch, prepare
from efa_training.runtime.launch.modes import DISTRIBUTED_MODES, SINGLE_MODES, VERSION_FILE
from efa_training.runtime.launch.neuron_compile import mark_compiled
from efa_training.runtime.launch.process import health_after_failure, run_forwarding, run_on_sagemaker, run_torchrun
from efa_training.runtime.launch.sagemaker import ml_root, on_sagemaker, write_failure
from efa_training.runtime.launch.stage_heartbeat import StageHeartbeat
from efa_training.runtime.run_paths import flag_value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    modes = [*DISTRIBUTED_MODES, *SINGLE_MODES]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print(f"usage: launch.py {{{'|'.join(modes)}}} [args...]; `launch.py MODE --help` shows the script's flags")
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"efa-training {runpy.run_path(str(VERSION_FILE))['VERSION']}")
        return 0
    mode, script_args = argv[0], argv[1:]
    try:
        if mode not in modes:
            raise UsageError("mode", mode, "unknown mode", "|".join(modes))
        launch = prepare(mode, script_args, os.environ)
    except UsageError as err:
        if on_sagemaker(os.environ):
            write_failure(ml_root(os.environ), EXIT_USAGE, mode, f"launch.py: {err}")
        exit_with_usage_error("launch.py", err)
    if launch.env.get("LAUNCH_DRY_RUN") == "1":
        return _dry_run(launch)
    if (unprepared := _unprepared_host(mode, launch, script_args)) is not None:
        return unprepared
    if launch.stop_by is not None and launch.stop_by.seconds_left() <= 0:
        line = f"the reservation ends too soon to train and save ({launch.stop_by.summary()})"
        print(f"launch.py: {line}", file=sys.stderr, flush=True)
        if launch.ml_root is not None:
            write_failure(launch.ml_root, EXIT_WINDOW_ENDED, mode, line)
        return EXIT_WINDOW_ENDED
    if launch.already_compiled:
        print(f"launch.py: {launch.already_compiled}; nothing to compile", file=sys.stderr, flush=True)
        return 0
    if launch.plan:
        _announce(launch)
    heartbeat = _heartbeat(mode, launch, script_args)
    try:
        code = _run(mode, launch, script_args, heartbeat is None)
    finally:
        if heartbeat is not None:
            heartbeat.stop()
    if launch.tracker is not None:  # what is queued for MLflow, waited for a bounded time
        launch.tracker.close("FINISHED" if code == 0 else "FAILED")
    return code


def _unprepared_host(mode: str, launch: Launch, script_args: list[str]) -> int | None:
    """A host whose preparation failed (runtime/bad_hosts.py setup_failure) runs nothing: it is named bad, for the
    pipeline to replace before the retry, and the job ends EXIT_HOST_UNPREPARED; None on a prepared host."""
    failed = bad_hosts.setup_failure(launch.env)
    if failed is None:
        return None
    line = f"this host's preparation failed ({failed}): {mode} not run on it"
    run_id = flag_value(script_args, "--run-id") or launch.env.get("RUN_ID")
    bad_hosts.record(launch.env, run_id, line, [failed])
    print(f"launch.py: {line}", file=sys.stderr, flush=True)
    return EXIT_HOST_UNPREPARED


def _run(mode: str, launch: Launch, script_args: list[str], may_exec: bool) -> int:
    """The mode's command to its end; its exit code. One plain process with nothing beside it replaces this one."""
    if launch.ml_root is None:
        if not launch.plan:
            if may_exec:  # one plain process: its exit code is the job's
                os.execvpe(launch.command[0], launch.command, launch.env)
            return run_forwarding(launch.command, launch.env)  # a child, so that the heartbeat goes on beside it
        code = run_torchrun(
            launch.command, launch.env, launch.on_line, launch.watchdog, launch.stop_by, launch.stop_codes
        )
        checked = health_after_failure(mode, code, launch.env, run_id=flag_value(script_args, "--run-id"))
        return mark_compiled(launch, checked)
    return mark_compiled(launch, run_on_sagemaker(mode, launch))


def _heartbeat(mode: str, launch: Launch, script_args: list[str]) -> StageHeartbeat | None:
    """In a deployed environment, a node that is up but not training says so (stage_heartbeat.py); not for
    preparing a dataset, which runs on no accelerator host."""
    if not launch.env.get("TRAINING_ENVIRONMENT") or mode == "prepare-data":
        return None
    watchdog = launch.watchdog
    run_id = flag_value(script_args, "--run-id") or launch.env.get("RUN_ID") or "unknown"
    return StageHeartbeat(mode, launch.env, run_id, (lambda: bool(watchdog.times)) if watchdog else None).start()


def _dry_run(launch: Launch) -> int:
    """LAUNCH_DRY_RUN=1: the command and its plan as one JSON line, nothing run."""
    plan = asdict(launch.plan) if launch.plan else None
    print(
        json.dumps(
            {
                "command": launch.command,
                "plan": plan,
                "sanity_first": launch.sanity_first,
                "ready_marker": str(launch.ready_marker) if launch.ready_marker else None,
                "already_compiled": launch.already_compiled,
            }
        )
    )
    return 0


def _announce(launch: Launch) -> None:
    """The job log's first line: which scheduler, which node, and the command."""
    assert launch.plan is not None
    print(
        f"launch.py: {launch.plan.scheduler} node {launch.plan.node_rank}"
        f"{' (main)' if launch.plan.is_main_node else ''}: {' '.join(launch.command)}",
        file=sys.stderr,
        flush=True,
    )
