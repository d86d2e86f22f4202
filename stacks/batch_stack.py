"""AWS Batch compute backend: EFA hosts in one cluster placement group, fair-share queues, the three jobs.

A `ComputeBackend` (constructs/compute/backend.py): `job_runner` submits the pipeline's jobs to the queues,
`accelerator_metrics` and `job_queue_names` feed the dashboard. Also exposed for operators and tests:
  multi_node_queue, single_node_queue, single_node_on_demand_queue (the on-demand path of single-node jobs when
  single_node_queue is on Spot, else None); job_definitions {"sanity", "train", "validate"}; log_group (every
  job's output); job_role (what the training code may do); the compute environments, placement group and
  launch templates.
"""

from typing import TYPE_CHECKING

import aws_cdk as cdk
import aws_cdk.aws_batch as batch
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from config import Accelerator, EnvironmentConfig, InstanceType
from config.layout import batch_name
from constructs import Construct
from constructs.compute.backend import MULTI_NODE_JOBS, ComputeBackend
from constructs.compute.batch.host_user_data import host_user_data
from constructs.compute.batch.job_definitions import BatchJobDefinitions, ecs_tasks
from constructs.compute.batch.job_runner import BatchJobRunner
from constructs.compute.shared.efa_launch_template import EfaLaunchTemplate, EfaLayout
from constructs.compute.shared.workload_pull import grant_workload_pull
from constructs.escape_hatch import cfn
from constructs.nag import acknowledge, acknowledge_log_group_encryption, managed_policy_finding
from constructs.observability.accelerator_metrics import accelerator_metrics
from constructs.storage.tracking import grant_tracking, tracking_uri
from contracts.job_environment import STOP_GRACE_SECONDS
from contracts.run import QUEUE_WAIT_MINUTES
from stacks.network_stack import NetworkStack
from stacks.policies import data_removal_policy, log_retention
from stacks.registry_stack import RegistryStack
from stacks.storage_stack import StorageStack

# ECS-optimized Amazon Linux 2023 Neuron AMI: the parameter aws/amazon-ecs-ami reads for its release notes
# (generate-release-notes.sh) and CDK's EcsOptimizedImage.amazonLinux2023(AmiHardwareType.NEURON) resolves;
# older ECS guide pages name it amazon-linux-2023/inf. Batch has no Neuron image type: ECS_AL2023 plus this AMI.
NEURON_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id"
SHARES = ("research", "production")
# Runs started through the pipeline are the production path; hand-submitted jobs name their own share.
PIPELINE_SHARE = "production"
# How long a single-node job may wait in RUNNABLE for instances EC2 cannot supply before it is cancelled (a
# multi-node job: the environment's batch_capacity_wait_minutes, since the hosts that did launch idle meanwhile).
CAPACITY_WAIT_MINUTES = QUEUE_WAIT_MINUTES  # the pipeline's stage timeouts allow each attempt this wait
# A validation waiting for Spot capacity gives up sooner: the pipeline then runs it on the on-demand queue.
SPOT_CAPACITY_WAIT_MINUTES = 20
SINGLE_NODE_MAX_INSTANCES = 2  # two validations at once; more wait in the queue
ROOT_VOLUME_GIB = 200  # the accelerated training images are 15-25 GiB; layers are unpacked next to them


NO_CAPACITY = batch.JobStateTimeLimitActionsReason.INSUFFICIENT_INSTANCE_CAPACITY


def _cancel_after(minutes: int, reason: batch.JobStateTimeLimitActionsReason) -> batch.JobStateTimeLimitAction:
    return batch.JobStateTimeLimitAction(
        max_time=cdk.Duration.minutes(minutes), reason=reason, action=batch.JobStateTimeLimitActionsAction.CANCEL
    )


def _set_instance_type(environment: batch.ManagedEc2EcsComputeEnvironment, instance: InstanceType) -> None:
    """Escape hatch: the L2 parses every instance type it is given with ec2.InstanceType's pattern, which refuses a
    family with digits after its hyphen (p6-b200.48xlarge: "Malformed instance type identifier", aws-cdk-lib 2.275
    InstanceType.sameInstanceClassAs), so the compute environment's one type is set on the L1 resource."""
    cfn(environment).add_property_override("ComputeResources.InstanceTypes", [instance.name])


def machine_image(instance: InstanceType) -> batch.EcsMachineImage:
    """GPU hosts: Batch's ECS AL2023 NVIDIA image. Neuron hosts: the ECS AL2023 Neuron AMI from SSM."""
    if instance.accelerator is Accelerator.NVIDIA:
        return batch.EcsMachineImage(image_type=getattr(batch.EcsMachineImageType, instance.batch_image_type))
    return batch.EcsMachineImage(
        image=ec2.MachineImage.from_ssm_parameter(NEURON_AMI_PARAMETER),
        image_type=getattr(batch.EcsMachineImageType, instance.batch_image_type),
    )


