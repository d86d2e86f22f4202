"""Storage: the data bucket and the FSx for Lustre file system every training node mounts at /fsx."""

import aws_cdk as cdk
from constructs import Construct

from config import EnvironmentConfig
from config.layout import FSX_MOUNT_PATH
from constructs.training_storage import TrainingStorage
from stacks.network_stack import NetworkStack
from stacks.policies import data_removal_policy


class StorageStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, network: NetworkStack,
                 **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        storage = TrainingStorage(
            self, "Storage",
            vpc=network.vpc,
            subnet=network.training_subnet,
            security_group=network.lustre_security_group,
            deployment_type=config.fsx_deployment_type,
            storage_gib=config.fsx_storage_gib,
            throughput_per_tib=config.fsx_throughput_per_tib,
            removal_policy=data_removal_policy(config),
        )
        self.bucket = storage.bucket
        self.file_system = storage.file_system
        self.mount_path = FSX_MOUNT_PATH
        cdk.CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
        cdk.CfnOutput(self, "FileSystemId", value=self.file_system.file_system_id)
        cdk.CfnOutput(self, "MountCommand", value=cdk.Fn.join("", [
            "mount -t lustre -o relatime,flock ", self.file_system.dns_name, "@tcp:/",
            self.file_system.mount_name, f" {FSX_MOUNT_PATH}"]))
