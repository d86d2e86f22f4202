"""train_config.py: the command line is derived from the config dataclass, so a default is written once."""

import importlib
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from efa_training import train, train_config
from efa_training.train_config import TrainConfig
from efa_training.workloads.gpt import builders as model_builders


def _defaults(monkeypatch, *argv: str) -> dict:
    for name in ("DATA_DIR", "CHECKPOINT_DIR", "RUN_ID", "FSX_MOUNT"):
        monkeypatch.delenv(name, raising=False)
    return vars(train.parse_args(["--max-steps", "1", *argv]))


def test_every_config_field_is_a_flag_with_the_fields_default(monkeypatch):
    parsed = _defaults(monkeypatch)
    static = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    assert static and {name: parsed[name] for name in static} == static
    assert {f.name for f in fields(TrainConfig)} <= set(parsed)


def test_a_field_without_a_default_is_a_required_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        train.parse_args(["--data", "d", "--checkpoint-dir", "c"])
    assert exited.value.code == 2 and "--max-steps" in capsys.readouterr().err


def test_the_run_id_and_the_paths_default_to_their_environment_variables(monkeypatch):
    assert (_defaults(monkeypatch)["run_id"], _defaults(monkeypatch)["data"]) == ("local", None)
    monkeypatch.setenv("RUN_ID", "run-7")
    monkeypatch.setenv("DATA_DIR", "/fsx/datasets/wikitext")
    monkeypatch.setenv("CHECKPOINT_DIR", "/fsx/checkpoints/run-7")
    parsed = vars(train.parse_args(["--max-steps", "1"]))
    assert (parsed["run_id"], parsed["data"], parsed["checkpoint_dir"]) == (
        "run-7",
        "/fsx/datasets/wikitext",
        "/fsx/checkpoints/run-7",
    )
    assert TrainConfig(data="d", checkpoint_dir="c", max_steps=1).run_id == "run-7"


def test_batch_size_is_the_micro_batch_sizes_alias(monkeypatch):
    # The Batch job definitions and the run contract say --batch-size.
    assert _defaults(monkeypatch, "--batch-size", "4")["micro_batch_size"] == 4


def test_a_bool_field_is_a_switch(monkeypatch):
    assert (_defaults(monkeypatch)["compile"], _defaults(monkeypatch, "--compile")["compile"]) == (False, True)


@pytest.mark.parametrize(
    "module",
    [
        "efa_training.train",
        "efa_training.validate",
        "efa_training.runtime.sanity.cli",
        "efa_training.prepare_data",
        "local_run",
    ],
)
def test_every_flag_has_help_text(module):
    parser = importlib.import_module(module).build_parser()
    assert all(action.help for action in parser._actions)


def test_lr_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(data="d", checkpoint_dir="c", max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    f = model_builders.lr_lambda(cfg)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(100) == pytest.approx(0.1)
    assert f(10) > f(50) > f(99)


def _documented_train_defaults() -> dict[str, str]:
    """Flag -> its Default cell, from docs/training_image.md's `train` table (a row may list several flags)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "training_image.md").read_text()
    table = text[text.index("### `train` (`train.py`)") : text.index("Exit codes: 0 done")]
    documented: dict[str, str] = {}
    for row in (line for line in table.splitlines() if line.startswith("| `--")):
        flags_cell, default_cell = row.split(" | ")[:2]
        flags = re.findall(r"`(--[a-z-]+)", flags_cell)
        values = [v.strip() for v in default_cell.split(",")] if len(flags) > 1 else [default_cell.strip()]
        if len(values) == 1:  # a flag and its alias
            values *= len(flags)
        documented.update(zip(flags, values, strict=True))
    return documented


def test_the_docs_train_table_shows_the_parsers_defaults(monkeypatch):
    # Only fields with a written default; words such as "required" or "model's" are checked by the tests above.
    parser = train.build_parser()
    documented = _documented_train_defaults()
    static = [f for f in fields(TrainConfig) if f.default is not MISSING and f.name != "seq_len"]
    assert {train_config.flag(f.name) for f in static} <= set(documented)
    for f in static:
        shown = documented[train_config.flag(f.name)].split(" ")[0]
        default = parser.get_default(f.name)
        if isinstance(default, bool):
            assert shown == ("on" if default else "off"), f.name
        elif isinstance(default, str):
            assert shown == default, f.name
        else:
            assert float(shown) == default, f.name
