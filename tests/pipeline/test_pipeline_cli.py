"""The operator CLI against the emulated pipeline (tests/sfn_emulator.py), and its one-line errors."""

import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.layout import NODE_LEASE_PREFIX, RUNS_TABLE_OUTPUT
from contracts.run import phases
from tests.pipeline.runs import ACCEPTED, RUN, hold_run
from tests.synthesis import ROOT
from tools.pipeline_cli import ATTEMPTS, CliError, _Progress, client_config, load_run, main

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)


class Deployed:
    """A boto3 session whose CloudFormation knows one stack, EfaTraining-dev-Pipeline, by its outputs (moto's
    CloudFormation needs packages this project does not install); every other client is moto's."""

    def __init__(self, outputs: dict[str, str]):
        self.outputs = outputs

    def client(self, service: str, region_name: str | None = None, config=None):
        if service != "cloudformation":
            return boto3.client(service, region_name=region_name, config=config)
        outputs = self.outputs

        class CloudFormation:
            @staticmethod
            def describe_stacks(StackName: str):
                storage = [
                    {"OutputKey": key, "OutputValue": outputs[key]}
                    for key in ("BucketName", RUNS_TABLE_OUTPUT)
                    if key in outputs
                ]
                if StackName == "EfaTraining-dev-Storage" and storage:
                    return {"Stacks": [{"Outputs": storage}]}
                if StackName != "EfaTraining-dev-Pipeline" or region_name != "us-east-1":
                    raise ClientError(
                        {"Error": {"Code": "ValidationError", "Message": f"Stack with id {StackName} does not exist"}},
                        "DescribeStacks",
                    )
                return {"Stacks": [{"Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()]}]}

        return CloudFormation()


@pytest.fixture
def deployed(emulator):
    emulator.session = Deployed(
        {
            "StateMachineArn": emulator.state_machine_arn,
            "MaxNodes": "2",
            "BucketName": emulator.bucket,
            RUNS_TABLE_OUTPUT: emulator.runs_table,
            "ExecutionLogGroup": "EfaTraining-dev-Pipeline-ExecutionLogs",
            "ApprovedModelParameter": "/efa-training/dev/approved-model",
        }
    )
    return emulator


_SESSION: list = []


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, session=_SESSION[-1] if _SESSION else None)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _session(request):
    """CLI calls in a test that uses `deployed` go through its session; others use boto3's default."""
    if "deployed" in request.fixturenames:
        _SESSION.append(request.getfixturevalue("deployed").session)
    elif "world" in request.fixturenames:
        _SESSION.append(Deployed({}))
    yield
    _SESSION.clear()


def run_file(tmp_path, **changes) -> str:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**RUN, **changes}))
    return str(path)


def test_start_and_watch_a_run_that_succeeds(deployed, tmp_path):
    deployed.verdict = ACCEPTED
    code, out, err = cli(
        "start", "dev", run_file(tmp_path, run_id="cli-ok"), "--name", "cli-ok", "--watch", "--interval", "0.05"
    )
    assert (code, err) == (0, ""), out
    lines = out.splitlines()
    # The quote first (tools/quote.py; moto has no MFU metrics and the budget as deployed, nothing spent).
    assert lines[0].startswith("quote: ~$") and "MFU 40% assumed" in lines[0]
    assert lines[1] == "budget: $2,000.00 left of $2,000.00 this month"  # dev's budget_monthly_usd (cdk.json)
    assert lines[2] == "started cli-ok"
    states = [line.split()[-1] for line in lines[4:-1]]
    # The run's phases (contracts.run.PHASES), then where it ended; progress counts every phase.
    assert states == [
        "ValidateInput",
        "RunClaimed",
        "SanityCheck",
        "Train",
        "Validate",
        "ReadVerdict",
        "IsModelAccepted",
        "RecordApproval",
        "PublishApprovedModel",
        "NotifyApproved",
        "RunSucceeded",
    ]
    assert "[##########] 10/10" in lines[-2]
    assert lines[-1].startswith("SUCCEEDED after 0:00:0")

    code, out, _ = cli("describe", "dev", "cli-ok")
    assert code == 0
    assert "verdict    accepted: val_loss = 3.18 (baseline 3.2" in out
    assert "#dashboards/dashboard/EfaTraining-dev-training" in out
    assert "logs       https://us-east-1.console.aws.amazon.com/cloudwatch/home?region=us-east-1#logsV2:" in out
    assert sum(line.startswith("job ") for line in out.splitlines()) == 3
    # The pipeline's own quote (QuoteRun, at the assumed MFU) beside the job states' cost: seconds here.
    assert f"quote      {lines[0].removeprefix('quote: ')}" in out
    assert "actual     ~$" in out and "Train 0.00 h" in out
    # Where the approved model is in the registry (constructs/pipeline/model_registry.py; tools/model_registry.py).
    assert re.search(r"^registry   efa-training-dev-gpt version \d+ \(Approved\): arn:aws:sagemaker:", out, re.M)

    code, out, _ = cli("list", "dev")
    assert code == 0 and any(line.startswith("cli-ok") and "SUCCEEDED" in line for line in out.splitlines())


