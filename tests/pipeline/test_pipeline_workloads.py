"""`pipeline_cli workload register|list|show|retire` against moto's DynamoDB (tools/pipeline_workloads.py), and `start`
and `quote` checking a run that names a registered workload against its registered schema."""

import dataclasses
import io
import json
from typing import Any

import boto3
import pytest
from moto import mock_aws

from config import load_config
from config.layout import RUN_HOLDER, RUN_SINCE, RUNS_TABLE_KEY, RUNS_TABLE_OUTPUT
from contracts.run import WorkloadSchema
from contracts.workload import BUILT_IN_ROOT
from contracts.workload_registry import pointer_key, record, registrable, schema, version_key
from tests.pipeline.test_pipeline_cli import GONE, Deployed
from tests.synthesis import context
from tools import pipeline_workloads
from tools.pipeline_cli import main
from tools.pipeline_session import ROOT, CliError, Pipeline

REGION, TABLE = "us-east-1", "EfaTraining-dev-Runs"
IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/efa-training-dev-workloads:torch-ddp-1"
DECLARATION = {**json.loads((ROOT / "examples/torch_ddp/workload.json").read_text()), "image": {"uri": IMAGE}}
RUN = {"run_id": "ddp-001", "dataset": "datasets/wikitext/", "nodes": 2, "baseline": 1.0, "workload": "torch-ddp"}


@pytest.fixture
def deployed():
    """moto's account with the runs table and a state machine, the stacks' outputs naming them."""
    with mock_aws():
        boto3.client("dynamodb", region_name=REGION).create_table(
            TableName=TABLE,
            KeySchema=[{"AttributeName": RUNS_TABLE_KEY, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": RUNS_TABLE_KEY, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        # The environment's budget, as the observability stack deploys it: start refuses a run whose budget it
        # cannot read (tools/quote.py).
        budget = {"BudgetName": load_config(context()).budget_name, "BudgetType": "COST", "TimeUnit": "MONTHLY"}
        limit = {"BudgetLimit": {"Amount": str(load_config(context()).budget_monthly_usd), "Unit": "USD"}}
        account = boto3.client("sts", region_name=REGION).get_caller_identity()["Account"]
        boto3.client("budgets", region_name="us-east-1").create_budget(AccountId=account, Budget={**budget, **limit})
        machine = boto3.client("stepfunctions", region_name=REGION).create_state_machine(
            name="EfaTraining-dev-Pipeline",
            definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}),
            roleArn="arn:aws:iam::123456789012:role/pipeline",
        )["stateMachineArn"]
        yield Deployed({"StateMachineArn": machine, "MaxNodes": "2", RUNS_TABLE_OUTPUT: TABLE})


def cli(session, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, session=session)
    return code, out.getvalue(), err.getvalue()


def declaration(tmp_path, name: str = "torch-ddp", **changes) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**DECLARATION, **changes}))
    return str(path)


def run_file(tmp_path, **changes) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**RUN, **changes}))
    return str(path)


def item(key: str) -> dict | None:
    found = boto3.client("dynamodb", region_name=REGION).get_item(TableName=TABLE, Key={RUNS_TABLE_KEY: {"S": key}})
    return found.get("Item")


def keys() -> list[str]:
    items = boto3.client("dynamodb", region_name=REGION).scan(TableName=TABLE)["Items"]
    return sorted(i[RUNS_TABLE_KEY]["S"] for i in items)


def executions(session) -> list[dict]:
    sfn = boto3.client("stepfunctions", region_name=REGION)
    return sfn.list_executions(stateMachineArn=session.outputs["StateMachineArn"])["executions"]


def test_register_writes_version_1_and_the_pointer(deployed, tmp_path):
    code, out, err = cli(deployed, "workload", "register", "dev", declaration(tmp_path))
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"registered workload torch-ddp version 1 ({IMAGE})"
    assert '"workload": "torch-ddp"' in out.splitlines()[1]
    version, pointer = item(version_key("torch-ddp", 1)), item(pointer_key("torch-ddp"))
    assert version is not None and pointer is not None
    assert version["version"] == pointer["version"] == {"N": "1"} and pointer["retired"] == {"BOOL": False}
    assert version["record"] == pointer["record"]
    written = json.loads(pointer["record"]["S"])
    assert (written["name"], written["version"], written["image"]) == ("torch-ddp", 1, IMAGE)
    assert [row["key"] for row in written["hyperparameters"]] == ["lr", "max_steps", "checkpoint_every"]
    assert written["source"] == DECLARATION  # as given, for the CLI's own checks


