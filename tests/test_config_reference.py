"""docs/configuration.md's field table is tools/config_reference.py's, rendered from config/environment.py: a field,
a default or a limit changed in the code and not in the page fails here."""

import re
from dataclasses import fields
from pathlib import Path

import pytest

from config import environment
from config.environment import EnvironmentConfig
from tools import config_reference

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_the_configuration_page_is_the_generated_reference():
    block = re.search(r"<!-- config-reference:start -->\n(.*?)\n<!-- config-reference:end -->", PAGE.read_text(), re.S)
    assert block is not None and block.group(1) == config_reference.table()


def test_every_field_is_a_row_in_the_configurations_order_with_its_own_default():
    rows = config_reference.table().splitlines()[2:]  # after the header and its rule
    documented = [f for f in fields(EnvironmentConfig) if f.name != "name"]
    assert [row.split("`")[1] for row in rows] == [f.name for f in documented]
    by_name = dict(zip([f.name for f in documented], rows, strict=True))
    assert by_name["nodes"].startswith("| `nodes` | `2` | 1 to 64 ")
    assert by_name["region"].startswith("| `region` | (required) |")
    assert by_name["account"].startswith("| `account` | unset (the CLI's credentials decide) |")
    assert by_name["retain_data"].startswith("| `retain_data` | `false` |")
    assert by_name["batch_production_weight"].startswith("| `batch_production_weight` | `0.25` |")


def test_a_limit_comes_from_the_code(monkeypatch):
    monkeypatch.setattr(environment, "MAX_NODES", 96)
    assert "| `nodes` | `2` | 1 to 96 (a guard" in config_reference.table()


def test_a_field_without_a_row_or_a_row_without_a_field_is_an_error(monkeypatch):
    monkeypatch.delitem(config_reference.FIELDS, "nodes")
    with pytest.raises(ValueError, match=r"no row for \['nodes'\], rows for no field \[\]"):
        config_reference.table()
    monkeypatch.setitem(config_reference.FIELDS, "nodes", ("", "1 to {max_nodes}"))
    monkeypatch.setitem(config_reference.FIELDS, "gone", ("", "a field that is no more"))
    with pytest.raises(ValueError, match=r"rows for no field \['gone'\]"):
        config_reference.table()
