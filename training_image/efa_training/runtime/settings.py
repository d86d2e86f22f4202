"""Settings as typed dataclasses whose command line is derived from their fields, so a default is written once.

Each field carries its flag's help text in its metadata (and, where a flag without a default reads one, the
environment variable it reads), and `add_flags` makes one flag per field. The train command's TrainConfig is built
this way (efa_training/train_config.py).
"""

from __future__ import annotations

import argparse
import os
import typing
from dataclasses import MISSING, Field, field, fields
from typing import Any


def setting(
    default: Any = MISSING,
    *,
    help: str,
    env: str | None = None,
    aliases: tuple[str, ...] = (),
    default_factory: Any = MISSING,
) -> Any:
    """A config field with its command-line help; `env` names the variable a flag without a default reads."""
    return field(
        default=default, default_factory=default_factory, metadata={"help": help, "env": env, "aliases": aliases}
    )


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def add_flags(p: argparse.ArgumentParser, config: type) -> None:
    """One flag per field of the `config` dataclass: a switch for a bool, else a typed value with the field's
    default."""
    types = typing.get_type_hints(config)
    for f in fields(config):
        names = (flag(f.name), *f.metadata["aliases"])
        if types[f.name] is bool:
            p.add_argument(*names, dest=f.name, action="store_true", help=f.metadata["help"])
        else:
            p.add_argument(*names, dest=f.name, type=types[f.name], **_default(f))


def _default(f: Field) -> dict:
    """The flag's default and help: the field's default, else its environment variable, else the flag is required."""
    if f.default_factory is not MISSING:  # its help says where the default comes from
        return {"default": f.default_factory(), "help": f.metadata["help"]}
    if f.default is not MISSING:
        return {"default": f.default, "help": f.metadata["help"] + " (default %(default)s)"}
    if f.metadata["env"]:
        return {"default": os.environ.get(f.metadata["env"]), "help": f.metadata["help"]}
    return {"required": True, "help": f.metadata["help"]}
