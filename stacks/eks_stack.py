"""EKS compute backend (-c compute=eks): cluster, accelerator node group, training workspace, pipeline job runner."""

import aws_cdk as cdk
from constructs import Construct

from config import EnvironmentConfig
from config.layout import RUNS_PREFIX
from constructs.eks_accelerator_nodegroup import EksAcceleratorNodegroup
from constructs.eks_cluster import EksTrainingCluster
from constructs.eks_job_runner import EksJobRunner
from constructs.eks_training_workspace import EksTrainingWorkspace
from stacks.network_stack import NetworkStack
from stacks.policies import log_retention
from stacks.registry_stack import RegistryStack
from stacks.storage_stack import StorageStack


class EksStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, network: NetworkStack,
                 storage: StorageStack, registry: RegistryStack, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self.instance = config.instance
        self.nodes = config.nodes
        self.image_uri = registry.image_uri
        training = EksTrainingCluster(self, "Training", vpc=network.vpc, instance=config.instance,
                                      admin_role_arns=config.eks_admin_role_arns)
        self.cluster = training.cluster
        self.cluster_name = self.cluster.cluster_name
        self.addons = training.addons
        self.charts = training.charts
        accelerators = EksAcceleratorNodegroup(
            self, "Accelerators", cluster=self.cluster, instance=config.instance, subnet=network.training_subnet,
            efa_security_group=network.efa_security_group, nodes=config.nodes, capacity_type=config.eks_capacity_type,
            capacity_reservation_id=config.eks_capacity_reservation_id)
        self.nodegroup = accelerators.nodegroup
        self.launch_template = accelerators.launch_template
        # A named export: the pod role's S3 statements (and their cdk-nag acknowledgements) name it verbatim.
        bucket_arn_export = f"{storage.stack_name}-DataBucketArn"
        if storage.node.try_find_child(f"Export{bucket_arn_export}") is None:  # PipelineStack shares it
            storage.export_value(storage.bucket.bucket_arn, name=bucket_arn_export)
        self.add_stack_dependency(storage)
        self.workspace = EksTrainingWorkspace(
            self, "Workspace", cluster=self.cluster, bucket_arn_export=bucket_arn_export,
            file_system=storage.file_system,
            storage_gib=config.fsx_storage_gib, instance=config.instance, image=registry.image_uri,
            nodes=config.nodes, trainer_chart=training.charts["trainer"],
            fsx_csi_driver=training.addons["aws-fsx-csi-driver"], fsx_revision=storage.file_system_revision,
            environment=config.name)
        # The pipeline (PipelineStack) runs its jobs through this.
        self.job_runner = EksJobRunner(cluster=self.cluster, instance=config.instance, image=registry.image_uri,
                                       max_nodes=config.nodes, nodegroup=self.nodegroup,
                                       runs_uri=f"s3://{storage.bucket.bucket_name}/{RUNS_PREFIX}",
                                       log_retention=log_retention(config), site=self.workspace.site)
        cdk.CfnOutput(self, "ClusterName", value=self.cluster.cluster_name)
        cdk.CfnOutput(self, "KubeconfigCommand", value=cdk.Fn.join("", [
            "aws eks update-kubeconfig --region ", self.region, " --name ", self.cluster.cluster_name]))
