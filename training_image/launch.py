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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import host_metrics
import neuron_compile
from errors import EXIT_STOPPED, EXIT_USAGE, UsageError, exit_with_usage_error, failure_reason
from exit_relay import EXIT_CODE_DIR, relayed_exit_code
from run_paths import flag_value, node_local_checkpoints

HERE = Path(__file__).resolve().parent
DISTRIBUTED_MODES = {"sanity": "sanity_check.py", "train": "train.py", "compile": "train.py"}
SINGLE_MODES = {"validate": "validate.py", "prepare-data": "prepare_data.py"}
DEFAULT_PORT = 29500
# How far apart nodes may start, in seconds: torchrun's c10d rendezvous gives up after join_timeout (600 s by
# default), and a rank that starts before the store's host after read_timeout (60 s) (torch/distributed/elastic/
# rendezvous/dynamic_rendezvous.py and c10d_rendezvous_backend.py). A cold start is slower: on EKS every run scales
# the node group from zero (boot, join, device plugins) and pulls a 15-25 GiB image per node, and SageMaker and
# Batch hosts pull the image one by one too. 30 minutes covers that, and stays far inside one attempt's time.
DEFAULT_RDZV_TIMEOUT = 1800
# A failed pre-flight check must fail the job, not retry; so must a failed compilation (the pipeline retries it).
DEFAULT_MAX_RESTARTS = {"train": 3, "sanity": 0, "compile": 0}

# SageMaker's container contract ("How Amazon SageMaker AI provides training information",
# https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html): the
# hyperparameters (a JSON object of strings) and the distributed training configuration (resourceconfig.json:
# current_host, hosts, network_interface_name) under /opt/ml/input/config; TRAINING_JOB_NAME in the environment.
ML_ROOT_ENV = "SAGEMAKER_ML_ROOT"  # tests redirect /opt/ml
DEFAULT_ML_ROOT = "/opt/ml"
# The hyperparameters each mode accepts: contracts/run.py JOB_PARAMETERS, plus train's expected_nodes (the image
# cannot import contracts/: tests/training/test_run_contract.py holds them equal).
SAGEMAKER_HYPERPARAMETERS = {
    "sanity": ("run_id",),
    "train": (
        "run_id",
        "dataset",
        "model",
        "strategy",
        "max_steps",
        "checkpoint_every",
        "seed",
        "lr",
        "batch_size",
        "init_from",
        "ps_servers_per_node",
        "staleness",
        "expected_nodes",
    ),
    "validate": ("run_id", "dataset", "model", "baseline", "tolerance"),
}
SAGEMAKER_HYPERPARAMETERS["compile"] = SAGEMAKER_HYPERPARAMETERS["train"]  # the trial run takes the run's flags
CHANNEL_HYPERPARAMETERS = ("dataset",)  # on SageMaker the `training` input channel: the --data flag wins


@dataclass(frozen=True)
class LaunchPlan:
    scheduler: str  # "aws-batch" | "pytorchjob" | "local"
    nnodes: str
    nproc_per_node: int
    rdzv_endpoint: str
    rdzv_id: str
    max_restarts: int
    node_rank: int
    is_main_node: bool
    local_addr: str | None = None
    rdzv_timeout: int = DEFAULT_RDZV_TIMEOUT

    def torchrun_args(self) -> list[str]:
        args = [
            "--nnodes",
            self.nnodes,
            "--nproc-per-node",
            str(self.nproc_per_node),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            self.rdzv_endpoint,
            "--rdzv-id",
            self.rdzv_id,
            "--max-restarts",
            str(self.max_restarts),
            # The store's host chosen by rank, not by name: without is_host, c10d hosts only where the endpoint's
            # name already resolves to the machine (`_matches_machine_hostname`, "it may return a false negative"):
            # a headless-service name not yet published, or SageMaker's algo-1, leaves nobody hosting.
            "--rdzv-conf",
            f"is_host={str(self.is_main_node).lower()},"
            f"join_timeout={self.rdzv_timeout},read_timeout={self.rdzv_timeout}",
        ]
        if self.local_addr:
            # The rank-0 agent publishes this address to every worker; a container hostname
            # may not resolve on other nodes, an IP does.
            args += ["--local-addr", self.local_addr]
        return args


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    text = env.get(name, "")
    if text == "":
        if default is None:
            raise UsageError(name, None, "environment variable not set", f"an integer >= {minimum}")
        return default
    if not text.strip().isdigit() or int(text) < minimum:
        raise UsageError(name, text, "not a valid count", f"an integer >= {minimum}")
    return int(text)


