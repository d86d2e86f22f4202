"""`make deploy DRY_RUN=1` and `make destroy DRY_RUN=1` offline: no AWS credentials, no Docker on PATH, and any AWS
client boto3 or botocore would make fails the test. Each prints its whole plan (the checks it would make, then the
commands) and exits 0."""

import shutil
from pathlib import Path
from typing import NoReturn

import boto3
import botocore.session
import pytest

from tools import deploy, destroy, preflight


def _refuse(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError(f"the dry run called out: {args}")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Nothing but the plan can happen: every way to an AWS client raises, no credentials anywhere, PATH holds only
    node (the in-process synthesis's jsii runtime needs it), and no command may run."""
    for name in ("client", "resource"):
        monkeypatch.setattr(boto3, name, _refuse)
        monkeypatch.setattr(boto3.session.Session, name, _refuse)
    monkeypatch.setattr(botocore.session.Session, "create_client", _refuse)
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    node = shutil.which("node")
    (tmp_path / "bin").mkdir()
    if node:
        (tmp_path / "bin" / "node").symlink_to(Path(node).resolve())
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert shutil.which("docker") is None
    monkeypatch.setattr(preflight, "_docker_answers", _refuse)
    monkeypatch.setattr(deploy, "_run", _refuse)
    monkeypatch.setattr(destroy, "_run", _refuse)


def test_destroying_dev_dry_prints_its_checks_and_command_offline(offline, capfd):
    assert destroy.main(["dev", "--dry-run"]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("destroy plan for dev (dry run: no AWS credentials, no AWS call")
    assert "  account: that of the credentials at destroy time (cdk.json names none)" in lines
    assert "  credentials: would call STS GetCallerIdentity; any account (cdk.json names none)" in lines
    # What preflight.check_no_run_in_flight asks: Step Functions ListExecutions (statusFilter RUNNING) on the
    # pipeline's state machine, then Batch ListJobs (jobQueue, jobStatus) on each of dev's queues.
    (in_flight,) = [line for line in lines if line.startswith("  run in flight: ")]
    assert "EfaTraining-dev-Pipeline's StateMachineArn output (CloudFormation DescribeStacks)" in in_flight
    assert "RUNNING executions (Step Functions ListExecutions)" in in_flight
    for unit in preflight.BATCH_QUEUE_UNITS:
        assert f"efa-training-dev-{unit}" in in_flight
    assert in_flight.endswith("(Batch ListJobs); any one refuses this destroy (ALLOW_RUNNING=1 skips this)")
    assert lines[-1] == f"destroy: would run: {deploy.CDK} destroy --all --force -c env=dev"


def test_destroying_dry_names_the_account_and_what_allow_running_skips(offline, capsys):
    (command,) = destroy.plan(
        "prod", dry_run=True, run=_refuse, allow_running=True, extra=["-c", "account=111111111111"]
    )
    out = capsys.readouterr().out
    assert "  account: 111111111111" in out.splitlines()
    assert "  credentials: would call STS GetCallerIdentity; the account must be 111111111111" in out
    assert "  run in flight: not checked (--allow-running)" in out
    # prod keeps its data: what would stay is said as what would, not what did.
    assert "destroy: would keep (retain_data)" in out and "EfaTraining-prod-Network" in out
    assert command[-3:] == ["EfaTraining-prod-Storage", "EfaTraining-prod-Registry", "EfaTraining-prod-Alerts"]


def test_deploying_dev_dry_prints_its_whole_plan_offline(offline, capfd):
    # The real plan: the app synthesized in-process (no AWS lookups, no Docker build), then the checks and commands.
    assert deploy.main(["dev", "--dry-run"]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "deploy plan for dev (dry run: no Docker, no AWS credentials, no AWS call)"
    for check in ("docker", "credentials", "instance offering", "bootstrap", "run in flight", "alert subscriptions"):
        assert any(line.startswith(f"  {check}: ") and "would " in line for line in lines), check
    ran = [line.removeprefix("deploy: would run: ") for line in lines if line.startswith("deploy: would run: ")]
    assert [command.split()[:2] for command in ran] == [
        ["docker", "login"],
        [str(deploy.CDK), "synth"],
        [str(deploy.CDK), "deploy"],
    ]
