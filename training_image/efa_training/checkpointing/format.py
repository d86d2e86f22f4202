"""A checkpoint on disk: its layout, its manifest, and the checks that say whether it is complete.

Layout: <checkpoint-dir>/step_000000120/
    meta.json          step, format, world size, config, and the manifest of every file (written last)
    state.pt           "full" format (DDP): model, optimizer, scheduler, train state
    *.distcp/.metadata "dcp" format (FSDP2): sharded model+optimizer via torch.distributed.checkpoint
    extra.pt           "dcp" format: scheduler and train state
    rng_rank{R}.pt     every rank's RNG states (python, numpy, torch CPU/CUDA), as tensors and ints

The manifest records each file's size, CRC-32 and writing rank. torch.load does not check its zip CRCs, so the
manifest is what catches a bit flip. Everything here is per-process (no collective): store.py builds the save
and the agreed load on top of it, validation verifies with it alone.
"""

from __future__ import annotations

import json
import os
import random
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

PREFIX = "step_"
TMP_PREFIX = ".tmp-"
ABANDONED_PREFIX = ".abandoned-"  # newer than the live timeline; kept for inspection, never loaded
DAMAGED_PREFIX = ".damaged-"  # failed verification or loading; kept for inspection, never loaded
REPLACED_PREFIX = ".replaced-"  # the old copy of a step being saved again, until the new copy is in place
STRATEGY_OF_FORMAT = {"full": "ddp", "dcp": "fsdp", "ps": "ps"}
META_FIELDS = {"step": int, "format": str, "world_size": int, "config": dict, "files": dict}
_CHUNK = 8 << 20


class CheckpointDamaged(Exception):
    """A checkpoint that is incomplete or unreadable: set aside, never loaded."""


def to_cpu(obj: Any) -> Any:
    """Tensors moved to CPU (recursively), so a checkpoint written on GPU loads on Trainium and vice versa."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Checksummed:
    """A write-only file that keeps the size and CRC-32 of what went through it (no second read)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.crc, self.size = f, 0, 0

    def write(self, data: bytes) -> int:
        self.crc, self.size = zlib.crc32(data, self.crc), self.size + len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def save_file(obj: Any, path: Path) -> dict:
    """torch.save to `path`, fsynced; returns the file's manifest record."""
    with open(path, "wb") as f:
        out = _Checksummed(f)
        torch.save(obj, cast(IO[bytes], out))  # torch.save needs only write() and flush()
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
    np_state: dict = np.random.get_state(legacy=False)  # legacy=False: a dict, not the legacy tuple
    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def step_of(path: Path) -> int:
    return int(path.name.rsplit("_", 1)[1])


def step_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def step_dirs(root: Path) -> list[Path]:
    """Checkpoints renamed into place, newest first (whether complete is for `verify` to say).

    A `.replaced-step_N` stands in for `step_N` while a save of the same step is between its two renames."""
    if not root.is_dir():
        return []
    found: dict[str, Path] = {}
    for p in root.iterdir():
        if p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit() and p.is_dir():
            found[p.name] = p
    for p in root.glob(f"{REPLACED_PREFIX}{PREFIX}*"):
        found.setdefault(p.name[len(REPLACED_PREFIX) :], p)
    return sorted(found.values(), key=step_of, reverse=True)


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
    if meta["step"] != step_of(path):
        raise CheckpointDamaged(f"meta.json says step {meta['step']}, the directory step {step_of(path)}")
    return meta


def required_files(meta: dict) -> list[str]:
    """Files without which the checkpoint is incomplete: the format's own and every rank's RNG state."""
    if meta["format"] == "ps":  # the parameter servers' cuts: world_size counts the servers, each writes its rows
        return ["dense.pt"] + [f"server_{g}.pt" for g in range(meta["world_size"])]
    own = ["state.pt"] if meta["format"] == "full" else [".metadata", "extra.pt"]
    return own + [f"rng_rank{r}.pt" for r in range(meta["world_size"])]


def check_meta(path: Path, fmt: str | None = None) -> dict:
    """The damage check of meta.json itself, which needs no other file: complete and typed, of the run's format
    (None: any), its manifest naming every required file, each with a record. Whatever reads a checkpoint's meta.json
    reads it through here: the resume (`verify`) and the pre-flight checks that run before any process group."""
    meta = read_meta(path)
    if fmt is not None and meta["format"] != fmt:
        raise CheckpointDamaged(f"format {meta['format']!r}, this run uses {fmt!r}")
    files = meta["files"]
    missing = [name for name in required_files(meta) if name not in files]
    if missing:
        raise CheckpointDamaged(f"incomplete: the manifest lacks {', '.join(missing)}")
    for name in sorted(files):
        if not isinstance(files[name], dict):
            raise CheckpointDamaged(f"meta.json: the manifest entry of {name} is not an object")
    return meta


def sound_metas(root: Path) -> Iterator[tuple[Path, dict]]:
    """The checkpoints whose meta.json passes `check_meta`, newest first, with that meta. The others are the
    resume's to set aside (with a warning): a check before it must not stop at them."""
    for path in step_dirs(root):
        try:
            meta = check_meta(path)
        except CheckpointDamaged:
            continue
        yield path, meta


def verify(path: Path, fmt: str | None, rank: int = 0, world_size: int = 1) -> dict:
    """Check this rank's share of a checkpoint without any collective; return its meta or raise CheckpointDamaged.

    Each file of the manifest is checked (size, CRC-32) by one rank: the rank that wrote it when the world
    size is unchanged (the file is then usually in its page cache), else by position. A single process
    (world_size 1, validation) checks everything."""
    meta = check_meta(path, fmt)
    files = meta["files"]
    same_world = meta["world_size"] == world_size
    for i, name in enumerate(sorted(files)):
        record = files[name]
        checker = record.get("rank", 0) if same_world else i
        if checker % world_size == rank:
            _check_file(path / name, record)
    return meta


def _check_file(path: Path, record: dict) -> None:
    try:
        found = file_record(path)
    except OSError as exc:
        raise CheckpointDamaged(f"{path.name}: {exc.strerror or exc}") from None
    if found["bytes"] != record.get("bytes"):
        raise CheckpointDamaged(f"{path.name}: {found['bytes']} bytes, the manifest says {record.get('bytes')}")
    if found["crc32"] != record.get("crc32"):
        raise CheckpointDamaged(f"{path.name}: CRC-32 mismatch (the file's bytes changed after it was written)")


def newest_meta(root: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint whose meta.json passes `check_meta`, with that meta (None if there is none)."""
    return next(sound_metas(root), None)


def dcp_options(path: Path | None) -> Any:
    """The optimizer's state by parameter name ("optim.param_groups.<name>.lr"): each rank writes the groups of its own
    parameters, so pipeline stages, which hold different ones, do not overwrite each other's list of a group's
    parameters (DCP keeps one rank's copy of a key; torchtitan flattens alike). `path`: a checkpoint to read, whose
    groups release 0.9.0 and earlier wrote nested ("optim.param_groups.0.params"): read as written."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    nested = (
        path is not None
        and "optim.param_groups.0.params" in FileSystemReader(str(path)).read_metadata().state_dict_metadata
    )
    return StateDictOptions(flatten_optimizer_state_dict=not nested)
