"""The command the launcher runs for a mode in this container, and the environment it runs with.

From the scheduler's environment (rendezvous.py's plan) and, on SageMaker, the job's files (sagemaker.py): the
torchrun line with each worker behind exit_relay, the workload's own supervisor (a parameter-server run), or one plain
process; on Trainium, the compile job's neuron_parallel_compile around a short trial run (neuron_compile.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from efa_training import workloads
from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import hyperparameters, neuron_compile, tracked
from efa_training.runtime.launch.hang_evidence import flight_recorder, run_folder
from efa_training.runtime.launch.modes import DISTRIBUTED_MODES, EXIT_RELAY, SINGLE_MODES, python_path
from efa_training.runtime.launch.rank_zero import RankZeroLines
from efa_training.runtime.launch.rendezvous import (
    DEFAULT_PORT,
    LaunchPlan,
    env_count,
    interface_ipv4,
    own_ipv4,
    plan_launch,
)
from efa_training.runtime.launch.sagemaker import (
    WORKLOAD_HYPERPARAMETERS,
    hyperparameter_flags,
    ml_root,
    on_sagemaker,
    read_json,
    sagemaker_hosts,
)
from efa_training.runtime.launch.stop_by import STOP_BY_VARIABLE, StopBy, margin_floor, parse_time, take_stop_by
from efa_training.runtime.launch.watchdog import Watchdog
from efa_training.runtime.run_paths import flag_value
from efa_training.runtime.tracking import Tracker
from efa_training.runtime.user_workload import (
    WORKLOAD_VARIABLE,
    node_environment,
    prepare_run,
    stop_codes,
    train_command,
)
from efa_training.runtime.workload_metrics import LogMetrics

USER_VALIDATE = "efa_training.runtime.user_validate"  # a declared workload's validate command, then the gate


@dataclass(frozen=True)
class Launch:
    """What main() runs: the command, its plan (None for a single process), the child environment, and on SageMaker
    the sanity check to pass first and where the failure file goes."""

    command: list[str]
    plan: LaunchPlan | None
    env: dict
    sanity_first: list[str] | None = None
    ml_root: Path | None = None  # set on SageMaker
    # compile: the marker the main node writes once the cache is filled, and why nothing needs compiling if so.
    ready_marker: Path | None = None
    run_shape: dict | None = None
    already_compiled: str | None = None
    scratch: Path | None = None  # the trial run's throwaway checkpoints
    # a declared workload's log lines -> its metrics (runtime/workload_metrics.py LogMetrics), on the main node
    on_line: Callable[[str], object] | None = None
    watchdog: Watchdog | None = None  # ends a training that stopped making progress (on the main node)
    stop_by: StopBy | None = None  # stops the training before its reservation ends (every node)
    tracker: Tracker | None = None  # the run's MLflow tracking, fed the metric lines (runtime/tracking.py)
    # a declared workload's own launcher's exit codes that mean a clean stop (user_workload.stop_codes)
    stop_codes: frozenset[int] = frozenset()


def prepare(mode: str, script_args: list[str], environ: Mapping[str, str]) -> Launch:
    """The command for `mode` in this container: from the scheduler's environment, and on SageMaker its files."""
    env = dict(environ)
    # A fresh rendezvous store per round: restarted workers never read a dead worker's address.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    env["PYTHONPATH"] = python_path(env)
    if env.get("ACCELERATOR_KIND") == "neuron" and mode in ("train", "compile"):
        # Neuron docs, "Neuron Persistent Cache": NEURON_COMPILE_CACHE_URL names the cache; on the shared file system
        # the compile job fills it and every node of every later run reads it.
        env.setdefault("NEURON_COMPILE_CACHE_URL", str(neuron_compile.cache_root(env)))
    elif mode == "compile":
        raise UsageError("mode", mode, "only Trainium (ACCELERATOR_KIND=neuron) compiles ahead of time", "train")
    script_args = take_stop_by(script_args, env)
    if env.get(WORKLOAD_VARIABLE) and mode in ("train", "validate"):
        launch = _prepare_workload(mode, script_args, env)
    elif not on_sagemaker(env):
        launch = _prepare_scheduler(mode, script_args, env)
    else:
        launch = _prepare_sagemaker(mode, script_args, env)
    return _stopping(mode, launch)


