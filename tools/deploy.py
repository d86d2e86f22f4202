"""One command per environment: check what a deploy needs, bootstrap if needed, log in to the base image's
registry, deploy every stack. `make deploy ENV=dev` runs it; `--dry-run` prints the plan and runs nothing.

    .venv/bin/python -m tools.deploy dev [--dry-run] [-- extra cdk deploy arguments]

Each check fails with one line and exit 2, before anything is created:
- Docker: `cdk deploy` builds the training image from training_image/ (not needed with `image_tag`);
- AWS credentials: STS GetCallerIdentity, and the account must be the environment's `account` if it names one;
- CDK bootstrap: the CDKToolkit stack in the environment's region (created with `cdk bootstrap` if missing);
- the base image's registry: the GPU image builds FROM an AWS Deep Learning Container in AWS's own ECR
  registry, which needs a login (DLC docs, "Available Deep Learning Containers images"); the Neuron base is on
  public ECR and needs none.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CDK = ROOT / "node_modules" / ".bin" / "cdk"
BOOTSTRAP_STACK = "CDKToolkit"
DOCKERFILES = {"nvidia": "Dockerfile.gpu", "neuron": "Dockerfile.neuron"}
_PRIVATE_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/")


class DeployError(Exception):
    """A missing prerequisite: printed as one line."""


def base_registry(dockerfile: Path) -> tuple[str, str, str] | None:
    """(registry host, account, region) of the Dockerfile's default base image when it is a private ECR one."""
    args: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"^ARG\s+(\w+)=(\S+)", line.strip())
        if match:
            args[match.group(1)] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), match.group(2))
    found = _PRIVATE_ECR.match(args.get("BASE_IMAGE", ""))
    if not found:
        return None
    return found.group(0).rstrip("/"), found.group("account"), found.group("region")


def _client(service: str, region: str):
    import boto3
    from botocore.config import Config

    # Bounded: a credential or endpoint problem ends in a line, not a hang.
    return boto3.client(
        service,
        region_name=region,
        config=Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}),
    )


def check_docker(run: Callable[[Sequence[str]], int]) -> None:
    if shutil.which("docker") is None:
        raise DeployError(
            "Docker is not installed: `cdk deploy` builds the training image from training_image/ "
            "(install Docker, or deploy a pushed image with -c image_tag=TAG)"
        )
    if run(["docker", "info", "--format", "{{.ServerVersion}}"]) != 0:
        raise DeployError("Docker is installed but its daemon does not answer (`docker info` failed): start it")


def caller_account(region: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return _client("sts", region).get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as exc:
        raise DeployError(
            f"no usable AWS credentials ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "configure a profile or AWS_* variables for the target account"
        ) from None


def is_bootstrapped(region: str) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        _client("cloudformation", region).describe_stacks(StackName=BOOTSTRAP_STACK)
    except ClientError as exc:
        if "does not exist" in str(exc):
            return False
        raise DeployError(f"could not check the CDK bootstrap stack in {region}: {exc}") from None
    except BotoCoreError as exc:
        raise DeployError(
            f"could not reach CloudFormation in {region} to check the CDK bootstrap stack ({type(exc).__name__})"
        ) from None
    return True


def registry_password(registry_account: str, registry_region: str) -> str:
    import base64

    from botocore.exceptions import BotoCoreError, ClientError

    try:
        data = _client("ecr", registry_region).get_authorization_token(registryIds=[registry_account])
    except (BotoCoreError, ClientError) as exc:
        raise DeployError(
            f"could not get a login for the base image's registry ({registry_account}, "
            f"{registry_region}): {type(exc).__name__}"
        ) from None
    token = data["authorizationData"][0]["authorizationToken"]
    return base64.b64decode(token).decode().split(":", 1)[1]


def plan(
    env: str, *, dry_run: bool, run: Callable[..., int], extra: Sequence[str] = (), context: dict | None = None
) -> list[list[str]]:
    """The commands, in order, after every check; runs them unless dry_run. Returns them."""
    sys.path.insert(0, str(ROOT))
    from config import ConfigError, load_config

    context = context if context is not None else json.loads((ROOT / "cdk.json").read_text())["context"]
    # `-c FIELD=VALUE` among the cdk arguments changes the configuration the checks see, as it does cdk's.
    overrides = dict(
        value.split("=", 1)
        for flag, value in zip(extra, [*extra[1:], ""], strict=False)  # each flag with the next item (or "")
        if flag in ("-c", "--context") and "=" in value
    )
    try:
        config = load_config({**context, **overrides, "env": env})
    except ConfigError as error:
        raise DeployError(str(error)) from None
    commands: list[list[str]] = []
    registry = base_registry(ROOT / "training_image" / DOCKERFILES[config.instance.accelerator.value])
    if not config.image_tag:
        check_docker(run)
    account = caller_account(config.region)
    if config.account and config.account != account:
        raise DeployError(
            f"environment '{env}' is for account {config.account}, but the credentials are for "
            f"{account}: switch profile, or change `account` in cdk.json"
        )
    if not is_bootstrapped(config.region):
        commands.append([str(CDK), "bootstrap", f"aws://{account}/{config.region}"])
    login = None
    if registry and not config.image_tag:
        host, registry_account, registry_region = registry
        login = registry_password(registry_account, registry_region)
        commands.append(["docker", "login", "--username", "AWS", "--password-stdin", host])
    commands.append([str(CDK), "deploy", "--all", "-c", f"env={env}", *extra])
    for command in commands:
        shown = " ".join(command)
        print(f"deploy: {'would run' if dry_run else 'running'}: {shown}", flush=True)
        if dry_run:
            continue
        code = run(command, stdin=login) if command[:2] == ["docker", "login"] else run(command)
        if code != 0:
            raise DeployError(f"`{shown}` failed with exit code {code}")
    return commands


def _run(command: Sequence[str], stdin: str | None = None) -> int:
    return subprocess.run(
        list(command),
        input=stdin,
        text=True,
        cwd=ROOT,
        check=False,
        stdout=None if stdin is None else subprocess.DEVNULL,
    ).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Everything after `--` goes to `cdk deploy` as it is (argparse would read its flags as ours).
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="after --: more `cdk deploy` arguments, e.g. -- --require-approval never",
    )
    parser.add_argument("env", help="an environment of cdk.json (dev, prod, ...)")
    parser.add_argument("--dry-run", action="store_true", help="check and print the plan, run nothing")
    options = parser.parse_args(ours)
    try:
        plan(options.env, dry_run=options.dry_run, run=_run, extra=extra)
    except DeployError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
