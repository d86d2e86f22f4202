"""The pipeline is one size however many workloads there are (issue 45's acceptance figure): workloads are data the
pipeline reads at run time (constructs/pipeline/workload_record.py), so declaring 50 changes no template, and prod's
state machine stays below the 275 states of release 0.10.0 (where each declared workload copied ~75 states in and the
13th failed synth)."""

import json

import pytest

RELEASE_0_10_STATES = 275  # prod-batch-p5 with no declared workload, before workloads were data
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/efa-training-prod:wl-{}"
DECLARATION = {
    "launch": "torchrun",
    "train": ["python", "train.py"],
    "validate": ["python", "evaluate.py"],
    "metric": {"name": "eval_loss", "direction": "lower"},
    "hyperparameters": {"lr": {"type": "number", "default": 0.01, "minimum": 0, "maximum": 1}},
}
FIFTY = {f"model-{i}": {**DECLARATION, "image": {"uri": IMAGE.format(i)}} for i in range(50)}


def _states(definition: dict) -> int:
    """Every state, those inside Parallel branches and Map processors too."""
    count = 0
    for state in definition["States"].values():
        count += 1
        count += sum(_states(branch) for branch in state.get("Branches", []))
        count += _states(state["ItemProcessor"]) if "ItemProcessor" in state else 0
    return count


def _training_machine(template: dict) -> dict:
    """The training pipeline's definition (the largest state machine of the stack), its tokens as placeholders."""
    definitions = []
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::StepFunctions::StateMachine":
            body = resource["Properties"]["DefinitionString"]
            parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
            definitions.append(json.loads("".join(p if isinstance(p, str) else "0" for p in parts)))
    return max(definitions, key=_states)


@pytest.fixture(scope="module")
def prod(synth):
    return {count: synth(env="prod", **({"workloads": json.dumps(FIFTY)} if count else {})) for count in (0, 50)}


def test_fifty_declared_workloads_change_no_template(prod):
    without, with_fifty = prod[0], prod[50]
    assert with_fifty.config.declared_workloads and not without.config.declared_workloads
    for unit, stack in without.stack_names.items():
        assert with_fifty.templates[with_fifty.stack_names[unit]] == without.templates[stack], unit


def test_prods_pipeline_has_fewer_states_than_release_0_10(prod):
    template = prod[0].templates[prod[0].stack_names["pipeline"]]
    assert _states(_training_machine(template)) < RELEASE_0_10_STATES


@pytest.mark.parametrize("compute", ["eks", "sagemaker"])
def test_the_other_backends_pipelines_ignore_declared_workloads_too(synth, compute):
    few = {name: FIFTY[name] for name in ("model-0", "model-1")}
    without = synth(env="dev", compute=compute)
    with_two = synth(env="dev", compute=compute, workloads=json.dumps(few))
    for unit, stack in without.stack_names.items():
        assert with_two.templates[with_two.stack_names[unit]] == without.templates[stack], unit