def test_registering_the_same_declaration_again_writes_nothing(deployed, tmp_path):
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    before = item(pointer_key("torch-ddp"))
    reordered = tmp_path / "again.json"  # the same declaration, its keys in another order, named by its "name"
    reordered.write_text(json.dumps({"name": "torch-ddp", **dict(reversed(list(DECLARATION.items())))}))
    code, out, err = cli(deployed, "workload", "register", "dev", str(reordered))
    assert (code, err) == (0, "")
    assert out == "workload torch-ddp version 1 is already registered (same declaration)\n"
    assert keys() == ["workload#torch-ddp", "workload#torch-ddp#1"] and item(pointer_key("torch-ddp")) == before


def test_a_changed_declaration_is_version_2_and_version_1_stays_readable(deployed, tmp_path):
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    hyper = {**DECLARATION["hyperparameters"], "lr": {"type": "number", "default": 0.01, "minimum": 0, "maximum": 1}}
    code, out, _ = cli(deployed, "workload", "register", "dev", declaration(tmp_path, hyperparameters=hyper))
    assert code == 0 and out.startswith("registered workload torch-ddp version 2 (")
    code, out, _ = cli(deployed, "workload", "show", "dev", "torch-ddp")
    newest = json.loads(out)
    assert code == 0 and newest["version"] == 2 and newest["source"]["hyperparameters"]["lr"]["default"] == 0.01
    code, out, _ = cli(deployed, "workload", "show", "dev", "torch-ddp", "--version", "1")
    first = json.loads(out)
    assert code == 0 and first["version"] == 1 and first["source"]["hyperparameters"]["lr"]["default"] == 0.05
    code, out, err = cli(deployed, "workload", "show", "dev", "torch-ddp", "--version", "3")
    assert (code, out, err) == (2, "", "error: workload 'torch-ddp' has no version 3 in dev\n")
    code, _, err = cli(deployed, "workload", "show", "dev", "nothing-here")
    assert code == 2 and err.startswith("error: workload 'nothing-here' is not registered in dev; register it: ")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"launch": "mpirun"}, "workloads.torch-ddp.launch='mpirun' is not valid; expected torchrun or per-node"),
        (
            {"image": {"directory": "examples/torch_ddp"}},
            "workloads.torch-ddp.image={'directory': 'examples/torch_ddp'} is not valid; expected {\"uri\": <image URI",
        ),
        ({"image": {"uri": "not an image"}}, "workloads.torch-ddp.image.uri='not an image' is not valid"),
        ({"name": "Torch DDP"}, "workloads.Torch DDP: the name is not valid"),
        ({"epochs": 3}, "workloads.torch-ddp.epochs=3 is not valid; expected no such field"),
    ],
)
def test_a_bad_declaration_exits_2_in_one_line_naming_the_field(deployed, tmp_path, changes, words):
    path = declaration(tmp_path, **changes)
    code, out, err = cli(deployed, "workload", "register", "dev", path)
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith(f"error: {path}: "), err
    assert words in err, err
    assert keys() == []