# ---- the runs table: every claimed run id, with the execution holding it -------------------------------------------

GONE = "arn:aws:states:us-east-1:123456789012:execution:EfaTraining-dev-Pipeline-TrainingPipeline:long-gone"


class ScanPages(Deployed):
    """The deployed session, its DynamoDB Scan answering `limit` items a page, as a large table's Scan does at 1 MB
    (DynamoDB API reference, Scan: LastEvaluatedKey)."""

    def __init__(self, outputs: dict[str, str], limit: int):
        super().__init__(outputs)
        self.limit, self.pages = limit, 0

    def client(self, service: str, region_name: str | None = None, config=None):
        client = super().client(service, region_name=region_name, config=config)
        if service == "dynamodb":
            scan = client.scan

            def paged(**request):
                self.pages += 1
                return scan(Limit=self.limit, **request)

            client.scan = paged
        return client


# `list` shows every claimed run, newest claim first, with its execution's status, claim time and name, across Scan
# pages; a run whose execution Step Functions no longer keeps shows EXPIRED.
def test_list_shows_every_claimed_run_from_the_runs_table(deployed, tmp_path):
    deployed.verdict = ACCEPTED
    hold_run(deployed, {**RUN, "run_id": "cli-old"}, GONE)
    for run_id in ("cli-one", "cli-two"):
        assert (
            cli("start", "dev", run_file(tmp_path, run_id=run_id), "--name", run_id, "--watch", "--interval", "0")[0]
            == 0
        )
    session = ScanPages(deployed.session.outputs, limit=1)
    _SESSION.append(session)
    code, out, err = cli("list", "dev")
    assert (code, err) == (0, "")
    rows = [line.split() for line in out.splitlines()]
    assert [(row[0], row[1], row[-1]) for row in rows] == [
        ("cli-two", "SUCCEEDED", "cli-two"),
        ("cli-one", "SUCCEEDED", "cli-one"),
        ("cli-old", "EXPIRED", "long-gone"),
    ]
    assert rows[-1][2:4] == ["2026-01-01", "00:00"] and session.pages >= 3  # one item a page, then the last


# EKS's node-group lease lives in the runs table too (constructs/compute/eks/node_lease.py): `list` shows runs only.
def test_list_shows_no_node_lease(deployed):
    hold_run(deployed, {**RUN, "run_id": "cli-held"}, GONE)
    hold_run(deployed, {**RUN, "run_id": f"{NODE_LEASE_PREFIX}dev"}, GONE)
    code, out, _ = cli("list", "dev")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["cli-held"]


# `list --status` keeps the runs whose execution has that status; `--max` bounds the rows.
def test_list_filters_by_status_and_stops_at_max(deployed, tmp_path):
    deployed.outcomes = {"train": [False]}
    hold_run(deployed, {**RUN, "run_id": "cli-old"}, GONE)
    assert (
        cli("start", "dev", run_file(tmp_path, run_id="cli-bad"), "--name", "cli-bad", "--watch", "--interval", "0")[0]
        == 1
    )
    code, out, _ = cli("list", "dev", "--status", "FAILED")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["cli-bad"]
    code, out, _ = cli("list", "dev", "--max", "1")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["cli-bad"]


# Without the storage stack's RunsTableName output (a stack deployed before the table), `list` says so in one line.
def test_list_without_the_runs_table_output_is_one_line(deployed):
    _SESSION.append(Deployed({k: v for k, v in deployed.session.outputs.items() if k != RUNS_TABLE_OUTPUT}))
    code, out, err = cli("list", "dev")
    assert (code, out) == (2, "")
    assert err == (
        "error: environment 'dev': stack EfaTraining-dev-Storage has no RunsTableName output; redeploy the storage "
        "stack\n"
    )


