"""Where one node's supervisor sits in a parameter-server job: the layout the launcher passes in the environment
(ps_environment, from the plan torchrun would have had) and the supervisor reads back (node_layout).

Environment: PS_NNODES, PS_NODE_RANK, PS_WORKERS_PER_NODE, PS_REGISTRY (host:port, node 0 hosts it), PS_HOST (this
node's address), MAX_RESTARTS (default 3). Free of torch: the launcher imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch.rendezvous import DEFAULT_PORT

if TYPE_CHECKING:
    from efa_training.runtime.launch.rendezvous import LaunchPlan


@dataclass(frozen=True)
class NodeLayout:
    nnodes: int
    node_rank: int
    workers_per_node: int
    servers_per_node: int
    registry: str
    host: str
    max_restarts: int

    @property
    def servers(self) -> int:
        return self.nnodes * self.servers_per_node

    @property
    def workers(self) -> int:
        return self.nnodes * self.workers_per_node

    @property
    def processes(self) -> int:
        """On one node."""
        return self.workers_per_node + self.servers_per_node


def node_layout(env: dict[str, str], servers_per_node: int) -> NodeLayout:
    def number(name: str, default: int, low: int) -> int:
        text = env.get(name, str(default)).strip()
        if not (text.isascii() and text.isdigit()) or int(text) < low:
            raise UsageError(name, text, "not a whole number", f">= {low}")
        return int(text)

    layout = NodeLayout(
        nnodes=number("PS_NNODES", 1, 1),
        node_rank=number("PS_NODE_RANK", 0, 0),
        workers_per_node=number("PS_WORKERS_PER_NODE", 2, 1),
        servers_per_node=servers_per_node,
        registry=env.get("PS_REGISTRY", f"127.0.0.1:{DEFAULT_PORT}"),
        host=env.get("PS_HOST", "127.0.0.1"),
        max_restarts=number("MAX_RESTARTS", 3, 0),
    )
    if layout.node_rank >= layout.nnodes:
        raise UsageError("PS_NODE_RANK", layout.node_rank, f"not below PS_NNODES={layout.nnodes}", "0 to nnodes-1")
    return layout


def ps_environment(plan: LaunchPlan) -> dict[str, str]:
    """supervisor.py's node layout, from the plan torchrun would get: the rendezvous endpoint hosts the registry."""
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