def _node_count(env: Mapping[str, str], name: str) -> str:
    """A node count, or an elastic range MIN:MAX (PyTorchJob elastic policies set PET_NNODES=1:4)."""
    text = env.get(name, "").strip()
    if ":" in text:
        low, _, high = text.partition(":")
        if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
            raise UsageError(name, text, "not a node range", "MIN:MAX with 1 <= MIN <= MAX, or a count >= 1")
        return f"{int(low)}:{int(high)}"
    return str(_int(env, name, minimum=1))


def _nnodes(env: Mapping[str, str], nodes: str) -> str:
    min_nodes = env.get("ELASTIC_MIN_NODES", "")
    if ":" in nodes or not min_nodes:
        return nodes
    if not min_nodes.isdigit() or not 1 <= int(min_nodes) <= int(nodes):
        raise UsageError("ELASTIC_MIN_NODES", min_nodes, "out of range", f"1..{nodes}")
    return f"{min_nodes}:{nodes}"


def plan_launch(
    mode: str, env: Mapping[str, str], own_address: str | None = None, resource_config: Mapping | None = None
) -> LaunchPlan:
    """torchrun settings for `mode` from the scheduler's environment variables and, on SageMaker, its resource
    configuration (pure function)."""
    if mode not in DISTRIBUTED_MODES:
        raise UsageError("mode", mode, "not a distributed mode", ", ".join(DISTRIBUTED_MODES))
    nproc = _int(env, "ACCELERATORS_PER_NODE", minimum=1)
    if env.get("PET_NPROC_PER_NODE", "").isdigit() and int(env["PET_NPROC_PER_NODE"]) != nproc:
        raise UsageError(
            "PET_NPROC_PER_NODE",
            env["PET_NPROC_PER_NODE"],
            f"disagrees with ACCELERATORS_PER_NODE={nproc}",
            "the same count, or unset",
        )
    max_restarts = _int(env, "MAX_RESTARTS", DEFAULT_MAX_RESTARTS[mode])
    port = _int(env, "MASTER_PORT", DEFAULT_PORT, minimum=1)
    # One local node; a scheduler's plan replaces what it knows (each checks its own node count).
    local = LaunchPlan(
        "local",
        "1",
        nproc,
        f"localhost:{port}",
        env.get("RUN_ID", "") or "local",
        max_restarts,
        node_rank=0,
        is_main_node=True,
        rdzv_timeout=_int(env, "RDZV_TIMEOUT", DEFAULT_RDZV_TIMEOUT, minimum=10),
    )
    if "AWS_BATCH_JOB_NUM_NODES" in env:
        return _batch_plan(env, local, port, own_address)
    if resource_config is not None:
        return _sagemaker_plan(env, local, port, resource_config, own_address)
    master = env.get("MASTER_ADDR") or env.get("PET_MASTER_ADDR")  # PyTorchJob v1 / Kubeflow Trainer v2
    if master and ("PET_NNODES" in env or "WORLD_SIZE" in env):
        return _kubernetes_plan(env, local, master, port, own_address)
    return replace(local, nnodes=_nnodes(env, "1"))


