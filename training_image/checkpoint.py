"""Atomic, self-describing checkpoints that resume bit-for-bit.

Layout: <checkpoint-dir>/step_000000120/
    meta.json          step, format, world size, config (written last)
    state.pt           "full" format (DDP): model, optimizer, scheduler, train state
    *.distcp/.metadata "dcp" format (FSDP2): sharded model+optimizer via torch.distributed.checkpoint
    extra.pt           "dcp" format: scheduler and train state
    rng_rank{R}.pt     every rank's RNG states (python, numpy, torch CPU/CUDA)

Every rank writes into `.tmp-step_000000120/`; files are fsynced, then rank 0
renames the directory into place and fsyncs the parent. A kill at any moment
therefore leaves either the old set of checkpoints or the new one, never a
half-written `step_*`. Tensors are moved to CPU before saving so a checkpoint
written on GPU loads on Trainium and vice versa. `--keep-last` counts checkpoints
up to the one just saved; newer ones (skipped on resume as unreadable: an
abandoned timeline) are moved aside to `.abandoned-step_*`, so they can neither
shadow nor outlive the live ones.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from errors import UsageError

PREFIX = "step_"
TMP_PREFIX = ".tmp-"
ABANDONED_PREFIX = ".abandoned-"  # newer than the live timeline; kept for inspection, never loaded
STRATEGY_OF_FORMAT = {"full": "ddp", "dcp": "fsdp"}


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_file(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def step_dirs(root: Path) -> list[Path]:
    """Complete checkpoints (renamed into place, meta.json present), newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "meta.json").exists()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]), reverse=True)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _step_of(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def newest_meta(root: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint whose meta.json parses, with that meta (None if there is none)."""
    for path in step_dirs(root):
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            continue  # load_latest will skip it with a warning too
        if isinstance(meta, dict):
            return path, meta
    return None


def check_reusable(root: Path, strategy: str, model_name: str, model_config: dict) -> None:
    """Refuse a --checkpoint-dir whose newest checkpoint another --strategy or --model wrote.

    Loading it would fail with a size mismatch, make DCP overwrite part of the model, or skip
    every checkpoint and silently train from step 0. Runs on every rank before any process group
    exists, reading only meta.json, so all ranks reach the same verdict.
    """
    found = newest_meta(root)
    if found is None:
        return
    path, meta = found
    config = meta.get("config") or {}
    held_strategy = STRATEGY_OF_FORMAT.get(meta.get("format"), repr(meta.get("format")))
    held_model = (config.get("train") or {}).get("model", "?")
    held_arch = config.get("model")
    problems = []
    if held_strategy != strategy:
        problems.append(f"--strategy {held_strategy}")
    if held_model != model_name:
        problems.append(f"--model {held_model}")
    elif isinstance(held_arch, dict) and held_arch != model_config:
        differ = sorted(k for k in set(held_arch) | set(model_config) if held_arch.get(k) != model_config.get(k))
        problems.append("model " + ", ".join(f"{k}={held_arch.get(k)}" for k in differ))
    if problems:
        raise UsageError("--checkpoint-dir", str(root),
                         f"holds checkpoints of {' '.join(problems)} (newest: {path.name}), "
                         f"this run is --strategy {strategy} --model {model_name}",
                         "the same --strategy/--model (and --seq-len) as those checkpoints, or a new --checkpoint-dir")


def probe_writable(root: Path) -> None:
    """Create the directory and write+delete a file in it, so a read-only or unmounted volume is a
    one-line usage error at start-up, not a traceback at the first save."""
    probe = root / f".write-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise UsageError("--checkpoint-dir", str(root), f"not writable ({type(exc).__name__}: "
                         f"{exc.strerror or exc})", "a writable directory (is the shared file system mounted?)") \
            from None


@dataclass
class TrainerState:
    """What the checkpoint must restore besides model and optimizer."""
    step: int = 0
    samples_consumed: int = 0  # global data position, see data.SequenceBatches
    tokens_seen: int = 0


class CheckpointManager:
    def __init__(self, root: Path, fmt: str, keep_last: int, rank: int, world_size: int) -> None:
        assert fmt in ("full", "dcp")
        self.root, self.fmt, self.keep_last = root, fmt, keep_last
        self.rank, self.world_size = rank, world_size
        self._touched_model = False

    def _barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    # ---- save -------------------------------------------------------------------------------
    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             train_state: TrainerState, config: dict, mark_step: Callable[[], None] = lambda: None) -> Path:
        name = f"{PREFIX}{train_state.step:09d}"
        final, tmp = self.root / name, self.root / f"{TMP_PREFIX}{name}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # leftover of a save killed half-way
            tmp.mkdir()
        self._barrier()
        mark_step()  # XLA: materialise pending computation before reading tensors out
        extra = {"scheduler": scheduler.state_dict(), "train_state": vars(train_state).copy()}
        if self.fmt == "full":
            if self.rank == 0:
                state = {"model": _to_cpu(_unwrap(model).state_dict()),
                         "optimizer": _to_cpu(optimizer.state_dict()), **extra}
                _save_file(state, tmp / "state.pt")
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict
            model_sd, optim_sd = get_state_dict(model, optimizer)
            # Collective: every rank writes its own shards; FileSystemWriter fsyncs each file.
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
            if self.rank == 0:
                _save_file(extra, tmp / "extra.pt")
        _save_file(rng_state(), tmp / f"rng_rank{self.rank}.pt")
        self._barrier()
        if self.rank == 0:
            meta = {"step": train_state.step, "format": self.fmt, "world_size": self.world_size,
                    "config": config}
            with open(tmp / "meta.json", "w") as f:
                json.dump(meta, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            _fsync_path(tmp)
            if final.exists():  # same step saved again (e.g. SIGTERM right after a resume)
                trash = self.root / f"{TMP_PREFIX}old-{name}"
                shutil.rmtree(trash, ignore_errors=True)
                os.replace(final, trash)
                os.replace(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _fsync_path(self.root)
            self._prune(train_state.step)
        self._barrier()
        return final

    def _prune(self, saved_step: int) -> None:
        # Checkpoints newer than the one just saved belong to an abandoned timeline (load_latest
        # skipped them as unreadable): keeping them by step number would delete the live
        # checkpoints instead and let a broken one shadow them at the next start. Move them aside.
        live = []
        for path in step_dirs(self.root):
            if _step_of(path) > saved_step:
                aside = self.root / f"{ABANDONED_PREFIX}{path.name}"
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(path, aside)
                log(f"checkpoint: WARNING moved {path.name}, newer than the step {saved_step} just saved "
                    f"(skipped when this run resumed), aside to {aside}")
            else:
                live.append(path)
        for old in live[self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
        for leftover in self.root.glob(f"{TMP_PREFIX}*"):  # saves killed half-way (no save is in flight now)
            shutil.rmtree(leftover, ignore_errors=True)

    # ---- load -------------------------------------------------------------------------------
    def load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    device: torch.device) -> tuple[TrainerState, Path] | None:
        """Restore the newest checkpoint that every rank can read; skip broken ones with a warning."""
        candidates = step_dirs(self.root)
        self._touched_model = False  # set once loading has started writing into the live model
        for path in candidates:
            try:
                loaded = self._read(path, model, optimizer)
                # Applied inside the try: a size mismatch is a reason to skip, agreed by all ranks below.
                self._touched_model = True
                self._apply(path, loaded, model, optimizer, scheduler)
                ts = TrainerState(**loaded["extra"]["train_state"])
                ok = 1
            except Exception as exc:  # any read/parse failure means "try the previous one"
                ok = 0
                log(f"checkpoint: WARNING skipping {path} on rank {self.rank}: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")
            flag = torch.tensor([ok], dtype=torch.int32, device=device)  # NCCL needs a GPU tensor
            if dist.is_initialized() and self.world_size > 1:
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # all ranks must agree on which one to use
            if not int(flag.item()):
                if ok and self.rank == 0:
                    log(f"checkpoint: WARNING skipping {path}: another rank could not read it")
                continue
            return ts, path
        if not candidates:
            return None
        touched = torch.tensor([int(self._touched_model)], dtype=torch.int32, device=device)
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(touched, op=dist.ReduceOp.MAX)  # every rank raises, or none does
        if int(touched.item()):
            raise RuntimeError(f"no checkpoint under {self.root} could be loaded, and a failed attempt may have "
                               "overwritten part of the model; move the broken checkpoints away to start fresh")
        return None

    def _read(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("format") != self.fmt:
            raise ValueError(f"checkpoint format {meta.get('format')!r}, this run uses {self.fmt!r}")
        rng_file = path / f"rng_rank{self.rank}.pt"
        rng = torch.load(rng_file, weights_only=False) if meta["world_size"] == self.world_size and \
            rng_file.exists() else None
        if self.fmt == "full":
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
            return {"state": state, "extra": state, "rng": rng}
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model_sd, optim_sd = get_state_dict(model, optimizer)
        self._touched_model = True  # from here on DCP loads in place, into the model's own shards
        dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        return {"model": model_sd, "optim": optim_sd, "extra": extra, "rng": rng}

    def _apply(self, path: Path, loaded: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: Any) -> None:
        if self.fmt == "full":
            _unwrap(model).load_state_dict(loaded["state"]["model"])
            optimizer.load_state_dict(loaded["state"]["optimizer"])
        else:
            from torch.distributed.checkpoint.state_dict import set_state_dict
            set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
        scheduler.load_state_dict(loaded["extra"]["scheduler"])
        if loaded["rng"] is not None:
            set_rng_state(loaded["rng"])


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    # Peel torch.compile (`_orig_mod`) and DDP (`module`) wrappers in whichever order they were applied.
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        model = getattr(model, "_orig_mod", None) or model.module
    return model
