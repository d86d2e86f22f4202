"""A declared workload through the emulated pipeline on Batch (docs/workloads.md): the run names `workload`, the first
state checks its hyperparameters against the workload's own schema, and its train and validate jobs are the
workload's job definitions (its image, WORKLOAD in their environment) with the hyperparameters as JSON; the sanity
check, retries, the gate and approval are the platform's, as for the built-in trainers."""

import json
from pathlib import Path

import pytest

from contracts.run import validate_run
from contracts.workload import parse_workloads, schemas
from tests.pipeline.runs import ACCEPTED, REJECTED, approval, approved_model, cleared, emulated_account
from tests.sfn_emulator import PREPARED_DATASET

ROOT = Path(__file__).resolve().parents[2]
DDP = json.loads((ROOT / "examples/torch_ddp/workload.json").read_text())
# A second workload, from an image URI, with a free-text hyperparameter.
NOTED = {
    **DDP,
    "image": {"uri": "111122223333.dkr.ecr.us-east-1.amazonaws.com/noted:v1"},
    "hyperparameters": {"note": {"type": "string", "default": ""}},
}
DECLARED = {"torch-ddp": DDP, "noted": NOTED}
WORKLOADS = schemas(parse_workloads(DECLARED, ROOT))
RUN = {
    "run_id": "ddp-001",
    "dataset": PREPARED_DATASET,
    "nodes": 2,
    "workload": "torch-ddp",
    "hyperparameters": {"lr": 0.1, "max_steps": 50},
    "baseline": 0.02,
}
# The example's gate: eval_loss, lower is better.
VERDICT = {**ACCEPTED, "metric": "eval_loss", "direction": "lower", "value": 0.019, "baseline": 0.02}


@pytest.fixture(scope="module")
def world(synth):
    with emulated_account(synth(env="dev", compute="batch", workloads=json.dumps(DECLARED))) as emulator:
        yield emulator


@pytest.fixture
def emulator(world):
    return cleared(world)


def test_a_declared_workload_trains_on_its_own_job_definitions_and_is_approved(emulator):
    emulator.verdict = VERDICT
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]
    sanity, train, validate = emulator.submitted
    assert sanity["jobDefinition"] == "efa-training-dev-sanity"  # the platform's check proves the hosts
    assert train["jobDefinition"] == "efa-training-dev-torch-ddp-train"
    assert validate["jobDefinition"] == "efa-training-dev-torch-ddp-validate"
    # The hyperparameters travel whole, defaults merged, as the JSON the launcher writes to HYPERPARAMETERS_FILE.
    assert json.loads(train["parameters"]["hyperparameters"]) == {"lr": 0.1, "max_steps": 50, "checkpoint_every": 20}
    assert set(train["parameters"]) == {"run_id", "dataset", "hyperparameters", "stop_by", "nodes"}
    assert validate["parameters"]["baseline"] == "0.02" and validate["parameters"]["tolerance"] == "0.001"
    assert approval(emulator)["verdict"]["metric"] == "eval_loss"


