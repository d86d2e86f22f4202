"""One node's share of a parameter-server job: its servers and workers as processes, kept running (server.py,
worker.py).

torchrun restarts every worker of a node when one fails, which is what an all-reduce job needs and what a parameter
server must not do, so `--strategy ps` runs under this supervisor instead (the launcher picks it: workloads.runner):
  - it starts `servers_per_node` servers and `workers_per_node` workers (PS_ROLE, PS_INDEX, ... in their
    environment); node 0's supervisor also hosts the job's registry store, where servers publish their addresses;
  - a worker that exits 0 is done; a worker that fails otherwise is replaced, up to MAX_RESTARTS times per worker,
    after the servers are told it left (so nobody waits for it); one that exits with a refusal (2, 4, 5) stops the
    job with that code;
  - a server that fails stops every process of the job on every node (the generation in the registry moves on) and
    they all start again from the last checkpoint, up to MAX_RESTARTS times;
  - SIGTERM/SIGINT stop every process; the job resumes from its last checkpoint.
Environment: nodes.py's layout (PS_NNODES, PS_NODE_RANK, PS_WORKERS_PER_NODE, PS_REGISTRY, PS_HOST, MAX_RESTARTS).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from efa_training.runtime.console import log
from efa_training.runtime.errors import EXIT_DIVERGED, EXIT_FOLDER_LOCKED, EXIT_STOPPED, EXIT_USAGE
from efa_training.workloads.ctr_ps.nodes import NodeLayout, node_layout
from efa_training.workloads.ctr_ps.protocol import INBOX, Layout, open_store, pack

REFUSALS = (EXIT_USAGE, EXIT_DIVERGED, EXIT_FOLDER_LOCKED)
POLL_SECONDS = 0.2
# Batch's default is SIGKILL 30 s after SIGTERM (Batch user guide, job_timeouts.html; the hosts here raise it to
# 120 s, as do the EKS pods' terminationGracePeriodSeconds), so the smallest grace is 30 s; a cut of the
# host-memory tables to FSx must fit, or the last periodic cut stands.
STOP_GRACE_SECONDS = 25
GENERATION = "generation"
NODES_DONE = "nodes_done"
TRAIN_MODULE = "efa_training.train"  # each server and worker runs the train command again, with PS_ROLE set


class Supervisor:
    def __init__(self, node: NodeLayout, train_argv: list[str]) -> None:
        self.node, self.argv = node, train_argv
        main = node.node_rank == 0
        host, port = node.registry.rsplit(":", 1)
        self.registry = open_store(node.registry, host_it=main)  # node 0 hosts it; it lives as long as this process
        if main:
            self.registry.set(GENERATION, "0")
        self.generation = int(self.registry.get(GENERATION))
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.worker_restarts: dict[int, int] = {}
        self.job_restarts = 0
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def start(self, role: str, index: int) -> None:
        layout = Layout(
            role, index, self.node.servers, self.node.workers, self.node.registry, self.generation, self.node.host
        )
        env = {
            **os.environ,
            "PS_ROLE": role,
            "PS_INDEX": str(index),
            "PS_SERVERS": str(layout.servers),
            "PS_WORKERS": str(layout.workers),
            "PS_REGISTRY": layout.registry,
            "PS_GENERATION": str(layout.generation),
            "PS_HOST": layout.host,
            "LOCAL_RANK": str(
                index
                - self.node.node_rank * (self.node.workers_per_node if role == "worker" else self.node.servers_per_node)
            ),
            # As torchrun does for its workers, unless the job sets it: one node's processes share its cores.
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")
            or str(max(1, (os.cpu_count() or 1) // self.node.processes)),
        }
        self.procs[(role, index)] = subprocess.Popen([sys.executable, "-m", TRAIN_MODULE, *self.argv], env=env)
        log(f"ps: {role} {index} started (pid {self.procs[(role, index)].pid}, generation {self.generation})")

    def start_all(self) -> None:
        n = self.node
        for g in range(n.node_rank * n.servers_per_node, (n.node_rank + 1) * n.servers_per_node):
            self.start("server", g)
        for w in range(n.node_rank * n.workers_per_node, (n.node_rank + 1) * n.workers_per_node):
            self.start("worker", w)

    def stop_all(self) -> None:
        """SIGKILL: the servers and workers ignore SIGTERM (run.run_role), and a cut on disk is complete or absent."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()

    def checkpoint_and_stop(self) -> int:
        """SIGTERM/SIGINT: ask server 0 for a cut at the first step no worker reached, wait for it (at most
        STOP_GRACE_SECONDS, inside Batch's and Kubernetes' grace before SIGKILL), then stop everything: 143."""
        layout = Layout("", 0, self.node.servers, 0, self.node.registry, self.generation, "")
        try:
            main = open_store(self.registry.get(layout.server_key(0)).decode())
            main.queue_push(INBOX, pack({"op": "stop"}))
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while not self.registry.check([layout.stopped_key()]) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
            saved = self.registry.check([layout.stopped_key()])
        except Exception as err:  # the registry or server 0 already gone: the last periodic cut stands
            log(f"ps: WARNING no checkpoint at the stop ({type(err).__name__}: {err})")
            saved = False
        if saved:
            log(f"ps: stopped after checkpoint {int(self.registry.get(layout.stopped_key()))}")
        self.stop_all()
        return EXIT_STOPPED

    def tell_servers(self, message: dict) -> None:
        layout = Layout("", 0, self.node.servers, 0, self.node.registry, self.generation, "")
        for g in range(self.node.servers):
            open_store(self.registry.get(layout.server_key(g)).decode()).queue_push(INBOX, pack(message))

    def run(self) -> int:
        self.start_all()
        finished: set[tuple[str, int]] = set()
        while True:
            time.sleep(POLL_SECONDS)
            if self.stopping:
                return self.checkpoint_and_stop()
            if int(self.registry.get(GENERATION)) != self.generation:  # a server failed, here or on another node
                if not self.restart_job("a server on another node failed"):
                    return 1
                finished.clear()
                continue
            for (role, index), proc in list(self.procs.items()):
                code = proc.poll()
                if code is None or (role, index) in finished:
                    continue
                if code == 0:
                    finished.add((role, index))
                elif code in REFUSALS:
                    log(f"ps: {role} {index} refused the run (exit {code}); stopping the job")
                    self.stop_all()
                    return code
                elif role == "worker":
                    if not self.replace_worker(index, code):
                        return 1
                else:
                    self.registry.add(GENERATION, 1)
                    if not self.restart_job(f"server {index} failed (exit {code})"):
                        return 1
                    finished.clear()
                    break
            if len(finished) == len(self.procs):
                return self.finish()

    def replace_worker(self, index: int, code: int) -> bool:
        used = self.worker_restarts.get(index, 0)
        if used >= self.node.max_restarts:
            log(f"ps: worker {index} failed (exit {code}) after {used} replacements; stopping the job")
            self.stop_all()
            return False
        self.worker_restarts[index] = used + 1
        log(f"ps: worker {index} failed (exit {code}); replacing it ({used + 1}/{self.node.max_restarts})")
        self.tell_servers({"op": "left", "w": index})
        self.start("worker", index)
        return True

    def restart_job(self, reason: str) -> bool:
        self.stop_all()
        if self.job_restarts >= self.node.max_restarts:
            log(f"ps: {reason} after {self.job_restarts} restarts; stopping the job")
            return False
        self.job_restarts += 1
        self.generation = int(self.registry.get(GENERATION))
        attempt = f"{self.job_restarts}/{self.node.max_restarts}"
        log(f"ps: {reason}; every process restarts from the last checkpoint ({attempt})")
        self.start_all()
        return True

    def finish(self) -> int:
        """Every process here exited 0; node 0 keeps the registry up until every node is done."""
        self.registry.add(NODES_DONE, 1)
        if self.node.node_rank == 0:
            while int(self.registry.add(NODES_DONE, 0)) < self.node.nnodes:
                time.sleep(POLL_SECONDS)
        return 0


def supervise(train_argv: list[str], servers_per_node: int, env: dict[str, str]) -> int:
    return Supervisor(node_layout(env, servers_per_node), train_argv).run()
