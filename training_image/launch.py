"""Container entry point: `launch.py {sanity|train|validate|prepare-data} [script args...]`.

sanity and train run under torchrun, with its arguments derived from the scheduler's
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
Both:
  ACCELERATORS_PER_NODE (required for sanity/train; must agree with PET_NPROC_PER_NODE if that is set)
                                       -> --nproc-per-node
  ELASTIC_MIN_NODES (optional)         -> --nnodes MIN:MAX (elastic)
  MAX_RESTARTS (default 3 for train, 0 for sanity) -> --max-restarts
  MASTER_PORT (default 29500)          -> rendezvous port on the main node
  RUN_ID                               -> --rdzv-id when no Batch job id; RunId metric dimension
Set LAUNCH_DRY_RUN=1 to print the command as JSON instead of running it.
Exit codes: torchrun turns every worker failure into 1, so each worker runs behind exit_relay.py, which
records its own exit code, and launch.py ends with the code of torchrun's last restart (errors.py lists
them: 2 usage, 4 diverged, 5 checkpoint folder locked; sanity_check.py's 3, report not written).
launch.py stays the container's main process and forwards SIGTERM/SIGINT to torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from errors import UsageError, exit_with_usage_error
from exit_relay import EXIT_CODE_DIR, relayed_exit_code

HERE = Path(__file__).resolve().parent
DISTRIBUTED_MODES = {"sanity": "sanity_check.py", "train": "train.py"}
SINGLE_MODES = {"validate": "validate.py", "prepare-data": "prepare_data.py"}
DEFAULT_PORT = 29500
DEFAULT_MAX_RESTARTS = {"train": 3, "sanity": 0}  # a failed pre-flight check must fail the job, not retry


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


def plan_launch(mode: str, env: Mapping[str, str], own_address: str | None = None) -> LaunchPlan:
    """torchrun settings for `mode` from the scheduler's environment variables (pure function)."""
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
    )
    if "AWS_BATCH_JOB_NUM_NODES" in env:
        return _batch_plan(env, local, port, own_address)
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


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def build_command(
    mode: str, script_args: list[str], env: Mapping[str, str], own_address: str | None = None
) -> tuple[list[str], LaunchPlan | None]:
    if mode in SINGLE_MODES:
        return [sys.executable, str(HERE / SINGLE_MODES[mode]), *script_args], None
    plan = plan_launch(mode, env, own_address)
    expected = _flag_value(script_args, "--expected-nodes")
    # Checked here as well as in the scripts: a mismatch must fail once, not once per torchrun restart.
    if expected is not None and ":" not in plan.nnodes and expected != plan.nnodes:
        raise UsageError(
            "--expected-nodes",
            expected,
            f"the scheduler gives {plan.nnodes} node(s)",
            "the job's node count (AWS_BATCH_JOB_NUM_NODES / PET_NNODES)",
        )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *plan.torchrun_args(),
        str(HERE / "exit_relay.py"),
        str(HERE / DISTRIBUTED_MODES[mode]),
        *script_args,
    ], plan


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    modes = [*DISTRIBUTED_MODES, *SINGLE_MODES]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print(f"usage: launch.py {{{'|'.join(modes)}}} [args...]; `launch.py MODE --help` shows the script's flags")
        return 0 if argv else 2
    mode, script_args = argv[0], argv[1:]
    try:
        if mode not in modes:
            raise UsageError("mode", mode, "unknown mode", "|".join(modes))
        own = own_ipv4(os.environ) if mode in DISTRIBUTED_MODES else None
        cmd, plan = build_command(mode, script_args, os.environ, own)
    except UsageError as err:
        exit_with_usage_error("launch.py", err)
    env = dict(os.environ)
    # A fresh rendezvous store per round: restarted workers never read a dead worker's address.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if env.get("LAUNCH_DRY_RUN") == "1":
        print(json.dumps({"command": cmd, "plan": asdict(plan) if plan else None}))
        return 0
    if plan:
        print(
            f"launch.py: {plan.scheduler} node {plan.node_rank}{' (main)' if plan.is_main_node else ''}: "
            f"{' '.join(cmd)}",
            file=sys.stderr,
            flush=True,
        )
    if not plan:
        os.execvpe(cmd[0], cmd, env)  # one plain process: its exit code is the job's
    return run_torchrun(cmd, env)


def run_torchrun(cmd: list[str], env: dict) -> int:
    """torchrun as a child, with the scheduler's stop signals passed on, ending with the workers' own exit code."""
    with tempfile.TemporaryDirectory(prefix="launch-exit-codes-") as folder:
        proc = subprocess.Popen(cmd, env={**env, EXIT_CODE_DIR: folder})
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
        code = proc.wait()
        return relayed_exit_code(Path(folder), code if code >= 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main())