def _batch_plan(env: Mapping[str, str], local: LaunchPlan, port: int, own_address: str | None) -> LaunchPlan:
    nodes = _int(env, "AWS_BATCH_JOB_NUM_NODES", minimum=1)
    index = _int(env, "AWS_BATCH_JOB_NODE_INDEX", 0)
    is_main = index == _int(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX", 0)
    host = (own_address or "localhost") if is_main else env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS", "")
    if not host:  # the main node is not told its own address; every child node is told the main node's
        raise UsageError(
            "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS",
            None,
            f"not set on child node {index}",
            "the main node's IPv4 address (set by Batch)",
        )
    job_id = env.get("AWS_BATCH_JOB_ID", "").split("#")[0]
    rdzv_id = f"{job_id}-{env.get('AWS_BATCH_JOB_ATTEMPT', '1')}" if job_id else (env.get("RUN_ID", "") or "batch")
    return replace(
        local,
        scheduler="aws-batch",
        nnodes=_nnodes(env, str(nodes)),
        rdzv_endpoint=f"{host}:{port}",
        rdzv_id=rdzv_id,
        node_rank=index,
        is_main_node=is_main,
        local_addr=own_address,
    )


def sagemaker_hosts(config: Mapping) -> tuple[list[str], int, str]:
    """(hosts, this host's index, the network interface) from resourceconfig.json, or one UsageError."""
    hosts, current, interface = config.get("hosts"), config.get("current_host"), config.get("network_interface_name")
    if not (isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts)):
        raise UsageError("resourceconfig.json hosts", hosts, "not a list of host names", 'e.g. ["algo-1", "algo-2"]')
    if len(set(hosts)) != len(hosts):
        raise UsageError("resourceconfig.json hosts", hosts, "names a host twice", "distinct host names")
    if current not in hosts:
        raise UsageError("resourceconfig.json current_host", current, "not one of hosts", ", ".join(hosts))
    if not (isinstance(interface, str) and interface):
        raise UsageError("resourceconfig.json network_interface_name", interface, "missing", "an interface, e.g. eth0")
    return hosts, hosts.index(current), interface


def _sagemaker_plan(
    env: Mapping[str, str], local: LaunchPlan, port: int, config: Mapping, own_address: str | None
) -> LaunchPlan:
    hosts, rank, _ = sagemaker_hosts(config)
    max_restarts = local.max_restarts
    if len(hosts) > 1 and node_local_checkpoints(env) and max_restarts:
        # torchrun's in-place restart would resume from this node's own folder, which holds only its own shards
        # (not the union SageMaker restores at the start of a job): a failure ends the job, and the next attempt
        # resumes on fresh instances from the whole checkpoint prefix.
        if env.get("MAX_RESTARTS"):
            raise UsageError(
                "MAX_RESTARTS",
                env["MAX_RESTARTS"],
                "an in-place restart cannot resume from node-local checkpoints (CHECKPOINT_NODE_LOCAL=1)",
                "0, or unset",
            )
        max_restarts = 0
    return replace(
        local,
        scheduler="sagemaker",
        nnodes=_nnodes(env, str(len(hosts))),
        rdzv_endpoint=f"{hosts[0] if len(hosts) > 1 else 'localhost'}:{port}",
        rdzv_id=env.get("TRAINING_JOB_NAME") or env.get("RUN_ID") or "sagemaker",
        max_restarts=max_restarts,
        node_rank=rank,
        is_main_node=rank == 0,
        local_addr=own_address,
    )


def hyperparameter_flags(mode: str, hyperparameters: object) -> list[str]:
    """SageMaker's hyperparameters as the script's flags: --name-with-dashes VALUE, as the EKS job runner passes them
    (constructs/compute/eks/job_runner.py launcher_flag), minus the ones an input channel already gives."""
    if not isinstance(hyperparameters, dict):
        raise UsageError("hyperparameters.json", hyperparameters, "not a JSON object", '{"max_steps": "1000", ...}')
    known = SAGEMAKER_HYPERPARAMETERS.get(mode, ())
    flags: list[str] = []
    for name, value in hyperparameters.items():
        if name not in known:
            raise UsageError(f"hyperparameter {name}", value, f"unknown to {mode}", ", ".join(known) or "none")
        if not isinstance(value, str):
            raise UsageError(f"hyperparameter {name}", value, "not a string", "strings (SageMaker passes strings)")
        if name not in CHANNEL_HYPERPARAMETERS:
            flags += ["--" + name.replace("_", "-"), value]
    return flags