def test_a_declaration_that_is_not_json_exits_2_before_any_aws_call(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"image": ')
    code, _, err = cli(None, "workload", "register", "dev", str(path))  # no moto: an AWS call would fail otherwise
    assert code == 2 and err.startswith(f"error: {path}: not valid JSON (line 1") and err.count("\n") == 1


def test_start_checks_a_run_against_the_registered_schema(deployed, tmp_path):
    code, _, err = cli(deployed, "start", "dev", run_file(tmp_path, hyperparameters={"lr": 0.1}))
    assert code == 2 and err == (
        "error: workload 'torch-ddp' is not registered in dev; register it: pipeline_cli workload register dev "
        "decl.json\n"
    )
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    code, out, err = cli(deployed, "start", "dev", run_file(tmp_path, hyperparameters={"lr": 0.1}), "--name", "ddp")
    assert (code, err) == (0, "") and "started ddp" in out
    (started,) = executions(deployed)
    described = boto3.client("stepfunctions", region_name=REGION).describe_execution(
        executionArn=started["executionArn"]
    )
    assert json.loads(described["input"])["workload"] == "torch-ddp"
    code, _, err = cli(deployed, "start", "dev", run_file(tmp_path, hyperparameters={"lr": 2, "epochs": 1}))
    assert code == 2 and err.count("\n") == 1
    assert "lr=2 is not valid; expected a number from 0 to 1" in err and "unknown hyperparameter 'epochs'" in err
    code, out, _ = cli(deployed, "quote", "dev", run_file(tmp_path, hyperparameters={"lr": 0.1}))
    assert code == 0 and out.startswith("quote: ")
    code, _, err = cli(deployed, "quote", "dev", run_file(tmp_path, hyperparameters={"lr": 2}))
    assert code == 2 and "lr=2 is not valid" in err
    assert len(executions(deployed)) == 1


def test_a_retired_workload_refuses_new_runs_and_keeps_its_versions(deployed, tmp_path):
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    code, out, err = cli(deployed, "workload", "retire", "dev", "torch-ddp")
    assert (code, err) == (0, "") and out.startswith("retired workload torch-ddp (newest version 1)")
    code, out, err = cli(deployed, "start", "dev", run_file(tmp_path))
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("error: workload 'torch-ddp' is retired in dev: it takes no new runs")
    assert executions(deployed) == []
    # A resume keeps the version it ran on; show still reads it.
    assert cli(deployed, "start", "dev", run_file(tmp_path, resume=True), "--name", "resumed")[0] == 0
    assert json.loads(cli(deployed, "workload", "show", "dev", "torch-ddp")[1])["version"] == 1
    code, _, err = cli(deployed, "workload", "retire", "dev", "never-registered")
    assert code == 2 and "workload 'never-registered' is not registered in dev" in err
    assert item(pointer_key("never-registered")) is None  # retiring never creates a pointer
    # Registering it again makes it take runs again, as a new version.
    code, out, _ = cli(deployed, "workload", "register", "dev", declaration(tmp_path))
    assert code == 0 and out.startswith("registered workload torch-ddp version 2")
    assert cli(deployed, "start", "dev", run_file(tmp_path), "--name", "again")[0] == 0


def test_list_shows_the_workloads_and_pipeline_list_shows_no_workload_items(deployed, tmp_path):
    assert cli(deployed, "workload", "list", "dev")[1] == "no workloads registered in dev\n"
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    hyper = {**DECLARATION["hyperparameters"], "max_steps": {"type": "integer", "default": 50, "minimum": 1}}
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path, hyperparameters=hyper))[0] == 0
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path), "--name", "old-ddp")[0] == 0
    assert cli(deployed, "workload", "retire", "dev", "old-ddp")[0] == 0
    boto3.client("dynamodb", region_name=REGION).put_item(
        TableName=TABLE,
        Item={RUNS_TABLE_KEY: {"S": "ddp-held"}, RUN_HOLDER: {"S": GONE}, RUN_SINCE: {"S": "2026-01-01T00:00:00Z"}},
    )
    code, out, err = cli(deployed, "workload", "list", "dev")
    assert (code, err) == (0, "")
    assert [line.split() for line in out.splitlines()] == [
        ["old-ddp", "version", "1", "retired", IMAGE],
        ["torch-ddp", "version", "2", "active", IMAGE],
    ]
    code, out, _ = cli(deployed, "list", "dev")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["ddp-held"]


@pytest.mark.parametrize("first", [True, False])
def test_a_registration_that_loses_a_race_writes_nothing(deployed, tmp_path, monkeypatch, first):
    if not first:
        assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    read = pipeline_workloads._item
    ours = 1 if first else 2

    def racing(pipeline, key):
        """Another registration moves the pointer between this one's read and its write."""
        found = read(pipeline, key)
        if key == pointer_key("torch-ddp"):
            boto3.client("dynamodb", region_name=REGION).put_item(
                TableName=TABLE,
                Item={RUNS_TABLE_KEY: {"S": key}, "version": {"N": str(ours)}, "record": {"S": "{}"}},
            )
        return found

    monkeypatch.setattr(pipeline_workloads, "_item", racing)
    changed = declaration(tmp_path, hang_timeout_seconds=600)
    code, out, err = cli(deployed, "workload", "register", "dev", changed)
    assert (code, out) == (2, "")
    assert err == "error: another registration of torch-ddp raced this one; run it again\n"
    assert item(version_key("torch-ddp", ours)) is None  # all or nothing: no version without its pointer


def test_a_run_may_pin_a_registered_version(deployed, tmp_path):
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    hyper = {"lr": {"type": "number", "default": 0.01}}
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path, hyperparameters=hyper))[0] == 0
    pipeline = Pipeline("dev", REGION, session=deployed)
    pinned = pipeline_workloads.registered_schemas(pipeline, {**RUN, "workload_version": 1})["torch-ddp"]
    newest = pipeline_workloads.registered_schemas(pipeline, RUN)["torch-ddp"]
    assert [f.key for f in pinned.hyperparameters] == ["lr", "max_steps", "checkpoint_every"]
    assert [f.key for f in newest.hyperparameters] == ["lr"]
    with pytest.raises(CliError, match=r"workload_version=3 is not valid; expected .* 'torch-ddp' in dev, 1 to 2"):
        pipeline_workloads.registered_schemas(pipeline, {**RUN, "workload_version": 3})
    assert pipeline_workloads.registered_schemas(pipeline, {**RUN, "workload": "gpt"}) == {}  # built in: no read


