"""The parameter-server strategy (`--strategy ps`) for sparse click-through models (ctr_model.py).

Roles, all processes of `train.py --strategy ps` (ps_supervisor.py starts them on every training node):
  server g   holds rows r of the embedding tables with r % servers == g in host memory, with their row-wise Adagrad
             state (one accumulator per row, as FBGEMM's rowwise Adagrad), and applies a worker's sparse gradients
             the moment they arrive. Server 0 also holds the dense model (ctr_model.CtrModel) and its Adagrad state,
             and every worker's data position: the dense layers train asynchronously on the servers, like the rows.
  worker w   reads its own blocks of the data (ctr_data.block_indices), pulls the rows its batch touches (and the
             dense weights), computes the loss and its gradients, pushes them without waiting, and goes on.
Messages travel over c10d's TCPStore queues (`queue_push`/`queue_pop`): each server hosts a store; requests go to its
"in" queue, replies to a queue named by the worker and its incarnation, so a replaced worker never reads an answer
meant for the one it replaces. No sockets of our own, and no torch.distributed.rpc: its dynamic membership fails
to admit a process once a member has crashed (measured here: the join waits on the dead member), which is exactly
what a replaced worker must do.

Bounded staleness (stale synchronous parallel, Ho et al. 2013): a server answers worker w's pull only when w's clock
(its next step, plus the offset that sets a replacement level with the others) is at most `staleness` above the
slowest live worker's; 0 is synchronous (every worker waits for the slowest each step), a large bound is
asynchronous. A server reorders nothing: a worker's push is applied before its next pull is answered, so a worker
always reads its own updates.

Checkpoints are consistent cuts: at a save step k every server holds back pushes of step k and later until every
live worker has pushed step k-1, then writes its shard; server 0 writes the dense model, the optimizer state and
every worker's position, then the manifest, and renames the folder into place (checkpoint_format.py's layout and
checks, format "ps"). A worker that dies (the supervisor tells the servers at once) stops counting for staleness
and saves; its replacement rejoins from its recorded position, at most repeating its last step. A server that dies
restarts every process of the job from the last checkpoint (ps_supervisor.py).
"""

from __future__ import annotations

import io
import math
import os
import shutil
import signal
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from checkpoint_folder import move_into_place
from checkpoint_format import PREFIX, TMP_PREFIX, CheckpointDamaged, fsync_path, save_file, step_dirs, step_name, verify
from checkpoint_lock import lock_folder_waiting, lock_holder
from console import log
from ctr_data import CtrRecords, block_indices
from ctr_model import CTR_SIZES, CtrConfig, CtrModel, table_rows
from distributed import resolve_device
from errors import EXIT_DIVERGED, EXIT_FOLDER_LOCKED, RunRefused, UsageError
from metrics import MetricsLogger
from train_config import TrainConfig

INBOX = "in"
EPS = 1e-8  # Adagrad's epsilon, as torch.optim.Adagrad's default is 1e-10; rows see few updates
STORE_TIMEOUT = timedelta(minutes=30)  # a pop that waits this long returns to the loop (an idle server)
DEFAULT_SAVES = 10  # --checkpoint-every 0: about ten cuts over the run


