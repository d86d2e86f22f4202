"""What the pipeline tests send to the state machine and read back: a run, verdicts, the definition's states."""

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import boto3
from moto import mock_aws
from moto.core.config import DefaultConfig

from config.layout import RUN_APPROVAL, RUN_HOLDER, RUN_INPUT, RUN_SINCE, RUNS_TABLE_KEY
from tests.sfn_emulator import ACCOUNT, PREPARED_DATASET, REGION, Emulator

MOTO_CONFIG: DefaultConfig = {"stepfunctions": {"execute_state_machine": True}, "batch": {"use_docker": False}}
APPROVED_MODEL_PARAMETER = "/efa-training/dev/approved-model"
RUN: dict[str, Any] = {
    "run_id": "gpt-tiny-001",
    "dataset": PREPARED_DATASET,
    "nodes": 2,
    "hyperparameters": {"max_steps": 500, "lr": 0.0006},
    "baseline": 3.2,
    "tolerance": 0.05,
}
ACCEPTED = {
    "metric": "val_loss",
    "value": 3.18,
    "baseline": 3.2,
    "delta": -0.02,
    "relative_delta": -0.00625,
    "tolerance": 0.05,
    "passed": True,
}
REJECTED = {**ACCEPTED, "value": 3.6, "delta": 0.4, "relative_delta": 0.125, "passed": False}


def messages(emulator) -> list[dict]:
    """The alerts the run published (an SQS queue subscribed to the alerts topic)."""
    received = emulator.sqs.receive_message(QueueUrl=emulator.alerts, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in received]


def approved_model(emulator) -> dict[str, Any] | None:
    """The approved model the pipeline published (its SSM parameter), or None."""
    try:
        return json.loads(emulator.ssm.get_parameter(Name=APPROVED_MODEL_PARAMETER)["Parameter"]["Value"])
    except emulator.ssm.exceptions.ParameterNotFound:
        return None


def approval(emulator) -> dict[str, Any]:
    """The approved model, which the run must have published."""
    model = approved_model(emulator)
    assert model is not None, "no approved model"
    return model


def run_item(emulator, run_id: str) -> dict[str, str] | None:
    """The run's item in the runs table, its string attributes as plain values (a strongly consistent read)."""
    table = boto3.client("dynamodb", region_name=REGION)
    found = table.get_item(TableName=emulator.runs_table, Key={RUNS_TABLE_KEY: {"S": run_id}}, ConsistentRead=True)
    return {name: value["S"] for name, value in found["Item"].items()} if "Item" in found else None


def hold_run(emulator, run: Mapping[str, Any], execution: str) -> None:
    """A run claimed earlier by `execution` (what ClaimRun writes), for the resume tests."""
    boto3.client("dynamodb", region_name=REGION).put_item(
        TableName=emulator.runs_table,
        Item={
            RUNS_TABLE_KEY: {"S": run["run_id"]},
            RUN_HOLDER: {"S": execution},
            RUN_SINCE: {"S": "2026-01-01T00:00:00Z"},
            RUN_INPUT: {"S": json.dumps(run)},
        },
    )


def record_approved(emulator, approval: Mapping[str, Any]) -> None:
    """A run approved earlier, as the pipeline leaves it: its item's approval in the runs table and the S3 copy."""
    boto3.client("dynamodb", region_name=REGION).put_item(
        TableName=emulator.runs_table,
        Item={RUNS_TABLE_KEY: {"S": approval["run_id"]}, RUN_APPROVAL: {"S": json.dumps(approval)}},
    )
    key = f"models/{approval['run_id']}/approval.json"
    emulator.s3.put_object(Bucket=emulator.bucket, Key=key, Body=json.dumps(approval).encode())


def state_machine(template: Mapping[str, Any]) -> dict:
    """The pipeline's state machine (the one with a fixed name), else the template's only one."""
    machines = [r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"]
    return next((m for m in machines if "StateMachineName" in m["Properties"]), machines[0])


def definition(template: Mapping[str, Any]) -> dict:
    """The state machine's definition; intrinsics sit inside JSON strings, so any placeholder keeps it JSON."""
    parts = state_machine(template)["Properties"]["DefinitionString"]["Fn::Join"][1]
    return json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))


