"""`make deploy ENV=... DRY_RUN=1`: what a deploy would do, told with neither Docker nor AWS credentials, and with
no AWS call. The app is synthesized in-process (synthesis needs neither) for what only the cloud assembly tells: the
stacks in the order `cdk deploy --all` takes them, the images it builds, the bootstrap version the templates need.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tools import preflight

if TYPE_CHECKING:
    from config import EnvironmentConfig

ROOT = Path(__file__).resolve().parent.parent
_PRIVATE_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com/")


def base_image(dockerfile: Path) -> str:
    """The Dockerfile's default base image: its `ARG BASE_IMAGE=...`, with the ARGs before it substituted."""
    args: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"^ARG\s+(\w+)=(\S+)", line.strip())
        if match:
            args[match.group(1)] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), match.group(2))
    return args.get("BASE_IMAGE", "")


def base_registry(dockerfile: Path) -> tuple[str, str, str] | None:
    """(registry host, account, region) of the Dockerfile's default base image when it is a private ECR one."""
    found = _PRIVATE_ECR.match(base_image(dockerfile))
    if not found:
        return None
    return found.group(0).rstrip("/"), found.group("account"), found.group("region")


@dataclass(frozen=True)
class Image:
    """A Docker image asset of the assembly: what `cdk deploy` builds and pushes before it deploys the stacks."""

    name: str
    stack: str
    dockerfile: Path
    platform: str
    region: str


@dataclass(frozen=True)
class Request:
    """What the deploy was asked: the environment, its validated configuration, whether a run may go on."""

    env: str
    config: EnvironmentConfig
    allow_running: bool
    run_units: Sequence[str]


@contextmanager
def synthesized(context: dict) -> Iterator[Path]:
    """The app as `cdk synth` builds it (cdk-nag included), in a temporary directory. The build contexts are read
    where they are, not copied: this assembly is read, never deployed."""
    import jsii

    from app import build_app

    with tempfile.TemporaryDirectory(prefix="deploy-plan-") as outdir:
        try:
            app, _ = build_app(context={**context, "aws:cdk:disable-asset-staging": True}, outdir=outdir)
            app.synth()
        except jsii.errors.JSIIError:
            raise preflight.PreflightError(
                f"the app does not synthesize for {context.get('env')}: `make synth` shows why"
            ) from None
        yield Path(outdir)


def stack_order(assembly: Path) -> list[str]:
    """The stacks in the manifest's order, which puts every stack after the stacks it depends on."""
    artifacts = json.loads((assembly / "manifest.json").read_text())["artifacts"]
    return [name for name, artifact in artifacts.items() if artifact["type"] == "aws:cloudformation:stack"]


def images(assembly: Path) -> list[Image]:
    artifacts = json.loads((assembly / "manifest.json").read_text())["artifacts"]
    found = []
    for name, artifact in artifacts.items():
        if artifact["type"] != "cdk:asset-manifest":
            continue
        assets = json.loads((assembly / artifact["properties"]["file"]).read_text())
        for asset_hash, image in assets.get("dockerImages", {}).items():
            source = image["source"]
            # Absolute where staging is off (ours), else a copy inside the assembly.
            dockerfile = assembly / source["directory"] / source.get("dockerFile", "Dockerfile")
            region = next(iter(image["destinations"].values())).get("region", "")
            stack = name.removesuffix(".assets")
            label = image.get("displayName", asset_hash[:12])
            found.append(Image(label, stack, dockerfile, source.get("platform", "the host's platform"), region))
    return found


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _image_lines(config: EnvironmentConfig, built: list[Image]) -> list[str]:
    if not built:
        tag = f"image_tag={config.image_tag}"
        return [f"images: none built ({tag}: the image CI pushed to {config.stack_prefix}-Registry's repository)"]
    lines = ["images `cdk deploy` would build and push to the bootstrap's container-assets repository:"]
    for image in built:
        lines.append(
            f"  {image.name} ({image.stack}): {_shown(image.dockerfile)}, context {_shown(image.dockerfile.parent)}/, "
            f"{image.platform}, pushed in {image.region}"
        )
        base = base_image(image.dockerfile)
        registry = base_registry(image.dockerfile)
        if registry:
            host, _, region = registry
            lines.append(f"    FROM {base}")
            lines.append(f"    private ECR: would log in to {host} first (ECR GetAuthorizationToken in {region})")
        else:
            lines.append(f"    FROM {base} (public: no login)")
    return lines


def _eks_admin_lines(config: EnvironmentConfig) -> list[str]:
    if config.compute != "eks":
        return []
    if config.eks_admin_role_arns:
        return [f"EKS admin: the {len(config.eks_admin_role_arns)} role(s) of eks_admin_role_arns"]
    # The deploy names the credentials' own role: an IAM Identity Center role is refused (its ARN's path is hidden).
    return [
        "EKS admin: would make the credentials' role (from STS GetCallerIdentity) the cluster's admin, passed as "
        "-c eks_admin_role_arns=<it> to the synth"
    ]


