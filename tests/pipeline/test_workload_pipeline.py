"""A registered workload through the emulated pipeline on Batch (docs/workloads.md): registered after the deploy (the
template knows no workload), the run names `workload`, the first state checks its hyperparameters against the
registered record, and its train and validate jobs run on job definitions the pipeline registers for the run (the
templates' with its image, WORKLOAD in their environment) with the hyperparameters as JSON; the sanity check, retries,
the gate and approval are the platform's, as for the built-in trainers."""

import json
from pathlib import Path

import boto3
import pytest

from contracts.run import validate_run
from contracts.workload_registry import registrable, schema
from tests.pipeline.runs import (
    ACCEPTED,
    REGISTERED_DDP,
    REJECTED,
    WORKLOAD_IMAGE,
    approval,
    approved_model,
    cleared,
    emulated_account,
    messages,
    register,
)
from tests.sfn_emulator import PREPARED_DATASET, REGION

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

ROOT = Path(__file__).resolve().parents[2]
DDP, IMAGE = REGISTERED_DDP, WORKLOAD_IMAGE
# A second workload, from an image URI, with a free-text hyperparameter.
NOTED = {
    **DDP,
    "image": {"uri": "public.ecr.aws/acme/noted:v1"},
    "hyperparameters": {"note": {"type": "string", "default": ""}},
}
DECLARED = {"torch-ddp": DDP, "noted": NOTED}
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
    with emulated_account(synth(env="dev", compute="batch")) as emulator:  # no workload in the template
        yield emulator


@pytest.fixture
def emulator(world):
    emulated = cleared(world)
    for name, declaration in DECLARED.items():  # registered after the deploy, as a user does
        register(emulated, name, declaration)
    return emulated


def _registered_definition(arn: str) -> dict:
    (definition,) = boto3.client("batch", region_name=REGION).describe_job_definitions(jobDefinitions=[arn])[
        "jobDefinitions"
    ]
    return definition


def test_a_declared_workload_trains_on_its_own_job_definitions_and_is_approved(emulator):
    emulator.verdict = VERDICT
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]
    sanity, train, validate = emulator.submitted
    assert sanity["jobDefinition"] == "efa-training-dev-sanity"  # the platform's check proves the hosts
    for job, submitted in (("train", train), ("validate", validate)):
        definition = _registered_definition(submitted["jobDefinition"])
        assert definition["jobDefinitionName"] == f"efa-training-dev-wl-torch-ddp-{job}"
        container = definition["containerProperties"]
        assert container["image"] == IMAGE
        (declaration,) = [e["value"] for e in container["environment"] if e["name"] == "WORKLOAD"]
        assert json.loads(declaration)["train"] == ["python", "train.py"]
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
    names = {_registered_definition(r["jobDefinition"])["jobDefinitionName"] for r in emulator.submitted[1:3]}
    assert names == {"efa-training-dev-wl-torch-ddp-train"}


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
    "change, state, cause",
    [
        ({"hyperparameters": {"lr": 2}}, "InvalidHyperparameters", "hyperparameters.lr is not valid"),
        ({"hyperparameters": {"model": "tiny"}}, "InvalidHyperparameters", "unknown field model"),
        ({"hyperparameters": {"max_steps": 2.0}}, "InvalidHyperparameters", "hyperparameters.max_steps is not valid"),
        ({"init_from": "approved"}, "InvalidHyperparameters", "init_from is not valid for workload 'torch-ddp'"),
        ({"workload": "noted", "hyperparameters": {"note": "x" * 2500}}, "InvalidHyperparameters", "at most 2500"),
        ({"workload": "my-llm"}, "WorkloadNotRegistered", "workload=my-llm (version 0) is not valid"),
        ({"workload_version": 3}, "WorkloadNotRegistered", "workload=torch-ddp (version 3) is not valid"),
        ({"workload": 7}, "InvalidWorkloadType", "workload is not valid"),
        ({"workload": "My_LLM"}, "InvalidWorkloadPattern", "workload is not valid"),
    ],
)
def test_the_first_state_refuses_what_the_contract_refuses(emulator, change, state, cause):
    run = {**RUN, **change}
    assert validate_run(run, max_nodes=2, min_nodes=2, workloads=_schemas(run))  # the CLI refuses it too
    result = emulator.run(run)
    assert result["status"] == "FAILED" and result["error"] == "InvalidInput"
    assert cause in result["cause"], result["cause"]
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in emulator.history(result["executionArn"])
        if "stateEnteredEventDetails" in e
    ]
    assert entered[-1] == state
    assert emulator.submitted == []


