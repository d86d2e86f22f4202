"""One command per environment: check what a deploy needs, bootstrap if needed, log in to the base image's
registry, synthesize, check again what only the synthesized app can tell, deploy every stack. `make deploy ENV=dev`
runs it; `--dry-run` prints the plan (tools/deploy_plan.py) with neither Docker nor AWS credentials, calls no AWS
API and runs nothing; `--ci` never prompts.

    .venv/bin/python -m tools.deploy dev [--dry-run] [--ci] [--allow-running] [-- extra cdk arguments]

Each check fails with one line and exit 2, before anything is changed:
- Docker: `cdk deploy` builds the training image from training_image/ (not needed with `image_tag`);
- AWS credentials: STS GetCallerIdentity, and the account must be the environment's `account` if it names one;
- CDK bootstrap: the CDKToolkit stack in the environment's region (created with `cdk bootstrap` if missing), at
  least the version the synthesized templates require;
- EKS: the region offers the pinned Kubernetes version in standard support (tools/preflight.py);
- a run in flight: no pipeline execution of the environment is running while the deploy would change the
  network, storage or compute stack under it, unless --allow-running;
- the base image's registry: the GPU image builds FROM an AWS Deep Learning Container in AWS's own ECR
  registry, which needs a login (DLC docs, "Available Deep Learning Containers images"); the Neuron base is on
  public ECR and needs none.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import deploy_plan, preflight
from tools.deploy_plan import base_registry

ROOT = Path(__file__).resolve().parent.parent
CDK = ROOT / "node_modules" / ".bin" / "cdk"
# `cdk deploy` deploys the assembly synthesized (and checked) here, not a new synthesis.
ASSEMBLY = ROOT / "cdk.out"
WORKLOAD_FILES = ROOT / "build" / "workloads"  # cdk.json's declarations, one file each, as `workload register` reads
# The stacks a run in flight stands on: a change to one of them may replace hosts or the file system under it.
RUN_UNITS = ("Network", "Storage", "Batch", "Eks", "SageMaker")
DOCKERFILES = {"nvidia": "Dockerfile.gpu", "neuron": "Dockerfile.neuron"}


class DeployError(preflight.PreflightError):
    """A missing prerequisite: printed as one line."""


def _client(service: str, region: str):
    return preflight.client(service, region)


def caller_account(region: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return _client("sts", region).get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as exc:
        # The error's code or class, not botocore's own sentence: this line says what to do.
        reason = exc.response["Error"]["Code"] if isinstance(exc, ClientError) else type(exc).__name__
        raise DeployError(
            f"no usable AWS credentials ({reason}): configure a profile (`aws configure sso`, AWS_PROFILE) or AWS_* "
            "variables for the target account; DRY_RUN=1 shows the plan without them"
        ) from None


def admin_principal(caller_arn: str) -> str:
    """The IAM principal an EKS access entry can name for these credentials: an assumed role's role (STS's ARN
    carries no path: a role with one must be named in eks_admin_role_arns), or the IAM user."""
    match = re.fullmatch(
        r"arn:(?P<partition>[\w-]+):sts::(?P<account>\d{12}):assumed-role/(?P<role>[^/]+)/.+", caller_arn
    )
    if match and match["role"].startswith("AWSReservedSSO_"):
        # IAM Identity Center's roles live under a path (aws-reserved/sso.amazonaws.com/...) that STS does not show.
        raise DeployError(
            f"the credentials are an IAM Identity Center role ({match['role']}), whose ARN has a path STS does not "
            "show: set eks_admin_role_arns to its full role ARN (aws iam get-role --role-name ...)"
        )
    if match:
        return f"arn:{match['partition']}:iam::{match['account']}:role/{match['role']}"
    if re.fullmatch(r"arn:[\w-]+:iam::\d{12}:user/.+", caller_arn):
        return caller_arn
    raise DeployError(
        f"the credentials ({caller_arn}) are no IAM role or user an EKS access entry can name: "
        "set eks_admin_role_arns in cdk.json (who may use kubectl on the cluster)"
    )


def _eks_admin_context(config, context_args: list[str]) -> list[str]:
    """compute=eks without eks_admin_role_arns: the deploying principal becomes the cluster's admin, so someone can
    use kubectl (the cluster's creator is CloudFormation's role, not the person who ran the deploy)."""
    if config.compute != "eks" or config.eks_admin_role_arns:
        return context_args
    principal = admin_principal(_client("sts", config.region).get_caller_identity()["Arn"])
    print(f"deploy: no eks_admin_role_arns: {principal} (these credentials) gets cluster-admin access", flush=True)
    return [*context_args, "-c", f"eks_admin_role_arns={principal}"]


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


def _split_context(extra: Sequence[str]) -> tuple[list[str], list[str]]:
    """`-c FIELD=VALUE` pairs (they shape the synthesis) and the rest (they go to `cdk deploy`)."""
    context: list[str] = []
    rest: list[str] = []
    items = iter(extra)
    for item in items:
        if item in ("-c", "--context"):
            context += ["-c", next(items, "")]
        elif item.startswith("--context="):
            context += ["-c", item.removeprefix("--context=")]
        else:
            rest.append(item)
    if any(value.startswith("env=") for value in context[1::2]):
        # The checks (account, a run in flight, what changes) follow the environment argument, so the synthesis must.
        raise DeployError(
            "-c env=... among the cdk arguments: name the environment once, as ENV=... (make) or the argument"
        )
    return context, rest


@dataclass(frozen=True)
class Options:
    dry_run: bool = False
    ci: bool = False  # never prompt: `cdk deploy --require-approval never`
    allow_running: bool = False  # deploy even while a pipeline execution is running


def plan(
    env: str,
    *,
    dry_run: bool = False,
    run: Callable[..., int],
    extra: Sequence[str] = (),
    context: dict | None = None,
    options: Options | None = None,
) -> list[list[str]]:
    """The commands, in order, after every check; runs them. Returns them. With dry_run, prints the plan and those
    commands instead, needing neither Docker nor credentials and calling no AWS API (tools/deploy_plan.py)."""
    options = options or Options(dry_run=dry_run)
    context_args, rest = _split_context(extra)
    config = _config(env, context, context_args)
    if options.dry_run:
        commands = _commands(env, _base_registry(config), context_args, rest, options, _registrations(env, config))
        request = deploy_plan.Request(env, config, options.allow_running, RUN_UNITS)
        deploy_plan.show(request, _context(env, context, context_args))
        for command in commands:
            _step(command, True, run, None)
        return commands
    account = _check_account(config, env)
    context_args = _eks_admin_context(config, context_args)
    for instance_type in preflight.offering_checked(config):
        preflight.check_instance_offered(config.region, instance_type, config.availability_zone)
    preflight.check_reservation(config)
    bootstrapped = preflight.bootstrap_version(config.region)
    if config.compute == "eks" and not preflight.stack_exists(config.region, f"{config.stack_prefix}-Eks"):
        # Only before the cluster exists: a running cluster past standard support must still take routine deploys.
        from constructs.compute.eks import versions

        preflight.check_kubernetes(config.region, versions.KUBERNETES_VERSION, versions.ADDON_MINIMUMS)
    commands = [[str(CDK), "bootstrap", f"aws://{account}/{config.region}"]] if bootstrapped is None else []
    registry = _base_registry(config)
    login = registry_password(registry[1], registry[2]) if registry else None
    commands += _commands(env, registry, context_args, rest, options, _registrations(env, config))
    for command in commands:
        if command[1] == "deploy":
            _check_assembly(config, account, bootstrapped, options)
        _step(command, False, run, login)
    _report_subscriptions(config)
    return commands


def _base_registry(config) -> tuple[str, str, str] | None:
    """The base image's private registry, logged in to first; None where nothing is built or the base is public."""
    if config.image_tag:
        return None
    return base_registry(ROOT / "training_image" / DOCKERFILES[config.instance.accelerator.value])


