"""Atomic, self-describing, verified checkpoints that resume bit-for-bit.

Layout: <checkpoint-dir>/step_000000120/
    meta.json          step, format, world size, config, and the manifest of every file (written last)
    state.pt           "full" format (DDP): model, optimizer, scheduler, train state
    *.distcp/.metadata "dcp" format (FSDP2): sharded model+optimizer via torch.distributed.checkpoint
    extra.pt           "dcp" format: scheduler and train state
    rng_rank{R}.pt     every rank's RNG states (python, numpy, torch CPU/CUDA), as tensors and ints

Every rank writes into `.tmp-step_000000120/`; files are fsynced, then rank 0 writes meta.json
with each file's size and CRC-32 and renames the directory into place. A kill at any moment
leaves either the old set of checkpoints or the new one, never a half-written `step_*`; a step
saved again keeps its old copy as `.replaced-step_*` until the new one is in place, so even that
has no window without the step. Everything is loaded with `torch.load(weights_only=True)`: a
checkpoint folder cannot run code. Tensors are moved to CPU before saving so a checkpoint written
on GPU loads on Trainium and vice versa.

Resume (`load_latest`), the same for DDP and FSDP: for the newest candidate, every rank first
checks its share of the files alone (meta.json complete, every file of the manifest present with
its size and CRC, its own RNG state readable); one collective tells every rank what the others
found; only if all are satisfied do they enter the collective load, whose outcome is agreed the
same way. A candidate that fails anywhere is dropped by every rank together and set aside as
`.damaged-step_*` with a warning naming the problem, and the previous one is tried. torch.load
does not check its zip CRCs, so the manifest is what catches a bit flip.

`--keep-last` counts checkpoints up to the one just saved; newer ones (an abandoned timeline) are
moved aside to `.abandoned-step_*`, so they can neither shadow nor outlive the live ones.
"""
from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import socket
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from errors import UsageError

PREFIX = "step_"
TMP_PREFIX = ".tmp-"
ABANDONED_PREFIX = ".abandoned-"  # newer than the live timeline; kept for inspection, never loaded
DAMAGED_PREFIX = ".damaged-"  # failed verification or loading; kept for inspection, never loaded
REPLACED_PREFIX = ".replaced-"  # the old copy of a step being saved again, until the new copy is in place
LOCK_NAME = ".writer.lock"
STRATEGY_OF_FORMAT = {"full": "ddp", "dcp": "fsdp"}
META_FIELDS = {"step": int, "format": str, "world_size": int, "config": dict, "files": dict}
_CHUNK = 8 << 20


class CheckpointDamaged(Exception):
    """A checkpoint that is incomplete or unreadable: set aside, never loaded."""


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


class _Checksummed:
    """A write-only file that keeps the size and CRC-32 of what went through it (no second read)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.crc, self.size = f, 0, 0

    def write(self, data) -> int:
        self.crc, self.size = zlib.crc32(data, self.crc), self.size + len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _save_file(obj: Any, path: Path) -> dict:
    with open(path, "wb") as f:
        out = _Checksummed(f)
        torch.save(obj, out)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": out.size, "crc32": out.crc}


def file_record(path: Path) -> dict:
    """Size and CRC-32 of a file, read in chunks."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"bytes": size, "crc32": crc}


