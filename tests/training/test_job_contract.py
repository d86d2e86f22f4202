"""The seam between infrastructure and image: what the synthesized jobs pass, the image's parsers accept.

Batch job definitions and the EKS pipeline's jobs are read from the synthesized templates, filled with the
values a pipeline run sends, and parsed by train.py, validate.py and sanity_check.py themselves.
"""

import argparse
import json
import re
from datetime import UTC, datetime

import pytest

from config.layout import RUNS_PREFIX
from efa_training import train, validate
from efa_training.runtime import run_paths, storage
from efa_training.runtime.launch.hyperparameters import as_flags
from efa_training.runtime.launch.stop_by import pop_stop_by
from efa_training.runtime.sanity import cli as sanity_check

HYPERPARAMETERS = {"model": "tiny", "max_steps": 500, "checkpoint_every": 100, "seed": 1, "strategy": "fsdp",
                   "lr": 0.0006, "batch_size": 4}  # fmt: skip
RUN = {
    "run_id": "run-7",
    "dataset": "datasets/wikitext/",
    # the run's hyperparameters as one JSON text (States.JsonToString in PrepareRun)
    "hyperparameters": json.dumps(HYPERPARAMETERS, separators=(",", ":")),
    "baseline": "3.2",
    "tolerance": "0.001",
    "nodes": "2",
    "init_from": "run-6",  # the resolved initial model (the pipeline's $.run.init_run)
    "stop_by": "2026-12-03T11:30:00Z",  # the reservation's end (the pipeline's $.run.stop_by)
}
PARSERS = {"sanity": sanity_check.parse_args, "train": train.parse_args, "validate": validate.parse_args}
DATA_BUCKET = "data-bucket"
# Where the pipeline reads the verdict (ReadVerdict: s3://<data bucket>/runs/<run_id>/verdict.json).
RUNS_URI = f"s3://{DATA_BUCKET}/{RUNS_PREFIX}"


def resolve(node):
    """A template value as a string: the storage stack's data bucket becomes DATA_BUCKET, anything else stays
    visibly unresolved, so a job pointing at another bucket or output fails the comparisons below."""
    if isinstance(node, str):
        return node
    ((function, argument),) = node.items()
    if function == "Fn::Join":
        return argument[0].join(resolve(part) for part in argument[1])
    if (
        function == "Fn::GetStackOutput"
        and argument["StackName"].endswith("-Storage")
        and argument["OutputName"].startswith("PublishOutputRefStorageData")
    ):
        return DATA_BUCKET
    return f"<unresolved {function}>"


def _batch_commands(synthesized) -> dict[str, list[str]]:
    commands = {}
    for definition in synthesized.template("compute").find_resources("AWS::Batch::JobDefinition").values():
        props = definition["Properties"]
        if "-workload-" in props.get("JobDefinitionName", ""):  # the registered workloads' templates: not the trainer's
            continue
        container = (
            props["NodeProperties"]["NodeRangeProperties"][0]["Container"]
            if "NodeProperties" in props
            else props["ContainerProperties"]
        )
        command = [resolve(item) for item in container["Command"]]
        command = [
            RUN.get(item[len("Ref::") :], props["Parameters"].get(item[len("Ref::") :]))
            if item.startswith("Ref::")
            else item
            for item in command
        ]
        commands[command[0]] = command[1:]
    return commands


