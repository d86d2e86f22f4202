"""Device and process-group set-up for the three backends.

  cuda: NCCL, one GPU per process (LOCAL_RANK), bf16 autocast.
  cpu:  gloo, fp32 (tests and the local run). Runs are seeded and the CPU kernels used are deterministic, so a
        resumed CPU run matches an uninterrupted one bit for bit; torch.use_deterministic_algorithms is not
        enabled (it imports inductor, +1 s per process), so GPU runs are seeded but not bit-reproducible.
  xla:  Trainium through torch-neuronx; torch_xla is imported on this path only,
        because it is not installed in the GPU image or on CPU machines.

Works under torchrun (RANK/WORLD_SIZE/LOCAL_RANK set) and as a plain single
process, where a world of one is created so the same code paths run.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import watchdog

DEVICES = ("auto", "cuda", "cpu", "xla")
# ACCELERATOR_KIND is the infrastructure's word for the node type (see launch.py).
KIND_TO_DEVICE = {"gpu": "cuda", "neuron": "xla", "cpu": "cpu"}


@dataclass
class Runtime:
    device_type: str  # "cuda" | "cpu" | "xla"
    device: torch.device
    rank: int
    local_rank: int
    world_size: int
    xm: Any = None  # torch_xla.core.xla_model on the xla path, else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def autocast(self):
        # bf16 autocast on accelerators only; CPU stays fp32 so runs are bit-reproducible.
        if self.device_type in ("cuda", "xla"):
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    def mark_step(self) -> None:
        if self.xm is not None:
            self.xm.mark_step()


def resolve_device(requested: str, supported: tuple[str, ...] = DEVICES) -> str:
    """The device type for `--device`: auto follows ACCELERATOR_KIND where the script supports that device
    (validate.py has no XLA path: a Neuron node evaluates on CPU), else cuda if present, else cpu."""
    if requested not in supported:
        raise UsageError("--device", requested, "unknown device", ", ".join(supported))
    if requested != "auto":
        _require_xla_if(requested, "--device", requested)
        return requested
    kind = os.environ.get("ACCELERATOR_KIND", "")
    if kind not in ("", *KIND_TO_DEVICE):
        raise UsageError("ACCELERATOR_KIND", kind, "unknown accelerator kind", ", ".join(KIND_TO_DEVICE))
    if kind and KIND_TO_DEVICE[kind] in supported:
        _require_xla_if(KIND_TO_DEVICE[kind], "ACCELERATOR_KIND", kind)
        return KIND_TO_DEVICE[kind]
    return "cuda" if torch.cuda.is_available() else "cpu"


def _require_xla_if(device_type: str, field: str, value: str) -> None:
    # The GPU image and CPU machines have no torch_xla: say so in one line instead of an import traceback.
    if device_type == "xla" and importlib.util.find_spec("torch_xla") is None:
        raise UsageError(
            field, value, "torch_xla (torch-neuronx) is not installed in this image", "cuda, cpu, or the Neuron image"
        )


def _xla_model() -> Any:
    """torch_xla's xla_model, with the "xla" process-group backend registered. torch_xla is only in the Neuron
    image, so it is imported here, by name, when the device is xla."""
    importlib.import_module("torch_xla")
    xla_model = importlib.import_module("torch_xla.core.xla_model")
    importlib.import_module("torch_xla.distributed.xla_backend")  # registers the "xla" backend
    return xla_model


def init_distributed(requested_device: str, timeout_s: int = 1800) -> Runtime:
    device_type = resolve_device(requested_device)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    timeout = timedelta(seconds=timeout_s)
    under_launcher = "MASTER_ADDR" in os.environ
    xm: Any = None
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device", "cuda", "no CUDA device visible", "cpu, xla or auto")
        # Bind the GPU before the process group so NCCL uses the right device (pytorch/examples).
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    elif device_type == "xla":
        xm = _xla_model()
        device = xm.xla_device()
        backend = "xla"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        if backend == "xla" and under_launcher:
            # Neuron programming guide (torch-neuronx, torchrun): init_process_group("xla").
            dist.init_process_group(backend, timeout=timeout)
        elif under_launcher:
            store = _restart_scoped_store(rank, world_size, timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            # Single process without torchrun: a private store, world of one.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return Runtime(device_type, device, dist.get_rank(), local_rank, dist.get_world_size(), xm)


def _restart_scoped_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The torchrun store, with keys scoped to this restart of the worker group.

    torchrun (c10d rendezvous, shared agent store) hands every restart the same
    TCPStore and init_process_group uses fixed key names, so a restarted worker
    can read the gloo/NCCL address that a killed worker published and fail with
    "Connection refused" (seen here in 2 of 3 tries). A prefix per restart makes
    the keys fresh. launch.py also sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
    which gives every rendezvous round a new store, covering elastic scale-ups
    that restart workers without counting a restart.
    """
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_hosts_store and rank == 0,
        timeout=timeout,
        multi_tenant=True,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"worker_group/restart_{attempt}", store)


def destroy_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# How long a hung collective outlasts the launcher's hang watchdog (runtime/launch/watchdog.py) before it times out:
# the watchdog polls each second, and the other nodes see its ask for their stacks through the shared run folder in
# a few more; only then are every node's workers frozen. Set equal, the ranks waiting for the hung one died of the
# timeout as the watchdog came, and only the hung rank's stacks were kept (issue 51).
EVIDENCE_MARGIN_SECONDS = 60


def collective_timeout_after_warm_up(rt: Runtime, env: Mapping[str, str], progress_every_s: float = 0.0) -> int | None:
    """After warm-up (rendezvous, the first step's compilation and allocations), the process group's timeout becomes
    the hang watchdog's limit (its floor, or FACTOR x the interval between progress lines, `progress_every_s`: the
    first step's, the slowest) plus EVIDENCE_MARGIN_SECONDS: the watchdog freezes every rank and takes its stacks
    first, and NCCL's own watchdog still aborts a collective it missed (writing its Flight Recorder traces).
    torchtitan sets its timeout after its first step through the same call (torchtitan/distributed/utils.py
    `set_pg_timeouts`, `comm.train_timeout_seconds`). The new timeout in seconds, or None where nothing changed
    (XLA, no process group)."""
    if rt.device_type == "xla" or not dist.is_initialized():
        return None
    limit = max(watchdog.floor_from(env), watchdog.FACTOR * progress_every_s)
    timeout = math.ceil(limit + EVIDENCE_MARGIN_SECONDS)
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout))
    return timeout
