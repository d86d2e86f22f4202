"""What `make deploy` and `make destroy` ask AWS before they change anything, each answer one line when it says no.

- Docker (`make deploy` builds the training image): installed, and its daemon answers;
- the CDK bootstrap stack's version against the one the synthesized templates require;
- the Kubernetes version (EKS backend): offered in the region and in standard support, with add-on defaults new
  enough for EFA;
- the reserved capacity (`capacity_reservation`): it exists, holds the instance type in the zone with enough
  instances, and has not ended;
- a run in flight: a pipeline execution of the environment that is RUNNING, and the stacks a deploy would change
  under it (their synthesized templates against the deployed ones).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from config.layout import batch_name

BOOTSTRAP_STACK = "CDKToolkit"


class PreflightError(Exception):
    """A reason not to go on: printed as one line."""


def one_line(step: Callable[[], object]) -> int:
    """Run a command's step: 0, or its refusal as one `error:` line and exit code 2."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        step()
    except PreflightError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as error:  # a call the named checks do not wrap (denied, throttled)
        print(f"error: AWS refused a check ({type(error).__name__}: {str(error).splitlines()[0]})", file=sys.stderr)
        return 2
    return 0


def _docker_answers(command: Sequence[str]) -> int:
    """`docker info`'s exit code, its output swallowed: the line it prints when the daemon is down is not ours."""
    try:
        return subprocess.run(
            list(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1


def check_docker(probe: Callable[[Sequence[str]], int] = _docker_answers) -> None:
    if shutil.which("docker") is None:
        raise PreflightError(
            "Docker is not installed: `cdk deploy` builds the training image from training_image/ "
            "(install Docker, or deploy a pushed image with -c image_tag=TAG; DRY_RUN=1 shows the plan without it)"
        )
    if probe(["docker", "info", "--format", "{{.ServerVersion}}"]) != 0:
        raise PreflightError(
            "Docker is installed but its daemon does not answer (`docker info` failed): start Docker Desktop or "
            "`sudo systemctl start docker`, and check that your user may use it"
        )


def client(service: str, region: str):
    import boto3
    from botocore.config import Config

    # Bounded: a credential or endpoint problem ends in a line, not a hang. A session of its own: boto3's default
    # session keeps the credentials it first found for the life of the process.
    return boto3.session.Session().client(
        service,
        region_name=region,
        config=Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}),
    )


def _stack(region: str, name: str) -> dict | None:
    """The stack's description, or None where it does not exist."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return client("cloudformation", region).describe_stacks(StackName=name)["Stacks"][0]
    except ClientError as exc:
        if "does not exist" in str(exc):
            return None
        raise PreflightError(f"could not read the stack {name} in {region}: {exc}") from None
    except BotoCoreError as exc:
        raise PreflightError(f"could not reach CloudFormation in {region} ({type(exc).__name__})") from None


def stack_exists(region: str, name: str) -> bool:
    return _stack(region, name) is not None


def _output(stack: dict, key: str) -> str | None:
    return next((o["OutputValue"] for o in stack.get("Outputs", []) if o["OutputKey"] == key), None)


def bootstrap_version(region: str) -> int | None:
    """The CDKToolkit stack's version (its BootstrapVersion output), None where the region is not bootstrapped."""
    stack = _stack(region, BOOTSTRAP_STACK)
    if stack is None:
        return None
    return int(_output(stack, "BootstrapVersion") or 0)


