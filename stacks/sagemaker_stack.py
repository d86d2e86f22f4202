"""SageMaker compute backend (-c compute=sagemaker): the training jobs' role and the pipeline's job runner.

A `ComputeBackend` (constructs/compute/backend.py) with nothing that runs between jobs: SageMaker provisions each
training job's instances in the training subnet and releases them when the job ends, so there are no compute
environments, node groups or idle hosts. `job_runner` creates the pipeline's jobs with Step Functions'
`sagemaker:createTrainingJob.sync`, directly rather than through AWS Batch's service environments for SageMaker:
the direct integration waits for the job, stops it when its state times out or the execution stops, and is
emulated in this repository's tests; queueing adds a poll loop and fair-share queues one pipeline does not need
(README, "SageMaker backend").
"""

from typing import TYPE_CHECKING

import aws_cdk as cdk
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from config import EnvironmentConfig
from constructs import Construct
from constructs.compute.backend import ComputeBackend
from constructs.compute.sagemaker.execution_role import TRAINING_LOG_GROUP, SageMakerExecutionRole
from constructs.compute.sagemaker.job_runner import SageMakerJobRunner
from constructs.compute.shared.workload_pull import grant_workload_pull
from constructs.observability.accelerator_metrics import accelerator_metrics
from constructs.storage.tracking import grant_tracking, tracking_uri
from stacks.network_stack import NetworkStack
from stacks.registry_stack import RegistryStack
from stacks.storage_stack import StorageStack


class SageMakerStack(cdk.Stack):
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
        fsx = config.sagemaker_data_source == "fsx"
        self.execution_role = SageMakerExecutionRole(
            self, "Execution", data_access=storage.data_access, file_system=fsx
        ).role
        registry.image_repository.grant_pull(self.execution_role)
        grant_workload_pull(self, self.execution_role, config.name)  # registered workloads' images
        grant_tracking(self.execution_role, config)
        file_system = None
        if fsx:
            # The file system's revision rides along so that a replaced file system changes the pipeline's
            # template and the same deploy re-resolves its id and mount name (stacks/storage_stack.py).
            file_system = (
                storage.file_system.file_system_id,
                storage.file_system.mount_name,
                storage.file_system_revision,
            )
        # The pipeline (PipelineStack) runs its jobs through this.
        self.job_runner = SageMakerJobRunner(
            image=registry.image_uri,
            role=self.execution_role,
            bucket_name=storage.bucket.bucket_name,
            subnet_id=network.training_subnet.subnet_id,
            # The zone the subnet was made in (availability_zone, else the VPC's first), not its GetAtt: no export.
            subnet_zone=network.training_subnet.availability_zone,
            security_group_id=network.efa_security_group.security_group_id,
            instance=config.instance,
            validation_instance=config.single_node_instance,
            environment=config.name,
            train_attempt_hours=config.batch_train_timeout_hours,
            spot=config.sagemaker_spot,
            file_system=file_system,
            neuron_cc_flags=config.neuron_cc_flags,
            tracking_uri=tracking_uri(self, config),
            training_plan=config.reservation.training_plan if config.reservation else None,
            capacity_wait_hours=config.capacity_wait_hours,  # a managed Spot attempt's allowance for Spot waits
        )
        self.accelerator_metrics = accelerator_metrics(
            "sagemaker",
            config.instance.accelerator,
            environment=config.name,
        )
        self.job_queue_names: list[str] = []  # Jobs go straight to SageMaker
        cdk.CfnOutput(self, "ExecutionRoleArn", value=self.execution_role.role_arn)
        cdk.CfnOutput(self, "TrainingInstanceType", value=config.instance.sagemaker_instance_type)
        cdk.CfnOutput(self, "ValidationInstanceType", value=config.single_node_instance.sagemaker_instance_type)
        cdk.CfnOutput(self, "ManagedSpot", value=str(config.sagemaker_spot).lower())
        cdk.CfnOutput(self, "DataSource", value=config.sagemaker_data_source)
        cdk.CfnOutput(self, "TrainingLogGroup", value=TRAINING_LOG_GROUP)

    def attach_pipeline(self, scope: Construct, state_machine: sfn.StateMachine, alerts: sns.ITopic) -> None:
        """Nothing to add: SageMaker starts and releases each job's instances itself."""


if TYPE_CHECKING:  # the type checker holds this stack to the seam the pipeline and observability stacks take
    _SEAM: type[ComputeBackend] = SageMakerStack
