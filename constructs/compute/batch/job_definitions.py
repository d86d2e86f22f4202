"""The Batch job definitions of one environment: multi-node "sanity" and "train" (and "compile" on Trainium),
single-node "validate".

Image contract (training_image/): ENTRYPOINT `python /opt/training/launch.py`, command `MODE [flags]`.
Batch replaces `Ref::name` only when it is a whole command argument (AWS Batch user guide, "Parameter
substitution": https://docs.aws.amazon.com/batch/latest/userguide/example-use-parameters.html), so paths
that contain a per-run value travel as a root plus a name (`--checkpoints-root /fsx/checkpoints --run-id
Ref::run_id`) and the image joins them. Every placeholder has a default in `parameters`; Step Functions sets
them per run with SubmitJob `Parameters` (multi-node jobs take no container overrides).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_batch as batch
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs

from config import Accelerator, InstanceType
from config.layout import (
    CHECKPOINTS_PREFIX,
    DATASETS_PREFIX,
    FSX_MOUNT_PATH,
    FSX_WRITABLE,
    HOST_IDENTITY_DIR,
    HOST_IDENTITY_MOUNT,
    INSTANCE_ID_FILE,
    MODELS_PREFIX,
    RUNS_PREFIX,
    batch_name,
)
from constructs import Construct
from constructs.compute.backend import MULTI_NODE_JOBS
from constructs.compute.batch.workload_jobs import workload_job_specs
from constructs.nag import acknowledge
from contracts.job_environment import job_environment, shared_memory_gib
from contracts.run import NO_INITIAL_MODEL, STOP_BY_NONE, stages
from contracts.run import defaults as run_defaults

DATASETS_ROOT = f"{FSX_MOUNT_PATH}/{DATASETS_PREFIX.rstrip('/')}"
CHECKPOINTS_ROOT = f"{FSX_MOUNT_PATH}/{CHECKPOINTS_PREFIX.rstrip('/')}"
# Share of the instance's memory a job asks for: the ECS agent and the OS keep the rest.
MEMORY_SHARE = 0.9

# Batch evaluates at most 5 rules, in order, and retries when none matches (API_EvaluateOnExit:
# https://docs.aws.amazon.com/batch/latest/APIReference/API_EvaluateOnExit.html). Infrastructure
# failures are retried; the application's own failures (any exit code) and anything else exit.
# An attempt whose host went away, a Spot reclaim among them (Batch user guide, "Automated job retries": "Amazon EC2
# instance failure or termination"): its StatusReason "Host EC2 (instance <id>) terminated." (AWS Compute Blog,
# "Introducing retry strategies for AWS Batch": onStatusReason "Host EC2*").
HOST_LOST = "Host EC2*"
RETRY_RULES: tuple[tuple[batch.Action, dict], ...] = (
    (batch.Action.RETRY, {"on_status_reason": HOST_LOST}),  # host terminated or Spot reclaimed
    (batch.Action.RETRY, {"on_reason": "CannotPullContainerError*"}),  # registry or network hiccup
    (batch.Action.RETRY, {"on_status_reason": "Task failed to start*"}),  # CannotStartContainerError and friends
    (batch.Action.EXIT, {"on_exit_code": "*"}),  # the training code failed: retrying repeats it
    (batch.Action.EXIT, {"on_reason": "*"}),  # anything else: fail rather than loop
)


def ecs_tasks(stack: cdk.Stack) -> iam.ServicePrincipal:
    """ECS tasks of this account and region only (ECS developer guide, "Task IAM role" and "Task execution IAM
    role": aws:SourceAccount and aws:SourceArn in the trust, against the confused deputy); Batch jobs are such tasks."""
    return iam.ServicePrincipal(
        "ecs-tasks.amazonaws.com",
        conditions={
            "StringEquals": {"aws:SourceAccount": stack.account},
            "ArnLike": {"aws:SourceArn": stack.format_arn(service="ecs", resource="*", resource_name=None)},
        },
    )


def retry_strategies() -> list[batch.RetryStrategy]:
    return [batch.RetryStrategy.of(action, batch.Reason.custom(**on)) for action, on in RETRY_RULES]


@dataclass(frozen=True)
class JobSpec:
    """One job definition: its mode, command flags (after the mode), parameter defaults, timeout, attempts."""

    mode: str
    flags: tuple[str, ...]
    defaults: Mapping[str, str]
    timeout: cdk.Duration
    attempts: int

    @property
    def command(self) -> list[str]:
        return [self.mode, *self.flags]


def job_specs(
    *, instance: InstanceType, nodes: int, bucket_name: str, train_timeout: cdk.Duration
) -> dict[str, JobSpec]:
    """The jobs' commands. Flags the image must accept are listed in docs/batch.md. Attempt timeouts and
    attempts come from the run contract's stages, which the pipeline's states also read."""
    runs_uri = f"s3://{bucket_name}/{RUNS_PREFIX}"
    stage = stages(int(train_timeout.to_hours()))
    run: dict[str, Any] = run_defaults(nodes)  # the run contract's defaults: what a run that omits a field gets

    def limits(name: str) -> dict:
        return {"timeout": cdk.Duration.seconds(stage[name].attempt_seconds), "attempts": stage[name].attempts}

    common = {"run_id": "manual", "nodes": str(nodes)}
    specs = {
        "sanity": JobSpec(
            mode="sanity",
            flags=(
                "--min-busbw-gbps",
                f"{instance.expected_busbw_gbps:g}",
                "--run-id",
                "Ref::run_id",
                "--expected-nodes",
                "Ref::nodes",
                "--report-prefix",
                runs_uri,
            ),
            defaults=common,
            **limits("sanity"),
        ),
        "train": JobSpec(
            mode="train",
            flags=(
                "--datasets-root",
                DATASETS_ROOT,
                "--dataset",
                "Ref::dataset",
                "--checkpoints-root",
                CHECKPOINTS_ROOT,
                "--run-id",
                "Ref::run_id",
                # the run's hyperparameters as JSON text, which the launcher turns into the trainer's flags
                "--hyperparameters",
                "Ref::hyperparameters",
                "--expected-nodes",
                "Ref::nodes",
                "--init-from",
                "Ref::init_from",
                "--stop-by",
                "Ref::stop_by",
            ),
            defaults={
                **common,
                "dataset": "sample",
                "hyperparameters": "{}",  # none given: the trainer's own defaults
                "init_from": NO_INITIAL_MODEL,
                "stop_by": STOP_BY_NONE,
            },
            **limits("train"),
        ),
        "validate": JobSpec(
            mode="validate",
            flags=(
                "--checkpoints-root",
                CHECKPOINTS_ROOT,
                "--run-id",
                "Ref::run_id",
                "--datasets-root",
                DATASETS_ROOT,
                "--dataset",
                "Ref::dataset",
                "--hyperparameters",
                "Ref::hyperparameters",
                "--baseline",
                "Ref::baseline",
                "--tolerance",
                "Ref::tolerance",
                "--verdict-prefix",
                runs_uri,
            ),
            defaults={
                "run_id": "manual",
                "dataset": "sample",
                "hyperparameters": "{}",
                "baseline": "none",
                "tolerance": str(run["tolerance"]),
            },
            **limits("validate"),
        ),
    }
    if instance.accelerator is Accelerator.NEURON:
        # Trainium compiles ahead of time: the training's own flags, mode `compile`
        # (training_image/efa_training/runtime/launch/neuron_compile.py).
        train = specs["train"]
        specs["compile"] = JobSpec(mode="compile", flags=train.flags, defaults=train.defaults, **limits("compile"))
    return specs


class BatchJobDefinitions(Construct):
    """Job definitions sharing one execution role, job role and log group; `.definitions[name]`, each under the fixed
    name `.names[name]` (config.layout.batch_name), which is what the pipeline submits."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        instance: InstanceType,
        single_node_instance: InstanceType,
        nodes: int,
        image: ecs.ContainerImage,
        job_role: iam.IRole,
        log_group: logs.ILogGroup,
        bucket_name: str,
        train_timeout: cdk.Duration,
        environment: str = "",
        neuron_cc_flags: str = "",
        tracking_uri: str = "",
    ) -> None:
        super().__init__(scope, id_)
        self.environment, self.neuron_cc_flags = environment, neuron_cc_flags
        self.tracking_uri = tracking_uri
        self.execution_role = iam.Role(
            self,
            "ExecutionRole",
            assumed_by=ecs_tasks(cdk.Stack.of(self)),
            description="Batch jobs: pull the training image and write the job logs",
        )
        self.specs = job_specs(instance=instance, nodes=nodes, bucket_name=bucket_name, train_timeout=train_timeout)
        self._hosts, self._job_role, self._log_group = (instance, single_node_instance), job_role, log_group
        self._nodes = nodes
        self._runs_uri = f"s3://{bucket_name}/{RUNS_PREFIX}"
        self._models_uri = f"s3://{bucket_name}/{MODELS_PREFIX}"  # an approved model's place (MLflow's source)
        self.definitions: dict[str, batch.IJobDefinition] = {}
        self.names: dict[str, str] = {}
        for name, spec in self.specs.items():
            self.names[name] = batch_name(environment or "manual", name)
            self.definitions[name] = self._define(name.capitalize(), name, spec, image, self.names[name], {})
        if self.execution_role.node.try_find_child("DefaultPolicy") is not None:  # the image's pull grant made it
            acknowledge(
                self.execution_role,
                "AwsSolutions-IAM5[Resource::*]",
                "ecr:GetAuthorizationToken has no resource-level permissions; the layer and image reads "
                "are limited to the training image's repository",
            )

    def _define(
        self, id_: str, job: str, spec: JobSpec, image: ecs.ContainerImage, name: str, extra: Mapping[str, str]
    ) -> batch.IJobDefinition:
        """One definition under the fixed `name`; `extra`: environment variables beyond the catalogue's."""
        multi_node = job in MULTI_NODE_JOBS
        host = self._hosts[0] if multi_node else self._hosts[1]
        container = self._container(f"{id_}Container", spec, host, image, efa=multi_node, extra=extra)
        common: dict[str, Any] = dict(
            parameters=dict(spec.defaults),
            timeout=spec.timeout,
            retry_attempts=spec.attempts,
            retry_strategies=retry_strategies(),
            propagate_tags=True,
            # JobDefinitionName is the resource's only create-only property (its CloudFormation resource
            # schema): a changed definition registers a new revision under the same name, and the name keeps
            # naming the latest active one.
            job_definition_name=name,
        )
        if not multi_node:
            return batch.EcsJobDefinition(self, f"{id_}JobDefinition", container=container, **common)
        # Nodes 0..nodes-1 run the same container; node 0 is the main node (torchrun's rendezvous host).
        return batch.MultiNodeJobDefinition(
            self,
            f"{id_}JobDefinition",
            main_node=0,
            **common,
            containers=[batch.MultiNodeContainer(start_node=0, end_node=self._nodes - 1, container=container)],
        )

    def add_workload_templates(self, image: ecs.ContainerImage) -> dict[str, str]:
        """The "train" (multi-node) and "validate" definitions every registered workload's jobs copy: the run's
        pipeline registers each with the workload's image and its declaration in WORKLOAD (BatchJobRunner.workload_jobs,
        docs/workloads.md), so a workload needs no deploy; returns their fixed names."""
        names = {}
        for job, spec in workload_job_specs(self.specs).items():
            names[job] = batch_name(self.environment or "manual", f"workload-{job}")
            self._define(f"WorkloadTemplate-{job}", job, spec, image, names[job], {"WORKLOAD": "{}"})
        return names

    def _container(
        self,
        id_: str,
        spec: JobSpec,
        host: InstanceType,
        image: ecs.ContainerImage,
        *,
        efa: bool,
        extra: Mapping[str, str],
    ) -> batch.EcsEc2ContainerDefinition:
        memory_mib = int(host.memory_gib * 1024 * MEMORY_SHARE)
        # Multi-node jobs take every accelerator of their host; a single-node job (validation) takes one.
        accelerators = host.accelerators if efa else 1
        linux = batch.LinuxParameters(
            self,
            f"{id_}Linux",
            # NCCL and data loaders exchange through /dev/shm: a quarter of the host's memory.
            shared_memory_size=cdk.Size.gibibytes(shared_memory_gib(host)),
        )
        # Permissions left out: Batch's default is read, write and mknod (CDK would render them lowercase).
        if efa:
            linux.add_devices(
                *(
                    batch.Device(host_path=f"/dev/infiniband/uverbs{i}", container_path=f"/dev/infiniband/uverbs{i}")
                    for i in range(host.efa_interfaces)
                )
            )
        if host.accelerator is Accelerator.NEURON:
            linux.add_devices(
                *(
                    batch.Device(host_path=f"/dev/neuron{i}", container_path=f"/dev/neuron{i}")
                    for i in range(accelerators)
                )
            )
        environment = job_environment(
            host,
            backend="batch",
            environment=self.environment,
            neuron_cc_flags=self.neuron_cc_flags,
            tracking_uri=self.tracking_uri,
        )
        if not efa:
            # One process on one accelerator: no collectives, no EFA, no bootstrap interface.
            environment = {
                k: v
                for k, v in environment.items()
                if not k.startswith(("FI_", "NCCL_SOCKET", "GLOO_SOCKET", "BUSBW_", "EXPECTED_BUSBW"))
                and k != "EFA_INTERFACES"
            }
            environment["ACCELERATORS_PER_NODE"] = str(accelerators * host.cores_per_accelerator)
        # Reports, verdicts and bad-host records go straight to S3 (runtime/storage.py, runtime/bad_hosts.py).
        environment.update(
            {
                "REPORT_PREFIX": self._runs_uri,
                "MODELS_PREFIX": self._models_uri,
                "INSTANCE_ID_FILE": INSTANCE_ID_FILE,
                **extra,
            }
        )
        return batch.EcsEc2ContainerDefinition(
            self,
            id_,
            image=image,
            cpu=host.vcpus,
            memory=cdk.Size.mebibytes(memory_mib),
            gpu=accelerators if host.accelerator is Accelerator.NVIDIA else None,
            command=spec.command,
            environment=environment,
            job_role=self._job_role,
            execution_role=self.execution_role,
            linux_parameters=linux,
            # EFA registers (pins) large buffers: locked memory must be unlimited.
            ulimits=[batch.Ulimit(name=batch.UlimitName.MEMLOCK, soft_limit=-1, hard_limit=-1)],
            volumes=[
                # The file system read-only, read-write only where a job writes (config/layout.py FSX_WRITABLE): a
                # mount point's readOnly (Batch API reference, MountPoint) and one volume per writable folder.
                batch.EcsVolume.host(
                    name="fsx", host_path=FSX_MOUNT_PATH, container_path=FSX_MOUNT_PATH, readonly=True
                ),
                *(
                    batch.EcsVolume.host(
                        name=f"fsx-{folder.rstrip('/')}",
                        host_path=f"{FSX_MOUNT_PATH}/{folder.rstrip('/')}",
                        container_path=f"{FSX_MOUNT_PATH}/{folder.rstrip('/')}",
                    )
                    for folder in FSX_WRITABLE
                ),
                # The host's instance id (host_user_data.py), named in a bad-host record the pipeline acts on.
                batch.EcsVolume.host(
                    name="host-identity", host_path=HOST_IDENTITY_DIR, container_path=HOST_IDENTITY_MOUNT, readonly=True
                ),
            ],
            logging=ecs.LogDriver.aws_logs(stream_prefix=spec.mode, log_group=self._log_group),
        )
