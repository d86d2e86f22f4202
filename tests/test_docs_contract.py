"""The docs state run facts that live in code; each table is held to its source, so neither can drift."""

import re
from pathlib import Path

from contracts.run import fields

ROOT = Path(__file__).resolve().parent.parent


def _rows(doc: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in (ROOT / doc).read_text().splitlines()
        if line.startswith("| ")
    ]


def _number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def test_batch_doc_defaults_are_the_job_definitions(synth):
    # docs/batch.md's job table: every `name=value` default is the synthesized job definition's parameter default.
    definitions = synth().template("compute").find_resources("AWS::Batch::JobDefinition")
    rows = {row[0]: row[2] for row in _rows("docs/batch.md") if row[0] in ("sanity", "train", "validate")}
    assert set(rows) == {"sanity", "train", "validate"}
    for job, cell in rows.items():
        (definition,) = [d for key, d in definitions.items() if f"{job.capitalize()}JobDefinition" in key]
        parameters = definition["Properties"]["Parameters"]
        for name, value in re.findall(r"(\w+)=([^,\s]+)", cell):
            if value.startswith(("`", "<")):  # a symbolic default (`<config nodes>`), named rather than written
                continue
            assert _number(parameters[name]) == _number(value), (job, name)


def test_pipeline_doc_defaults_are_the_run_contract():
    # docs/pipeline.md's input table: each field's default is the run contract's (contracts/run.py).
    documented = {row[0].strip("`"): row[2] for row in _rows("docs/pipeline.md") if row[0].startswith("`")}
    checked = 0
    for field in fields(max_nodes=2):
        literal = isinstance(_number(documented.get(field.name, "")), float)  # `nodes` is named, not written
        if literal and not field.required and field.kind in ("integer", "number"):
            assert _number(documented[field.name]) == float(str(field.default)), field.name
            checked += 1
    assert checked >= 6


def test_batch_doc_bandwidth_thresholds_are_the_catalogues():
    # docs/batch.md names the sanity check's bus-bandwidth gate per instance type; each is the catalogue's.
    from config.catalogue import CATALOGUE

    text = (ROOT / "docs" / "batch.md").read_text()
    start = text.index("`expected_busbw_gbps`, config/catalogue.py):")
    stated = re.findall(r"([a-z0-9-]+\.\w+) (\d+(?:\.\d+)?)", text[start : text.index("\n-", start)])
    assert len(stated) >= 5
    for instance, gbps in stated:
        assert CATALOGUE[instance].expected_busbw_gbps == float(gbps), instance
