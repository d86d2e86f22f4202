"""A built-in trainer's jobs receive the run's hyperparameters as one JSON object, like every workload's
(contracts/run.py JOB_VALUES); the launcher turns them into the trainer's own flags
(runtime/launch/hyperparameters.py)."""

import json

import pytest

from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import command, hyperparameters

BATCH = {
    "ACCELERATORS_PER_NODE": "2",
    "AWS_BATCH_JOB_NUM_NODES": "2",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
    "AWS_BATCH_JOB_NODE_INDEX": "0",
    "AWS_BATCH_JOB_ID": "0f1e2d#0",
    "AWS_BATCH_JOB_ATTEMPT": "1",
    "GLOO_SOCKET_IFNAME": "lo",
}
GPT = {"model": "mini", "strategy": "fsdp", "max_steps": 40, "lr": 0.0003, "batch_size": 4}


def test_training_takes_every_hyperparameter_as_its_flag():
    flags = hyperparameters.as_flags("train", ["--run-id", "r1", "--hyperparameters", json.dumps(GPT)])
    assert flags == ["--run-id", "r1", "--model", "mini", "--strategy", "fsdp", "--max-steps", "40", "--lr",
                     "0.0003", "--batch-size", "4"]  # fmt: skip


def test_the_validation_takes_only_the_model_size_it_must_find():
    flags = hyperparameters.as_flags("validate", [f"--hyperparameters={json.dumps(GPT)}", "--baseline", "none"])
    assert flags == ["--baseline", "none", "--model", "mini"]


def test_without_the_flag_the_arguments_are_unchanged():
    assert hyperparameters.as_flags("train", ["--model", "tiny"]) == ["--model", "tiny"]


@pytest.mark.parametrize("text", ["[1]", "{", '{"model": {"size": 1}}', '{"model": null}'])
def test_hyperparameters_that_are_not_single_values_are_a_usage_error(text):
    with pytest.raises(UsageError):
        hyperparameters.as_flags("train", ["--hyperparameters", text])


def test_a_batch_train_job_runs_the_trainer_with_the_runs_flags():
    prepared = command.prepare("train", ["--run-id", "r1", "--hyperparameters", json.dumps(GPT)], BATCH)
    script = prepared.command[prepared.command.index("efa_training.train") :]
    assert script[script.index("--model") + 1] == "mini" and script[script.index("--strategy") + 1] == "fsdp"
    assert "--hyperparameters" not in prepared.command


def test_a_ctr_ps_job_gets_the_parameter_servers_supervisor_from_its_strategy():
    ctr = {"model": "ctr-tiny", "strategy": "ps", "staleness": -1}
    prepared = command.prepare("train", ["--run-id", "r1", "--hyperparameters", json.dumps(ctr)], BATCH)
    assert "torch.distributed.run" not in prepared.command and prepared.command[1:3] == ["-m", "efa_training.train"]
    assert prepared.command[-2:] == ["--staleness", "-1"] and prepared.env["PS_NNODES"] == "2"