def states(template: Mapping[str, Any]) -> dict:
    return definition(template)["States"]


def queue_of(template: Mapping[str, Any], state: str) -> str:
    """The queue ARN a state submits to, as text with its tokens shown as <...> (the ARN is formatted from the
    queue's fixed name with pseudo parameters: arn:<AWS::Partition>:batch:...:job-queue/<name>)."""
    parts = state_machine(template)["Properties"]["DefinitionString"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else f"<{json.dumps(p)[1:-1].replace(chr(34), '')}>" for p in parts)
    start = text.index(f'"{state}":') + len(state) + 3
    queue = text.index('"JobQueue":"', start) + len('"JobQueue":"')
    return text[queue : text.index('"', queue)]


@contextlib.contextmanager
def emulated_account(synthesized, emulator_class: type[Emulator] = Emulator) -> Iterator[Any]:
    """One emulated account: moto, the app's resolved state machine and an SQS queue on the alerts topic."""
    with (
        mock_aws(config=MOTO_CONFIG),
        emulator_class(template=synthesized.raw("pipeline"), templates=synthesized.templates) as emulator,
    ):
        topic = next(v["Ref"] for v in emulator.physical.values() if v["type"] == "AWS::SNS::Topic")
        emulator.alerts = emulator.subscribe_queue(topic)
        # The environment's monthly budget, as the Observability stack makes it (the pipeline reads it by name).
        config = synthesized.config
        boto3.client("budgets", region_name=REGION).create_budget(
            AccountId=ACCOUNT,
            Budget={"BudgetName": config.budget_name, "TimeUnit": "MONTHLY", "BudgetType": "COST",
                    "BudgetLimit": {"Amount": f"{config.budget_monthly_usd:.2f}", "Unit": "USD"}},
        )  # fmt: skip
        yield emulator


def _clear_registry() -> None:
    """No model package groups or versions: moto's SageMaker as new (a test's approvals are its own)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].reset()


def cleared(world):
    """The shared emulator as new: no job plan, no recorded jobs or sleeps, no approval, no messages, no claimed
    runs, no objects but the prepared dataset."""
    world.reset()
    world.sqs.purge_queue(QueueUrl=world.alerts)
    with contextlib.suppress(world.ssm.exceptions.ParameterNotFound):
        world.ssm.delete_parameter(Name=APPROVED_MODEL_PARAMETER)
    _clear_registry()
    for listed in world.s3.list_objects_v2(Bucket=world.bucket).get("Contents", []):
        world.s3.delete_object(Bucket=world.bucket, Key=listed["Key"])
    table = boto3.client("dynamodb", region_name=REGION)
    for page in table.get_paginator("scan").paginate(TableName=world.runs_table):
        for item in page["Items"]:
            table.delete_item(TableName=world.runs_table, Key={RUNS_TABLE_KEY: item[RUNS_TABLE_KEY]})
    # The runs' dataset, prepared (prepare_data.py writes dataset.json last): the pipeline checks it first.
    world.s3.put_object(Bucket=world.bucket, Key=f"{PREPARED_DATASET}dataset.json", Body=b'{"tokenizer": "byte"}')
    return world


# The DDP example as a user registers it after the deploy: its image pushed to the environment's workload repository.
WORKLOAD_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/efa-training-dev-workloads:torch-ddp-1"
REGISTERED_DDP = {
    **json.loads((Path(__file__).resolve().parents[2] / "examples/torch_ddp/workload.json").read_text()),
    "image": {"uri": WORKLOAD_IMAGE},
}


def register(world, name: str, declaration: dict) -> None:
    """Register a workload in the emulated environment with `pipeline_cli workload register` itself, after the deploy
    (its stacks' outputs naming the emulated runs table)."""
    import io
    import tempfile

    from config.layout import RUNS_TABLE_OUTPUT
    from tests.pipeline.test_pipeline_cli import Deployed
    from tools.pipeline_cli import main

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}.json"
        path.write_text(json.dumps(declaration))
        out, err = io.StringIO(), io.StringIO()
        session = Deployed({RUNS_TABLE_OUTPUT: world.runs_table, "StateMachineArn": "unused", "MaxNodes": "2"})
        code = main(["workload", "register", "dev", str(path)], session=session, out=out, err=err)
    assert code == 0, err.getvalue()
