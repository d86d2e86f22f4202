"""Atomic, verified checkpoints that resume bit-for-bit: the save and the agreed load (format.py: layout).

Save: every rank writes into `.tmp-step_000000120/`; files are fsynced, then rank 0 writes meta.json with each
file's size and CRC-32 and renames the directory into place. A kill at any moment leaves either the old set of
checkpoints or the new one, never a half-written `step_*`; a step saved again keeps its old copy as
`.replaced-step_*` until the new one is in place, so even that has no window without the step. DDP writes one
`state.pt` from rank 0; FSDP2 writes its shards with torch.distributed.checkpoint (DCP), every rank its own.
Everything is loaded with `torch.load(weights_only=True)`: a checkpoint folder cannot run code.

Resume (`load_latest`), the same for DDP and FSDP: for the newest candidate, every rank first checks its share of
the files alone (meta.json complete, every file of the manifest present with its size and CRC, its own RNG state
readable); one collective tells every rank what the others found; only if all are satisfied do they enter the
collective load, whose outcome is agreed the same way. A candidate that fails anywhere is dropped by every rank
together and set aside as `.damaged-step_*` with a warning naming the problem, and the previous one is tried.

Node-local folders (CHECKPOINT_NODE_LOCAL=1, SageMaker): each instance has its own /opt/ml/checkpoints, which
SageMaker uploads to one S3 prefix (files deleted locally are deleted there too) and restores whole to every instance
of the next job ("Checkpoints in Amazon SageMaker AI": https://docs.aws.amazon.com/sagemaker/latest/dg/model-checkpoints.html).
So every node's local rank 0 does what rank 0 does to a shared folder, to its own node's folder, after the same
barrier: the temporary folder, the rename into place, pruning and setting aside. Every node writes rank 0's meta.json
(broadcast, with the whole manifest), so the union of the nodes' folders is one complete checkpoint and each node's
folder holds complete step folders of its own files. A union that lacks a node's files of the newest step (an upload
cut short) fails that node's ranks' share of the check above, and the previous step is loaded.

Rank 0's renames, pruning and setting aside are folder.py's; when to save is manager.py's.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from efa_training.checkpointing.folder import move_into_place, prune, set_aside
from efa_training.checkpointing.format import (
    DAMAGED_PREFIX,
    TMP_PREFIX,
    CheckpointDamaged,
    dcp_options,
    file_record,
    fsync_path,
    rng_state,
    save_file,
    set_rng_state,
    step_dirs,
    step_name,
    to_cpu,
    verify,
)
from efa_training.checkpointing.state import TrainerState
from efa_training.runtime.console import log


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}" if not isinstance(exc, CheckpointDamaged) else text[0]


class CheckpointStore:
    """One checkpoint folder, seen by one rank: `save` and `load_latest` are collective over the process group."""

    def __init__(
        self,
        root: Path,
        fmt: str,
        keep_last: int,
        rank: int,
        world_size: int,
        *,
        local_rank: int = 0,
        node_local: bool = False,
    ) -> None:
        assert fmt in ("full", "dcp")
        self.root, self.fmt, self.keep_last = root, fmt, keep_last
        self.rank, self.world_size = rank, world_size
        self.node_local = node_local
        # Who renames, prunes and sets aside in this process's folder: rank 0 of a shared folder, else each node's.
        self.finalises = local_rank == 0 if node_local else rank == 0
        self.device = torch.device("cpu")  # where the agreement's flags live (NCCL needs the GPU)

    @property
    def _distributed(self) -> bool:
        return dist.is_initialized() and self.world_size > 1

    def _barrier(self) -> None:
        if self._distributed:
            dist.barrier()

    def _failed_ranks(self, problem: str | None) -> list[int]:
        """The one collective of an agreement: every rank learns which ranks found a problem."""
        flags = torch.zeros(self.world_size, dtype=torch.int32, device=self.device)  # NCCL needs a GPU tensor
        flags[self.rank] = int(problem is not None)
        if self._distributed:
            dist.all_reduce(flags)
        return [r for r, bad in enumerate(flags.tolist()) if bad]

    # ---- save -------------------------------------------------------------------------------
    def save(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        train_state: TrainerState,
        config: dict,
        mark_step: Callable[[], None] = lambda: None,
    ) -> Path:
        final = self.root / step_name(train_state.step)
        tmp = self.root / f"{TMP_PREFIX}{final.name}"
        if self.finalises:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # leftover of a save killed half-way
            tmp.mkdir()
        self._barrier()
        mark_step()  # XLA: materialise pending computation before reading tensors out
        extra = {"scheduler": scheduler.state_dict(), "train_state": vars(train_state).copy()}
        written = self._write_state(tmp, model, optimizer, extra)
        written[f"rng_rank{self.rank}.pt"] = save_file(rng_state(), tmp / f"rng_rank{self.rank}.pt")
        manifest = self._gather_manifest(written)  # also the barrier: every rank's files are written
        if self.rank == 0:  # files no rank claimed (DCP's .metadata, a renamed shard): rank 0 sums them
            for path in tmp.iterdir():
                manifest.setdefault(path.name, {**file_record(path), "rank": 0})
        meta = {"step": train_state.step, "format": self.fmt, "world_size": self.world_size, "config": config}
        meta["files"] = manifest
        if self.node_local:
            meta = self._broadcast(meta)  # every node writes rank 0's meta.json, byte for byte
        if self.finalises:
            self._publish(tmp, final, meta)
            prune(self.root, train_state.step, self.keep_last)
        self._barrier()
        return final

    def _write_state(
        self, tmp: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: dict
    ) -> dict[str, dict]:
        """This rank's files of the format, with their manifest records."""
        if self.fmt == "full":
            if self.rank != 0:
                return {}
            state = {"model": to_cpu(_unwrap(model).state_dict()), "optimizer": to_cpu(optimizer.state_dict()), **extra}
            return {"state.pt": save_file(state, tmp / "state.pt")}
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer, options=dcp_options(None))
        # Collective: every rank writes its own shards (FileSystemWriter names them __<rank>_<n>.distcp
        # and fsyncs them); each rank checksums its own, still in its page cache.
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        written = {shard.name: file_record(shard) for shard in tmp.glob(f"__{self.rank}_*.distcp")}
        if self.rank == 0:
            written["extra.pt"] = save_file(extra, tmp / "extra.pt")
        return written

    def _gather_manifest(self, written: dict[str, dict]) -> dict[str, dict]:
        own = {name: {**record, "rank": self.rank} for name, record in written.items()}
        if not self._distributed:
            return own
        if self.device.type == "xla":
            # Object collectives are not an XLA backend feature; the full format's other files are the ranks'
            # small RNG files, which rank 0 sums itself (_publish sums every file no rank claimed).
            self._barrier()
            return own
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, own)
        return {name: record for part in everyone for name, record in part.items()}

    def _broadcast(self, meta: dict) -> dict:
        if not self._distributed:
            return meta
        box: list[Any] = [meta]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _publish(self, tmp: Path, final: Path, meta: dict) -> None:
        """meta.json with the whole manifest, written last, then the rename into place."""
        with open(tmp / "meta.json", "w") as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_path(tmp)
        move_into_place(tmp, final)

    # ---- load -------------------------------------------------------------------------------
    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, device: torch.device
    ) -> tuple[TrainerState, Path] | None:
        """Restore the newest checkpoint that every rank can read; set aside damaged ones with a warning.

        Every step that can fail on one rank only is followed by an agreement, so no rank enters the
        collective DCP load while another has given up on the candidate (which would hang both)."""
        self.device = device
        touched = False  # whether a failed attempt may have written into the live model
        candidates = step_dirs(self.root)
        for path in candidates:
            meta, rng, problem = self._check_candidate(path)
            failed = self._failed_ranks(problem)
            if not failed:
                touched = True
                state, problem = self._try_load(path, model, optimizer, scheduler, rng)
                failed = self._failed_ranks(problem)
            if failed:
                self._set_aside(path, problem, failed)
                continue
            if meta["world_size"] != self.world_size and self.rank == 0:
                log(
                    f"checkpoint: WARNING {path.name} was written by {meta['world_size']} ranks, this run has "
                    f"{self.world_size}: RNG streams start afresh (dropout is not bit-exact across the resize)"
                )
            return state, path
        if candidates and touched:
            raise RuntimeError(
                f"no checkpoint under {self.root} could be loaded, and a failed attempt may have "
                "overwritten part of the model; move the damaged checkpoints away to start fresh"
            )
        return None

    def _check_candidate(self, path: Path) -> tuple[dict, dict | None, str | None]:
        """(meta, this rank's RNG state, None), or ({}, None, the problem this rank found)."""
        try:
            meta = verify(path, self.fmt, self.rank, self.world_size)
            return meta, self._read_rng(path, meta), None
        except CheckpointDamaged as exc:
            return {}, None, str(exc)

    def _try_load(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rng: dict | None
    ) -> tuple[TrainerState, str | None]:
        try:
            return self._load(path, model, optimizer, scheduler, rng), None
        # DCP raises CheckpointException, a BaseException in torch 2.13: caught by name, not by Exception.
        except (Exception, CheckpointException) as exc:
            return TrainerState(), f"loading failed: {_describe(exc)}"

    def _read_rng(self, path: Path, meta: dict) -> dict | None:
        if meta["world_size"] != self.world_size:
            return None  # another world size: no stream of this rank to restore
        try:
            return torch.load(path / f"rng_rank{self.rank}.pt", map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling errors have many types; all mean the same here
            raise CheckpointDamaged(f"rng_rank{self.rank}.pt unreadable ({_describe(exc)})") from None

    def _set_aside(self, path: Path, problem: str | None, failed: list[int]) -> None:
        if problem is not None:
            log(f"checkpoint: WARNING rank {self.rank}: {path.name} is damaged: {problem}")
        if self.finalises:
            try:
                where = f"set aside as {set_aside(path, DAMAGED_PREFIX).name}"
            except OSError as exc:
                where = f"left in place ({exc.strerror or exc})"
            log(
                f"checkpoint: WARNING skipping {path.name} (damaged on rank(s) {', '.join(map(str, failed))}), "
                f"{where}; trying the previous checkpoint"
            )

    def _load(
        self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, rng: dict | None
    ) -> TrainerState:
        if self.fmt == "full":
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
            _unwrap(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            extra = state
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            options = dcp_options(path)
            model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
            dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))  # collective, in place
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=options)
            extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        scheduler.load_state_dict(extra["scheduler"])
        if rng is not None:
            set_rng_state(rng)
        return TrainerState(**extra["train_state"])


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    # Peel torch.compile (`_orig_mod`) and DDP (`module`) wrappers in whichever order they were applied.
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        inner = getattr(model, "_orig_mod", None) or model.module
        assert isinstance(inner, torch.nn.Module)
        model = inner
    return model