def _registrations(env: str, config) -> list[list[str]]:
    """After the deploy: each of cdk.json's workloads registered (docs/workloads.md), since no template holds one: a
    folder built on the platform's image and pushed first (tools/push_workload.py), a URI as it is. Registering the
    same declaration again writes nothing, so an unchanged workload stays at its version."""
    commands = []
    for workload in config.declared_workloads:
        path = WORKLOAD_FILES / env / f"{workload.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(json.loads(str(config.workloads))[workload.name]))
        if workload.image_directory:
            folder = str(ROOT / workload.image_directory)
            commands.append([sys.executable, "-m", "tools.push_workload", env, workload.name, folder, "--register",
                             str(path)])  # fmt: skip
        else:
            commands.append([sys.executable, "-m", "tools.pipeline_cli", "workload", "register", env, str(path),
                             "--name", workload.name])  # fmt: skip
    return commands


def _commands(
    env: str, registry, context_args: list[str], rest: list[str], options: Options, after: list[list[str]]
) -> list[list[str]]:
    """After the bootstrap (where it is missing): the registry login, one synthesis, the deploy of that assembly,
    then `after` (cdk.json's workloads registered)."""
    login = [["docker", "login", "--username", "AWS", "--password-stdin", registry[0]]] if registry else []
    synth = [str(CDK), "synth", "--quiet", "-c", f"env={env}", *context_args, "--output", str(ASSEMBLY)]
    approval = ["--require-approval", "never"] if options.ci else []
    return [*login, synth, [str(CDK), "deploy", "--app", str(ASSEMBLY), "--all", *approval, *rest], *after]