def _offering_line(config: EnvironmentConfig) -> str:
    types = preflight.offering_checked(config)
    if not types:
        return f"instance offering: not checked (compute={config.compute}, or Capacity Blocks only)"
    where = config.availability_zone or "any zone"
    return (
        f"instance offering: would list the zones of {config.region} where EC2 offers {', '.join(types)} "
        f"(DescribeInstanceTypeOfferings) and refuse unless {where} is one"
    )


def _reservation_line(config: EnvironmentConfig) -> str:
    found = config.reservation
    if found is None:
        return "capacity reservation: none declared"
    if found.resource_group:
        return "capacity reservation: a reservation group, checked at synth only (its members are not listed)"
    if found.training_plan:
        return (
            f"capacity reservation: would read training plan {found.training_plan.rsplit('/', 1)[-1]} "
            "(DescribeTrainingPlan) and refuse unless it is scheduled or active, for training jobs, with "
            f"{config.instance.sagemaker_instance_type} and at least {config.nodes} instances"
        )
    return (
        f"capacity reservation: would read {found.id} (DescribeCapacityReservations) and refuse unless it holds "
        f"{config.instance_type} in {found.zone}, at least {config.nodes} instances, as a "
        f"{'Capacity Block' if found.capacity_block else 'On-Demand reservation'}, and has not ended"
    )


def _eks_versions_line(config: EnvironmentConfig) -> str:
    if config.compute != "eks":
        return f"EKS versions: not checked (compute={config.compute})"
    from constructs.compute.eks import versions

    minimums = ", ".join(f"{addon} >= {version}" for addon, version in versions.ADDON_MINIMUMS.items())
    return (
        f"EKS versions: unless {config.stack_prefix}-Eks exists, would check EKS in {config.region} offers "
        f"Kubernetes {versions.KUBERNETES_VERSION} in standard support with default add-ons {minimums}"
    )


def _check_lines(request: Request, stacks: list[str], required: int) -> list[str]:
    config, prefix = request.config, request.config.stack_prefix
    docker = "not needed (image_tag: nothing is built)"
    if not config.image_tag:
        docker = "would find `docker` on PATH and run `docker info` (its output hidden): the daemon must answer"
    account = f"the account must be {config.account}" if config.account else "any account (cdk.json names none)"
    under_a_run = [name for name in stacks if name in {f"{prefix}-{unit}" for unit in request.run_units}]
    in_flight = "not checked (--allow-running)"
    if not request.allow_running:
        batch = config.name if config.compute == "batch" else None  # where the Batch stack changes (deploy.py)
        in_flight = f"would compare {', '.join(under_a_run)} with the deployed templates and, if one changes, " + (
            preflight.run_in_flight_plan(f"{prefix}-Pipeline", "deploy", batch)
        )
    emails = ", ".join(config.alert_emails) or "alert_emails is empty"
    target = f"{config.account or '<account>'}/{config.region}"
    return [
        f"docker: {docker}",
        f"credentials: would call STS GetCallerIdentity; {account}",
        *_eks_admin_lines(config),
        _offering_line(config),
        _reservation_line(config),
        f"bootstrap: would read the {preflight.BOOTSTRAP_STACK} stack's BootstrapVersion in {config.region} (needs "
        f">= {required}); where the stack is missing, `cdk bootstrap aws://{target}` runs first",
        _eks_versions_line(config),
        f"run in flight: {in_flight}",
        f"alert subscriptions: after the deploy, would list {prefix}-Alerts's topic subscriptions and say whether "
        f"any is confirmed, and name the e-mails not confirmed yet ({emails})",
        *(f"warning: {line}" for line in preflight.placeholder_emails(config.alert_emails)),
    ]


def show(request: Request, context: dict) -> None:
    """Print the plan: the environment, its stacks in deploy order, the images, one line per check."""
    config = request.config
    with synthesized(context) as assembly:
        stacks, built = stack_order(assembly), images(assembly)
        required = preflight.required_bootstrap_version(assembly)
    account = config.account or "from your credentials at deploy time (cdk.json names none)"
    lines = [
        f"deploy plan for {request.env} (dry run: no Docker, no AWS credentials, no AWS call)",
        f"  account: {account}",
        f"  region: {config.region}",
        f"  compute: {config.compute}, {config.nodes} x {config.instance_type}",
        "stacks in deploy order (each after the stacks it uses):",
        *(f"  {number}. {name}" for number, name in enumerate(stacks, 1)),
        *_image_lines(config, built),
        "checks, in the order the deploy makes them (the first that refuses stops it with one line):",
        *(f"  {line}" for line in _check_lines(request, stacks, required)),
    ]
    print("\n".join(lines), flush=True)
