"""`make push-workload` (tools/push_workload.py) without Docker: the commands it runs, in order, with a recording
stand-in, and the URI by digest it prints and registers."""

import base64
import io
import json

import boto3
import pytest
from moto import mock_aws

from config import Accelerator
from config.layout import RUNS_TABLE_KEY, RUNS_TABLE_OUTPUT
from stacks.registry_stack import platform_image_tag
from tools import push_workload
from tools.pipeline_session import ROOT

REGION = "us-east-1"
REPOSITORY = "123456789012.dkr.ecr.us-east-1.amazonaws.com/efa-training-dev-workloads"
DIGEST = "sha256:" + "ab" * 32


class Session:
    """A boto3 session whose CloudFormation knows the Registry and Storage stacks' outputs; the rest is moto's."""

    def client(self, service: str, region_name: str | None = None, config=None):
        if service != "cloudformation":
            return boto3.client(service, region_name=region_name, config=config)
        outputs = {"EfaTraining-dev-Registry": {"WorkloadRepositoryUri": REPOSITORY},
                   "EfaTraining-dev-Storage": {RUNS_TABLE_OUTPUT: "runs"},
                   "EfaTraining-dev-Pipeline": {"StateMachineArn": "unused", "MaxNodes": "2"}}  # fmt: skip

        class CloudFormation:
            @staticmethod
            def describe_stacks(StackName: str):
                found = outputs[StackName]
                return {"Stacks": [{"Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in found.items()]}]}

        return CloudFormation()


class Docker:
    """Records every command; answers `images -q` (the platform image is there or not) and `inspect`."""

    def __init__(self, platform_built: bool):
        self.commands: list[list[str]] = []
        self.platform_built = platform_built

    def __call__(self, command: list[str]) -> str:
        self.commands.append(command)
        if command[:3] == ["docker", "images", "-q"]:
            return "0123abcd\n" if self.platform_built else ""
        if command[:2] == ["docker", "inspect"]:
            return json.dumps([f"{REPOSITORY}@{DIGEST}"])
        return ""


@pytest.fixture
def account():
    with mock_aws():
        boto3.client("dynamodb", region_name=REGION).create_table(
            TableName="runs",
            KeySchema=[{"AttributeName": RUNS_TABLE_KEY, "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": RUNS_TABLE_KEY, "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield Session()


def test_it_builds_on_this_trees_platform_image_pushes_and_prints_the_uri_by_digest(account):
    docker, out = Docker(platform_built=False), io.StringIO()
    assert push_workload.main(["dev", "torch-ddp", str(ROOT / "examples/torch_ddp")], session=account, out=out,
                              run=docker) == 0  # fmt: skip
    assert out.getvalue().strip() == f"{REPOSITORY}@{DIGEST}"
    platform = platform_image_tag(Accelerator.NVIDIA)
    builds = [c for c in docker.commands if c[:2] == ["docker", "build"]]
    assert builds[0][-3:] == ["-t", platform, str(ROOT / "training_image")]  # the platform's first, not there yet
    tag = push_workload.folder_tag("torch-ddp", ROOT / "examples/torch_ddp")
    assert builds[1] == ["docker", "build", "--build-arg", f"PLATFORM_IMAGE={platform}", "-t", f"{REPOSITORY}:{tag}",
                         str(ROOT / "examples/torch_ddp")]  # fmt: skip
    login = next(i for i, c in enumerate(docker.commands) if "docker login" in " ".join(c))
    assert docker.commands.index(["docker", "push", f"{REPOSITORY}:{tag}"]) > login


def test_an_unchanged_folder_is_the_same_tag_and_a_changed_one_another(tmp_path):
    (tmp_path / "Dockerfile").write_text("ARG PLATFORM_IMAGE\nFROM ${PLATFORM_IMAGE}\n")
    first = push_workload.folder_tag("w", tmp_path)
    assert push_workload.folder_tag("w", tmp_path) == first
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert push_workload.folder_tag("w", tmp_path) != first


def test_register_registers_the_declaration_with_the_pushed_image(account, tmp_path):
    declaration = json.loads((ROOT / "examples/torch_ddp/workload.json").read_text())  # its image: a folder
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(declaration))
    docker = Docker(platform_built=True)
    argv = ["dev", "torch-ddp", str(ROOT / "examples/torch_ddp"), "--register", str(path)]
    assert push_workload.main(argv, session=account, out=io.StringIO(), run=docker) == 0
    assert not [c for c in docker.commands if c[-1] == str(ROOT / "training_image")]  # the platform image was there
    item = boto3.client("dynamodb", region_name=REGION).get_item(
        TableName="runs", Key={RUNS_TABLE_KEY: {"S": "workload#torch-ddp"}}
    )["Item"]
    assert json.loads(item["record"]["S"])["image"] == f"{REPOSITORY}@{DIGEST}"


def test_the_ecr_token_is_passed_on_stdin_not_the_command_line(account):
    docker = Docker(platform_built=True)
    push_workload.main(["dev", "w", str(ROOT / "examples/torch_ddp")], session=account, out=io.StringIO(), run=docker)
    (login,) = [c for c in docker.commands if "docker login" in " ".join(c)]
    token = boto3.client("ecr", region_name=REGION).get_authorization_token()["authorizationData"][0]
    password = base64.b64decode(token["authorizationToken"]).decode().split(":", 1)[1]
    assert password not in " ".join(login) and "--password-stdin" in login[-1]


def test_a_register_file_that_is_not_json_is_one_line_after_the_push(account, tmp_path, capsys):
    path = tmp_path / "workload.json"
    path.write_text("{not json")
    argv = ["dev", "w", str(ROOT / "examples/torch_ddp"), "--register", str(path)]
    assert push_workload.main(argv, session=account, out=io.StringIO(), run=Docker(platform_built=True)) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "not a readable JSON declaration" in err and f"{REPOSITORY}@{DIGEST} is pushed" in err
    )