def _schemas(run: dict) -> dict:
    """What the CLI checks a run against: the schema of the version it names, as registered (none for another)."""
    name, version = run.get("workload"), run.get("workload_version", 0)
    if name not in DECLARED or version not in (0, 1):
        return {}
    return {name: schema(_record(name))}


def _record(name: str) -> dict:
    from contracts.workload_registry import record

    return record(registrable(name, DECLARED[name]), DECLARED[name], 1)


def test_a_valid_declared_run_passes_the_cli_check_too():
    assert validate_run(RUN, max_nodes=2, min_nodes=2, workloads=_schemas(RUN)) == []


# The hyperparameters reach the job as one JSON text: 2,500 characters at most (SageMaker's limit on one value).
def test_the_longest_hyperparameters_a_run_may_give_pass_and_one_more_character_does_not():
    fits = {"note": "x" * (2500 - len('{"note":""}'))}
    run = {**RUN, "workload": "noted", "hyperparameters": fits}
    assert validate_run(run, max_nodes=2, min_nodes=2, workloads=_schemas(run)) == []
    run["hyperparameters"] = {"note": fits["note"] + "x"}
    (problem,) = validate_run(run, max_nodes=2, min_nodes=2, workloads=_schemas(run))
    assert problem.startswith(
        "hyperparameters is not valid; expected hyperparameters (defaults merged) of at most 2500"
    )


def test_the_first_state_counts_the_hyperparameters_length_as_the_cli_does(emulator):
    emulator.verdict = VERDICT
    fits = {"note": "x" * (2500 - len('{"note":""}'))}
    assert emulator.run({**RUN, "workload": "noted", "hyperparameters": fits})["status"] == "SUCCEEDED"
    assert len(emulator.submitted[1]["parameters"]["hyperparameters"]) == 2500


# A registration Batch keeps failing (past its retries) ends the run through the failure path, named and mailed,
# before any job: the Parallel around the JSONata register states keeps the run's state for it.
def test_a_registration_that_keeps_failing_ends_the_run_before_any_job_with_its_reason(emulator):
    emulator.faults["batch.register_job_definition"] = ["ClientException"] * 10
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result["error"] == "RunNotStarted", result
    assert emulator.submitted == []
    (alert,) = messages(emulator)
    assert alert["state"] == "RegisterWorkloadJobs" and "ClientException" in alert["cause"]


def test_throttled_registrations_are_retried(emulator):
    emulator.verdict = VERDICT
    emulator.faults["batch.register_job_definition"] = ["TooManyRequestsException"] * 2
    emulator.faults["batch.describe_job_definitions"] = ["ServerException"]
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert emulator.submitted_kinds() == ["sanity", "train", "validate"]


# Retiring takes no run in flight and no resume: a resume keeps the workload it ran with (docs/workloads.md).
def test_a_retired_workload_refuses_a_new_run_and_resumes_one(emulator):
    from config.layout import RUNS_TABLE_KEY

    emulator.verdict = VERDICT
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    boto3.client("dynamodb", region_name=REGION).update_item(
        TableName=emulator.runs_table,
        Key={RUNS_TABLE_KEY: {"S": "workload#torch-ddp"}},
        UpdateExpression="SET retired = :yes",
        ExpressionAttributeValues={":yes": {"BOOL": True}},
    )
    refused = emulator.run({**RUN, "run_id": "ddp-002"})
    assert refused["status"] == "FAILED" and "expected a workload that is not retired" in refused["cause"]
    emulator.submitted.clear()
    resumed = emulator.run({**RUN, "resume": True})
    assert resumed["status"] == "SUCCEEDED", resumed


# SIGTERM (a reclaimed host, a stopped job): the job ends 143, an attempt failure, retried; the next attempt resumes.
def test_a_registered_workload_stopped_on_sigterm_is_retried(emulator):
    emulator.verdict = VERDICT
    emulator.outcomes = {"train": [143, 0]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert emulator.submitted_kinds() == ["sanity", "train", "train", "validate"]


# A NaN metric fails the gate (the validation's verdict: passed false, no value): rejected, never approved.
def test_a_registered_workloads_nan_metric_is_rejected(emulator):
    emulator.verdict = {**REJECTED, "metric": "eval_loss", "value": None}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result["error"] == "ValidationFailed", result
    assert approved_model(emulator) is None
