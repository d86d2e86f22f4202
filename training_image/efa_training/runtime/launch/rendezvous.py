"""Where torchrun's rendezvous is, from the scheduler's environment: a pure function (`plan_launch`), unit-tested
without a cluster. The launcher's manual (cli.py) lists what each scheduler sets and what it becomes.

AWS Batch multi-node parallel jobs, Kubernetes (PyTorchJob, Kubeflow Trainer TrainJob, an Indexed Job) and SageMaker
training jobs each say how many nodes there are, which one this is and where the main node is; the plan is the same
torchrun arguments on all of them, and the parameter-server supervisor's node layout (workloads/ctr_ps/nodes.py).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace

from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch.modes import DISTRIBUTED_MODES
from efa_training.runtime.launch.sagemaker import sagemaker_hosts
from efa_training.runtime.run_paths import node_local_checkpoints

DEFAULT_PORT = 29500
# How far apart nodes may start, in seconds: torchrun's c10d rendezvous gives up after join_timeout (600 s by
# default), and a rank that starts before the store's host after read_timeout (60 s) (torch/distributed/elastic/
# rendezvous/dynamic_rendezvous.py and c10d_rendezvous_backend.py). A cold start is slower: on EKS every run scales
# the node group from zero (boot, join, device plugins) and pulls a 15-25 GiB image per node, and SageMaker and
# Batch hosts pull the image one by one too. 30 minutes covers that, and stays far inside one attempt's time.
DEFAULT_RDZV_TIMEOUT = 1800
# A failed pre-flight check must fail the job, not retry; so must a failed compilation (the pipeline retries it).
DEFAULT_MAX_RESTARTS = {"train": 3, "sanity": 0, "compile": 0}


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


def env_count(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    """The count an environment variable holds (at least `minimum`), or `default` when unset; else one UsageError."""
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
    return str(env_count(env, name, minimum=1))


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
    nproc = env_count(env, "ACCELERATORS_PER_NODE", minimum=1)
    if env.get("PET_NPROC_PER_NODE", "").isdigit() and int(env["PET_NPROC_PER_NODE"]) != nproc:
        raise UsageError(
            "PET_NPROC_PER_NODE",
            env["PET_NPROC_PER_NODE"],
            f"disagrees with ACCELERATORS_PER_NODE={nproc}",
            "the same count, or unset",
        )
    max_restarts = env_count(env, "MAX_RESTARTS", DEFAULT_MAX_RESTARTS[mode])
    port = env_count(env, "MASTER_PORT", DEFAULT_PORT, minimum=1)
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
        rdzv_timeout=env_count(env, "RDZV_TIMEOUT", DEFAULT_RDZV_TIMEOUT, minimum=10),
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
    nodes = env_count(env, "AWS_BATCH_JOB_NUM_NODES", minimum=1)
    index = env_count(env, "AWS_BATCH_JOB_NODE_INDEX", 0)
    is_main = index == env_count(env, "AWS_BATCH_JOB_MAIN_NODE_INDEX", 0)
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


def _kubernetes_plan(
    env: Mapping[str, str], local: LaunchPlan, master: str, port: int, own_address: str | None
) -> LaunchPlan:
    nodes = _node_count(env, "PET_NNODES") if env.get("PET_NNODES") else str(env_count(env, "WORLD_SIZE", minimum=1))
    # RANK is a fallback only: with PET_NODE_RANK set, a RANK meaning something else must not matter.
    rank = env_count(env, "PET_NODE_RANK") if env.get("PET_NODE_RANK") else env_count(env, "RANK", 0)
    if "MASTER_PORT" not in env and env.get("PET_MASTER_PORT"):
        port = env_count(env, "PET_MASTER_PORT", minimum=1)
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