# `describe` shows who holds the run id: a failed run's execution, once resumed, no longer holds it.
def test_describe_shows_the_claim_of_the_run(deployed, tmp_path):
    deployed.outcomes = {"train": [False]}
    cli("start", "dev", run_file(tmp_path, run_id="cli-resume"), "--name", "cli-failed", "--watch", "--interval", "0")
    _, out, _ = cli("describe", "dev", "cli-failed")
    assert "claim      held by this execution since 20" in out
    deployed.outcomes = {}
    deployed.verdict = ACCEPTED
    code, _, _ = cli(
        "start",
        "dev",
        run_file(tmp_path, run_id="cli-resume", resume=True),
        "--name",
        "cli-resumed",
        "--watch",
        "--interval",
        "0",
    )
    assert code == 0
    _, out, _ = cli("describe", "dev", "cli-failed")
    assert "claim      held by execution cli-resumed since 20" in out


def test_describe_names_the_runs_mlflow_run_where_tracking_is_on(deployed, tmp_path, monkeypatch):
    import dataclasses

    from tools import pipeline_describe

    deployed.outcomes = {"train": [False]}
    cli("start", "dev", run_file(tmp_path, run_id="cli-tracked"), "--name", "cli-tracked", "--watch", "--interval", "0")
    config = pipeline_describe.environment_config("dev")
    assert config.tracking_uri == ""  # off in dev: no line
    assert "tracking " not in cli("describe", "dev", "cli-tracked")[1]
    tracked = dataclasses.replace(config, tracking_uri="https://mlflow.example.internal")
    monkeypatch.setattr(pipeline_describe, "environment_config", lambda env: tracked)
    _, out, _ = cli("describe", "dev", "cli-tracked")
    assert "tracking   MLflow https://mlflow.example.internal: experiment 'dev', run 'cli-tracked'" in out
    managed = dataclasses.replace(config, tracking_server="small")  # config tracking_server: the managed one
    monkeypatch.setattr(pipeline_describe, "environment_config", lambda env: managed)
    _, out, _ = cli("describe", "dev", "cli-tracked")
    assert "tracking   MLflow SageMaker managed server efa-training-dev: experiment 'dev', run 'cli-tracked'" in out
    assert "create-presigned-mlflow-tracking-server-url --tracking-server-name efa-training-dev" in out


def test_describe_shows_the_hosts_the_run_took_out(deployed, tmp_path):
    # A host the training named bad, taken out before the retry (constructs/pipeline/quarantine.py): its record under
    # runs/<run_id>/bad-hosts/ (tools/bad_hosts.py), with why and the first evidence.
    deployed.outcomes = {"train": [1, True]}
    deployed.bad_hosts = {"train": [["i-0123456789abcdef0"]]}
    code, _, _ = cli("start", "dev", run_file(tmp_path, run_id="cli-bad-host"), "--name", "cli-bad-host")
    assert code == 0
    deployed.wait(deployed.state_machine_arn.replace(":stateMachine:", ":execution:") + ":cli-bad-host")
    code, out, _ = cli("describe", "dev", "cli-bad-host")
    (line,) = [line for line in out.splitlines() if line.startswith("bad host")]
    assert line == (
        "bad host   i-0123456789abcdef0  taken out: failed the health check after a failed attempt (exit 1) "
        "(Xid 79 on GPU 3)"
    )


def test_watch_a_failing_run_shows_attempts_and_exits_1(deployed, tmp_path):
    deployed.outcomes = {"train": [False]}
    code, out, _ = cli("start", "dev", run_file(tmp_path, run_id="cli-bad"), "--name", "cli-bad")
    assert code == 0
    deployed.wait(deployed.state_machine_arn.replace(":stateMachine:", ":execution:") + ":cli-bad")
    code, out, _ = cli("watch", "dev", "cli-bad", "--interval", "0.05")
    assert code == 1
    assert [line.split("  ")[-1] for line in out.splitlines() if "  Train" in line] == [
        "Train",
        "Train attempt 1 failed: States.TaskFailed",
        "Train attempt 2",
        "Train attempt 2 failed: States.TaskFailed",
        "Train attempt 3",
        "Train attempt 3 failed: States.TaskFailed",
        "Train attempt 4",
        "Train attempt 4 failed: States.TaskFailed",
    ]
    assert out.splitlines()[-1].startswith("FAILED after") and "TrainingFailed" in out.splitlines()[-1]

    code, out, _ = cli("describe", "dev", "cli-bad")
    assert code == 1
    assert "status     FAILED" in out and "error      TrainingFailed" in out and "verdict    none yet" in out