def _kubernetes_plan(
    env: Mapping[str, str], local: LaunchPlan, master: str, port: int, own_address: str | None
) -> LaunchPlan:
    nodes = _node_count(env, "PET_NNODES") if env.get("PET_NNODES") else str(_int(env, "WORLD_SIZE", minimum=1))
    # RANK is a fallback only: with PET_NODE_RANK set, a RANK meaning something else must not matter.
    rank = _int(env, "PET_NODE_RANK") if env.get("PET_NODE_RANK") else _int(env, "RANK", 0)
    if "MASTER_PORT" not in env and env.get("PET_MASTER_PORT"):
        port = _int(env, "PET_MASTER_PORT", minimum=1)
    return replace(
        local,
        scheduler="pytorchjob",
        nnodes=_nnodes(env, nodes),
        rdzv_endpoint=f"{master}:{port}",
        rdzv_id=env.get("RUN_ID", "") or master,
        node_rank=rank,
        is_main_node=rank == 0,
        local_addr=own_address,
    )


def build_command(
    mode: str,
    script_args: list[str],
    env: Mapping[str, str],
    own_address: str | None = None,
    resource_config: Mapping | None = None,
) -> tuple[list[str], LaunchPlan | None]:
    if mode in SINGLE_MODES:
        return [sys.executable, str(HERE / SINGLE_MODES[mode]), *script_args], None
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
        # Parameter servers run under their own supervisor, not torchrun (ps_supervisor.py says why).
        return [sys.executable, str(HERE / "train.py"), *script_args], plan
    return torchrun_command(plan, mode, script_args), plan


def parameter_servers(mode: str, script_args: list[str]) -> bool:
    return mode == "train" and flag_value(script_args, "--strategy") == "ps"


def ps_environment(plan: LaunchPlan) -> dict[str, str]:
    """ps_supervisor.py's node layout, from the plan torchrun would get: the rendezvous endpoint hosts the registry."""
    if ":" in plan.nnodes:
        raise UsageError("ELASTIC_MIN_NODES", plan.nnodes, "--strategy ps runs on a fixed node count", "unset")
    return {
        "PS_NNODES": plan.nnodes,
        "PS_NODE_RANK": str(plan.node_rank),
        "PS_WORKERS_PER_NODE": str(plan.nproc_per_node),
        "PS_REGISTRY": plan.rdzv_endpoint,
        "PS_HOST": plan.local_addr or "127.0.0.1",
        "MAX_RESTARTS": str(plan.max_restarts),
    }


def torchrun_command(plan: LaunchPlan, mode: str, script_args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *plan.torchrun_args(),
        str(HERE / "exit_relay.py"),
        str(HERE / DISTRIBUTED_MODES[mode]),
        *script_args,
    ]


def sanity_first_command(
    plan: LaunchPlan, script_args: list[str], env: Mapping[str, str], resource_config: Mapping | None
) -> list[str]:
    """sanity_check.py on the training's hosts, with a rendezvous of its own (MASTER_PORT + 1, rdzv id + -sanity)."""
    port = _int(env, "MASTER_PORT", DEFAULT_PORT, minimum=1) + 1
    sanity = plan_launch("sanity", {**env, "MASTER_PORT": str(port)}, plan.local_addr, resource_config)
    sanity = replace(sanity, rdzv_id=f"{plan.rdzv_id}-sanity")
    run_id = flag_value(script_args, "--run-id") or env.get("RUN_ID", "")
    args = ["--run-id", run_id] if run_id else []
    if ":" not in plan.nnodes:
        args += ["--expected-nodes", plan.nnodes]
    return torchrun_command(sanity, "sanity", args)


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of one network interface (Linux SIOCGIFADDR), or None if it has none."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def own_ipv4(env: Mapping[str, str]) -> str | None:
    """The address this node's torchrun agent publishes: the bootstrap interface's, where the job names one.

    On Batch (awsvpc) GLOO_SOCKET_IFNAME=eth0 names the task's interface; the container also has ecs-eth0, a
    link-local link to the ECS agent that no other host can reach (contracts/job_environment.py).
    """
    interface = env.get("GLOO_SOCKET_IFNAME", "").split(",")[0].strip()
    if interface:
        addr = interface_ipv4(interface)
        if addr is None:
            raise UsageError(
                "GLOO_SOCKET_IFNAME",
                interface,
                "no IPv4 address on that interface in this container",
                "the task's interface (eth0 on AWS Batch)",
            )
        return addr
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


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


