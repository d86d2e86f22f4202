"""The seam between infrastructure and image: what the synthesized jobs pass, the image's parsers accept.

Batch job definitions and the EKS pipeline's jobs are read from the synthesized templates, filled with the
values a pipeline run sends, and parsed by train.py, validate.py and sanity_check.py themselves.
"""

import json
import re

import pytest

import run_paths
import sanity_check
import train
import validate

RUN = {"run_id": "run-7", "dataset": "datasets/wikitext/", "model": "tiny", "strategy": "fsdp", "max_steps": "500",
       "checkpoint_every": "100", "seed": "1", "lr": "0.0006", "batch_size": "4", "baseline": "3.2",
       "tolerance": "0.001", "nodes": "2"}
PARSERS = {"sanity": sanity_check.parse_args, "train": train.parse_args, "validate": validate.parse_args}
BUCKET_URI = "s3://data-bucket/runs/"


def _value(item, parameters):
    if isinstance(item, dict):  # a token (the bucket name from the storage stack) inside a path
        return BUCKET_URI
    if item.startswith("Ref::"):
        name = item[len("Ref::"):]
        return RUN.get(name, parameters[name])
    return item


def _batch_commands(synthesized) -> dict[str, list[str]]:
    commands = {}
    for definition in synthesized.template("compute").find_resources("AWS::Batch::JobDefinition").values():
        props = definition["Properties"]
        container = (props["NodeProperties"]["NodeRangeProperties"][0]["Container"] if "NodeProperties" in props
                     else props["ContainerProperties"])
        command = [_value(item, props.get("Parameters", {})) for item in container["Command"]]
        commands[command[0]] = command[1:]
    return commands


def _eks_commands(synthesized, monkeypatch) -> dict[str, list[str]]:
    definition = json.dumps(synthesized.raw("pipeline"))
    commands = {}
    for mode, rest in re.findall(r"States\.Array\('(\w+)'((?:, [^,)]+)*)\)", definition):
        items = [item.strip() for item in rest.split(",") if item.strip()]
        commands[mode] = [RUN[item.split(".")[-1]] if item.startswith("$.job.") else item.strip("'")
                          for item in items]
    # What the job's environment supplies instead of flags, only where the synthesized job really sets it.
    monkeypatch.delenv("FSX_MOUNT", raising=False)
    if '\\"name\\":\\"FSX_MOUNT\\",\\"value\\":\\"/fsx\\"' in definition:
        monkeypatch.setenv("FSX_MOUNT", "/fsx")
    for variable in ("REPORT_PREFIX", "VERDICT_PREFIX"):
        monkeypatch.delenv(variable, raising=False)
        if f'\\"name\\":\\"{variable}\\",\\"value\\":\\"s3://' in definition:
            monkeypatch.setenv(variable, BUCKET_URI)
    return commands


@pytest.fixture(params=["batch", "eks"])
def commands(request, synth, monkeypatch):
    synthesized = synth(compute=request.param)
    found = _batch_commands(synthesized) if request.param == "batch" else _eks_commands(synthesized, monkeypatch)
    assert set(found) == set(PARSERS)
    return {mode: PARSERS[mode](argv) for mode, argv in found.items()}


def test_training_reads_the_runs_dataset_and_checkpoints_from_fsx(commands):
    # The dataset the run names (a bucket path) and the run's checkpoint folder, both under /fsx.
    args = commands["train"]
    assert run_paths.data_dir(args) == "/fsx/datasets/wikitext"
    assert run_paths.checkpoint_dir(args, "--checkpoint-dir") == "/fsx/checkpoints/run-7"


def test_training_gets_the_runs_hyperparameters(commands):
    # What the pipeline's input says reaches train.py unchanged.
    args = commands["train"]
    assert (args.max_steps, args.checkpoint_every, args.seed, args.strategy, args.lr) == (500, 100, 1, "fsdp", 0.0006)


def test_validation_reads_the_runs_checkpoints_and_writes_its_verdict_to_s3(commands):
    # The pipeline reads s3://<bucket>/runs/<run_id>/verdict.json right after the job: S3, not /fsx.
    args = commands["validate"]
    assert run_paths.checkpoint_dir(args, "--checkpoint") == "/fsx/checkpoints/run-7"
    assert args.verdict_prefix == BUCKET_URI and (args.tolerance, args.baseline) == (0.001, "3.2")


def test_sanity_report_goes_to_the_runs_folder(commands):
    # The sanity report lands beside the verdict, under runs/<run_id>/.
    assert commands["sanity"].report_prefix == BUCKET_URI and commands["sanity"].run_id == "run-7"
