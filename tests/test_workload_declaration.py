"""Workload declarations (contracts/workload.py): a good one is read whole, and every mistake is one line naming the
workload, the field, the value and what is allowed."""

import json
import re
from pathlib import Path

import pytest

from config import ConfigError, load_config
from contracts.run import check_value
from contracts.workload import PLATFORM_IMAGE_ARG, WorkloadError, parse_workload, parse_workloads

DOCKERFILE = f"ARG {PLATFORM_IMAGE_ARG}\nFROM ${{{PLATFORM_IMAGE_ARG}}}\nCOPY train.py /opt/code/\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "Dockerfile").write_text(DOCKERFILE)
    return tmp_path


def _declaration(**changes) -> dict:
    base = {
        "image": {"directory": "code"},
        "launch": "torchrun",
        "train": ["python", "train.py"],
        "validate": ["python", "evaluate.py"],
        "metric": {"name": "eval_loss", "direction": "lower"},
        "metrics": {"loss": r"loss=([0-9.eE+-]+)"},
        "hyperparameters": {
            "lr": {"type": "number", "default": 0.001, "minimum": 0, "maximum": 1},
            "optimizer": {"type": "string", "default": "adamw", "choices": ["adamw", "sgd"]},
            "max_steps": {"type": "integer"},
        },
    }
    return {**base, **changes}


def _refusal(root: Path, **changes) -> str:
    with pytest.raises(WorkloadError) as refused:
        parse_workload("my-llm", _declaration(**changes), root)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("workloads.my-llm")
    return message


# A good declaration is read whole: the image folder, launch, commands, metric and its direction, regexes, schema.
def test_a_declaration_is_read_whole(root):
    workload = parse_workload("my-llm", _declaration(), root)
    assert (workload.image_directory, workload.image_uri, workload.launch) == ("code", None, "torchrun")
    assert workload.train == ("python", "train.py") and (workload.metric, workload.direction) == ("eval_loss", "lower")
    lr, optimizer, steps = workload.hyperparameters
    assert (lr.name, lr.kind, lr.default, lr.minimum, lr.maximum) == ("hyperparameters.lr", "number", 0.001, 0, 1)
    assert optimizer.choices == ("adamw", "sgd") and steps.required
    # The schema is the run contract's own Field: a run's value is checked the same way as the built-ins'.
    assert check_value(lr, 2) == "hyperparameters.lr=2 is not valid; expected a number from 0 to 1"
    assert workload.as_json()["metric"] == {"name": "eval_loss", "direction": "lower"}


# An image URI is taken as given (the README says it must carry the platform's launcher: it cannot be read here).
def test_an_image_uri_is_accepted_with_a_tag_or_digest(root):
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v3"
    assert parse_workload("my-llm", _declaration(image={"uri": uri}), root).image_uri == uri
    assert "an image URI with a tag or digest" in _refusal(root, image={"uri": "my-llm"})


# A folder whose Dockerfile does not start from the platform's image is refused at synth: without the launcher, the
# sanity check and the EFA stack, every attempt would fail on the hosts.
@pytest.mark.parametrize(
    "dockerfile",
    ["FROM python:3.12\n", f"FROM ${{{PLATFORM_IMAGE_ARG}}}\n", f"ARG {PLATFORM_IMAGE_ARG}\nFROM ubuntu\n", ""],
)
def test_a_dockerfile_not_built_on_the_platform_image_is_refused(root, dockerfile):
    (root / "code" / "Dockerfile").write_text(dockerfile)
    assert "FROM ${PLATFORM_IMAGE}" in _refusal(root)


# A folder that is missing, lacks a Dockerfile or leaves the project is refused.
@pytest.mark.parametrize("directory", ["missing", "../code", ""])
def test_an_image_folder_outside_the_project_or_without_a_dockerfile_is_refused(root, directory):
    assert "holding a Dockerfile" in _refusal(root, image={"directory": directory})


# Each field's mistake names the field and what is allowed.
@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    [
        ({"launch": "mpirun"}, "launch", "torchrun or per-node or one-process"),
        ({"train": []}, "train", "a command as a list"),
        ({"validate": "python evaluate.py"}, "validate", "a command as a list"),
        ({"metric": {"name": "eval_loss"}}, "metric", '"direction"'),
        ({"metric": {"name": "eval_loss", "direction": "down"}}, "metric.direction", "lower or higher"),
        ({"metrics": {"loss": "loss=[0-9.]+"}}, "metrics.loss", "exactly one group"),
        ({"metrics": {"loss": "loss=([0-9.]+"}}, "metrics.loss", "exactly one group"),
        ({"image": {"directory": "code", "uri": "x"}}, "image", '{"directory"'),
        ({"entry_point": "train.py"}, "entry_point", "no such field"),
        ({"hang_timeout_seconds": 30}, "hang_timeout_seconds", "an integer from 60 to 604800"),
        ({"hang_timeout_seconds": 600.5}, "hang_timeout_seconds", "an integer from 60 to 604800"),
    ],
)
def test_each_mistake_is_one_line_naming_the_field(root, changes, field, allowed):
    message = _refusal(root, **changes)
    assert message.startswith(f"workloads.my-llm.{field}=") and allowed in message


# Hyperparameter declarations: a known type, bounds only on numbers and in order, choices only on strings, and a
# default the run contract itself would accept.
@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"type": "float"}, "type"),
        ({"type": "string", "minimum": 1}, "minimum and maximum only on integer and number"),
        ({"type": "number", "minimum": 2, "maximum": 1}, "no larger than the maximum"),
        ({"type": "integer", "choices": ["a"]}, "choices (a list of strings) only on string"),
        ({"type": "integer", "default": 1.5}, "an integer"),
        ({"type": "number", "default": 5, "maximum": 1}, "a number up to 1"),
        ({"type": "string", "default": "rmsprop", "choices": ["adamw", "sgd"]}, "one of adamw, sgd"),
    ],
)
def test_a_hyperparameter_declaration_that_cannot_hold_is_refused(root, spec, problem):
    assert problem in _refusal(root, hyperparameters={"x": spec})


# Names reach job definition names and Kubernetes labels: lower case, short; a hyperparameter name is an identifier.
def test_names_are_checked(root):
    with pytest.raises(WorkloadError, match=r"^workloads\.My_LLM: the name is not valid"):
        parse_workload("My_LLM", _declaration(), root)
    assert "lower-case letters" in _refusal(root, hyperparameters={"Learning-Rate": {"type": "number"}})
    with pytest.raises(WorkloadError, match=re.escape("workloads=[] is not valid")):
        parse_workloads([], root)


# In the environment's configuration (cdk.json `workloads`, or `-c workloads='<JSON>'`): read when the app starts,
# and a mistake stops it with one line naming the environment, the workload and the field.
def test_the_environment_reads_its_workloads_when_the_app_starts():
    declaration = _declaration(image={"uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/my-llm:v3"})
    context = {"environments": {"dev": {"region": "us-east-1", "workloads": {"my-llm": declaration}}}}
    (workload,) = load_config(context).declared_workloads
    assert workload.name == "my-llm" and workload.metric == "eval_loss"
    override = {**context, "workloads": json.dumps({"my-llm": {**declaration, "launch": "mpirun"}})}
    with pytest.raises(ConfigError, match=r"^environment 'dev': workloads\.my-llm\.launch='mpirun' is not valid"):
        load_config(override)
    with pytest.raises(ConfigError, match=r"workloads='\[\]' is not valid; expected a JSON object"):
        load_config({**context, "workloads": "[]"})