# The platform's retries hold for a declared workload: an attempt failure is retried (it resumes from its own
# checkpoint), its exit code 2 (its input is wrong: docs/workloads.md) ends the run without a retry.
def test_a_declared_workloads_failed_attempt_is_retried(emulator):
    emulator.verdict = VERDICT
    emulator.outcomes = {"train": [1, 0]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert emulator.submitted_kinds() == ["sanity", "train", "train", "validate"]
    assert {r["jobDefinition"] for r in emulator.submitted[1:3]} == {"efa-training-dev-torch-ddp-train"}


def test_a_declared_workload_exiting_2_is_not_retried(emulator):
    emulator.outcomes = {"train": [2]}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result["error"] == "TrainingFailed"
    assert emulator.submitted_kinds() == ["sanity", "train"] and approved_model(emulator) is None


def test_a_run_without_workload_trains_the_default_built_in_workload(emulator):
    emulator.verdict = ACCEPTED
    run = {**RUN, "run_id": "gpt-001", "hyperparameters": {"max_steps": 10}, "baseline": 3.2}
    del run["workload"]
    assert emulator.run(run)["status"] == "SUCCEEDED"
    assert [r["jobDefinition"] for r in emulator.submitted] == [
        "efa-training-dev-sanity",
        "efa-training-dev-train",
        "efa-training-dev-validate",
    ]
    assert json.loads(emulator.submitted[1]["parameters"]["hyperparameters"])["model"] == "tiny"


def test_a_rejected_model_of_a_declared_workload_is_not_approved(emulator):
    emulator.verdict = {**REJECTED, "metric": "eval_loss"}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and approved_model(emulator) is None


@pytest.mark.parametrize(
    "change, state",
    [
        ({"workload": "torch-ddp", "hyperparameters": {"lr": 2}}, "InvalidLrType-torch-ddp"),
        ({"workload": "torch-ddp", "hyperparameters": {"model": "tiny"}}, "InvalidUnknownField-torch-ddp"),
        ({"workload": "torch-ddp", "hyperparameters": {"max_steps": 2.0}}, "InvalidMaxStepsNotInteger-torch-ddp"),
        ({"workload": "torch-ddp", "init_from": "approved"}, "InvalidInitFromForWorkload-torch-ddp"),
        ({"workload": "noted", "hyperparameters": {"note": "x" * 2500}}, "InvalidHyperparametersLength-noted"),
        ({"workload": "my-llm"}, "InvalidWorkloadType"),
        ({"workload": 7}, "InvalidWorkloadType"),
    ],
)
def test_the_first_state_refuses_what_the_contract_refuses(emulator, change, state):
    run = {**RUN, **change}
    assert validate_run(run, max_nodes=2, min_nodes=2, workloads=WORKLOADS)  # the CLI refuses it too
    result = emulator.run(run)
    assert result["status"] == "FAILED" and result["error"] == "InvalidInput"
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in emulator.history(result["executionArn"])
        if "stateEnteredEventDetails" in e
    ]
    assert entered[-1] == state
    assert emulator.submitted == []


def test_a_valid_declared_run_passes_the_cli_check_too():
    assert validate_run(RUN, max_nodes=2, min_nodes=2, workloads=WORKLOADS) == []


# The hyperparameters reach the job as one JSON text: 2,500 characters at most (SageMaker's limit on one value).
def test_the_longest_hyperparameters_a_run_may_give_pass_and_one_more_character_does_not():
    fits = {"note": "x" * (2500 - len('{"note":""}'))}
    run = {**RUN, "workload": "noted", "hyperparameters": fits}
    assert validate_run(run, max_nodes=2, min_nodes=2, workloads=WORKLOADS) == []
    run["hyperparameters"] = {"note": fits["note"] + "x"}
    (problem,) = validate_run(run, max_nodes=2, min_nodes=2, workloads=WORKLOADS)
    assert problem.startswith(
        "hyperparameters is not valid; expected hyperparameters (defaults merged) of at most 2500"
    )


# The CLI checks a run file against the environment's declarations in cdk.json before any AWS call.
def test_the_cli_refuses_a_workload_the_environment_does_not_declare(tmp_path, capsys):
    from tools.pipeline_cli import main

    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN))
    assert main(["start", "dev", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("workload='torch-ddp' is not valid; expected one of gpt, ctr-ps (the platform's trainers and "
                        "this environment's own)")  # fmt: skip


def test_the_cli_checks_a_declared_workloads_hyperparameters(tmp_path, capsys, monkeypatch):
    from tools import pipeline_cli, pipeline_session

    monkeypatch.setattr(pipeline_session, "_environment", lambda env: {"region": "us-east-1", "workloads": DECLARED})
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**RUN, "hyperparameters": {"lr": 2}}))
    assert pipeline_cli.main(["start", "dev", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith("hyperparameters.lr=2 is not valid; expected a number from 0 to 1")


def test_the_first_state_counts_the_hyperparameters_length_as_the_cli_does(emulator):
    emulator.verdict = VERDICT
    fits = {"note": "x" * (2500 - len('{"note":""}'))}
    assert emulator.run({**RUN, "workload": "noted", "hyperparameters": fits})["status"] == "SUCCEEDED"
    assert len(emulator.submitted[1]["parameters"]["hyperparameters"]) == 2500
