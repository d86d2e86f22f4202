"""The platform's own trainers are declared like any workload (training_image/efa_training/workloads/<name>/
workload.json), and what a declaration may say beyond PR 27's first fields: a rule in words, an exclusive minimum, a
cost model. Only the built-in declarations may be run by the platform on its own image."""

import pytest

from contracts.run import check_value, relation_problem, validate_run
from contracts.workload import BUILT_IN_ROOT, built_in_workloads, parse_workload
from tests.test_workload_declaration import _declaration, _refusal, root  # noqa: F401 (a fixture)

RUN = {"run_id": "r1", "dataset": "datasets/sample/"}


def test_the_built_in_trainers_are_read_from_their_declarations_the_default_first():
    names = [w.name for w in built_in_workloads()]
    assert names == ["gpt", "ctr-ps"]
    assert {p.parent.name for p in BUILT_IN_ROOT.glob("*/workload.json")} == {"gpt", "ctr_ps"}


def test_a_run_that_names_no_workload_trains_the_gpt_declaration():
    assert validate_run({**RUN, "hyperparameters": {"model": "1.3b", "strategy": "fsdp"}}, 2) == []


# The model/strategy rule of the old built-in contract is now two declarations: each refuses the other's values in
# one line that says where they belong.
def test_the_parameter_servers_belong_to_the_ctr_ps_workload():
    model, strategy = validate_run({**RUN, "hyperparameters": {"strategy": "ps", "model": "ctr-tiny"}}, 2)
    assert model.startswith("hyperparameters.model='ctr-tiny' is not valid") and "workload ctr-ps" in model
    assert strategy.startswith("hyperparameters.strategy='ps' is not valid") and "workload ctr-ps" in strategy
    ctr = {**RUN, "workload": "ctr-ps", "hyperparameters": {"model": "ctr-small", "staleness": -1}}
    assert validate_run(ctr, 2) == []
    assert validate_run({**ctr, "hyperparameters": {"model": "1.3b"}}, 2) == [
        "hyperparameters.model='1.3b' is not valid; expected one of ctr-tiny, ctr-small, ctr-large"
    ]


def test_the_old_built_in_name_is_refused_naming_the_workloads_there_are():
    (problem,) = validate_run({**RUN, "workload": "built-in"}, 2)
    assert problem.startswith("workload='built-in' is not valid; expected a workload's name: gpt, ctr-ps")


def test_only_a_built_in_trainer_may_start_from_an_approved_model():
    assert validate_run({**RUN, "workload": "ctr-ps", "init_from": "approved"}, 2) == []


@pytest.mark.parametrize("name", ["gpt", "ctr-ps"])
def test_a_declared_workload_may_not_take_a_built_in_trainers_name(root, name):  # noqa: F811
    with pytest.raises(ValueError, match=rf"^workloads\.{name}: the name is not valid; .*other than gpt and ctr-ps"):
        parse_workload(name, _declaration(), root)


def test_the_platforms_image_and_launch_are_the_built_in_trainers_only(root):  # noqa: F811
    assert "image" in _refusal(root, image="platform").split("=")[0]
    assert "torchrun or per-node or one-process" in _refusal(root, launch="platform")


def test_a_rule_in_words_and_an_exclusive_minimum_are_what_a_run_is_told(root):  # noqa: F811
    spec = {"type": "number", "default": 0.1, "minimum": 0, "exclusive_minimum": True, "rule": "a positive rate"}
    (rate,) = parse_workload("my-llm", _declaration(hyperparameters={"rate": spec}), root).hyperparameters
    assert check_value(rate, 0) == "hyperparameters.rate=0 is not valid; expected a positive rate"
    assert check_value(rate, 1e-9) is None
    assert "true only with a minimum" in _refusal(
        root, hyperparameters={"x": {"type": "number", "exclusive_minimum": True}}
    )


STEPS = {"type": "integer", "default": 10, "minimum": 1}
SIZE = {"type": "string", "default": "s", "choices": ["s", "l"]}


def _with_cost(cost: object) -> dict:
    return _declaration(hyperparameters={"steps": STEPS, "batch": STEPS, "size": SIZE}, cost=cost)


def test_a_cost_model_by_size_is_read(root):  # noqa: F811
    cost = {"steps": "steps", "batch_size": "batch", "tflops_per_sample": {"by": "size", "values": {"s": 1, "l": 4}}}
    model = parse_workload("my-llm", _with_cost(cost), root).cost
    assert model is not None and model.sample_tflops({"size": "l"}) == 4.0 and model.size({"size": "s"}) == "s"


