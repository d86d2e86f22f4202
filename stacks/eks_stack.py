"""EKS compute backend (-c compute=eks): cluster, accelerator node group, training workspace, pipeline job runner.

A `ComputeBackend` (constructs/compute/backend.py): `job_runner` runs the pipeline's jobs as Indexed Jobs, and
`attach_pipeline` adds the reconciler that brings the node groups to zero when no execution runs (the pipeline sizes
them itself: node_scaling.py).
"""

from typing import TYPE_CHECKING

import aws_cdk as cdk
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from config import EnvironmentConfig
from config.layout import MODELS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.compute.backend import TRAINING, VALIDATION, ComputeBackend
from constructs.compute.eks.accelerator_nodegroup import (
    VALIDATION_NODES,
    EksAcceleratorNodegroup,
    EksValidationNodegroup,
)
from constructs.compute.eks.cluster import EksTrainingCluster, as_icluster
from constructs.compute.eks.job_runner import EksJobRunner
from constructs.compute.eks.node_lease import NodeLease
from constructs.compute.eks.node_reconciler import EksNodeReconciler
from constructs.compute.eks.node_scaling import EksNodeScaling, SizedGroup
from constructs.compute.eks.training_workspace import EksTrainingWorkspace
from constructs.observability.accelerator_metrics import accelerator_metrics
from constructs.storage.tracking import grant_tracking, tracking_uri
from stacks.network_stack import NetworkStack
from stacks.policies import data_removal_policy, log_retention
from stacks.registry_stack import RegistryStack
from stacks.storage_stack import StorageStack


class EksStack(cdk.Stack):
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
        self.instance = config.instance
        self.nodes = config.nodes
        self.image_uri = registry.image_uri
        training = EksTrainingCluster(
            self,
            "Training",
            vpc=network.vpc,
            instance=config.instance,
            admin_role_arns=config.eks_admin_role_arns,
            kubeflow_trainer=config.eks_kubeflow_trainer,
            public_access_cidrs=config.eks_public_access_cidrs,
            log_retention=log_retention(config),
            removal_policy=data_removal_policy(config),
        )
        self.cluster = training.cluster
        self.cluster_name = self.cluster.cluster_name
        self.addons = training.addons
        self.charts = training.charts
        accelerators = EksAcceleratorNodegroup(
            self,
            "Accelerators",
            cluster=self.cluster,
            instance=config.instance,
            subnet=network.training_subnet,
            efa_security_group=network.efa_security_group,
            nodes=config.nodes,
            capacity_type=config.eks_capacity_type,
            reservation=config.reservation,
        )
        self.nodegroup = accelerators.nodegroup
        self.launch_template = accelerators.launch_template
        # Validation on the catalogue's small type, as on Batch and SageMaker, not on a whole training node.
        self.validation_nodegroup = EksValidationNodegroup(
            self,
            "Validation",
            cluster=self.cluster,
            instance=config.single_node_instance,
            subnet=network.training_subnet,
            efa_security_group=network.efa_security_group,
        ).nodegroup
        self.node_scaling = EksNodeScaling(
            cluster_name=self.cluster.cluster_name,
            groups={
                TRAINING: SizedGroup(self.nodegroup, config.nodes),
                VALIDATION: SizedGroup(self.validation_nodegroup, VALIDATION_NODES),
            },
            lease=NodeLease(table=storage.runs_table, environment=config.name),  # one run at a time (node_lease.py)
            training_wait_minutes=config.eks_node_wait_minutes,
        )
        self.add_stack_dependency(storage)
        self.workspace = EksTrainingWorkspace(
            self,
            "Workspace",
            cluster=self.cluster,
            data_access=storage.data_access,
            file_system=storage.file_system,
            storage_gib=config.fsx_storage_gib,
            instance=config.instance,
            image=registry.image_uri,
            nodes=config.nodes,
            trainer_chart=training.charts.get("trainer"),
            fsx_csi_driver=training.addons["aws-fsx-csi-driver"],
            fsx_revision=storage.file_system_revision,
            environment=config.name,
            neuron_cc_flags=config.neuron_cc_flags,
            tracking_uri=tracking_uri(self, config),
        )
        grant_tracking(self.workspace.role, config)
        # The pipeline (PipelineStack) runs its jobs through this.
        self.job_runner = EksJobRunner(
            cluster=as_icluster(self.cluster),
            instance=config.instance,
            image=registry.image_uri,
            max_nodes=config.nodes,
            validation_instance=config.single_node_instance,
            node_scaling=self.node_scaling,
            runs_uri=f"s3://{storage.bucket.bucket_name}/{RUNS_PREFIX}",
            models_uri=f"s3://{storage.bucket.bucket_name}/{MODELS_PREFIX}",
            site=self.workspace.site,
            train_attempt_hours=config.batch_train_timeout_hours,
        )
        self.accelerator_metrics = accelerator_metrics(
            "eks", config.instance.accelerator, environment=config.name, cluster_name=self.cluster.cluster_name
        )
        self.job_queue_names: list[str] = []  # Jobs go straight to the cluster
        self._log_retention = log_retention(config)
        self._alarm_prefix = config.stack_prefix  # as the observability stack's alarms are named
        cdk.CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
        command, description = kubeconfig_command(self.region, self.cluster.cluster_name, config.eks_admin_role_arns)
        cdk.CfnOutput(self, "KubeconfigCommand", value=command, description=description)

    def attach_pipeline(self, scope: Construct, state_machine: sfn.StateMachine, alerts: sns.ITopic) -> None:
        """What no pipeline state can catch (a timed-out or aborted execution): node groups to 0 when none runs; its
        own failures page `alerts` (nodes left up by a failing reconciler cost their hourly price)."""
        self.reconciler = EksNodeReconciler(
            scope,
            "EksNodeReconciler",
            scaling=self.node_scaling,
            pipeline=state_machine,
            log_retention=self._log_retention,
            alerts=alerts,
            alarm_name=f"{self._alarm_prefix}-eks-reconciler-failing",
        )


def kubeconfig_command(region: str, cluster_name: str, admin_role_arns: tuple[str, ...]) -> tuple[str, str]:
    """`aws eks update-kubeconfig` for the cluster, as the first role of eks_admin_role_arns (the roles
    EksTrainingCluster gives an AmazonEKSClusterAdminPolicy access entry), and the output's description. --role-arn:
    the role kubectl authenticates as, "Otherwise, the IAM entity in your default AWS CLI or SDK credential chain is
    used" (AWS CLI reference, `aws eks update-kubeconfig`); an IAM user of eks_admin_role_arns is no role to assume."""
    command = ["aws eks update-kubeconfig --region ", region, " --name ", cluster_name]
    roles = [arn for arn in admin_role_arns if ":role/" in arn]
    if not roles:
        return cdk.Fn.join("", command), (
            "No role in eks_admin_role_arns: add --role-arn <a role with an access entry on the cluster> (set "
            "eks_admin_role_arns, docs/eks.md kubectl access), or run it as the IAM user eks_admin_role_arns names"
        )
    return cdk.Fn.join("", [*command, " --role-arn ", roles[0]]), (
        "kubectl as the first role of eks_admin_role_arns (cluster admin). Leave --role-arn out where your "
        "credentials already are that role's: a role assumes itself only where its own trust policy allows it"
    )


if TYPE_CHECKING:  # the type checker holds this stack to the seam the pipeline and observability stacks take
    _SEAM: type[ComputeBackend] = EksStack