def _stopping(mode: str, launch: Launch) -> Launch:
    """A training with a stop-by time: on every node, asked to stop before it (runtime/launch/stop_by.py)."""
    if mode != "train" or launch.plan is None or not launch.env.get(STOP_BY_VARIABLE):
        return launch
    stop_by = StopBy(parse_time(launch.env[STOP_BY_VARIABLE]), floor=margin_floor(launch.env))
    return replace(launch, stop_by=stop_by, on_line=stop_by.watch(launch.on_line) if launch.on_line else None)


def _prepare_scheduler(mode: str, script_args: list[str], env: dict) -> Launch:
    """AWS Batch, Kubernetes or a local node: everything comes from the environment."""
    given, script_args = hyperparameters.given(script_args), hyperparameters.as_flags(mode, script_args)
    own = own_ipv4(env) if mode in DISTRIBUTED_MODES else None
    cmd, plan = build_command(mode, script_args, env, own)
    if plan and parameter_servers(mode, script_args):
        env.update(workloads.supervisor_environment(plan))
    return _watched(mode, ahead_of_time(mode, Launch(cmd, plan, env), script_args), script_args, given)


def _watched(mode: str, launch: Launch, script_args: list[str], given: dict) -> Launch:
    """The built-in trainer's training under the hang watchdog, on every node: its EMF lines (rank 0's, wherever
    rank 0 runs) are its progress, and its tracking's metrics (`given`: the run's hyperparameters). On every node
    NCCL's Flight Recorder dumps into the run's folder if a collective times out."""
    if mode != "train" or launch.plan is None:
        return launch
    run = run_folder(launch.env, script_args)
    launch.env.update(flight_recorder(run))
    launch.env["PYTHONFAULTHANDLER"] = "1"  # a worker's stacks on SIGABRT: the watchdog's evidence of a hang
    run_id = flag_value(script_args, "--run-id") or launch.env.get("RUN_ID")
    watchdog = _watchdog(launch.plan, launch.env, run, run_id)
    workload = workloads.workload_for(flag_value(script_args, "--strategy"))
    track = tracked.tracker(launch.env, launch.plan, run_id or "local", workload, given)
    return replace(
        launch, on_line=watchdog.watch(tracked.feeding(track, is_metrics_line)), watchdog=watchdog, tracker=track
    )


def _watchdog(
    plan: LaunchPlan, env: Mapping[str, str], run: Path | None, run_id: str | None, declared: float | None = None
) -> Watchdog:
    """This node's watchdog: it finds a hang where it sees progress, and gives its stacks when another node asks.
    The other nodes share the run's folder on Batch and EKS (FSx); on SageMaker each instance has its own
    (hang_evidence.run_folder), so there a node's evidence is its own."""
    others = 0 if on_sagemaker(env) else int(str(plan.nnodes).split(":")[-1]) - 1
    floor = {} if declared is None else {"declared": declared}
    return Watchdog.from_env(env, run=run, run_id=run_id, peers=others, node=str(plan.node_rank), **floor)


def is_metrics_line(line: str) -> bool:
    """A line of CloudWatch's embedded metric format (runtime/metrics.py), which the trainer prints per logged step."""
    return line.startswith("{") and '"_aws"' in line