@pytest.mark.parametrize(
    ("cost", "field", "allowed"),
    [
        ({"steps": "steps"}, "cost", '"tflops_per_sample"'),
        ({"steps": "size", "batch_size": "batch", "tflops_per_sample": 1}, "cost.steps", "integer hyperparameters"),
        ({"steps": "steps", "batch_size": "nope", "tflops_per_sample": 1}, "cost.batch_size", "integer"),
        ({"steps": "steps", "batch_size": "batch", "tflops_per_sample": 0}, "cost.tflops_per_sample", "positive"),
        (
            {"steps": "steps", "batch_size": "batch", "tflops_per_sample": 1, "split_by": "size"},
            "cost.split_by",
            "integer hyperparameters whose minimum is at least 1",
        ),
        (
            {"steps": "steps", "batch_size": "batch", "tflops_per_sample": 1, "split_by": ["batch", "size"]},
            "cost.split_by",
            "or a list of them",
        ),
        (
            {"steps": "steps", "batch_size": "batch", "tflops_per_sample": 1, "pipeline_stages": "size"},
            "cost.pipeline_stages",
            "integer hyperparameters whose minimum is at least 1",
        ),
        (
            {"steps": "steps", "batch_size": "batch", "tflops_per_sample": {"by": "steps", "values": {}}},
            "cost.tflops_per_sample.by",
            "string hyperparameters with choices",
        ),
        (
            {"steps": "steps", "batch_size": "batch", "tflops_per_sample": {"by": "size", "values": {"s": 1}}},
            "cost.tflops_per_sample.values",
            "for each of s, l",
        ),
    ],
)
def test_a_cost_model_that_cannot_price_a_run_is_refused(root, cost, field, allowed):  # noqa: F811
    with pytest.raises(ValueError) as refused:
        parse_workload("my-llm", _with_cost(cost), root)
    assert str(refused.value).startswith(f"workloads.my-llm.{field}=") and allowed in str(refused.value)


def test_a_rule_in_words_names_every_choice_it_stands_for():
    for workload in built_in_workloads():
        for field in workload.hyperparameters:
            assert all(choice in field.rule for choice in field.choices if field.rule), field.name


MODE = {"type": "string", "default": "a", "choices": ["a", "b"]}
DEGREE = {"type": "integer", "default": 1, "minimum": 1, "maximum": 8}


def _related(degree: dict) -> dict:
    without_default = {k: v for k, v in degree.items() if not (k == "default" and v is None)}
    return _declaration(hyperparameters={"size": SIZE, "mode": MODE, "degree": without_default, "degree2": DEGREE})


def test_relations_between_hyperparameters_are_read_and_judged(root):  # noqa: F811
    # "requires": a value other than the default needs mode b; "divides": the value divides the size's number.
    degree = {**DEGREE, "requires": {"mode": ["b"]}, "divides": {"by": "size", "values": {"s": 2, "l": 6}}}
    (field,) = [f for f in parse_workload("my-llm", _related(degree), root).hyperparameters if f.key == "degree"]
    assert (relation_problem(field, {"degree": 2, "mode": "a", "size": "s"}) or "").endswith("an integer from 1 to 8")
    assert "with size='s'" in (relation_problem(field, {"degree": 3, "mode": "b", "size": "s"}) or "")
    assert relation_problem(field, {"degree": 3, "mode": "b", "size": "l"}) is None
    assert relation_problem(field, {"degree": 1, "mode": "a", "size": "s"}) is None  # the default needs nothing


@pytest.mark.parametrize(
    ("extra", "field", "allowed"),
    [
        ({"requires": {"nope": ["b"]}}, "degree.requires", "another string hyperparameter"),
        ({"requires": {"mode": ["c"]}}, "degree.requires", "some of its choices"),
        ({"divides": {"by": "size", "values": {"s": 2}}}, "degree.divides", "each of its choices"),
        ({"divides": {"by": "mode", "values": {"a": 0, "b": 2}}}, "degree.divides", "a positive integer"),
        ({"minimum": 0, "divides": {"by": "size", "values": {"s": 2, "l": 6}}}, "degree.divides", "at least 1"),
        ({"divides": {"by": "degree2", "values": {}}}, "degree.divides", "a string hyperparameter with choices"),
        ({"default": 2, "divides": {"by": "size", "values": {"s": 3, "l": 6}}}, "degree.divides", "default divides"),
        ({"default": None, "requires": {"mode": ["b"]}}, "degree.default", "a default, for"),
        ({"layout": "rack"}, "degree.layout", '"node" or "run"'),
        ({"minimum": 0, "layout": "node"}, "degree.layout", "minimum is at least 1"),
    ],
)
def test_a_relation_that_cannot_be_judged_is_refused_in_one_line(root, extra, field, allowed):  # noqa: F811
    with pytest.raises(ValueError) as refused:
        parse_workload("my-llm", _related({**DEGREE, **extra}), root)
    assert str(refused.value).startswith(f"workloads.my-llm.hyperparameters.{field}=") and allowed in str(refused.value)


def test_layout_degrees_are_judged_on_a_node_and_on_the_run():
    # gpt's tensor_parallel is a node degree, pipeline_parallel a run degree (contracts.run.layout_problem).
    from contracts.run import layout_problem

    table = next(w for w in built_in_workloads() if w.name == "gpt").hyperparameters
    # 3 nodes of 4: tp 3 x pp 1 divides the 12 workers, but a group of 3 would cross a node of 4.
    assert "a divisor of a node's 4 workers (1, 2, 4)" in (
        layout_problem(table, {"tensor_parallel": 3, "pipeline_parallel": 1}, 3, 4) or ""
    )
    # 2 nodes of 4: tp 4 x pp 4 = 16 ranks a pipeline replica, more than the 8 workers.
    assert "= 16 is not valid with nodes=2; expected a divisor of the run's 8 workers" in (
        layout_problem(table, {"tensor_parallel": 4, "pipeline_parallel": 4}, 2, 4) or ""
    )
    assert layout_problem(table, {"tensor_parallel": 4, "pipeline_parallel": 2}, 2, 4) is None
