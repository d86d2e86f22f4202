"""How the parameter-server processes talk: c10d TCPStore queues, messages as torch.save'd dicts of tensors and plain
containers, and where each process sits in the job (Layout, set by the supervisor in its environment).

Each server hosts a store; requests go to its "in" queue (INBOX), replies to a queue named by the worker and its
incarnation, so a replaced worker never reads an answer meant for the one it replaces. The registry (node 0's
supervisor's store) holds each server's address and the job's generation.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

INBOX = "in"
STORE_TIMEOUT = timedelta(minutes=30)  # a pop that waits this long returns to the loop (an idle server)


def pack(message: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(message, buf)
    return buf.getvalue()


def unpack(raw: bytes) -> dict:
    return torch.load(io.BytesIO(raw), weights_only=True)  # tensors and plain containers only


def open_store(address: str, host_it: bool = False) -> dist.TCPStore:
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=host_it, wait_for_workers=False, timeout=STORE_TIMEOUT)


@dataclass(frozen=True)
class Layout:
    """Where this process sits in the job: set by supervisor.py in the environment."""

    role: str  # "server" or "worker"
    index: int
    servers: int
    workers: int
    registry: str  # host:port of the job's registry store (node 0's supervisor)
    generation: int  # bumped by a restart from the checkpoint; keys of older generations are ignored
    host: str  # this node's address, where the servers' stores are reached

    @staticmethod
    def from_env(env: dict[str, str]) -> Layout:
        return Layout(
            env["PS_ROLE"],
            int(env["PS_INDEX"]),
            int(env["PS_SERVERS"]),
            int(env["PS_WORKERS"]),
            env["PS_REGISTRY"],
            int(env["PS_GENERATION"]),
            env.get("PS_HOST", "127.0.0.1"),
        )

    def server_key(self, g: int) -> str:
        return f"gen{self.generation}/server/{g}"

    def stopped_key(self) -> str:
        """Set by server 0 once the cut a stop asked for is complete."""
        return f"gen{self.generation}/stopped"
