"""`make deploy ENV=...` (tools/deploy.py): one line per missing prerequisite, then bootstrap, registry login and
deploy; `DRY_RUN=1` prints the plan with neither Docker nor credentials (tools/deploy_plan.py)."""

import json
from contextlib import contextmanager
from pathlib import Path

import botocore.session
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from tests import synthesis
from tests.synthesis import CDK_JSON_CONTEXT, ROOT
from tools import deploy, deploy_plan, preflight


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """STS and ECR from moto; CloudFormation (not among the moto extras we install) stubbed: no stack exists yet,
    not even CDKToolkit. The synthesized assembly the checks read is an empty one."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    real = preflight.client

    def client(service, region):
        made = real(service, region)
        if service == "cloudformation":
            stubber = Stubber(made)
            stubber.add_client_error(
                "describe_stacks",
                service_error_code="ValidationError",
                service_message="Stack with id CDKToolkit does not exist",
            )
            stubber.activate()
        return made

    monkeypatch.setattr(preflight, "client", client)
    (tmp_path / "manifest.json").write_text(json.dumps({"artifacts": {}}))
    monkeypatch.setattr(deploy, "ASSEMBLY", tmp_path)
    with mock_aws():
        yield


@pytest.fixture
def docker_ok(monkeypatch):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup from a test


@pytest.fixture
def path_without_docker(monkeypatch, tmp_path):
    """PATH is one folder, with only what the test puts there."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return tmp_path / "bin"


def test_gpu_base_image_registry_is_read_from_the_dockerfile():
    # The DLC base lives in AWS's own ECR registry (account 763104351884): it needs a login; public ECR does not.
    registry = deploy.base_registry(deploy.ROOT / "training_image" / "Dockerfile.gpu")
    assert registry is not None
    host, account, region = registry
    assert (account, region) == ("763104351884", "us-west-2") and host == f"{account}.dkr.ecr.{region}.amazonaws.com"
    assert deploy.base_registry(deploy.ROOT / "training_image" / "Dockerfile.neuron") is None


def test_missing_docker_is_one_line(path_without_docker, capfd):
    assert deploy.main(["dev"]) == 2
    out, err = capfd.readouterr()
    (line,) = (out + err).strip().splitlines()
    assert line.startswith("error: Docker is not installed") and "DRY_RUN=1" in line


def test_a_stopped_docker_daemon_is_one_line_of_ours(path_without_docker, capfd):
    # Docker's own line (and its exit code 1) when the daemon is down: it must not reach the terminal.
    docker = path_without_docker / "docker"
    own_line = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    docker.write_text(f"#!/bin/sh\necho 'Client: Docker Engine'\necho '{own_line}' >&2\nexit 1\n")
    docker.chmod(0o755)
    assert deploy.main(["dev"]) == 2
    out, err = capfd.readouterr()  # the file descriptors: what the `docker` process wrote, too
    (line,) = (out + err).strip().splitlines()
    assert line.startswith("error: Docker is installed but its daemon does not answer")


def test_missing_credentials_are_one_line(docker_ok, no_credentials, capfd):
    assert deploy.main(["dev"]) == 2
    out, err = capfd.readouterr()
    (line,) = (out + err).strip().splitlines()
    assert line.startswith("error: no usable AWS credentials (NoCredentialsError)") and "DRY_RUN=1" in line
    assert "Unable to locate credentials" not in line  # botocore's sentence: ours says what to do


