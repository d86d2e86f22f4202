"""A parameter server: its shard of the embedding rows in host memory with their row-wise Adagrad state, and on server
0 the dense model too; it applies each worker's gradients the moment they arrive, within the staleness bound.

Server g holds rows r of the tables with r % servers == g (one Adagrad accumulator per row, as FBGEMM's rowwise
Adagrad). It answers worker w's pull only when w's clock (its next step, plus the offset that sets a replacement level
with the others) is at most `staleness` above the slowest live worker's (stale synchronous parallel, Ho et al. 2013);
a worker's push is applied before its next pull is answered, so a worker always reads its own updates. When to cut a
checkpoint is decided here; writing it is cuts.py's.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from efa_training.workloads.ctr_ps.cuts import Cuts
from efa_training.workloads.ctr_ps.model import CTR_SIZES, CtrModel
from efa_training.workloads.ctr_ps.protocol import INBOX, STORE_TIMEOUT, Layout, open_store, pack, unpack

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig

EPS = 1e-8  # Adagrad's epsilon, as torch.optim.Adagrad's default is 1e-10; rows see few updates
DEFAULT_SAVES = 10  # --checkpoint-every 0: about ten cuts over the run


def save_every(cfg: TrainConfig) -> int:
    return cfg.checkpoint_every or max(1, cfg.max_steps // DEFAULT_SAVES)


@dataclass
class WorkerView:
    """What a server knows of one worker."""

    next_step: int = 0  # the step of its next push
    # Added to next_step, the worker's clock for the staleness bound. A replacement is set level with the slowest
    # worker, so it holds nobody back; server 0 decides it and the worker carries it to every other server, so that
    # all servers count the same clocks (per-server clocks deadlocked two workers in a test: each was ahead on the
    # server the other waited on).
    offset: int = 0
    position: int = 0  # samples consumed (server 0 records it with the dense gradients)
    live: bool = False
    done: bool = False
    waiting: deque = field(default_factory=deque)  # its messages held back, in order


class Server(Cuts):
    def __init__(self, cfg: TrainConfig, layout: Layout) -> None:
        self.cfg, self.layout = cfg, layout
        self.ccfg = CTR_SIZES[cfg.model]
        self._init_shard()
        self.workers = [WorkerView() for _ in range(layout.workers)]
        self.every = save_every(cfg)
        self.saved_at = 0
        self.stop_at = None  # a cut asked for by a stop (SIGTERM): at the first step no worker reached
        self.pending_saves = {}  # server 0: the files of each save step written so far
        if layout.index == 0:
            self.take_folder()
        self.resume()
        # Any free port, on every interface: the training nodes' security group allows all traffic among its members
        # (the EFA user guide requires it, efa-start.html; constructs/network/efa_network.py), so no port is opened.
        self.store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
        self.registry = open_store(layout.registry)
        self.registry.set(layout.server_key(layout.index), f"{layout.host}:{self.store.port}")
        self.finished = False

    def _init_shard(self) -> None:
        """This server's rows, seeded per server; server 0 also builds the dense model and its optimizer."""
        cfg, g, n = self.cfg, self.layout.index, self.layout.servers
        self.local_rows = (self.ccfg.table_rows - g + n - 1) // n  # global rows r with r % n == g
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + g)
        bound = 1.0 / math.sqrt(self.ccfg.rows)  # DLRM's uniform(-1/sqrt(rows), 1/sqrt(rows)) initialisation
        self.table = torch.empty(self.local_rows, self.ccfg.dim).uniform_(-bound, bound, generator=generator)
        self.accum = torch.zeros(self.local_rows)
        self.dense = None
        self.optimizer = None
        if g == 0:
            torch.manual_seed(cfg.seed)
            self.dense = CtrModel(self.ccfg)
            self.optimizer = torch.optim.Adagrad(self.dense.parameters(), lr=cfg.lr)

    # -- the loop --

    def serve(self) -> int:
        handlers = {"hello": self.on_hello, "pull": self.on_request, "push": self.on_request, "done": self.on_done}
        handlers |= {"left": self.on_left, "saved": self.on_saved, "stop": self.on_stop, "cut": self.on_cut}
        while not self.finished:
            try:
                message = unpack(self.store.queue_pop(INBOX))
            except dist.DistStoreError:
                continue  # idle for STORE_TIMEOUT
            handlers[message["op"]](message)
            self.release()
        return 0

    def release(self) -> None:
        """Serve what was held back and is now allowed, then take a checkpoint when one is due."""
        progress = True
        while progress:
            progress = False
            for w, view in enumerate(self.workers):
                while view.waiting and self.allowed(w, view.waiting[0]):
                    self.handle_now(view.waiting.popleft())
                    progress = True
            if self.save_due():
                self.save(self.next_save())
                progress = True
        if self.saved_at >= self.cfg.max_steps and all(v.done for v in self.workers) and not self.pending_saves:
            self.finished = True  # a run resumed from its last cut: nothing was left to train

    def allowed(self, w: int, message: dict) -> bool:
        if message["op"] == "pull":
            return self.within_staleness(w)
        if self.stop_at is not None and self.saved_at >= self.stop_at:
            # Stopped: the cut a stop asked for is the job's last state until the supervisor ends it. Without this,
            # pushes went on to the next regular cut while the supervisor was still ending the processes.
            return False
        return message["step"] < self.next_save() or self.saved_at >= self.next_save()  # a push past the cut waits

    def within_staleness(self, w: int) -> bool:
        return self.cfg.staleness < 0 or self.clock(self.workers[w]) - self.slowest() <= self.cfg.staleness

    @staticmethod
    def clock(view: WorkerView) -> int:
        return view.next_step + view.offset

    def slowest(self) -> int:
        """The clock of the slowest worker that can move: one held at the next cut waits for the others to reach it,
        so counting it would deadlock a worker that is ahead in clock (a replacement starts level) but behind in
        steps."""
        cut = self.next_save()
        clocks = [self.clock(v) for v in self.workers if v.live and not v.done and v.next_step < cut]
        return min(clocks) if clocks else 0

    def next_save(self) -> int:
        regular = min(self.saved_at - self.saved_at % self.every + self.every, self.cfg.max_steps)
        return min(regular, self.stop_at) if self.stop_at is not None and self.stop_at > self.saved_at else regular

    def save_due(self) -> bool:
        k = self.next_save()
        if self.saved_at >= k:
            return False
        if k == self.cfg.max_steps:  # the last save waits for every worker
            return all(v.done for v in self.workers)
        return any(v.live for v in self.workers) and all(v.next_step >= k for v in self.workers if v.live)

    def handle_now(self, message: dict) -> None:
        (self.answer_pull if message["op"] == "pull" else self.apply_push)(message)

    def on_hello(self, message: dict) -> None:
        """A worker (re)joins: server 0 records where it stands and sets its clock level with the slowest other
        worker; the worker then brings that offset to every other server."""
        view = self.workers[message["w"]]
        if "offset" in message:
            view.offset = message["offset"]
        else:
            view.offset = max(view.offset, self.slowest() - view.next_step)
        view.live, view.done = True, False
        view.waiting.clear()
        reply = {"position": view.position, "step": view.next_step, "offset": view.offset}
        self.store.queue_push(message["reply"], pack(reply))

    def on_left(self, message: dict) -> None:
        view = self.workers[message["w"]]
        view.live = False
        view.waiting.clear()

    def on_stop(self, message: dict) -> None:
        """Server 0, asked by a supervisor that got SIGTERM: a cut at the first step no worker has pushed anywhere.
        A worker pushes step j+1 only after this server answered its pull j+1, which it does only after applying
        push j, so no server has applied a push of step max(next_step here) + 1 or later."""
        live = [v.next_step for v in self.workers if v.live]
        step = min(max(live, default=self.saved_at) + 1, self.cfg.max_steps)
        for g in range(1, self.layout.servers):
            open_store(self.registry.get(self.layout.server_key(g)).decode()).queue_push(
                INBOX, pack({"op": "cut", "step": step})
            )
        self.on_cut({"step": step})
        if step <= self.saved_at:  # nothing new since the last cut
            self.registry.set(self.layout.stopped_key(), str(self.saved_at))

    def on_cut(self, message: dict) -> None:
        self.stop_at = message["step"]

    def on_done(self, message: dict) -> None:
        view = self.workers[message["w"]]
        view.done, view.live = True, False

    def on_request(self, message: dict) -> None:
        """A pull or a push: handled now, or held behind the worker's earlier held messages (their order kept)."""
        view = self.workers[message["w"]]
        if view.waiting or not self.allowed(message["w"], message):
            view.waiting.append(message)
        else:
            self.handle_now(message)

    def answer_pull(self, message: dict) -> None:
        w = message["w"]
        reply: dict[str, Any] = {
            "rows": self.table[message["rows"]],
            "staleness": self.clock(self.workers[w]) - self.slowest(),
        }
        if self.dense is not None:
            reply["dense"] = self.dense.state_dict()
        self.store.queue_push(message["reply"], pack(reply))

    def apply_push(self, message: dict) -> None:
        rows, grads = message["rows"], message["grads"]
        if len(rows):  # row-wise Adagrad: one accumulator per row, the mean squared gradient of its elements
            self.accum[rows] += grads.pow(2).mean(dim=1)
            self.table[rows] -= self.cfg.lr * grads / (self.accum[rows].sqrt() + EPS).unsqueeze(1)
        if self.dense is not None and self.optimizer is not None:
            for p, grad in zip(self.dense.parameters(), message["dense"], strict=True):
                p.grad = grad
            self.optimizer.step()
        view = self.workers[message["w"]]
        view.next_step = message["step"] + 1
        if "position" in message:
            view.position = message["position"]