def required_bootstrap_version(assembly: Path) -> int:
    """The newest bootstrap version any stack of the cloud assembly asks for (its `requiresBootstrapStackVersion`)."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    return max(
        (a.get("properties", {}).get("requiresBootstrapStackVersion", 0) for a in manifest["artifacts"].values()),
        default=0,
    )


def check_bootstrap(deployed: int | None, required: int, account: str, region: str) -> None:
    if deployed is not None and deployed < required:
        raise PreflightError(
            f"the CDK bootstrap stack in {region} is version {deployed}, and these templates need {required} or "
            f"newer: upgrade it with `cdk bootstrap aws://{account}/{region}` (or ask who owns it)"
        )


def offering_checked(config) -> list[str]:
    """The EC2 instance types whose regional offering the deploy checks: the training and validation types on
    Batch and EKS. Not SageMaker (its ml.* types are SageMaker's capacity, not EC2's offerings) and not a type sold
    only as Capacity Blocks (its capacity is the reservation's, wherever the block was bought)."""
    if config.compute == "sagemaker":
        return []
    types = [config.instance, config.single_node_instance]
    return list(dict.fromkeys(t.name for t in types if not t.capacity_blocks_only))


def check_instance_offered(region: str, instance_type: str, zone: str | None) -> None:
    """EC2 offers the type in the region, and in the environment's zone where it names one (EC2 API reference:
    DescribeInstanceTypeOfferings with LocationType availability-zone lists the zones that offer it)."""
    ec2 = client("ec2", region)
    offered: set[str] = set()
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )
    for page in pages:
        offered |= {o["Location"] for o in page.get("InstanceTypeOfferings", [])}
    if not offered:
        raise PreflightError(f"EC2 does not offer {instance_type} in {region}: choose another instance_type or region")
    if zone and zone not in offered:
        raise PreflightError(
            f"EC2 offers {instance_type} in {region} only in {', '.join(sorted(offered))}, not in {zone}: set "
            "availability_zone to one of those (or leave it unset for the first zone)"
        )


# EC2 API reference, CapacityReservation.State: these never launch an instance again.
RESERVATION_ENDED = ("expired", "cancelled", "failed", "payment-failed", "cancelling", "unsupported")
TRAINING_PLAN_ENDED = ("Expired", "Failed")  # SageMaker API reference, DescribeTrainingPlan Status


def check_reservation(config) -> None:
    """The declared reservation against EC2's (DescribeCapacityReservations) or SageMaker's (DescribeTrainingPlan)
    record of it. A reservation group is checked at synth only (its members are listed by AWS Resource Groups)."""
    from botocore.exceptions import ClientError

    reservation = config.reservation
    if reservation is None or reservation.resource_group:
        return
    if reservation.training_plan:
        _check_training_plan(config, reservation.training_plan)
        return
    try:
        (found,) = client("ec2", config.region).describe_capacity_reservations(CapacityReservationIds=[reservation.id])[
            "CapacityReservations"
        ]
    except ClientError as error:  # InvalidCapacityReservationId.NotFound or .Malformed
        raise PreflightError(
            f"capacity_reservation.id={reservation.id}: EC2 does not show it in {config.region} ({error})"
        ) from None
    problems = [
        f"type {found['InstanceType']}, not {config.instance_type}" * (found["InstanceType"] != config.instance_type),
        f"zone {found['AvailabilityZone']}, not {reservation.zone}" * (found["AvailabilityZone"] != reservation.zone),
        f"{found['TotalInstanceCount']} instances, fewer than nodes ({config.nodes})"
        * (found["TotalInstanceCount"] < config.nodes),
        f"state {found['State']}" * (found["State"] in RESERVATION_ENDED),
        "a Capacity Block, declared on_demand"
        * (found.get("ReservationType") == "capacity-block" and not reservation.capacity_block),
        "an On-Demand reservation, declared capacity_block"
        * (found.get("ReservationType", "default") == "default" and reservation.capacity_block),
    ]
    _refuse_reservation(f"capacity_reservation {reservation.id}", [p for p in problems if p])


def _check_training_plan(config, arn: str) -> None:
    from botocore.exceptions import ClientError

    name = arn.rsplit("/", 1)[-1]
    try:
        plan = client("sagemaker", config.region).describe_training_plan(TrainingPlanName=name)
    except ClientError as error:  # ResourceNotFound
        raise PreflightError(
            f"capacity_reservation.training_plan={arn}: SageMaker does not show it ({error})"
        ) from None
    wanted = config.instance.sagemaker_instance_type
    types = {c.get("InstanceType") for c in plan.get("ReservedCapacitySummaries", [])}
    problems = [
        f"status {plan['Status']}" * (plan["Status"] in TRAINING_PLAN_ENDED),
        "no training-job target (it is for HyperPod clusters)"
        * ("training-job" not in plan.get("TargetResources", [])),
        f"instance types {', '.join(sorted(t for t in types if t))}, not {wanted}" * (wanted not in types),
        f"{plan.get('TotalInstanceCount', 0)} instances, fewer than nodes ({config.nodes})"
        * (plan.get("TotalInstanceCount", 0) < config.nodes),
    ]
    _refuse_reservation(f"training plan {name}", [p for p in problems if p])