def ml_root(env: Mapping[str, str]) -> Path:
    return Path(env.get(ML_ROOT_ENV) or DEFAULT_ML_ROOT)


def on_sagemaker(env: Mapping[str, str]) -> bool:
    return "AWS_BATCH_JOB_NUM_NODES" not in env and (ml_root(env) / "input/config/resourceconfig.json").is_file()


def _read_json(path: Path, default: object = None) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if default is None:
            raise UsageError(str(path), None, "missing", "the file SageMaker writes") from None
        return default
    except (OSError, ValueError) as exc:
        raise UsageError(str(path), None, f"unreadable ({type(exc).__name__}: {exc})", "a JSON object") from None


def prepare(mode: str, script_args: list[str], environ: Mapping[str, str]) -> Launch:
    """The command for `mode` in this container: from the scheduler's environment, and on SageMaker its files."""
    env = dict(environ)
    # A fresh rendezvous store per round: restarted workers never read a dead worker's address.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if env.get("ACCELERATOR_KIND") == "neuron" and mode in ("train", "compile"):
        # Neuron docs, "Neuron Persistent Cache": NEURON_COMPILE_CACHE_URL names the cache; on the shared file system
        # the compile job fills it and every node of every later run reads it.
        env.setdefault("NEURON_COMPILE_CACHE_URL", str(neuron_compile.cache_root(env)))
    elif mode == "compile":
        raise UsageError("mode", mode, "only Trainium (ACCELERATOR_KIND=neuron) compiles ahead of time", "train")
    if not on_sagemaker(env):
        own = own_ipv4(env) if mode in DISTRIBUTED_MODES else None
        cmd, plan = build_command(mode, script_args, env, own)
        if plan and parameter_servers(mode, script_args):
            env.update(ps_environment(plan))
        return ahead_of_time(mode, Launch(cmd, plan, env), script_args)
    root = ml_root(env)
    config = _read_json(root / "input/config/resourceconfig.json")
    if not isinstance(config, dict):
        raise UsageError("resourceconfig.json", config, "not a JSON object", "SageMaker's resource configuration")
    _, _, interface = sagemaker_hosts(config)
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if not env.get(name):
            # NCCL takes a bare name as a prefix ("eth0" would also match eth01): "=" asks for the exact interface.
            env[name] = f"={interface}" if name.startswith("NCCL") else interface
    args = [*script_args, *hyperparameter_flags(mode, _read_json(root / "input/config/hyperparameters.json", {}))]
    own = None
    if mode in DISTRIBUTED_MODES:
        own = interface_ipv4(interface)
        if own is None:
            raise UsageError(
                "resourceconfig.json network_interface_name", interface, "no IPv4 address in this container", "eth0"
            )
    cmd, plan = build_command(mode, args, env, own, config)
    if plan and parameter_servers(mode, args):
        env.update(ps_environment(plan))
    sanity = None
    if plan and mode == "train" and env.get("SANITY_BEFORE_TRAINING") == "1":
        sanity = sanity_first_command(plan, args, env, config)
    return ahead_of_time(mode, Launch(cmd, plan, env, sanity, root), args)


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    modes = [*DISTRIBUTED_MODES, *SINGLE_MODES]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print(f"usage: launch.py {{{'|'.join(modes)}}} [args...]; `launch.py MODE --help` shows the script's flags")
        return 0 if argv else 2
    if argv[0] == "--version":
        from version import VERSION

        print(f"efa-training {VERSION}")
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
    if launch.already_compiled:
        print(f"launch.py: {launch.already_compiled}; nothing to compile", file=sys.stderr, flush=True)
        return 0
    if launch.plan:
        print(
            f"launch.py: {launch.plan.scheduler} node {launch.plan.node_rank}"
            f"{' (main)' if launch.plan.is_main_node else ''}: {' '.join(launch.command)}",
            file=sys.stderr,
            flush=True,
        )
    if launch.ml_root is None:
        if not launch.plan:
            os.execvpe(launch.command[0], launch.command, launch.env)  # one plain process: its exit code is the job's
        return compiled(launch, run_torchrun(launch.command, launch.env))
    return compiled(launch, run_on_sagemaker(mode, launch))