def rng_state() -> dict:
    """Every RNG stream as ints and tensors: loadable with weights_only=True (no pickled numpy arrays)."""
    np_state = np.random.get_state(legacy=False)
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                       "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                       "gauss": float(np_state["gauss"])}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": "MT19937", "state": {"key": n["key"].numpy().astype(np.uint32),
                                                                "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _step_of(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[1])


def step_dirs(root: Path) -> list[Path]:
    """Checkpoints renamed into place, newest first (whether complete is for `verify` to say).

    A `.replaced-step_N` stands in for `step_N` while a save of the same step is between its two renames."""
    if not root.is_dir():
        return []
    found: dict[str, Path] = {}
    for p in root.iterdir():
        if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit() and p.is_dir():
            found[p.name] = p
    for p in root.glob(f"{REPLACED_PREFIX}{PREFIX}*"):
        found.setdefault(p.name[len(REPLACED_PREFIX):], p)
    return sorted(found.values(), key=_step_of, reverse=True)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_meta(path: Path) -> dict:
    """meta.json of a checkpoint, with every field present and of its type, else CheckpointDamaged."""
    try:
        meta = json.loads((path / "meta.json").read_text())
    except FileNotFoundError:
        raise CheckpointDamaged("meta.json is missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointDamaged(f"meta.json unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise CheckpointDamaged("meta.json is not an object")
    wrong = [k for k, kind in META_FIELDS.items() if not isinstance(meta.get(k), kind)]
    if wrong:
        raise CheckpointDamaged(f"meta.json lacks or mistypes {', '.join(wrong)}")
    if meta["step"] != _step_of(path):
        raise CheckpointDamaged(f"meta.json says step {meta['step']}, the directory step {_step_of(path)}")
    return meta


def required_files(meta: dict) -> list[str]:
    """Files without which the checkpoint is incomplete: the format's own and every rank's RNG state."""
    own = ["state.pt"] if meta["format"] == "full" else [".metadata", "extra.pt"]
    return own + [f"rng_rank{r}.pt" for r in range(meta["world_size"])]


def verify(path: Path, fmt: str | None, rank: int = 0, world_size: int = 1) -> dict:
    """Check this rank's share of a checkpoint without any collective; return its meta or raise CheckpointDamaged.

    Each file of the manifest is checked (size, CRC-32) by one rank: the rank that wrote it when the world
    size is unchanged (the file is then usually in its page cache), else by position. A single process
    (world_size 1, validate.py) checks everything."""
    meta = read_meta(path)
    if fmt is not None and meta["format"] != fmt:
        raise CheckpointDamaged(f"format {meta['format']!r}, this run uses {fmt!r}")
    files = meta["files"]
    missing = [name for name in required_files(meta) if name not in files]
    if missing:
        raise CheckpointDamaged(f"incomplete: the manifest lacks {', '.join(missing)}")
    same_world = meta["world_size"] == world_size
    for i, name in enumerate(sorted(files)):
        record = files[name]
        if not isinstance(record, dict):
            raise CheckpointDamaged(f"meta.json: the manifest entry of {name} is not an object")
        checker = record.get("rank", 0) if same_world else i
        if checker % world_size != rank:
            continue
        try:
            found = file_record(path / name)
        except OSError as exc:
            raise CheckpointDamaged(f"{name}: {exc.strerror or exc}") from None
        if found["bytes"] != record.get("bytes"):
            raise CheckpointDamaged(f"{name}: {found['bytes']} bytes, the manifest says {record.get('bytes')}")
        if found["crc32"] != record.get("crc32"):
            raise CheckpointDamaged(f"{name}: CRC-32 mismatch (the file's bytes changed after it was written)")
    return meta


def newest_meta(root: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint whose meta.json is complete, with that meta (None if there is none)."""
    for path in step_dirs(root):
        try:
            return path, read_meta(path)
        except CheckpointDamaged:
            continue  # load_latest sets it aside with a warning
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
    config = meta["config"]
    held_strategy = STRATEGY_OF_FORMAT.get(meta["format"], repr(meta["format"]))
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


# A lock whose holder is this same run (an earlier attempt whose host died) is waited for this long: a dead
# node's Lustre locks go only when the file system evicts that client, which takes minutes, not seconds.
# CHECKPOINT_LOCK_WAIT_SECONDS changes it; it stays well inside the process group's timeout (ranks wait meanwhile).
SAME_RUN_LOCK_WAIT_SECONDS = 300
LOCK_POLL_SECONDS = 5.0


def lock_folder_waiting(root: Path, holder: dict) -> IO | str:
    """`lock_folder`, but a lock held under this run's own id is retried for a bounded time before giving up."""
    text = os.environ.get("CHECKPOINT_LOCK_WAIT_SECONDS", "").strip()
    if text and not (text.isascii() and text.replace(".", "", 1).isdigit()):
        raise UsageError("CHECKPOINT_LOCK_WAIT_SECONDS", text, "not a number of seconds", "e.g. 300, or unset")
    wait = float(text) if text else SAME_RUN_LOCK_WAIT_SECONDS
    deadline = time.monotonic() + wait
    while True:
        got = lock_folder(root, holder)
        if not isinstance(got, str) or time.monotonic() >= deadline or not _same_run(got, holder):
            return got
        log(f"checkpoint folder held by an earlier attempt of this run ({got}); waiting up to {wait:.0f} s "
            "for its lock to be released")
        time.sleep(LOCK_POLL_SECONDS)


def _same_run(held: str, holder: dict) -> bool:
    try:
        previous = json.loads(held)
    except ValueError:
        return False
    return isinstance(previous, dict) and bool(holder.get("run_id")) and previous.get("run_id") == holder["run_id"]


def lock_folder(root: Path, holder: dict) -> IO | str:
    """Take the folder's writer lock: the open lock file on success, else the holder's description.

    flock(2) is released by the kernel when its process dies, so a killed job never holds the folder.
    FSx for Lustre honours it across nodes when mounted with `-o flock` ("full flock support, coherent
    across all client nodes": mount.lustre(8); FSx mounts with `relatime,flock`:
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/mounting-ec2-instance.html)."""
    f = open(root / LOCK_NAME, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        text = f.read().strip()
        f.close()
        return text or "another process (it has not written its name yet)"
    f.seek(0)
    f.truncate()
    f.write(json.dumps(holder, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())
    return f


def lock_holder() -> dict:
    """Who holds a checkpoint folder: enough to find the job (Batch job id or pod) and the process."""
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "run_id": os.environ.get("RUN_ID", ""),
              "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for name in ("AWS_BATCH_JOB_ID", "HOSTNAME"):  # HOSTNAME is the pod name on Kubernetes
        if os.environ.get(name):
            holder[name.lower()] = os.environ[name]
    return holder


@dataclass
class TrainerState:
    """What the checkpoint must restore besides model and optimizer."""
    step: int = 0
    samples_consumed: int = 0  # global data position, see data.SequenceBatches
    tokens_seen: int = 0


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}" if not isinstance(exc, CheckpointDamaged) else text[0]


class CheckpointManager:
    def __init__(self, root: Path, fmt: str, keep_last: int, rank: int, world_size: int) -> None:
        assert fmt in ("full", "dcp")
        self.root, self.fmt, self.keep_last = root, fmt, keep_last
        self.rank, self.world_size = rank, world_size
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
        written: dict[str, dict] = {}
        if self.fmt == "full":
            if self.rank == 0:
                state = {"model": _to_cpu(_unwrap(model).state_dict()),
                         "optimizer": _to_cpu(optimizer.state_dict()), **extra}
                written["state.pt"] = _save_file(state, tmp / "state.pt")
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict
            model_sd, optim_sd = get_state_dict(model, optimizer)
            # Collective: every rank writes its own shards (FileSystemWriter names them __<rank>_<n>.distcp
            # and fsyncs them); each rank checksums its own, still in its page cache.
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
            for shard in tmp.glob(f"__{self.rank}_*.distcp"):
                written[shard.name] = file_record(shard)
            if self.rank == 0:
                written["extra.pt"] = _save_file(extra, tmp / "extra.pt")
        written[f"rng_rank{self.rank}.pt"] = _save_file(rng_state(), tmp / f"rng_rank{self.rank}.pt")
        manifest = self._gather_manifest(written)  # also the barrier: every rank's files are written
        if self.rank == 0:
            for path in tmp.iterdir():  # files no rank claimed (DCP's .metadata, a renamed shard): rank 0 sums them
                manifest.setdefault(path.name, {**file_record(path), "rank": 0})
            meta = {"step": train_state.step, "format": self.fmt, "world_size": self.world_size,
                    "config": config, "files": manifest}
            with open(tmp / "meta.json", "w") as f:
                json.dump(meta, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            _fsync_path(tmp)
            self._move_into_place(tmp, final)
            self._prune(train_state.step)
        self._barrier()
        return final

    def _gather_manifest(self, written: dict[str, dict]) -> dict[str, dict]:
        own = {name: {**record, "rank": self.rank} for name, record in written.items()}
        if not self._distributed:
            return own
        if self.device.type == "xla":
            # Object collectives are not an XLA backend feature; the full format's other files are the ranks'
            # small RNG files, which rank 0 sums itself (save() sums every file no rank claimed).
            self._barrier()
            return own
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, own)
        return {name: record for part in everyone for name, record in part.items()}

    def _move_into_place(self, tmp: Path, final: Path) -> None:
        if final.exists():  # the same step saved again (e.g. SIGTERM right after a resume)
            # Two renames; between them step_dirs() finds the old copy under its .replaced- name.
            replaced = self.root / f"{REPLACED_PREFIX}{final.name}"
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(final, replaced)
            os.replace(tmp, final)
            _fsync_path(self.root)
            shutil.rmtree(replaced, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_path(self.root)

    def _prune(self, saved_step: int) -> None:
        # Checkpoints newer than the one just saved belong to an abandoned timeline: keeping them by step
        # number would delete the live checkpoints instead and let them shadow the live ones at the next
        # start. Move them aside.
        live = []
        for path in step_dirs(self.root):
            if _step_of(path) > saved_step:
                aside = self.root / f"{ABANDONED_PREFIX}{PREFIX}{_step_of(path):09d}"
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(path, aside)
                log(f"checkpoint: WARNING moved {path.name}, newer than the step {saved_step} just saved "
                    f"(skipped when this run resumed), aside to {aside}")
            else:
                live.append(path)
        for old in live[self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
        # Saves killed half-way (this job holds the folder's writer lock: no other save is in flight), and old
        # copies of re-saved steps whose new copy is in place.
        for leftover in self.root.glob(f"{TMP_PREFIX}{PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for replaced in self.root.glob(f"{REPLACED_PREFIX}{PREFIX}*"):
            if (self.root / replaced.name[len(REPLACED_PREFIX):]).is_dir():
                shutil.rmtree(replaced, ignore_errors=True)

    # ---- load -------------------------------------------------------------------------------
    def load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                    device: torch.device) -> tuple[TrainerState, Path] | None:
        """Restore the newest checkpoint that every rank can read; set aside damaged ones with a warning.

        Every step that can fail on one rank only is followed by an agreement, so no rank enters the
        collective DCP load while another has given up on the candidate (which would hang both)."""
        self.device = device
        touched = False  # whether a failed attempt may have written into the live model
        candidates = step_dirs(self.root)
        for path in candidates:
            problem, meta = None, None
            try:
                meta = verify(path, self.fmt, self.rank, self.world_size)
                rng = self._read_rng(path, meta)
            except CheckpointDamaged as exc:
                problem = str(exc)
            failed = self._failed_ranks(problem)
            if not failed:
                try:
                    touched = True
                    state = self._load(path, model, optimizer, scheduler, rng)
                # DCP raises CheckpointException, a BaseException in torch 2.13: caught by name, not by Exception.
                except (Exception, CheckpointException) as exc:
                    problem = f"loading failed: {_describe(exc)}"
                failed = self._failed_ranks(problem)
            if failed:
                self._set_aside(path, problem, failed)
                continue
            if meta["world_size"] != self.world_size and self.rank == 0:
                log(f"checkpoint: WARNING {path.name} was written by {meta['world_size']} ranks, this run has "
                    f"{self.world_size}: RNG streams start afresh (dropout is not bit-exact across the resize)")
            return state, path
        if candidates and touched:
            raise RuntimeError(f"no checkpoint under {self.root} could be loaded, and a failed attempt may have "
                               "overwritten part of the model; move the damaged checkpoints away to start fresh")
        return None

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
        if self.rank != 0:
            return
        aside = self.root / f"{DAMAGED_PREFIX}{PREFIX}{_step_of(path):09d}"
        try:
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            where = f"set aside as {aside.name}"
        except OSError as exc:
            where = f"left in place ({exc.strerror or exc})"
        log(f"checkpoint: WARNING skipping {path.name} (damaged on rank(s) {', '.join(map(str, failed))}), "
            f"{where}; trying the previous checkpoint")

    def _load(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
              rng: dict | None) -> TrainerState:
        if self.fmt == "full":
            state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
            _unwrap(model).load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            extra = state
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))  # collective, in place
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
            extra = torch.load(path / "extra.pt", map_location="cpu", weights_only=True)
        scheduler.load_state_dict(extra["scheduler"])
        if rng is not None:
            set_rng_state(rng)
        return TrainerState(**extra["train_state"])


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    # Peel torch.compile (`_orig_mod`) and DDP (`module`) wrappers in whichever order they were applied.
    while hasattr(model, "_orig_mod") or hasattr(model, "module"):
        model = getattr(model, "_orig_mod", None) or model.module
    return model