def _refuse_reservation(what: str, problems: list[str]) -> None:
    if problems:
        raise PreflightError(f"{what} cannot take this environment's training: {'; '.join(problems)}")


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("-")[0].split(".") if part.isdigit())


def check_kubernetes(region: str, version: str, addon_minimums: dict[str, str]) -> None:
    """EKS offers `version` in the region in standard support, and each add-on's default build for it is new
    enough (EKS API reference: DescribeClusterVersions `versionStatus`, DescribeAddonVersions `defaultVersion`)."""
    eks = client("eks", region)
    found = eks.describe_cluster_versions(clusterVersions=[version]).get("clusterVersions", [])
    status = found[0].get("versionStatus") if found else None
    if status != "STANDARD_SUPPORT":
        raise PreflightError(
            f"EKS in {region} does not offer Kubernetes {version} in standard support ({status or 'not listed'}): "
            "see `aws eks describe-cluster-versions`, and constructs/compute/eks/versions.py"
        )
    for addon, minimum in addon_minimums.items():
        default = _default_addon_version(eks, addon, version)
        if default is None or _semver(default) < _semver(minimum):
            raise PreflightError(
                f"EKS's default {addon} for Kubernetes {version} in {region} is {default or 'missing'}; EFA needs "
                f"{minimum} or newer: pin one in constructs/compute/eks/versions.py"
            )


def _default_addon_version(eks, addon: str, kubernetes: str) -> str | None:
    answer = eks.describe_addon_versions(addonName=addon, kubernetesVersion=kubernetes)
    for entry in answer.get("addons", []):
        for build in entry.get("addonVersions", []):
            if any(
                c.get("defaultVersion")
                for c in build.get("compatibilities", [])
                if c.get("clusterVersion") == kubernetes
            ):
                return build["addonVersion"]
    return None


def running_executions(region: str, pipeline_stack: str) -> list[str]:
    """The names of the environment's pipeline executions that are RUNNING (none before the first deploy)."""
    stack = _stack(region, pipeline_stack)
    machine = _output(stack, "StateMachineArn") if stack else None
    if not machine:
        return []
    answer = client("stepfunctions", region).list_executions(stateMachineArn=machine, statusFilter="RUNNING")
    return [execution["name"] for execution in answer["executions"]]


# Reserved for documentation (RFC 2606, "Reserved Top Level DNS Names"): mail there reaches nobody.
PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org")


def placeholder_emails(emails: Iterable[str]) -> list[str]:
    """One line naming the alert e-mails at a documentation domain (cdk.json ships them as placeholders)."""
    placeholders = sorted(e for e in emails if e.rsplit("@", 1)[-1].lower() in PLACEHOLDER_DOMAINS)
    if not placeholders:
        return []
    return [
        f"alert_emails {', '.join(placeholders)}: a documentation domain (RFC 2606) that reaches nobody: set the "
        "environment's alert_emails in cdk.json to a mailbox that is read, and deploy"
    ]


def unconfirmed_subscriptions(region: str, alerts_stack: str) -> list[str]:
    """Lines on the alerts topic's subscriptions in every state: none confirmed (every alarm then reaches nobody),
    and the e-mails not confirmed yet. SNS deletes an unconfirmed subscription after 48 hours (SNS developer guide,
    "Confirm your Amazon SNS subscription"), and a redeploy does not send the link again (the subscription resource
    is unchanged); `aws sns subscribe` with the same endpoint does."""
    stack = _stack(region, alerts_stack)
    topic = _output(stack, "AlertsTopicArn") if stack else None
    if not topic:
        return []
    subscriptions = client("sns", region).list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    pending = sorted(s["Endpoint"] for s in subscriptions if s["SubscriptionArn"] == "PendingConfirmation")
    confirmed = [s for s in subscriptions if s["SubscriptionArn"].startswith("arn:")]
    lines = []
    if not confirmed:
        lines.append(
            f"no confirmed subscription on {topic} ({len(subscriptions)} in all): every alarm and run notification "
            "reaches nobody until one is confirmed"
        )
    if pending:
        resend = f"aws sns subscribe --region {region} --topic-arn {topic} --protocol email --notification-endpoint"
        lines.append(
            f"{len(pending)} alert e-mail(s) not confirmed yet ({', '.join(pending)}): each must click the link SNS "
            f"sent; it is deleted after 48 hours unconfirmed, and a redeploy does not resend it: `{resend} <e-mail>`"
        )
    return lines


