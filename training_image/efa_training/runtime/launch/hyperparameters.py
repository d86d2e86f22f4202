"""The platform's own trainers' hyperparameters, as every workload's jobs receive them, turned into the trainer's flags.

The pipeline gives each job a run's hyperparameters as one JSON object (`--hyperparameters`, contracts/run.py
JOB_VALUES), already checked against the workload's declaration (training_image/efa_training/workloads/<name>/
workload.json). A declared workload's code reads them from HYPERPARAMETERS_FILE (runtime/user_workload.py); the
built-in trainers take one flag each, `--name-with-dashes VALUE`, as a person running them by hand would type.
"""

from __future__ import annotations

import json

from efa_training.runtime.errors import UsageError

FLAG = "--hyperparameters"
# What each mode takes of them: training all (train.py's flags); the validation only the model size it must find in
# the checkpoint (validate.py --model); the sanity check none.
TAKEN = {"train": None, "compile": None, "validate": ("model",), "sanity": ()}


def as_flags(mode: str, args: list[str]) -> list[str]:
    """`args` with `--hyperparameters JSON` replaced by the flags `mode` takes; unchanged without it."""
    rest, text = _without(args)
    if text is None:
        return args
    try:
        hyperparameters = json.loads(text)
    except ValueError:
        hyperparameters = None
    if not isinstance(hyperparameters, dict):
        raise UsageError(FLAG, text[:60], "not a JSON object", '{"model": "tiny", "max_steps": 100}')
    taken = TAKEN.get(mode, ())
    flags: list[str] = []
    for name, value in hyperparameters.items():
        if taken is not None and name not in taken:
            continue
        if isinstance(value, (dict, list)) or value is None:
            raise UsageError(f"hyperparameter {name}", value, "not a single value", "a string, number or boolean")
        flags += ["--" + name.replace("_", "-"), _text(value)]
    return [*rest, *flags]


def given(args: list[str]) -> dict:
    """The hyperparameters `--hyperparameters` gives (an empty object where none, or not an object)."""
    text = _without(args)[1]
    try:
        found = json.loads(text) if text is not None else {}
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


def _without(args: list[str]) -> tuple[list[str], str | None]:
    """The arguments without the flag (`--hyperparameters VALUE` or `--hyperparameters=VALUE`), and its value."""
    for i, arg in enumerate(args):
        if arg == FLAG and i + 1 < len(args):
            return [*args[:i], *args[i + 2 :]], args[i + 1]
        if arg.startswith(FLAG + "="):
            return [*args[:i], *args[i + 1 :]], arg.split("=", 1)[1]
    return args, None


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
