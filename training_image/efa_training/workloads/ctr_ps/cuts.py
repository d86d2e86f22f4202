"""The parameter servers' checkpoints: consistent cuts, written by every server and completed by server 0.

At a save step k every server holds back pushes of step k and later until every live worker has pushed step k-1
(server.py decides when), then writes its shard; server 0 writes the dense model, the optimizer state and every
worker's position, then the manifest, and renames the folder into place (the checkpoint library's layout and checks,
format "ps"). Server 0 also holds the folder's writer lock, as the other strategies' rank 0 does.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from efa_training.checkpointing.folder import move_into_place
from efa_training.checkpointing.format import (
    PREFIX,
    TMP_PREFIX,
    CheckpointDamaged,
    fsync_path,
    save_file,
    step_dirs,
    step_name,
    verify,
)
from efa_training.checkpointing.lock import lock_folder_waiting, lock_holder
from efa_training.runtime.console import log
from efa_training.runtime.errors import EXIT_FOLDER_LOCKED, RunRefused, UsageError
from efa_training.workloads.ctr_ps.evaluate import load_newest
from efa_training.workloads.ctr_ps.protocol import INBOX, Layout, open_store, pack

if TYPE_CHECKING:
    from efa_training.train_config import TrainConfig
    from efa_training.workloads.ctr_ps.model import CtrConfig, CtrModel
    from efa_training.workloads.ctr_ps.server import WorkerView


class Cuts:
    """The checkpoint part of a Server (server.py): its state is declared here, set there."""

    cfg: TrainConfig
    layout: Layout
    ccfg: CtrConfig
    table: torch.Tensor
    accum: torch.Tensor
    dense: CtrModel | None
    optimizer: torch.optim.Optimizer | None
    workers: list[WorkerView]
    saved_at: int
    stop_at: int | None
    pending_saves: dict[int, dict[str, dict]]
    registry: dist.TCPStore
    finished: bool

    def take_folder(self) -> None:
        """Server 0: one writer per checkpoint folder, as for the other strategies (checkpointing/lock.py): a second
        copy of the same job is refused with exit 5 before it touches a cut. Held until this process ends."""
        cfg = self.cfg
        Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        self._lock = lock_folder_waiting(Path(cfg.checkpoint_dir), lock_holder(cfg.named_run_id()))
        if isinstance(self._lock, str):
            raise RunRefused(
                EXIT_FOLDER_LOCKED,
                f"--checkpoint-dir={cfg.checkpoint_dir!r} is in use by another job (holder: {self._lock}); "
                "one writer per checkpoint folder",
            )
        # Parts of a cut that a stopped generation did not complete; no save is under way yet.
        for leftover in Path(cfg.checkpoint_dir).glob(f"{TMP_PREFIX}{PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)

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
        try:
            model, table, meta, path = load_newest(folder, with_optimizer=True)
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
