"""A parameter-server worker: reads its own blocks of the data, pulls the rows its batch touches (and the dense
weights), computes the loss and its gradients, pushes them without waiting, and goes on.

Its position in the data is one integer (the samples it consumed), recorded by server 0 with its dense gradients, so
a worker the supervisor replaces rejoins where the one it replaces stopped, at most repeating its last step.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from efa_training.runtime.console import log
from efa_training.runtime.distributed import resolve_device
from efa_training.runtime.errors import EXIT_DIVERGED, RunRefused
from efa_training.runtime.metrics import PROGRESS_METRIC, MetricsLogger
from efa_training.workloads.ctr_ps.criteo import CtrRecords, block_indices
from efa_training.workloads.ctr_ps.model import CTR_SIZES, CtrModel, table_rows
from efa_training.workloads.ctr_ps.protocol import INBOX, Layout, open_store, pack, unpack

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig


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
        # One write per line: workers share the job's stdout, and print() under PYTHONUNBUFFERED writes the text and
        # its newline separately, so two workers' lines could share one line of the log.
        line = _summary_line(self.layout.index, step - first_step, self.cfg.micro_batch_size, seconds, loss)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
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
        embedded, replies, pull_ms = self._pull(local, mine, len(unique))
        value = self._forward_backward(batch, embedded, inverse, replies[0]["dense"], step)
        if self.slowdown > 1:  # benchmarks only: a straggler
            time.sleep((self.slowdown - 1) * (time.perf_counter() - began))
        push_ms = self._push(step, position, local, mine, embedded)
        seconds = time.perf_counter() - began
        if (step + 1) % self.cfg.log_every == 0 or step + 1 == self.cfg.max_steps:
            staleness = max(r["staleness"] for r in replies)
            self._record(step + 1, value, seconds, pull_ms, push_ms, staleness, len(unique))
        return value

    def _pull(
        self, local: torch.Tensor, mine: list[torch.Tensor], count: int
    ) -> tuple[torch.Tensor, list[dict], float]:
        """The batch's rows from the servers that hold them (server 0 adds the dense weights), on this worker's
        device with their gradients kept; the servers' replies; the pull's latency in milliseconds."""
        pulled = time.perf_counter()
        for g in range(self.layout.servers):
            self.ask(g, {"op": "pull", "rows": local[mine[g]]})
        replies = [self.answer(g) for g in range(self.layout.servers)]
        pull_ms = 1000 * (time.perf_counter() - pulled)
        embedded = torch.empty(count, self.ccfg.dim)
        for g, reply in enumerate(replies):
            embedded[mine[g]] = reply["rows"]
        return embedded.to(self.device).requires_grad_(True), replies, pull_ms

    def _forward_backward(
        self, batch: np.ndarray, embedded: torch.Tensor, inverse: torch.Tensor, dense_state: dict, step: int
    ) -> float:
        """The batch's loss, its gradients left on the rows and the dense layers; a non-finite loss stops the job
        (exit 4)."""
        self.model.load_state_dict(dense_state)
        self.model.zero_grad(set_to_none=True)
        dense = torch.from_numpy(np.ascontiguousarray(batch["dense"])).to(self.device)
        labels = torch.from_numpy(batch["label"].astype(np.float32)).to(self.device)
        loss = nn.functional.binary_cross_entropy_with_logits(
            self.model(dense, embedded[inverse.to(self.device)]), labels
        )
        loss.backward()
        value = float(loss.detach())
        if not math.isfinite(value):
            # Its metrics line first, on whatever step it comes: the NonFiniteLoss alarm watches it.
            self.metrics.record(step + 1, {"NonFiniteLoss": 1}, Worker=self.layout.index)
            raise RunRefused(EXIT_DIVERGED, f"worker {self.layout.index}: the loss is {value} at step {step}")
        return value

    def _push(
        self, step: int, position: int, local: torch.Tensor, mine: list[torch.Tensor], embedded: torch.Tensor
    ) -> float:
        """Each server its rows' gradients (server 0 also the dense ones and this worker's next data position),
        without waiting for an answer; the push's latency in milliseconds."""
        pushed = time.perf_counter()
        assert embedded.grad is not None
        grads = embedded.grad.cpu()
        for g in range(self.layout.servers):
            message: dict[str, Any] = {"op": "push", "step": step, "rows": local[mine[g]], "grads": grads[mine[g]]}
            if g == 0:
                message["dense"] = [p.grad.cpu() for p in self.model.parameters() if p.grad is not None]
                message["position"] = position + self.cfg.micro_batch_size
            self.ask(g, message)
        return 1000 * (time.perf_counter() - pushed)

    def _record(
        self, step: int, loss: float, seconds: float, pull_ms: float, push_ms: float, staleness: int, rows: int
    ) -> None:
        """One EMF line of this worker's step (its Worker property tells the workers' lines apart)."""
        self.metrics.record(
            step,
            {
                "Loss": loss,
                "NonFiniteLoss": 0,
                PROGRESS_METRIC: 1,
                "SamplesPerSecond": self.cfg.micro_batch_size / seconds,
                "StepTimeSeconds": seconds,
                "PullLatencyMs": pull_ms,
                "PushLatencyMs": push_ms,
                "StalenessSteps": staleness,
                "RowsTouched": rows,
            },
            Worker=self.layout.index,
        )


def _slowdown(worker: int) -> float:
    """PS_SLOW_WORKER=<index>:<factor> makes one worker that many times slower (the straggler benchmark)."""
    spec = os.environ.get("PS_SLOW_WORKER", "")
    if not spec:
        return 1.0
    index, factor = spec.split(":")
    return float(factor) if int(index) == worker else 1.0


def _summary_line(worker: int, steps: int, batch: int, seconds: float, loss: float) -> str:
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