class BatchStack(cdk.Stack):
    """Implements constructs.compute.backend.ComputeBackend."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        config: EnvironmentConfig,
        network: NetworkStack,
        storage: StorageStack,
        registry: RegistryStack,
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        self._config = config
        self._hosts(config, network, storage)
        # ---- logs and the job role (least privilege on the data bucket's prefixes)
        self.log_group = logs.LogGroup(
            self, "JobLogs", retention=log_retention(config), removal_policy=data_removal_policy(config)
        )
        acknowledge_log_group_encryption(self.log_group)
        self.job_role = iam.Role(
            self,
            "JobRole",
            assumed_by=ecs_tasks(self),
            description="Training containers: read datasets and models, write checkpoints and reports",
        )
        storage.data_access.grant_training(self.job_role, "Batch training jobs")
        grant_tracking(self.job_role, config)
        self.log_group.grant_write(self.job_role)
        self.jobs = BatchJobDefinitions(
            self,
            "Jobs",
            instance=config.instance,
            single_node_instance=config.single_node_instance,
            nodes=config.nodes,
            image=registry.container_image,
            job_role=self.job_role,
            log_group=self.log_group,
            bucket_name=storage.bucket.bucket_name,
            train_timeout=cdk.Duration.hours(config.batch_train_timeout_hours),
            environment=config.name,
            neuron_cc_flags=config.neuron_cc_flags,
            tracking_uri=tracking_uri(self, config),
        )
        self.job_definitions: dict[str, batch.IJobDefinition] = dict(self.jobs.definitions)
        # The definitions a registered workload's jobs copy at run start with its own image (docs/workloads.md).
        workload_templates = self.jobs.add_workload_templates(registry.container_image)
        grant_workload_pull(self, self.jobs.execution_role, config.name)
        self._compute_environments(config, network)
        self._queues(config)
        # By fixed names, not references (BatchJobRunner): a redeploy never leaves the pipeline on a stale value.
        self.job_runner = BatchJobRunner(
            multi_node_queue=self.queue_names["multi_node"],
            single_node_queue=self.queue_names["single_node"],
            job_definitions=dict(self.jobs.names),
            share_identifier=PIPELINE_SHARE,
            single_node_on_demand_queue=self.queue_names.get("single_node_on_demand"),
            workload_templates=workload_templates,
            environment=config.name,
        )
        self.accelerator_metrics = accelerator_metrics("batch", config.instance.accelerator, environment=config.name)
        self.job_queue_names = list(self.queue_names.values())
        self._outputs()

    def attach_pipeline(self, scope: Construct, state_machine: sfn.StateMachine, alerts: sns.ITopic) -> None:
        """Nothing to add: Batch queues jobs and scales its compute environments itself."""

    def _hosts(self, config: EnvironmentConfig, network: NetworkStack, storage: StorageStack) -> None:
        """The instance role, the cluster placement group and one launch template per host kind."""
        self.instance_role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="Batch training hosts: ECS agent, CloudWatch agent",
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("service-role/AmazonEC2ContainerServiceforEC2Role"),
                iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy"),
            ],
        )
        acknowledge(
            self.instance_role,
            managed_policy_finding("service-role/AmazonEC2ContainerServiceforEC2Role"),
            "The ECS container agent on every Batch host needs exactly this AWS-maintained policy",
        )
        acknowledge(
            self.instance_role,
            managed_policy_finding("CloudWatchAgentServerPolicy"),
            "The CloudWatch agent publishes nvidia_smi_* and efa_* host metrics (CWAgent) the dashboard reads",
        )
        # Hosts launched into a reservation are placed where it is: a new cluster placement group is no part of it
        # (EC2 user guide, "Launch instances into an existing Capacity Reservation"); otherwise one cluster group.
        self.placement_group = (
            None
            if config.reservation is not None
            else ec2.PlacementGroup(self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
        )

        def template(id_: str, host: InstanceType, efa: bool) -> EfaLaunchTemplate:
            user_data = host_user_data(
                instance=host,
                fsx_dns_name=storage.file_system.dns_name,
                fsx_revision=storage.file_system_revision,
                fsx_mount_name=storage.file_system.mount_name,
                check_efa=efa,
                environment=config.name,
                ecs_stop_timeout_seconds=STOP_GRACE_SECONDS,
            )
            return EfaLaunchTemplate(
                self,
                id_,
                instance=host,
                security_groups=[network.efa_security_group],
                user_data=user_data,
                # One interface per card: card 0 keeps a place for the multi-node job's awsvpc task interface.
                layout=EfaLayout.BATCH,
                root_volume_gib=ROOT_VOLUME_GIB,
                include_network_interfaces=efa,
                # The multi-node hosts launch into the reservation (AWS HPC blog, "How to use Capacity Blocks for ML
                # with AWS Batch": a launch template with the block's market type and target on the compute
                # environment); validation runs on its own small type, outside it.
                reservation=config.reservation if efa else None,
            )

        self.launch_templates = {
            "multi_node": template("MultiNodeLaunchTemplate", config.instance, efa=True),
            "single_node": template("SingleNodeLaunchTemplate", config.single_node_instance, efa=False),
        }

    def _compute_environments(self, config: EnvironmentConfig, network: NetworkStack) -> None:
        """Multi-node (on-demand, EFA, placement group) and single-node (Spot when configured, with an on-demand
        twin for when Spot capacity is short), all in the one training subnet (the FSx file system's zone)."""
        instance, single = config.instance, config.single_node_instance
        subnets = ec2.SubnetSelection(subnets=[network.training_subnet])
        self.multi_node_environment = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "MultiNodeEnvironment",
            vpc=network.vpc,
            vpc_subnets=subnets,
            security_groups=[network.efa_security_group],  # given so the L2 creates none; removed below
            spot=False,  # multi-node parallel jobs cannot run on Spot
            # A placeholder the L2 requires; _set_instance_type replaces it with the catalogue's type.
            instance_classes=[ec2.InstanceClass.P5],
            use_optimal_instance_classes=False,
            minv_cpus=0,
            maxv_cpus=config.nodes * instance.vcpus,
            images=[machine_image(instance)],
            launch_template=self.launch_templates["multi_node"].launch_template,
            placement_group=self.placement_group,
            instance_role=self.instance_role,
            update_to_latest_image_version=True,
            **self._never_cut_short(tuple(job for job in self.jobs.specs if job in MULTI_NODE_JOBS)),
        )
        self._launch_template_version(self.multi_node_environment, self.launch_templates["multi_node"])
        _set_instance_type(self.multi_node_environment, instance)
        # Batch rejects compute-environment security groups next to launch-template network interfaces
        # ("exclusively allowed"); the interfaces carry the EFA group instead.
        cfn(self.multi_node_environment).add_property_deletion_override("ComputeResources.SecurityGroupIds")
        self.single_node_environment = self._single_node_environment(
            "SingleNodeEnvironment", network, subnets, single, spot=config.batch_single_node_spot
        )
        self.single_node_on_demand_environment = (
            self._single_node_environment("SingleNodeOnDemandEnvironment", network, subnets, single, spot=False)
            if config.batch_single_node_spot
            else None
        )
        self._allow_task_network(network)

    def _queues(self, config: EnvironmentConfig) -> None:
        """Fair-share queues (lower weight factor = larger share). A job whose resources no instance of the queue
        can ever satisfy is cancelled instead of waiting forever; so is a job waiting for capacity that does not
        come (the hosts already launched for a multi-node job would idle meanwhile; the pipeline retries later)."""
        weights = {"research": config.batch_research_weight, "production": config.batch_production_weight}
        self.scheduling_policy = batch.FairshareSchedulingPolicy(
            self,
            "FairshareSchedulingPolicy",
            share_decay=cdk.Duration.hours(1),
            shares=[batch.Share(share_identifier=name, weight_factor=weights[name]) for name in SHARES],
        )
        unsatisfiable = _cancel_after(30, batch.JobStateTimeLimitActionsReason.JOB_RESOURCE_REQUIREMENT)
        stuck = [unsatisfiable, _cancel_after(CAPACITY_WAIT_MINUTES, NO_CAPACITY)]
        spot_stuck = [unsatisfiable, _cancel_after(SPOT_CAPACITY_WAIT_MINUTES, NO_CAPACITY)]
        self.queue_names: dict[str, str] = {}
        multi_node_stuck = [unsatisfiable, _cancel_after(config.batch_capacity_wait_minutes, NO_CAPACITY)]
        self.multi_node_queue = self._queue(
            "MultiNodeQueue", "multi-node", self.multi_node_environment, multi_node_stuck
        )
        self.single_node_queue = self._queue(
            "SingleNodeQueue",
            "single-node",
            self.single_node_environment,
            spot_stuck if config.batch_single_node_spot else stuck,
        )
        self.single_node_on_demand_queue = (
            self._queue(
                "SingleNodeOnDemandQueue", "single-node-on-demand", self.single_node_on_demand_environment, stuck
            )
            if self.single_node_on_demand_environment
            else None
        )

    def _outputs(self) -> None:
        for name, queue in (
            ("MultiNode", self.multi_node_queue),
            ("SingleNode", self.single_node_queue),
            ("SingleNodeOnDemand", self.single_node_on_demand_queue),
        ):
            if queue is not None:
                cdk.CfnOutput(self, f"{name}QueueArn", value=queue.job_queue_arn)
        for name, definition in self.jobs.names.items():
            # The name, not the ARN: submitted without a revision, it runs the latest active one (SubmitJob).
            cdk.CfnOutput(self, f"{name.capitalize()}JobDefinitionName", value=definition)
        cdk.CfnOutput(self, "JobLogGroupName", value=self.log_group.log_group_name)

    def _never_cut_short(self, jobs: tuple[str, ...]) -> dict:
        """An infrastructure update (new launch-template version, image, user data) waits for running jobs.

        Batch gives running jobs UpdatePolicy.jobExecutionTimeoutMinutes (default 30) before it replaces their
        hosts, and at most 7200 (Batch API reference, UpdatePolicy); config.environment caps the training
        timeout to fit. With terminateJobsOnUpdate false, no attempt is cut short by a `cdk deploy`.
        """
        minutes = max(int(self.jobs.specs[job].timeout.to_minutes()) for job in jobs)
        return {
            "update_timeout": cdk.Duration.minutes(minutes),
            "terminate_on_update": False,
            "replace_compute_environment": False,
        }

    def _single_node_environment(
        self, id_: str, network: NetworkStack, subnets: ec2.SubnetSelection, single: InstanceType, *, spot: bool
    ) -> batch.ManagedEc2EcsComputeEnvironment:
        environment = batch.ManagedEc2EcsComputeEnvironment(
            self,
            id_,
            vpc=network.vpc,
            vpc_subnets=subnets,
            security_groups=[network.efa_security_group],  # reaches FSx, S3 and ECR like the training hosts
            spot=spot,
            # A placeholder the L2 requires; _set_instance_type replaces it with the catalogue's type.
            instance_classes=[ec2.InstanceClass.P5],
            use_optimal_instance_classes=False,
            minv_cpus=0,
            maxv_cpus=SINGLE_NODE_MAX_INSTANCES * single.vcpus,
            images=[machine_image(single)],
            launch_template=self.launch_templates["single_node"].launch_template,
            instance_role=self.instance_role,
            update_to_latest_image_version=True,
            **self._never_cut_short(("validate",)),
        )
        self._launch_template_version(environment, self.launch_templates["single_node"])
        _set_instance_type(environment, single)
        return environment

    def _queue(
        self, id_: str, unit: str, environment: batch.IComputeEnvironment, stuck: list[batch.JobStateTimeLimitAction]
    ) -> batch.JobQueue:
        # A fixed name: the pipeline and the dashboard name the queue instead of reading a reference. JobQueueName
        # is create-only (as are Tags and JobQueueType), so CloudFormation refuses, rather than performs, any change
        # that would replace a named queue, and deleting a queue terminates its jobs (Batch API, DeleteJobQueue).
        self.queue_names[unit.replace("-", "_")] = name = batch_name(self._config.name, unit)
        return batch.JobQueue(
            self,
            id_,
            job_queue_name=name,
            priority=1,
            scheduling_policy=self.scheduling_policy,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=environment, order=1)],
            job_state_time_limit_actions=stuck,
        )

    @staticmethod
    def _launch_template_version(
        environment: batch.ManagedEc2EcsComputeEnvironment, template: EfaLaunchTemplate
    ) -> None:
        # The L2 renders no version, so Batch would keep the template's first version; pinning the latest
        # version number makes a template change update the compute environment.
        cfn(environment).add_property_override(
            "ComputeResources.LaunchTemplate.Version", template.launch_template.latest_version_number
        )

    def _allow_task_network(self, network: NetworkStack) -> None:
        """Multi-node job containers (awsvpc) get the VPC's default group when the environment names none.

        AWS Batch user guide, "Compute environment considerations for MNP"
        (https://docs.aws.amazon.com/batch/latest/userguide/mnp-ce.html). The app strips that group's rules
        (@aws-cdk/aws-ec2:restrictDefaultSecurityGroup), so the task interfaces get back exactly what
        torchrun and the job need: all traffic between the job's containers, HTTPS to AWS APIs.
        """
        default_sg = ec2.SecurityGroup.from_security_group_id(
            self,
            "VpcDefaultSecurityGroup",
            network.vpc.vpc_default_security_group,
            allow_all_outbound=False,
            mutable=True,
        )
        default_sg.add_ingress_rule(
            default_sg, ec2.Port.all_traffic(), "Multi-node job containers: rendezvous, NCCL bootstrap"
        )
        default_sg.add_egress_rule(default_sg, ec2.Port.all_traffic(), "Multi-node job containers: to each other")
        default_sg.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "Job containers: S3, CloudWatch, STS")


if TYPE_CHECKING:  # the type checker holds this stack to the seam the pipeline and observability stacks take
    _SEAM: type[ComputeBackend] = BatchStack