def _eks_commands(synthesized, monkeypatch) -> dict[str, list[str]]:
    machine = next(
        r for r in synthesized.raw("pipeline")["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"
    )
    definition = json.loads(resolve(machine["Properties"]["DefinitionString"]))

    def every_state(states: dict):  # top-level ones and those inside Parallel blocks (Train, Validate)
        for state in states.values():
            yield state
            for branch in state.get("Branches", []):
                yield from every_state(branch["States"])

    commands = {}
    for state in every_state(definition["States"]):
        if "eks:runJob" not in state.get("Resource", ""):
            continue
        container = state["Parameters"]["Job"]["spec"]["template"]["spec"]["containers"][0]
        if "image.$" in container:  # a registered workload's job (its image from the run's record): not the trainer's
            continue
        found = re.fullmatch(r"States\.Array\('(\w+)'((?:, [^,)]+)*)\)", container["args.$"])
        assert found, container["args.$"]
        mode, rest = found.groups()
        items = [item.strip() for item in rest.split(",") if item.strip()]
        commands[mode] = [RUN[item.split(".")[-1]] if item.startswith("$.job.") else item.strip("'") for item in items]
        # The job's own environment, as synthesized, supplies what the flags leave out.
        for variable in container["env"]:
            if variable["name"] in ("FSX_MOUNT", "REPORT_PREFIX", "VERDICT_PREFIX"):
                monkeypatch.setenv(variable["name"], variable["value"])
    return commands


@pytest.fixture(params=["batch", "eks"])
def commands(request, synth, monkeypatch):
    for variable in ("FSX_MOUNT", "REPORT_PREFIX", "VERDICT_PREFIX"):
        monkeypatch.delenv(variable, raising=False)
    synthesized = synth(compute=request.param)
    found = _batch_commands(synthesized) if request.param == "batch" else _eks_commands(synthesized, monkeypatch)
    assert set(found) == set(PARSERS)
    # launch.py takes its own --stop-by before the script parses the rest (runtime/launch/stop_by.py), and turns the
    # hyperparameters into the trainer's flags (runtime/launch/hyperparameters.py).
    launcher = {mode: pop_stop_by(argv) for mode, argv in found.items()}
    parsed = {mode: PARSERS[mode](as_flags(mode, argv)) for mode, (argv, _) in launcher.items()}
    return {**parsed, "stop_by": launcher["train"][1]}


def test_training_reads_the_runs_dataset_and_checkpoints_from_fsx(commands):
    # The dataset the run names (a bucket path) and the run's checkpoint folder, both under /fsx.
    args = commands["train"]
    assert run_paths.data_dir(args) == "/fsx/datasets/wikitext"
    assert run_paths.checkpoint_dir(args, "--checkpoint-dir") == "/fsx/checkpoints/run-7"


def test_training_stops_before_the_runs_reservation_ends(commands):
    # The end the pipeline read reaches the launcher of the train job, which stops and saves before it.
    assert commands["stop_by"] == datetime(2026, 12, 3, 11, 30, tzinfo=UTC).timestamp()


def test_training_gets_the_runs_hyperparameters(commands):
    # What the pipeline's input says reaches train.py unchanged.
    args = commands["train"]
    assert (args.max_steps, args.checkpoint_every, args.seed, args.strategy, args.lr) == (500, 100, 1, "fsdp", 0.0006)
    assert (args.model, args.micro_batch_size) == ("tiny", 4)


def test_training_starts_from_the_initial_models_folder_next_to_its_own(commands):
    # The pipeline's resolved init_from (a run id) reaches train.py, which finds it beside the run's own folder.
    from efa_training import train_config

    config = train_config.from_args(commands["train"])
    assert str(config.initial_model_dir()) == "/fsx/checkpoints/run-6"


def test_validation_reads_the_runs_checkpoints_and_writes_its_verdict_to_s3(commands):
    # The pipeline reads s3://<bucket>/runs/<run_id>/verdict.json right after the job: S3, not /fsx.
    args = commands["validate"]
    assert run_paths.checkpoint_dir(args, "--checkpoint") == "/fsx/checkpoints/run-7"
    assert args.verdict_prefix == RUNS_URI and (args.tolerance, args.baseline) == (0.001, "3.2")
    # The exact object the pipeline's ReadVerdict state gets (RUNS_PREFIX + run id + /verdict.json).
    assert (
        storage.under_prefix(args.verdict_prefix, args.run_id, "verdict.json")
        == f"s3://{DATA_BUCKET}/{RUNS_PREFIX}run-7/verdict.json"
    )


def test_sanity_report_goes_to_the_runs_folder(commands):
    # The sanity report lands beside the verdict, under runs/<run_id>/.
    assert commands["sanity"].report_prefix == RUNS_URI and commands["sanity"].run_id == "run-7"


def test_pipeline_layout_flags_name_the_data_and_checkpoint_dirs():
    args = argparse.Namespace(
        data=None,
        checkpoint_dir=None,
        datasets_root="/fsx/datasets",
        dataset="datasets/wikitext/",
        checkpoints_root="/fsx/checkpoints",
        run_id="run-7",
    )
    assert run_paths.data_dir(args) == "/fsx/datasets/wikitext"
    assert run_paths.checkpoint_dir(args, "--checkpoint-dir") == "/fsx/checkpoints/run-7"
