"""The operator CLI against the emulated pipeline (tests/sfn_emulator.py), and its one-line errors."""

import io
import json

import boto3
import pytest
from botocore.exceptions import ClientError

from test_pipeline import ACCEPTED, RUN, emulator, world  # noqa: F401  (fixtures)
from tools.pipeline_cli import main



class Deployed:
    """A boto3 session whose CloudFormation knows one stack, EfaTraining-dev-Pipeline, by its outputs (moto's
    CloudFormation needs packages this project does not install); every other client is moto's."""

    def __init__(self, outputs: dict[str, str]):
        self.outputs = outputs

    def client(self, service: str, region_name: str | None = None):
        if service != "cloudformation":
            return boto3.client(service, region_name=region_name)
        outputs = self.outputs

        class CloudFormation:
            @staticmethod
            def describe_stacks(StackName: str):
                if StackName == "EfaTraining-dev-Storage" and "BucketName" in outputs:
                    return {"Stacks": [{"Outputs": [{"OutputKey": "BucketName", "OutputValue": outputs["BucketName"]}]}]}
                if StackName != "EfaTraining-dev-Pipeline" or region_name != "us-east-1":
                    raise ClientError({"Error": {"Code": "ValidationError",
                                                 "Message": f"Stack with id {StackName} does not exist"}},
                                      "DescribeStacks")
                return {"Stacks": [{"Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()]}]}
        return CloudFormation()


@pytest.fixture
def deployed(emulator):  # noqa: F811
    emulator.session = Deployed({
        "StateMachineArn": emulator.state_machine_arn, "MaxNodes": "2", "BucketName": emulator.bucket,
        "ExecutionLogGroup": "EfaTraining-dev-Pipeline-ExecutionLogs",
        "ApprovedModelParameter": "/efa-training/dev/approved-model"})
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
    code, out, err = cli("start", "dev", run_file(tmp_path, run_id="cli-ok"), "--name", "cli-ok", "--watch",
                         "--interval", "0.05")
    assert (code, err) == (0, ""), out
    lines = out.splitlines()
    assert lines[0] == "started cli-ok"
    states = [line.split()[-1] for line in lines[2:-1]]
    # Validate is a parallel block on Batch: its Spot attempt shows as the state inside it.
    assert states == ["ValidateInput", "SanityCheck", "Train", "Validate", "ValidateOnSpot", "ReadVerdict",
                      "IsModelAccepted", "CopyVerdictToModels", "PublishApprovedModel", "NotifyApproved",
                      "RunSucceeded"]
    assert "[######] 6/6" in lines[-2]
    assert lines[-1].startswith("SUCCEEDED after 0:00:0")

    code, out, _ = cli("describe", "dev", "cli-ok")
    assert code == 0
    assert "verdict    accepted: val_loss = 3.18 (baseline 3.2" in out
    assert "#dashboards/dashboard/EfaTraining-dev-training" in out
    assert "logs       https://us-east-1.console.aws.amazon.com/cloudwatch/home?region=us-east-1#logsV2:" in out
    assert sum(line.startswith("job ") for line in out.splitlines()) == 3

    code, out, _ = cli("list", "dev")
    assert code == 0 and any(line.startswith("cli-ok") and "SUCCEEDED" in line for line in out.splitlines())


def test_watch_a_failing_run_shows_attempts_and_exits_1(deployed, tmp_path):
    deployed.outcomes = {"train": [False]}
    code, out, _ = cli("start", "dev", run_file(tmp_path, run_id="cli-bad"), "--name", "cli-bad")
    assert code == 0
    deployed.wait(deployed.state_machine_arn.replace(":stateMachine:", ":execution:") + ":cli-bad")
    code, out, _ = cli("watch", "dev", "cli-bad", "--interval", "0.05")
    assert code == 1
    assert [line.split("  ")[-1] for line in out.splitlines() if "  Train" in line] == [
        "Train", "Train attempt 1 failed: States.TaskFailed",
        "Train attempt 2", "Train attempt 2 failed: States.TaskFailed",
        "Train attempt 3", "Train attempt 3 failed: States.TaskFailed",
        "Train attempt 4", "Train attempt 4 failed: States.TaskFailed"]
    assert out.splitlines()[-1].startswith("FAILED after") and "TrainingFailed" in out.splitlines()[-1]

    code, out, _ = cli("describe", "dev", "cli-bad")
    assert code == 1
    assert "status     FAILED" in out and "error      TrainingFailed" in out and "verdict    none yet" in out


def test_start_refuses_an_invalid_run_before_starting(deployed, tmp_path):
    code, out, err = cli("start", "dev", run_file(tmp_path, nodes=3))
    assert code == 2 and out == ""
    assert err.strip().endswith("nodes=3 is above this environment's maximum of 2 nodes")
    assert deployed.sfn.list_executions(stateMachineArn=deployed.state_machine_arn, statusFilter="RUNNING")[
        "executions"] == []


def test_malformed_run_file(tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text('{"run_id": "x",')
    code, _, err = cli("start", "dev", str(bad))
    assert code == 2 and err.startswith(f"error: {bad}: not valid JSON (line 1")
    assert len(err.strip().splitlines()) == 1


def test_environment_not_deployed(world, tmp_path):  # noqa: F811
    code, _, err = cli("list", "prod")
    assert code == 2
    assert err.strip() == ("error: environment 'prod' is not deployed: no stack EfaTraining-prod-Pipeline in "
                           "us-west-2 (deploy it with `cdk deploy -c env=prod EfaTraining-prod-Pipeline`)")


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