def _prepare_workload(mode: str, script_args: list[str], env: dict) -> Launch:
    """A declared workload's training on this node (docs/workloads.md): the declared command under the platform's
    torchrun (or its own launcher), with the contract's environment and folders (user_workload.prepare_run); its
    validation: the validate command, then the gate (user_validate). On SageMaker the flags come from the job's
    hyperparameters, the hosts from its resource configuration, and the sanity check runs first where asked."""
    root = ml_root(env) if on_sagemaker(env) else None
    config, own = None, None
    if root is not None:
        given = read_json(root / "input/config/hyperparameters.json", {})
        flags = hyperparameter_flags(mode, given, WORKLOAD_HYPERPARAMETERS)
        script_args = take_stop_by([*script_args, *flags], env)
    if mode == "validate":
        return Launch([sys.executable, "-m", USER_VALIDATE, *script_args], None, env, ml_root=root)
    if root is not None:
        config, own = _sagemaker_network(root, env, distributed=True)
    workload, run_id, contract = prepare_run(script_args, env)
    env.update(contract)
    plan = plan_launch("train", env, own if root is not None else own_ipv4(env), config)
    env.update(node_environment(workload, plan))
    run = Path(contract["HYPERPARAMETERS_FILE"]).parent  # the run's folder (user_workload.contract_environment)
    env.update(flight_recorder(run))
    env["PYTHONFAULTHANDLER"] = "1"  # a worker's stacks on SIGABRT: the watchdog's evidence of a hang
    env.setdefault("PYTHONUNBUFFERED", "1")  # progress lines as they are printed (the images set it too)
    # Read where global rank 0 runs (rank_zero.py: not always the main node): one metric line per step however many
    # nodes print it; each is progress.
    track = tracked.tracker(env, plan, run_id, workload.name, hyperparameters.given(script_args))
    emit = tracked.feeding(track, _print_flushed)
    metrics = LogMetrics(workload, run_id, env.get("TRAINING_ENVIRONMENT", ""), emit=emit)
    sanity = None
    if root is not None and env.get("SANITY_BEFORE_TRAINING") == "1":
        sanity = sanity_first_command(plan, script_args, env, config)
    watchdog = _watchdog(plan, env, run, run_id, workload.hang_timeout_seconds)
    on_line = watchdog.watch(RankZeroLines(metrics.feed, only_node=plan.nnodes == "1"))
    command = train_command(workload, plan, hyperparameters.given(script_args))
    launch = Launch(command, plan, env, sanity, root, on_line=on_line, watchdog=watchdog, tracker=track)
    return replace(launch, stop_codes=stop_codes(workload))  # how its own launcher's clean stop ends


def _print_flushed(line: str) -> None:
    print(line, flush=True)


def _prepare_sagemaker(mode: str, script_args: list[str], env: dict) -> Launch:
    """A SageMaker training job: the hosts and interface from resourceconfig.json, flags from hyperparameters.json,
    and the sanity check first where the job asks for it."""
    root = ml_root(env)
    config, own = _sagemaker_network(root, env, mode in DISTRIBUTED_MODES)
    flags = hyperparameter_flags(mode, read_json(root / "input/config/hyperparameters.json", {}))
    args = take_stop_by([*script_args, *flags], env)
    given, args = hyperparameters.given(args), hyperparameters.as_flags(mode, args)
    cmd, plan = build_command(mode, args, env, own, config)
    if plan and parameter_servers(mode, args):
        env.update(workloads.supervisor_environment(plan))
    sanity = None
    if plan and mode == "train" and env.get("SANITY_BEFORE_TRAINING") == "1":
        sanity = sanity_first_command(plan, args, env, config)
    return _watched(mode, ahead_of_time(mode, Launch(cmd, plan, env, sanity, root), args), args, given)


def _sagemaker_network(root: Path, env: dict, distributed: bool) -> tuple[dict, str | None]:
    """resourceconfig.json, and for a distributed mode this host's IPv4 address on its interface (which NCCL and
    gloo are told to use)."""
    config = read_json(root / "input/config/resourceconfig.json")
    if not isinstance(config, dict):
        raise UsageError("resourceconfig.json", config, "not a JSON object", "SageMaker's resource configuration")
    _, _, interface = sagemaker_hosts(config)
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if not env.get(name):
            # NCCL takes a bare name as a prefix ("eth0" would also match eth01): "=" asks for the exact interface.
            env[name] = f"={interface}" if name.startswith("NCCL") else interface
    own = interface_ipv4(interface) if distributed else None
    if distributed and own is None:
        raise UsageError(
            "resourceconfig.json network_interface_name", interface, "no IPv4 address in this container", "eth0"
        )
    return config, own