def compiled(launch: Launch, code: int) -> int:
    """After its compilation succeeded, the main node marks the run shape ready (the ranks of a data-parallel run trace
    the same graphs, so its own cache entries are every node's) and drops the trial run's throwaway checkpoints."""
    if code == 0 and launch.ready_marker is not None and launch.run_shape is not None:
        neuron_compile.write_ready(launch.ready_marker, launch.run_shape)
        print(f"launch.py: compile cache ready: {launch.ready_marker}", file=sys.stderr, flush=True)
        if launch.scratch is not None:
            shutil.rmtree(launch.scratch, ignore_errors=True)
    return code


def run_on_sagemaker(mode: str, launch: Launch) -> int:
    """The job's processes as children (so the failure file can be written after them), sanity first if asked."""
    assert launch.ml_root is not None
    host_metrics.start_beside(mode, launch.env, launch.ml_root)  # this instance's utilisation, for the idle alarm
    stage, code = mode, 0
    if launch.sanity_first:
        stage = "sanity check before training"
        print(f"launch.py: {stage}: {' '.join(launch.sanity_first)}", file=sys.stderr, flush=True)
        code = run_torchrun(launch.sanity_first, launch.env)
        if code == 0 and _signals_received:
            code = EXIT_STOPPED  # stopped between the check and the training: nothing to train or save yet
    if code == 0:
        stage = mode
        code = run_torchrun(launch.command, launch.env) if launch.plan else run_forwarding(launch.command, launch.env)
    if code != 0:
        write_failure(launch.ml_root, code, stage)
    return code


def write_failure(root: Path, code: int, stage: str, detail: str = "") -> None:
    """SageMaker's failure file: DescribeTrainingJob returns its first 1024 characters as FailureReason
    (https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-output.html)."""
    path = root / "output" / "failure"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(failure_reason(code, stage, detail)[:1024] + "\n")
    except OSError as exc:  # the exit code still tells the job failed
        print(f"launch.py: WARNING could not write {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)


_signals_received: list[int] = []


def run_forwarding(cmd: list[str], env: dict) -> int:
    """`cmd` as a child with the scheduler's stop signals passed on (StopTrainingJob sends SIGTERM and waits 120 s:
    https://docs.aws.amazon.com/sagemaker/latest/dg/API_StopTrainingJob.html); its exit code, 128+N if killed."""
    proc = subprocess.Popen(cmd, env=env)

    def forward(signum: int, frame: object) -> None:
        _signals_received.append(signum)
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = proc.wait()
    return code if code >= 0 else 128 - code


def run_torchrun(cmd: list[str], env: dict) -> int:
    """torchrun as a child, with the scheduler's stop signals passed on, ending with the workers' own exit code."""
    with tempfile.TemporaryDirectory(prefix="launch-exit-codes-") as folder:
        return relayed_exit_code(Path(folder), run_forwarding(cmd, {**env, EXIT_CODE_DIR: folder}))


if __name__ == "__main__":
    sys.exit(main())
