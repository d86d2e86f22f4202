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


def _agree(kind: str, hyperparameters: dict, **run) -> None:
    rec = _record(kind)
    given_run = {"run_id": "r", "nodes": 2, "init_from": "", "workload_version": 0, **run,
                 "hyperparameters": hyperparameters}  # fmt: skip
    cause, problems = _first_state(rec, given_run), _contract(rec, given_run)
    assert bool(cause) == bool(problems), (cause, problems)
    if cause:
        named = cause.split(" is ")[0].replace("hyperparameters has an unknown field ", "unknown hyperparameter ")
        assert any(named.split(";")[0].split(" ")[-1] in p for p in problems), (cause, problems)


CASES = [
    ("none", {}),
    ("none", {"lr": 1}),
    ("one", {}),
    ("one", {"lr": 0}),
    ("one", {"lr": 1}),
    ("one", {"lr": "0.1"}),
    ("one", {"lr": None}),
    ("required", {}),
    ("required", {"steps": 3}),
    ("required", {"steps": 3.0}),
    ("required", {"steps": 1e3}),
    ("required", {"steps": 0}),
    ("flags", {"fused": True, "mode": "b"}),
    ("flags", {"fused": "true"}),
    ("flags", {"mode": "c"}),
    ("run-layout-only", {}),
    ("run-layout-only", {"pp": 8}),
    ("run-layout-only", {"pp": 3}),
    ("note", {"note": '"note": 2.5, "x": {'}),
    ("note", {"note": "x" * 2500}),
    ("gpt", {"strategy": "fsdp", "tensor_parallel": 2}),
    ("gpt", {"tensor_parallel": 2}),
    ("gpt", {"model": "350m", "strategy": "fsdp", "tensor_parallel": 8}),
    ("gpt", {"model": "mini", "strategy": "fsdp", "tensor_parallel": 4, "pipeline_parallel": 4}),
    ("ctr-ps", {"model": "tiny"}),
]


@pytest.mark.parametrize("kind, hyperparameters", CASES, ids=[f"{k}-{json.dumps(h)[:40]}" for k, h in CASES])
def test_the_first_state_and_the_contract_agree(kind, hyperparameters):
    _agree(kind, hyperparameters)


def test_a_registered_workload_takes_no_initial_model_and_a_built_in_one_no_version():
    _agree("one", {}, init_from="approved")
    _agree("gpt", {}, workload_version=2)
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
    _agree("one", {"lr": lr})
    _agree("run-layout-only", {"pp": pp}, nodes=nodes)
