"""The one generic check of a run's hyperparameters (constructs/pipeline/hyperparameter_check.py) against the CLI's
contract (contracts.run.validate_run), on schemas of every shape: its JSONata evaluated with the engine the emulator
uses (jsonata-python), the hyperparameters' text as the first JSONPath state takes it. Each pair must agree on whether
the run is refused and, when it is, name the same field (the emulated pipeline runs the same states end to end:
tests/pipeline/test_pipeline.py, test_workload_pipeline.py)."""

import json

import jsonata
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constructs.pipeline.hyperparameter_check import _expression
from contracts.run import validate_run
from contracts.workload import built_in_workloads, parse_workload
from contracts.workload_registry import record, schema
from tests.synthesis import ROOT

PER_NODE = 4
BASE = {
    "image": {"uri": "public.ecr.aws/acme/trainer:1"},
    "train": ["python", "train.py"],
    "validate": ["python", "evaluate.py"],
    "metric": {"name": "loss", "direction": "lower"},
}
SCHEMAS = {
    "none": {},
    "one": {"lr": {"type": "number", "default": 0.1, "minimum": 0, "maximum": 1, "exclusive_minimum": True}},
    "required": {"steps": {"type": "integer", "minimum": 1}},
    "flags": {
        "fused": {"type": "boolean", "default": False},
        "mode": {"type": "string", "default": "a", "choices": ["a", "b"]},
    },  # fmt: skip
    "run-layout-only": {"pp": {"type": "integer", "default": 1, "minimum": 1, "maximum": 64, "layout": "run"}},
    "note": {"note": {"type": "string", "default": ""}},
}


def _record(kind: str) -> dict:
    if kind in ("gpt", "ctr-ps"):
        workload = next(w for w in built_in_workloads() if w.name == kind)
        return record(workload, {}, 0)
    workload = parse_workload(kind, {**BASE, "hyperparameters": SCHEMAS[kind]}, ROOT)
    return record(workload, {**BASE, "hyperparameters": SCHEMAS[kind]}, 1)


def _first_state(rec: dict, run: dict) -> str:
    """The refusal's cause ('' when the run passes), as CheckHyperparameters computes it."""
    states = {"input": {"run": run, "registered": rec, "raw": json.dumps(run["hyperparameters"])}}
    program = "($states := " + json.dumps(states) + "; " + _expression(PER_NODE)[3:-3] + ")"
    return jsonata.Jsonata(program).evaluate(None)["problem"]


def _contract(rec: dict, run: dict) -> list[str]:
    full = {"dataset": "datasets/x/", "baseline": 1.0, **run, "workload": rec["name"]}
    return validate_run(full, 2, workloads={rec["name"]: schema(rec)}, workers_per_node=PER_NODE)


def _both(kind: str, hyperparameters: dict, **run) -> tuple[str, list[str]]:
    """(the first state's cause, the contract's problems) for one run of workload `kind`."""
    rec = _record(kind)
    given_run = {"run_id": "r", "nodes": 2, "init_from": "", "workload_version": 0, **run,
                 "hyperparameters": hyperparameters}  # fmt: skip
    return _first_state(rec, given_run), _contract(rec, given_run)


def _same_field(cause: str, problems: list[str]) -> bool:
    """The cause names a field one of the contract's problems names too."""
    named = cause.split(" is ")[0].replace("hyperparameters has an unknown field ", "unknown hyperparameter ")
    return any(named.split(";")[0].split(" ")[-1] in p for p in problems)


CASES = [
    ("none", {}, False),
    ("none", {"lr": 1}, True),
    ("one", {}, False),
    ("one", {"lr": 0}, True),
    ("one", {"lr": 1}, False),
    ("one", {"lr": "0.1"}, True),
    ("one", {"lr": None}, True),
    ("required", {}, True),
    ("required", {"steps": 3}, False),
    ("required", {"steps": 3.0}, True),
    ("required", {"steps": 1e3}, True),
    ("required", {"steps": 0}, True),
    ("flags", {"fused": True, "mode": "b"}, False),
    ("flags", {"fused": "true"}, True),
    ("flags", {"mode": "c"}, True),
    ("run-layout-only", {}, False),
    ("run-layout-only", {"pp": 8}, False),
    ("run-layout-only", {"pp": 3}, True),
    ("note", {"note": '"note": 2.5, "x": {'}, False),
    ("note", {"note": "x" * 2500}, True),
    ("gpt", {"strategy": "fsdp", "tensor_parallel": 2}, False),
    ("gpt", {"tensor_parallel": 2}, True),
    ("gpt", {"model": "350m", "strategy": "fsdp", "tensor_parallel": 8}, True),
    ("gpt", {"model": "mini", "strategy": "fsdp", "tensor_parallel": 4, "pipeline_parallel": 4}, True),
    ("ctr-ps", {"model": "tiny"}, True),
]


# (workload, hyperparameters, refused): each case's outcome written down, not only the two checks' agreement.
@pytest.mark.parametrize(
    "kind, hyperparameters, refused", CASES, ids=[f"{k}-{json.dumps(h)[:40]}" for k, h, _ in CASES]
)
def test_the_first_state_and_the_contract_agree(kind, hyperparameters, refused):
    cause, problems = _both(kind, hyperparameters)
    assert bool(cause) == refused and bool(problems) == refused, (cause, problems)
    assert not refused or _same_field(cause, problems), (cause, problems)


def test_a_registered_workload_takes_no_initial_model_and_a_built_in_one_no_version():
    for kind, run in (("one", {"init_from": "approved"}), ("gpt", {"workload_version": 2})):
        cause, problems = _both(kind, {}, **run)
        assert cause and problems and _same_field(cause, problems), (cause, problems)
    assert "init_from is not valid for workload 'one'" in _first_state(
        _record("one"),
        {"run_id": "r", "nodes": 2, "init_from": "approved", "workload_version": 0, "hyperparameters": {}},  # fmt: skip
    )


@settings(max_examples=60, deadline=None)
@given(
    lr=st.one_of(st.floats(-2, 2, allow_nan=False), st.integers(-3, 3), st.text(max_size=3), st.booleans()),
    pp=st.one_of(st.integers(-2, 70), st.floats(0, 9, allow_nan=False)),
    nodes=st.integers(1, 2),
)
def test_any_values_are_refused_by_both_or_neither(lr, pp, nodes):
    for cause, problems in (_both("one", {"lr": lr}), _both("run-layout-only", {"pp": pp}, nodes=nodes)):
        assert bool(cause) == bool(problems), (cause, problems)
        assert not cause or _same_field(cause, problems), (cause, problems)