def _report_subscriptions(config) -> None:
    """After a deploy that succeeded, a failure to ask about the subscriptions is a line, not a failed deploy."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        lines = preflight.unconfirmed_subscriptions(config.region, f"{config.stack_prefix}-Alerts")
    except (BotoCoreError, ClientError, preflight.PreflightError) as exc:
        lines = [f"could not list the alert subscriptions ({type(exc).__name__}); check their confirmations in SNS"]
    for line in [*preflight.placeholder_emails(config.alert_emails), *lines]:
        print(f"deploy: {line}", flush=True)


def _context(env: str, context: dict | None, context_args: list[str]) -> dict:
    """The CDK context `cdk synth -c env=ENV ...` gives the app."""
    context = context if context is not None else json.loads((ROOT / "cdk.json").read_text())["context"]
    # `-c FIELD=VALUE` among the cdk arguments changes the configuration the checks see, as it does cdk's.
    overrides = dict(value.split("=", 1) for value in context_args[1::2] if "=" in value)
    return {**context, **overrides, "env": env}


def _config(env: str, context: dict | None, context_args: list[str]):
    sys.path.insert(0, str(ROOT))
    from config import ConfigError, load_config

    try:
        return load_config(_context(env, context, context_args))
    except ConfigError as error:
        raise DeployError(str(error)) from None


def _check_account(config, env: str) -> str:
    if not config.image_tag:
        preflight.check_docker()
    account = caller_account(config.region)
    if config.account and config.account != account:
        raise DeployError(
            f"environment '{env}' is for account {config.account}, but the credentials are for "
            f"{account}: switch profile, or change `account` in cdk.json"
        )
    return account


def _check_assembly(config, account: str, bootstrapped: int | None, options: Options) -> None:
    """What only the synthesized app can tell: the bootstrap version it needs, and what it changes under a run."""
    if bootstrapped is not None:
        preflight.check_bootstrap(bootstrapped, preflight.required_bootstrap_version(ASSEMBLY), account, config.region)
    if not options.allow_running:
        under_a_run = [f"{config.stack_prefix}-{unit}" for unit in RUN_UNITS]
        changing = preflight.changed_stacks(config.region, ASSEMBLY, under_a_run)
        batch = config.name if f"{config.stack_prefix}-Batch" in changing else None  # hand-submitted jobs too
        preflight.check_no_run_in_flight(config.region, f"{config.stack_prefix}-Pipeline", changing, "deploy", batch)


def _step(command: list[str], dry_run: bool, run: Callable[..., int], login: str | None, tool: str = "deploy") -> None:
    shown = " ".join(command)
    print(f"{tool}: {'would run' if dry_run else 'running'}: {shown}", flush=True)
    if dry_run:
        return
    code = run(command, stdin=login) if command[:2] == ["docker", "login"] else run(command)
    if code != 0:
        raise DeployError(f"`{shown}` failed with exit code {code}")


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
        epilog="after --: -c FIELD=VALUE (for the synthesis) and more `cdk deploy` arguments",
    )
    parser.add_argument("env", help="an environment of cdk.json (dev, prod, ...)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan: no Docker, no credentials, no AWS call, nothing run"
    )
    parser.add_argument("--ci", action="store_true", help="never prompt (cdk deploy --require-approval never)")
    parser.add_argument(
        "--allow-running", action="store_true", help="deploy even while a pipeline execution is running"
    )
    args = parser.parse_args(ours)
    options = Options(dry_run=args.dry_run, ci=args.ci, allow_running=args.allow_running)
    return preflight.one_line(lambda: plan(args.env, run=_run, extra=extra, options=options))


if __name__ == "__main__":
    sys.exit(main())