def test_start_refuses_an_invalid_run_before_starting(deployed, tmp_path):
    code, out, err = cli("start", "dev", run_file(tmp_path, nodes=3))
    assert code == 2 and out == ""
    assert err.strip().endswith("nodes=3 is not valid; expected an integer from 1 to 2 (this environment's maximum)")
    assert (
        deployed.sfn.list_executions(stateMachineArn=deployed.state_machine_arn, statusFilter="RUNNING")["executions"]
        == []
    )


def test_malformed_run_file(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text('{"run_id": "x",')
    code, _, err = cli("start", "dev", str(bad))
    assert code == 2 and err.startswith(f"error: {bad}: not valid JSON (line 1")
    assert len(err.strip().splitlines()) == 1


def test_environment_not_deployed(world, tmp_path):
    code, _, err = cli("list", "prod")
    assert code == 2
    assert err.strip() == (
        "error: environment 'prod' is not deployed: no stack EfaTraining-prod-Pipeline in "
        "us-west-2 (deploy it with `cdk deploy -c env=prod EfaTraining-prod-Pipeline`)"
    )


def test_unknown_environment():
    code, _, err = cli("list", "staging")
    assert code == 2
    assert err.strip() == "error: unknown environment 'staging'; expected one of dev, prod (from cdk.json)"


def test_missing_credentials(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, _, err = cli("list", "dev")
    assert code == 2
    assert err.strip() == "error: no AWS credentials found: set AWS_PROFILE, run `aws configure` or `aws sso login`"


# ---- run integrity: the CLI never hangs and never ends in a traceback ------------------------------------


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\xff\xfe{\x00}", "not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"run_id": "a", "nodes": ' + b"9" * 5000 + b"}", "not a valid run file"),
        (b'{"run_id": "gpt", "dataset": "datasets/w/", "baseline": NaN}', "NaN is not a JSON number"),
        (json.dumps({**RUN, "run_id": "gpt-tiny-001\n"}).encode(), "run_id='gpt-tiny-001\\n' is not valid"),
        (json.dumps({**RUN, "nodes": 2.0}).encode(), "nodes=2.0 is not valid"),
        (json.dumps({**RUN, "hyperparameters": {"max_steps": 1e30}}).encode(), "max_steps=1e+30 is not valid"),
        (json.dumps({**RUN, "dataset": "datasets/../x/"}).encode(), "dataset='datasets/../x/' is not valid"),
        (json.dumps({**RUN, "hyperparameters": {"model": "gpt5"}}).encode(), "model='gpt5' is not valid"),
        (
            json.dumps({**RUN, "hyperparameters": {"model": "ctr-tiny"}}).encode(),
            "model='ctr-tiny' is not valid; expected one of tiny",
        ),
        (json.dumps([RUN]).encode(), "the run must be a JSON object, not an array"),
        (b"null", "the run must be a JSON object, not null"),
    ],
)
def test_a_bad_run_file_ends_in_one_line_before_any_aws_call(tmp_path, content, words):
    path = tmp_path / "run.json"
    path.write_bytes(content)
    code, out, err = cli("start", "dev", str(path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert words in err, err


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
            lambda children: st.one_of(
                st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda value: json.dumps(value).encode()),
        st.fixed_dictionaries(
            {},
            optional={
                key: st.one_of(
                    st.none(),
                    st.integers(),
                    st.floats(),
                    st.text(max_size=50),
                    st.booleans(),
                    st.lists(st.integers(), max_size=2),
                )
                for key in (
                    "run_id",
                    "dataset",
                    "nodes",
                    "baseline",
                    "tolerance",
                    "max_attempts",
                    "resume",
                    "hyperparameters",
                )
            },
        ).map(lambda value: json.dumps(value).encode()),
    )
)
def test_any_run_file_is_loaded_or_refused_in_one_line(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("runs") / "run.json"
    path.write_bytes(content)
    try:
        run = load_run(str(path), max_nodes=2)
    except CliError as error:
        assert "\n" not in str(error) and str(error).startswith(str(path))
    else:
        assert isinstance(run, dict)


def test_describe_an_execution_someone_started_with_any_input(deployed):
    for i, raw in enumerate(["[1, 2]", "null", '"a string"', '{"run_id": ["x"]}']):
        arn = deployed.sfn.start_execution(stateMachineArn=deployed.state_machine_arn, name=f"odd-{i}", input=raw)[
            "executionArn"
        ]
        deployed.wait(arn)
        code, out, err = cli("describe", "dev", f"odd-{i}")
        assert (code, err) == (1, ""), err
        assert "status     FAILED" in out and "InvalidInput" in out
        assert "run        (the input names no run id)" in out


# botocore Config connect_timeout/read_timeout/retries: https://botocore.amazonaws.com/v1/documentation/api/latest/reference/config.html
# Standard retry mode waits base 2 exponential backoff, at most 20 s per wait (boto3 guide, "Retries":
# https://docs.aws.amazon.com/boto3/latest/guide/retries.html: "a maximum backoff time of 20 seconds").
def test_an_endpoint_that_never_answers_costs_at_most_a_minute():
    config = client_config()
    attempts = config.retries["max_attempts"]  # the first attempt included
    assert config.retries["mode"] == "standard" and attempts == ATTEMPTS
    waits = sum(min(2 ** (attempt - 1), 20) for attempt in range(1, attempts))
    assert attempts * (config.connect_timeout + config.read_timeout) + waits < 60


# The CLI as a process, its client_config's waits shortened to 0.5 s (same retries, same error path), so the test
# takes seconds; the real waits are bounded by the test above.
SHORT_WAITS = (
    "import sys; from botocore.config import Config; import tools.pipeline_cli as cli; "
    "import tools.pipeline_session as session; real = session.client_config; "
    "session.client_config = lambda: real().merge(Config(connect_timeout=0.5, read_timeout=0.5)); "
    "sys.exit(cli.main(sys.argv[1:]))"
)


def test_an_endpoint_that_never_answers_ends_in_one_line():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_never_answer():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept_and_never_answer, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        result = subprocess.run(
            [sys.executable, "-c", SHORT_WAITS, "list", "dev"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        stop.set()
        for connection in held:
            connection.close()
        server.close()
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("error: AWS did not answer after 3 attempts") and "127.0.0.1" in lines[0], lines


# SageMaker's training job checks its own hosts: the stack's `Phases` output has no SanityCheck, and the progress
# bar counts the phases that backend passes through.
def test_progress_counts_the_backends_own_phases():
    out, started = io.StringIO(), datetime(2026, 1, 1, tzinfo=UTC)
    progress = _Progress(out, phases(sanity_in_training=True))
    for name in phases(sanity_in_training=True):
        progress.show({"timestamp": started, "type": "TaskStateEntered", "stateEnteredEventDetails": {"name": name}})
    assert "SanityCheck" not in out.getvalue()
    assert out.getvalue().splitlines()[-1].split()[1] == "[#########]" and "9/9" in out.getvalue().splitlines()[-1]


# ---- the dataset a run names (tools/dataset.py, `make dataset`; constructs/pipeline/dataset_check.py)


def test_start_refuses_a_dataset_that_was_never_prepared_before_starting(deployed, tmp_path):
    code, _, err = cli("start", "dev", run_file(tmp_path, dataset="datasets/wikitxt/"))
    assert code == 2 and err.count("\n") == 1, err
    assert (
        f"dataset 'datasets/wikitxt/' is not prepared: no s3://{deployed.bucket}/datasets/wikitxt/dataset.json" in err
    )
    assert deployed.sfn.list_executions(stateMachineArn=deployed.state_machine_arn)["executions"] == []


def test_make_dataset_uploads_a_prepared_dataset_that_the_printed_run_file_trains_on(deployed, tmp_path, capsys):
    from tools import dataset

    assert dataset.main(["dev", "sample", "--synthetic"], session=deployed.session) == 0
    printed = json.loads(capsys.readouterr().out)
    keys = [
        o["Key"] for o in deployed.s3.list_objects_v2(Bucket=deployed.bucket, Prefix="datasets/sample/")["Contents"]
    ]
    assert "datasets/sample/dataset.json" in keys and any(k.endswith(".bin") for k in keys)
    deployed.verdict = ACCEPTED
    path = tmp_path / "first.json"
    path.write_text(json.dumps(printed))
    code, out, err = cli("start", "dev", str(path), "--watch", "--interval", "0")
    assert printed["dataset"] == "datasets/sample/" and code == 0, (out, err)


def test_make_dataset_without_input_is_one_line(capsys):
    from tools import dataset

    assert dataset.main(["dev", "sample"]) == 2
    assert capsys.readouterr().err == "error: nothing to prepare: give --input <files or folders> or --synthetic\n"