def test_a_record_reads_back_as_the_schema_of_its_declaration():
    """Every rule of a declaration (bounds, choices, requires, divides, layout, cost) survives the registry: the
    record's rows read back as the fields the declaration parses to (their rule spelled out)."""
    source = {
        **json.loads((BUILT_IN_ROOT / "gpt" / "workload.json").read_text()),
        "image": {"uri": IMAGE},
        "launch": "torchrun",
    }
    workload = registrable("gpt-copy", source)
    rules = tuple(dataclasses.replace(f, rule=f.allowed()) for f in workload.hyperparameters)
    stored = json.loads(json.dumps(record(workload, source, 1)))  # as the table holds it: JSON text
    assert schema(stored) == WorkloadSchema(rules, False, workload.cost)
    assert any(f.divides for f in rules) and any(f.requires for f in rules) and workload.cost is not None


# Nothing grants a pull from another private repository without a deploy: refused before anything is written.
def test_a_private_image_outside_the_workload_repository_is_refused(deployed, tmp_path):
    elsewhere = {"uri": "111122223333.dkr.ecr.us-east-1.amazonaws.com/team/llm:v7"}
    code, _, err = cli(deployed, "workload", "register", "dev", declaration(tmp_path, image=elsewhere))
    assert code == 2 and "expected an image in efa-training-dev-workloads" in err and keys() == []


def test_a_public_image_is_registered(deployed, tmp_path):
    public = {"uri": "public.ecr.aws/acme/trainer:1.0"}
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path, image=public))[0] == 0


# A resume meets its checkpoints with the code that wrote them: the version its claim recorded, not the newest.
def test_a_resume_keeps_the_version_its_run_started_with(deployed, tmp_path):
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path))[0] == 0
    claimed = {**RUN, "registered": {"name": "torch-ddp", "version": 1}}
    boto3.client("dynamodb", region_name=REGION).put_item(
        TableName=TABLE,
        Item={RUNS_TABLE_KEY: {"S": RUN["run_id"]}, RUN_HOLDER: {"S": "arn:execution"},
              RUN_SINCE: {"S": "2026-12-01T00:00:00Z"}, "input": {"S": json.dumps(claimed)}},
    )  # fmt: skip
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path, metrics={"l": "l=([0-9.]+)"}))[0] == 0
    code, out, err = cli(deployed, "start", "dev", run_file(tmp_path, resume=True), "--name", "resumed")
    assert (code, err) == (0, "") and "version 1, the one it ran with" in out
    (started,) = executions(deployed)
    described = boto3.client("stepfunctions", region_name=REGION).describe_execution(
        executionArn=started["executionArn"]
    )
    assert json.loads(described["input"])["workload_version"] == 1


def test_a_declaration_too_long_for_a_sagemaker_environment_value_is_refused_there(deployed, tmp_path, monkeypatch):
    from tools import pipeline_workloads as registry

    sagemaker = dataclasses.replace(registry.environment_config("dev"), compute="sagemaker")
    monkeypatch.setattr(registry, "environment_config", lambda env: sagemaker)
    long = {"loss": "loss=([0-9.eE+-]+)", **{f"m{i}": f"m{i}=([0-9.]+)" for i in range(30)}}
    code, _, err = cli(deployed, "workload", "register", "dev", declaration(tmp_path, metrics=long))
    assert code == 2 and "at most 512 on SageMaker" in err and keys() == []


# The CLI's quote of a registered workload's run prices it by its registered cost model, as QuoteRun does.
def test_a_registered_workloads_cost_model_prices_its_run(deployed, tmp_path):
    costed: dict[str, Any] = {
        "hyperparameters": {
            "max_steps": {"type": "integer", "default": 100, "minimum": 1},
            "batch_size": {"type": "integer", "default": 8, "minimum": 1},
        },
        "cost": {"steps": "max_steps", "batch_size": "batch_size", "tflops_per_sample": 2.0},
    }
    assert cli(deployed, "workload", "register", "dev", declaration(tmp_path, **costed))[0] == 0
    code, out, err = cli(deployed, "quote", "dev", run_file(tmp_path, hyperparameters={"max_steps": 1000}))
    assert code == 0, err
    assert out.startswith("quote: ~$") and "min of training" in out, out  # not "no FLOPs model for this workload"