@pytest.fixture
def nothing_outside(monkeypatch, no_credentials, path_without_docker, synth):
    """No Docker on PATH, no credentials, and any AWS client, Docker probe or command fails the test. The synthesis
    the dry run asks for is the test run's shared one of the same context (tests/synthesis.py)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the dry run called out: {args}")

    monkeypatch.setattr(botocore.session.Session, "create_client", refuse)
    monkeypatch.setattr(preflight, "_docker_answers", refuse)
    monkeypatch.setattr(deploy, "_run", refuse)

    @contextmanager
    def shared(context: dict):
        assert context == synthesis.context(env="dev")  # what `cdk synth -c env=dev` gives the app
        yield synth(env="dev").outdir

    monkeypatch.setattr(deploy_plan, "synthesized", shared)
    return synth(env="dev").outdir


def test_the_dry_run_prints_the_plan_without_docker_credentials_or_aws(nothing_outside, capfd):
    assert deploy.main(["dev", "--dry-run"]) == 0
    out, err = capfd.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert "  account: from your credentials at deploy time (cdk.json names none)" in lines
    units = ("Network", "Storage", "Registry", "Alerts", "Batch", "Pipeline", "Observability")
    numbered = [line for line in lines if line[:5].strip().rstrip(".").isdigit()]
    assert numbered == [f"  {n}. EfaTraining-dev-{unit}" for n, unit in enumerate(units, 1)]
    # The image asset, and the registry of its base that the deploy logs in to.
    image = next(i for i, line in enumerate(lines) if line.startswith("  TrainingImage (EfaTraining-dev-Registry)"))
    assert "Dockerfile.gpu" in lines[image] and "linux/amd64" in lines[image]
    assert "would log in to 763104351884.dkr.ecr.us-west-2.amazonaws.com" in lines[image + 2]
    required = preflight.required_bootstrap_version(nothing_outside)
    checks = {
        "docker": "would find `docker` on PATH and run `docker info`",
        "credentials": "would call STS GetCallerIdentity; any account",
        "bootstrap": f"would read the CDKToolkit stack's BootstrapVersion in us-east-1 (needs >= {required})",
        "EKS versions": "not checked (compute=batch)",
        "capacity reservation": "none declared",
        "run in flight": "would compare EfaTraining-dev-Network, EfaTraining-dev-Storage, EfaTraining-dev-Batch",
        "alert subscriptions": "after the deploy, would list EfaTraining-dev-Alerts's topic subscriptions",
    }
    for name, starts in checks.items():
        assert any(line.startswith(f"  {name}: {starts}") for line in lines), name
    assert lines[-1] == f"deploy: would run: {deploy.CDK} deploy --app {deploy.ASSEMBLY} --all"
    assert lines[-2].startswith(f"deploy: would run: {deploy.CDK} synth --quiet -c env=dev")


def test_the_plan_names_each_backends_checks_and_what_a_pushed_image_skips():
    # No synthesis: the check lines follow the configuration (EKS: the admin and the Kubernetes version).
    config = deploy._config("dev", None, ["-c", "compute=eks", "-c", "image_tag=v1", "-c", "account=111111111111"])
    request = deploy_plan.Request("dev", config, allow_running=True, run_units=deploy.RUN_UNITS)
    lines = deploy_plan._check_lines(request, ["EfaTraining-dev-Eks"], 6)
    assert lines[:3] == [
        "docker: not needed (image_tag: nothing is built)",
        "credentials: would call STS GetCallerIdentity; the account must be 111111111111",
        "EKS admin: would make the credentials' role (from STS GetCallerIdentity) the cluster's admin, passed as "
        "-c eks_admin_role_arns=<it> to the synth",
    ]
    assert any(line.startswith("EKS versions: unless EfaTraining-dev-Eks exists") for line in lines)
    assert "run in flight: not checked (--allow-running)" in lines
    assert deploy_plan._image_lines(config, [])[0].startswith("images: none built (image_tag=v1")


def test_the_plan_names_the_reservation_check():
    # `make deploy` reads the declared reservation before it changes anything (tools/preflight.py check_reservation).
    block = '{"kind": "capacity_block", "id": "cr-0123456789abcdef0", "zone": "us-east-1a", "instances": 2}'
    context = ["-c", f"capacity_reservation={block}", "-c", "availability_zone=us-east-1a", "-c", "image_tag=v1"]
    config = deploy._config("dev", None, context)
    request = deploy_plan.Request("dev", config, allow_running=True, run_units=deploy.RUN_UNITS)
    (line,) = [x for x in deploy_plan._check_lines(request, [], 6) if x.startswith("capacity reservation:")]
    assert line.startswith("capacity reservation: would read cr-0123456789abcdef0 (DescribeCapacityReservations)")
    assert "g5.12xlarge in us-east-1a, at least 2 instances, as a Capacity Block" in line


def test_first_deploy_bootstraps_logs_in_and_deploys(aws, monkeypatch):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    ran: list[tuple[list[str], str | None]] = []

    def run(command: list[str], stdin: str | None = None) -> int:
        ran.append((command, stdin))
        return 0

    commands = deploy.plan("dev", dry_run=False, run=run)
    assert [c[1] for c in commands] == ["bootstrap", "login", "synth", "deploy"]
    assert commands[0][2] == "aws://123456789012/us-east-1"  # the caller's account, the environment's region
    assert commands[1][-1] == "763104351884.dkr.ecr.us-west-2.amazonaws.com"
    assert ran[1][1]  # the registry password goes to docker on stdin, never on the command line
    # One synthesis, checked, then deployed as it is.
    assert commands[2][-5:-2] == ["--quiet", "-c", "env=dev"] and commands[2][-1] == str(deploy.ASSEMBLY)
    assert commands[3][2:] == ["--app", str(deploy.ASSEMBLY), "--all"]


def test_an_account_mismatch_stops_before_anything_runs(aws, monkeypatch):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    ran: list[tuple] = []

    def run(*command: object, **options: object) -> int:
        ran.append(command)
        return 0

    context = {**CDK_JSON_CONTEXT, "account": "111111111111"}
    mismatch = "is for account 111111111111, but the credentials are for 123456789012"
    with pytest.raises(deploy.DeployError, match=mismatch):
        deploy.plan("dev", dry_run=False, run=run, context=context)
    assert ran == []


def test_a_failed_step_is_one_line_with_its_exit_code(aws, monkeypatch, capsys):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    monkeypatch.setattr(deploy, "_run", lambda command, stdin=None: 3 if "deploy" in command else 0)
    assert deploy.main(["dev"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("failed with exit code 3")


def test_arguments_after_the_separator_go_to_cdk_deploy(aws, monkeypatch):
    # `make deploy CDK_ARGS="--require-approval never"` passes them on as they are, and no separator is fine too.
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    ran: list[list[str]] = []

    def run(command: list[str], stdin: str | None = None) -> int:
        ran.append(command)
        return 0

    monkeypatch.setattr(deploy, "_run", run)
    assert deploy.main(["dev", "--", "--progress", "events", "-c", "nodes=4"]) == 0
    assert ran[-1][1:] == ["deploy", "--app", str(deploy.ASSEMBLY), "--all", "--progress", "events"]
    assert ran[-2][-4:-2] == ["-c", "nodes=4"]  # context shapes the synthesis
    assert deploy.main(["dev"]) == 0 and ran[-1][-3:] == ["--app", str(deploy.ASSEMBLY), "--all"]


def test_ci_mode_never_prompts(aws, monkeypatch):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    commands = deploy.plan("dev", run=lambda *a, **k: 0, options=deploy.Options(ci=True))
    assert commands[-1][-2:] == ["--require-approval", "never"]


def test_context_overrides_reach_the_checks(aws, monkeypatch):
    # With -c image_tag=TAG nothing is built, so Docker is neither checked nor logged in to.
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)  # no Docker at all
    commands = deploy.plan("dev", run=lambda *a, **k: 0, extra=["-c", "image_tag=v1"])
    assert [c[1] for c in commands] == ["bootstrap", "synth", "deploy"]
    assert commands[1][-4:-2] == ["-c", "image_tag=v1"]


def test_an_eks_deploy_without_admin_roles_makes_the_deployer_the_clusters_admin(aws, monkeypatch):
    # The cluster's creator is CloudFormation's execution role, not the person deploying: without eks_admin_role_arns
    # nobody could use kubectl. The deploying role (STS names it as an assumed role) gets the admin access entry.
    identity = {"Account": "123456789012", "Arn": "arn:aws:sts::123456789012:assumed-role/Admin/alice", "UserId": "A"}

    class Sts:
        def get_caller_identity(self) -> dict:
            return identity

    real = deploy._client
    monkeypatch.setattr(deploy, "_client", lambda service, region: Sts() if service == "sts" else real(service, region))
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    monkeypatch.setattr(preflight, "check_kubernetes", lambda *args: None)
    commands = deploy.plan("dev", run=lambda *a, **k: 0, extra=["-c", "compute=eks"])
    synth = next(c for c in commands if c[1] == "synth")
    assert synth[-4:-2] == ["-c", "eks_admin_role_arns=arn:aws:iam::123456789012:role/Admin"]


def test_an_assumed_role_is_named_by_its_role():
    arn = "arn:aws:sts::123456789012:assumed-role/MlPlatformAdmin/alice@example.com"
    assert deploy.admin_principal(arn) == "arn:aws:iam::123456789012:role/MlPlatformAdmin"
    with pytest.raises(deploy.DeployError, match="no IAM role or user"):
        deploy.admin_principal("arn:aws:iam::123456789012:root")


def test_an_identity_center_role_must_be_named_by_hand():
    # IAM Identity Center roles have a path (aws-reserved/sso.amazonaws.com/...) that STS's assumed-role ARN omits.
    arn = "arn:aws:sts::123456789012:assumed-role/AWSReservedSSO_Admin_0123456789abcdef/alice"
    with pytest.raises(deploy.DeployError, match="IAM Identity Center role"):
        deploy.admin_principal(arn)


# cdk.json's workloads are registered after the deploy (no template holds one: docs/workloads.md): a folder pushed on
# the platform's image and registered with it, a URI registered as it is.
def test_cdk_jsons_workloads_are_registered_after_the_deploy(aws, monkeypatch):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    folder = json.loads((ROOT / "examples/torch_ddp/workload.json").read_text())
    pushed = {**folder, "image": {"uri": "public.ecr.aws/acme/trainer:1"}}
    context = {**CDK_JSON_CONTEXT, "workloads": json.dumps({"torch-ddp": folder, "pushed": pushed})}
    commands = deploy.plan("dev", dry_run=False, run=lambda *command, **options: 0, context=context)
    assert [c[1] for c in commands][:4] == ["bootstrap", "login", "synth", "deploy"]
    by_tool = {c[2]: c for c in commands[4:]}
    push, register = by_tool["tools.push_workload"], by_tool["tools.pipeline_cli"]
    assert push[1:6] == ["-m", "tools.push_workload", "dev", "torch-ddp", str(ROOT / "examples/torch_ddp")]
    assert json.loads(Path(push[push.index("--register") + 1]).read_text()) == folder
    assert register[1:6] == ["-m", "tools.pipeline_cli", "workload", "register", "dev"]
    assert json.loads(Path(register[6]).read_text()) == pushed and register[-2:] == ["--name", "pushed"]


def test_without_workloads_nothing_more_is_run(aws, monkeypatch):
    monkeypatch.setattr(preflight, "check_docker", lambda: None)
    commands = deploy.plan("dev", dry_run=False, run=lambda *command, **options: 0)
    assert commands[-1][1] == "deploy" and "build" not in [c[1] for c in commands]


def test_the_plans_run_in_flight_line_names_the_batch_jobs_it_would_wait_for():
    # The deploy also refuses while a Batch job (a hand-submitted one included) has not ended in the environment's
    # queues (tools/preflight.py check_no_run_in_flight): the plan says so, as the check's own words.
    config = deploy._config("dev", None, [])
    request = deploy_plan.Request("dev", config, allow_running=False, run_units=deploy.RUN_UNITS)
    (line,) = [x for x in deploy_plan._check_lines(request, ["EfaTraining-dev-Batch"], 6) if x.startswith("run in")]
    assert "efa-training-dev-multi-node" in line and "Batch ListJobs" in line and "ALLOW_RUNNING=1" in line
