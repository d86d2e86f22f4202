"""The ctr-ps workload's `train`: in a process the supervisor started (PS_ROLE set), its role, a server or a worker;
else the pre-flight checks, then the supervisor of this node's servers and workers."""

from __future__ import annotations

import os
import signal
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from efa_training.checkpointing.reuse import as_meta_json, check_reusable
from efa_training.runtime.preflight import check_platform, probe_writable
from efa_training.workloads.ctr_ps import supervisor
from efa_training.workloads.ctr_ps.criteo import CtrRecords
from efa_training.workloads.ctr_ps.model import CTR_SIZES
from efa_training.workloads.ctr_ps.protocol import Layout
from efa_training.workloads.ctr_ps.server import Server
from efa_training.workloads.ctr_ps.worker import Worker

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


def train(cfg: TrainConfig, expected_nodes: int | None, argv: list[str]) -> int:
    if "PS_ROLE" in os.environ:  # a process the supervisor started
        return run_role(cfg, Layout.from_env(dict(os.environ)))
    check_before_start(cfg, expected_nodes)
    return supervisor.supervise(argv, cfg.ps_servers_per_node, dict(os.environ))


def check_before_start(cfg: TrainConfig, expected_nodes: int | None) -> None:
    """What a parameter-server run refuses before its processes start: the platform's checks, then its Criteo
    records, a checkpoint folder of another strategy or model, an unwritable folder (one line, exit 2)."""
    check_platform(expected_nodes, cfg.device)
    CtrRecords(Path(cfg.data), "train")
    check_reusable(Path(cfg.checkpoint_dir), cfg.strategy, cfg.model, as_meta_json(asdict(CTR_SIZES[cfg.model])))
    probe_writable(Path(cfg.checkpoint_dir))


def run_role(cfg: TrainConfig, layout: Layout) -> int:
    # The supervisor decides when its processes stop (it cuts a checkpoint first), so a signal sent to the whole
    # process group does not stop them half-way.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if layout.role == "server":
        return Server(cfg, layout).serve()
    return Worker(cfg, layout).run()