def changed_stacks(region: str, assembly: Path, names: Iterable[str]) -> list[str]:
    """Which of the named stacks a deploy of the assembly would update: their template differs from the deployed
    one (`cdk deploy` skips a stack whose template did not change)."""
    manifest = json.loads((assembly / "manifest.json").read_text())["artifacts"]
    changed = []
    for name in names:
        if name not in manifest or _stack(region, name) is None:
            continue
        body = client("cloudformation", region).get_template(StackName=name, TemplateStage="Original")["TemplateBody"]
        deployed = json.loads(body) if isinstance(body, str) else body
        synthesized = json.loads((assembly / manifest[name]["properties"]["templateFile"]).read_text())
        if deployed != synthesized:
            changed.append(name)
    return changed


# A Batch job not yet ended (Batch API reference, ListJobs jobStatus): what a compute environment's update or deletion
# would cut short or leave waiting.
UNFINISHED_JOB_STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
BATCH_QUEUE_UNITS = ("multi-node", "single-node", "single-node-on-demand")  # stacks/batch_stack.py's queues


def unfinished_batch_jobs(region: str, environment: str) -> list[str]:
    """The names of the jobs not yet ended in the environment's Batch queues, a job submitted by hand (the `research`
    share) among them; a queue that is not there (another backend, before the first deploy) holds none."""
    batch, names = client("batch", region), []
    for unit in BATCH_QUEUE_UNITS:
        for status in UNFINISHED_JOB_STATES:
            try:
                pages = batch.get_paginator("list_jobs").paginate(
                    jobQueue=batch_name(environment, unit), jobStatus=status
                )
                names += [job["jobName"] for page in pages for job in page["jobSummaryList"]]
            except batch.exceptions.ClientException:
                break
    return names


# The override as the tool and as make take it (Makefile: ALLOW_RUNNING=1 passes --allow-running to deploy and destroy).
ALLOW_RUNNING = "--allow-running (make: ALLOW_RUNNING=1)"


def run_in_flight_plan(pipeline_stack: str, verb: str, batch_environment: str | None = None) -> str:
    """What check_no_run_in_flight asks, told without asking (a dry run's plan): kept beside the check so the two
    say the same."""
    # CloudFormation API reference, DescribeStacks (Outputs); Step Functions API reference, ListExecutions
    # (statusFilter); Batch API reference, ListJobs (jobQueue, jobStatus).
    pipeline = (
        f"would read {pipeline_stack}'s StateMachineArn output (CloudFormation DescribeStacks) and list its RUNNING "
        "executions (Step Functions ListExecutions)"
    )
    if batch_environment:
        queues = ", ".join(batch_name(batch_environment, unit) for unit in BATCH_QUEUE_UNITS)
        pipeline += f", then the jobs not ended ({', '.join(UNFINISHED_JOB_STATES)}) in {queues} (Batch ListJobs)"
    return f"{pipeline}; any one refuses this {verb} (ALLOW_RUNNING=1 skips this)"


def check_no_run_in_flight(
    region: str, pipeline_stack: str, changing: list[str], verb: str, batch_environment: str | None = None
) -> None:
    """Refuse to change the stacks a run depends on while one is in flight: a pipeline execution, or (with
    `batch_environment`, where the Batch stack changes) a job in its queues, which a deploy that updates their
    compute environments or a destroy would cut short."""
    if not changing:
        return
    running = running_executions(region, pipeline_stack)
    if running:
        raise PreflightError(
            f"pipeline execution {running[0]} is running ({len(running)} in all) and this {verb} changes "
            f"{', '.join(changing)} under it (docs/operators-guide.md, 'Day two'): wait for it, stop it, or pass "
            f"{ALLOW_RUNNING}"
        )
    jobs = unfinished_batch_jobs(region, batch_environment) if batch_environment else []
    if jobs:
        raise PreflightError(
            f"Batch job {jobs[0]} has not ended ({len(jobs)} in all) and this {verb} changes {', '.join(changing)} "
            f"under it (docs/operators-guide.md, 'Day two'): wait for it, terminate it, or pass {ALLOW_RUNNING}"
        )