def ahead_of_time(mode: str, launch: Launch, script_args: list[str]) -> Launch:
    """compile: neuron_parallel_compile around a short train.py run, unless this run shape's cache is ready.
    train on Trainium: says whether its shape was compiled ahead of time (if not, graphs compile as they appear)."""
    plan = launch.plan
    if plan is None or launch.env.get("ACCELERATOR_KIND") != "neuron" or mode not in ("train", "compile"):
        return launch
    run_shape = neuron_compile.shape(script_args, launch.env, plan.nnodes, plan.nproc_per_node)
    marker = neuron_compile.ready_marker(launch.env, neuron_compile.shape_key(run_shape))
    if mode == "train":
        state = "ready" if marker.is_file() else "missing: graphs will compile during training"
        print(f"launch.py: compile cache for this run shape {state} ({marker})", file=sys.stderr, flush=True)
        return launch
    if marker.is_file():
        return replace(launch, already_compiled=f"compile cache already ready for this run shape ({marker})")
    run_id = flag_value(script_args, "--run-id") or launch.env.get("RUN_ID", "") or plan.rdzv_id
    scratch = neuron_compile.cache_root(launch.env) / neuron_compile.SCRATCH_DIR / plan.rdzv_id
    steps = neuron_compile.compile_steps(launch.env)
    trial = torchrun_command(plan, "compile", neuron_compile.compile_args(script_args, run_id, scratch, steps))
    # Neuron docs: `neuron_parallel_compile <run commands>`, the run command being torchrun with a few steps.
    command = ["neuron_parallel_compile", *trial]
    main = plan.is_main_node
    return replace(launch, command=command, ready_marker=marker if main else None, run_shape=run_shape, scratch=scratch)


def build_command(
    mode: str,
    script_args: list[str],
    env: Mapping[str, str],
    own_address: str | None = None,
    resource_config: Mapping | None = None,
) -> tuple[list[str], LaunchPlan | None]:
    if mode in SINGLE_MODES:
        return [sys.executable, "-m", SINGLE_MODES[mode], *script_args], None
    plan = plan_launch(mode, env, own_address, resource_config)
    expected = flag_value(script_args, "--expected-nodes")
    # Checked here as well as in the scripts: a mismatch must fail once, not once per torchrun restart.
    if expected is not None and ":" not in plan.nnodes and expected != plan.nnodes:
        raise UsageError(
            "--expected-nodes",
            expected,
            f"the scheduler gives {plan.nnodes} node(s)",
            "the job's node count (AWS_BATCH_JOB_NUM_NODES / PET_NNODES / SageMaker's hosts)",
        )
    if parameter_servers(mode, script_args):
        # Parameter servers run under their own supervisor, not torchrun (workloads/ctr_ps/supervisor.py says why).
        return [sys.executable, "-m", DISTRIBUTED_MODES[mode], *script_args], plan
    return torchrun_command(plan, mode, script_args), plan


def parameter_servers(mode: str, script_args: list[str]) -> bool:
    """Whether this `train` runs under its workload's own supervisor instead of torchrun (workloads.runner)."""
    return mode == "train" and workloads.runner(flag_value(script_args, "--strategy")) == "supervisor"


def torchrun_command(plan: LaunchPlan, mode: str, script_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *plan.torchrun_args(),
        "-m",
        EXIT_RELAY,
        DISTRIBUTED_MODES[mode],
        *script_args,
    ]


def sanity_first_command(
    plan: LaunchPlan, script_args: list[str], env: Mapping[str, str], resource_config: Mapping | None
) -> list[str]:
    """The sanity check on the training's hosts, with a rendezvous of its own (MASTER_PORT + 1, rdzv id + -sanity)."""
    port = env_count(env, "MASTER_PORT", DEFAULT_PORT, minimum=1) + 1
    sanity = plan_launch("sanity", {**env, "MASTER_PORT": str(port)}, plan.local_addr, resource_config)
    sanity = replace(sanity, rdzv_id=f"{plan.rdzv_id}-sanity")
    run_id = flag_value(script_args, "--run-id") or env.get("RUN_ID", "")
    args = ["--run-id", run_id] if run_id else []
    if ":" not in plan.nnodes:
        args += ["--expected-nodes", plan.nnodes]
    return torchrun_command(sanity, "sanity", args)