def pack(message: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(message, buf)
    return buf.getvalue()


def unpack(raw: bytes) -> dict:
    return torch.load(io.BytesIO(raw), weights_only=True)  # tensors and plain containers only


def open_store(address: str, host_it: bool = False) -> dist.TCPStore:
    host, port = address.rsplit(":", 1)
    return dist.TCPStore(host, int(port), is_master=host_it, wait_for_workers=False, timeout=STORE_TIMEOUT)


def save_every(cfg: TrainConfig) -> int:
    return cfg.checkpoint_every or max(1, cfg.max_steps // DEFAULT_SAVES)


@dataclass(frozen=True)
class Layout:
    """Where this process sits in the job: set by ps_supervisor.py in the environment."""

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


# ---- the server -------------------------------------------------------------------------------------------------


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


class Server:
    def __init__(self, cfg: TrainConfig, layout: Layout) -> None:
        self.cfg, self.layout = cfg, layout
        self.ccfg: CtrConfig = CTR_SIZES[cfg.model]
        g, n = layout.index, layout.servers
        self.local_rows = (self.ccfg.table_rows - g + n - 1) // n  # global rows r with r % n == g
        generator = torch.Generator().manual_seed(cfg.seed * 7919 + g)
        bound = 1.0 / math.sqrt(self.ccfg.rows)  # DLRM's uniform(-1/sqrt(rows), 1/sqrt(rows)) initialisation
        self.table = torch.empty(self.local_rows, self.ccfg.dim).uniform_(-bound, bound, generator=generator)
        self.accum = torch.zeros(self.local_rows)
        self.dense: CtrModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        if g == 0:
            torch.manual_seed(cfg.seed)
            self.dense = CtrModel(self.ccfg)
            self.optimizer = torch.optim.Adagrad(self.dense.parameters(), lr=cfg.lr)
        self.workers = [WorkerView() for _ in range(layout.workers)]
        self.every = save_every(cfg)
        self.saved_at = 0
        self.stop_at: int | None = None  # a cut asked for by a stop (SIGTERM): at the first step no worker reached
        self.pending_saves: dict[int, dict[str, dict]] = {}  # server 0: the files of each save step written so far
        if g == 0:
            # One writer per checkpoint folder, as for the other strategies (checkpoint_lock.py): a second copy of the
            # same job is refused with exit 5 before it touches a cut. Held until this process ends.
            Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            self._lock = lock_folder_waiting(Path(cfg.checkpoint_dir), lock_holder())
            if isinstance(self._lock, str):
                raise RunRefused(
                    EXIT_FOLDER_LOCKED,
                    f"--checkpoint-dir={cfg.checkpoint_dir!r} is in use by another job (holder: {self._lock}); "
                    "one writer per checkpoint folder",
                )
            # Parts of a cut that a stopped generation did not complete; no save is under way yet.
            for leftover in Path(cfg.checkpoint_dir).glob(f"{TMP_PREFIX}{PREFIX}*"):
                shutil.rmtree(leftover, ignore_errors=True)
        self.resume()
        # Any free port, on every interface: the training nodes' security group allows all traffic among its members
        # (the EFA user guide requires it, efa-start.html; constructs/network/efa_network.py), so no port is opened.
        self.store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT)
        self.registry = open_store(layout.registry)
        self.registry.set(layout.server_key(g), f"{layout.host}:{self.store.port}")
        self.finished = False

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

    # -- checkpoints --

    def folder(self, step: int) -> Path:
        return Path(self.cfg.checkpoint_dir) / f"{TMP_PREFIX}{step_name(step)}"

    def save(self, step: int) -> None:
        """This server's part of the cut at `step`: its rows and their optimizer state (server 0: the dense model,
        its optimizer and the workers' positions too); server 0 completes the checkpoint when every part is in."""
        tmp = self.folder(step)
        tmp.mkdir(parents=True, exist_ok=True)
        g = self.layout.index
        files = {f"server_{g}.pt": save_file({"table": self.table, "accum": self.accum}, tmp / f"server_{g}.pt")}
        if self.dense is not None and self.optimizer is not None:
            state = {
                "model": self.dense.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "positions": [v.position for v in self.workers],
                "next_steps": [v.next_step for v in self.workers],
            }
            files["dense.pt"] = save_file(state, tmp / "dense.pt")
        self.saved_at = step
        message = {"op": "saved", "step": step, "files": files}
        if g == 0:
            self.on_saved(message)
        else:
            main = open_store(self.registry.get(self.layout.server_key(0)).decode())
            main.queue_push(INBOX, pack(message))
        if step == self.cfg.max_steps and g != 0:
            self.finished = True

    def on_saved(self, message: dict) -> None:
        files = self.pending_saves.setdefault(message["step"], {})
        files.update(message["files"])
        if len(files) == self.layout.servers + 1:  # every server's shard and the dense state
            self.complete(message["step"], self.pending_saves.pop(message["step"]))

    def complete(self, step: int, files: dict[str, dict]) -> None:
        import json

        tmp = self.folder(step)
        meta = {
            "step": step,
            "format": "ps",
            "world_size": self.layout.servers,
            "workers": self.layout.workers,
            "config": {"train": asdict(self.cfg), "model": asdict(self.ccfg)},
            "files": files,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        fsync_path(tmp / "meta.json")
        fsync_path(tmp)
        move_into_place(tmp, Path(self.cfg.checkpoint_dir) / step_name(step))
        for old in step_dirs(Path(self.cfg.checkpoint_dir))[self.cfg.keep_last :]:
            shutil.rmtree(old, ignore_errors=True)
        log(f"ps: checkpoint {step_name(step)} complete ({self.layout.servers} server shards)")
        if step == self.stop_at:
            self.registry.set(self.layout.stopped_key(), str(step))
        if step == self.cfg.max_steps:
            self.finished = True

    def resume(self) -> None:
        """Load this server's part of the newest complete checkpoint; another server count is refused."""
        root = Path(self.cfg.checkpoint_dir)
        for path in step_dirs(root):
            try:
                meta = verify(path, "ps")
            except CheckpointDamaged as err:
                log(f"ps: WARNING skipping {path.name}: {err}")
                continue
            if meta["world_size"] != self.layout.servers or meta["workers"] != self.layout.workers:
                raise UsageError(
                    "--checkpoint-dir",
                    str(path),
                    f"written by {meta['world_size']} servers and {meta['workers']} workers, this job has "
                    f"{self.layout.servers} and {self.layout.workers}",
                    "the same node count, servers per node and accelerators per node, or a new --checkpoint-dir",
                )
            shard = torch.load(path / f"server_{self.layout.index}.pt", weights_only=True)
            self.table, self.accum = shard["table"], shard["accum"]
            if self.dense is not None and self.optimizer is not None:
                state = torch.load(path / "dense.pt", weights_only=True)
                self.dense.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
            else:
                state = torch.load(path / "dense.pt", weights_only=True)
            for view, position, step in zip(self.workers, state["positions"], state["next_steps"], strict=True):
                view.position, view.next_step = position, step
            self.saved_at = meta["step"]
            if self.layout.index == 0:
                log(f"ps: resumed from {path} at step {meta['step']}")
            return
        initial = self.cfg.initial_model_dir()
        if initial is not None:  # no checkpoint of its own: incremental training from another run's model
            self.start_from(initial)

    def start_from(self, folder: Path) -> None:
        """The rows and dense weights of another run's newest loadable ps checkpoint, resharded to this job's server
        count, with their Adagrad state: Adagrad has no warm-up, and fresh accumulators make the first updates as
        large as the learning rate, which undid the initial model in a test (its first losses rose above a fresh
        model's). Steps and data positions start afresh. Another model size is refused (exit 2)."""
        import ctr_validate

        try:
            model, table, meta, path = ctr_validate.load_newest(folder, with_optimizer=True)
        except (UsageError, RuntimeError) as err:
            raise UsageError("--init-from", str(folder), str(err), "a ps run with a loadable checkpoint") from None
        if model.cfg != self.ccfg:
            raise UsageError(
                "--init-from",
                str(path),
                f"a {meta['config']['train']['model']} model",
                f"a {self.cfg.model} checkpoint",
            )
        mine = torch.arange(self.layout.index, self.ccfg.table_rows, self.layout.servers)  # this server's global rows
        self.table, self.accum = table[mine], meta["accum"][mine]
        if self.dense is not None and self.optimizer is not None:
            self.dense.load_state_dict(model.state_dict())
            self.optimizer.load_state_dict(meta["optimizer"])
        if self.layout.index == 0:
            log(f"ps: starting from the weights of {path}")


# ---- the worker -------------------------------------------------------------------------------------------------


class Worker:
    def __init__(self, cfg: TrainConfig, layout: Layout) -> None:
        self.cfg, self.layout = cfg, layout
        self.ccfg = CTR_SIZES[cfg.model]
        self.reply = f"out/{layout.index}/{uuid.uuid4().hex[:12]}"  # this incarnation's reply queue
        registry = open_store(layout.registry)
        keys = [layout.server_key(g) for g in range(layout.servers)]
        registry.wait(keys)
        self.servers = [open_store(registry.get(k).decode()) for k in keys]
        # The dense part computes on this worker's GPU where there is one (embedding rows travel through host memory).
        kind = resolve_device(cfg.device, ("auto", "cuda", "cpu"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", local % torch.cuda.device_count()) if kind == "cuda" else torch.device("cpu")
        self.model = CtrModel(self.ccfg).to(self.device)
        self.records = CtrRecords(Path(cfg.data), "train")
        self.metrics = MetricsLogger(cfg.run_id, enabled=True)
        self.slowdown = _slowdown(layout.index)

    def ask(self, g: int, message: dict) -> None:
        self.servers[g].queue_push(INBOX, pack({**message, "w": self.layout.index, "reply": self.reply}))

    def answer(self, g: int) -> dict:
        return unpack(self.servers[g].queue_pop(self.reply))

    def run(self) -> int:
        self.ask(0, {"op": "hello"})  # server 0 records positions and decides the clock offset
        start = self.answer(0)
        for g in range(1, self.layout.servers):
            self.ask(g, {"op": "hello", "offset": start["offset"]})
        for g in range(1, self.layout.servers):
            self.answer(g)
        position, step = start["position"], start["position"] // self.cfg.micro_batch_size
        if position:
            log(f"ps: worker {self.layout.index} rejoins at step {step} ({position} samples consumed)")
        started, first_step, loss = time.perf_counter(), step, math.nan
        while step < self.cfg.max_steps:
            loss = self.step(step, position)
            position += self.cfg.micro_batch_size
            step += 1
        for g in range(self.layout.servers):
            self.ask(g, {"op": "done"})
        seconds = time.perf_counter() - started
        print(_summary_line(self.layout.index, step - first_step, self.cfg.micro_batch_size, seconds, loss), flush=True)
        return 0

    def step(self, step: int, position: int) -> float:
        began = time.perf_counter()
        batch = self.records.take(
            block_indices(self.layout.index, self.layout.workers, self.cfg.micro_batch_size, position)
        )
        rows = table_rows(torch.from_numpy(batch["sparse"].astype(np.int64)), self.ccfg.rows)
        unique, inverse = rows.unique(return_inverse=True)
        owner, local = unique % self.layout.servers, unique // self.layout.servers
        mine = [owner == g for g in range(self.layout.servers)]
        pulled = time.perf_counter()
        for g in range(self.layout.servers):
            self.ask(g, {"op": "pull", "rows": local[mine[g]]})
        replies = [self.answer(g) for g in range(self.layout.servers)]
        pull_ms = 1000 * (time.perf_counter() - pulled)
        embedded = torch.empty(len(unique), self.ccfg.dim)
        for g, reply in enumerate(replies):
            embedded[mine[g]] = reply["rows"]
        embedded = embedded.to(self.device).requires_grad_(True)
        self.model.load_state_dict(replies[0]["dense"])
        self.model.zero_grad(set_to_none=True)
        dense = torch.from_numpy(np.ascontiguousarray(batch["dense"])).to(self.device)
        labels = torch.from_numpy(batch["label"].astype(np.float32)).to(self.device)
        loss = nn.functional.binary_cross_entropy_with_logits(
            self.model(dense, embedded[inverse.to(self.device)]), labels
        )
        loss.backward()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RunRefused(EXIT_DIVERGED, f"worker {self.layout.index}: the loss is {value} at step {step}")
        if self.slowdown > 1:  # benchmarks only: a straggler
            time.sleep((self.slowdown - 1) * (time.perf_counter() - began))
        pushed = time.perf_counter()
        assert embedded.grad is not None
        grads = embedded.grad.cpu()
        for g in range(self.layout.servers):
            message: dict[str, Any] = {"op": "push", "step": step, "rows": local[mine[g]], "grads": grads[mine[g]]}
            if g == 0:
                message["dense"] = [p.grad.cpu() for p in self.model.parameters() if p.grad is not None]
                message["position"] = position + self.cfg.micro_batch_size
            self.ask(g, message)
        push_ms = 1000 * (time.perf_counter() - pushed)
        seconds = time.perf_counter() - began
        if (step + 1) % self.cfg.log_every == 0 or step + 1 == self.cfg.max_steps:
            self.metrics.record(
                step + 1,
                {
                    "Loss": value,
                    "NonFiniteLoss": 0,
                    "SamplesPerSecond": self.cfg.micro_batch_size / seconds,
                    "StepTimeSeconds": seconds,
                    "PullLatencyMs": pull_ms,
                    "PushLatencyMs": push_ms,
                    "StalenessSteps": max(r["staleness"] for r in replies),
                    "RowsTouched": len(unique),
                },
                Worker=self.layout.index,
            )
        return value


def _slowdown(worker: int) -> float:
    """PS_SLOW_WORKER=<index>:<factor> makes one worker that many times slower (the straggler benchmark)."""
    spec = os.environ.get("PS_SLOW_WORKER", "")
    if not spec:
        return 1.0
    index, factor = spec.split(":")
    return float(factor) if int(index) == worker else 1.0


def _summary_line(worker: int, steps: int, batch: int, seconds: float, loss: float) -> str:
    import json

    return json.dumps(
        {
            "ps_worker_summary": {
                "worker": worker,
                "steps": steps,
                "samples": steps * batch,
                "seconds": round(seconds, 3),
                "samples_per_second": round(steps * batch / seconds, 1) if seconds > 0 else None,
                "final_loss": loss if math.isfinite(loss) else None,
            }
        }
    )


def run_role(cfg: TrainConfig, layout: Layout) -> int:
    # The supervisor decides when its processes stop (it cuts a checkpoint first), so a signal sent to the whole
    # process group does not stop them half-way.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if layout.role == "server":
        return Server(cfg, layout).serve()
    return Worker(cfg, layout).run()
