"""Storage: the data bucket, the FSx for Lustre file system every training node mounts at /fsx, and the runs table."""

import hashlib
import json

import aws_cdk as cdk

from config import EnvironmentConfig
from config.layout import FSX_MOUNT_PATH, RUNS_TABLE_OUTPUT
from constructs import Construct
from constructs.storage.data_bucket_access import DataBucketAccess
from constructs.storage.runs_table import RunsTable
from constructs.storage.tracking import TrackingServer
from constructs.storage.training_storage import TrainingStorage
from stacks.network_stack import NetworkStack
from stacks.policies import data_removal_policy


def file_system_revision(config: EnvironmentConfig, path: str) -> str:
    """A fingerprint of everything whose change replaces the file system (a new DNS and mount name).

    Why: consumers read the names through weak references (Fn::GetStackOutput), which CloudFormation resolves
    only when the consuming stack itself is updated ("Fn::GetStackOutput", CloudFormation template reference).
    A replaced file system with unchanged consumers would leave every new host mounting the old name, failing
    and powering itself off, in a loop. Consumers write this fingerprint into what they render (host user
    data, the EKS volume's name), so a replacement changes their templates too, and the same `cdk deploy`
    updates them and re-resolves the names. Chosen over classic exports (CloudFormation refuses to change an
    export in use, so replacing the file system would fail the deploy) and over SSM parameters read at boot
    (correct for new hosts only: running EKS nodes and the static volume would keep the old name).
    AWS::FSx::FileSystem: a new DeploymentType, SubnetIds or SecurityGroupIds requires replacement; the subnet
    follows from the VPC range and the zone; the construct path is the logical id.
    """
    inputs = {
        "path": path,
        "deployment_type": config.fsx_deployment_type,
        "lustre": "2.15",
        "region": config.region,
        "vpc_cidr": config.vpc_cidr,
        "availability_zone": config.availability_zone,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:10]


class StorageStack(cdk.Stack):
    def __init__(
        self, scope: Construct, id_: str, *, config: EnvironmentConfig, network: NetworkStack, **kwargs
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        storage = TrainingStorage(
            self,
            "Storage",
            vpc=network.vpc,
            subnet=network.training_subnet,
            security_group=network.lustre_security_group,
            deployment_type=config.fsx_deployment_type,
            storage_gib=config.fsx_storage_gib,
            throughput_per_tib=config.fsx_throughput_per_tib,
            removal_policy=data_removal_policy(config),
            noncurrent_version_days=config.noncurrent_version_days,
        )
        self.bucket = storage.bucket
        self.file_system = storage.file_system
        self.file_system_revision = file_system_revision(config, self.file_system.node.path)
        self.mount_path = FSX_MOUNT_PATH
        # The compute and pipeline stacks reach the bucket through this (its ARN through one named export).
        self.data_access = DataBucketAccess(self, self.bucket)
        # The pipeline's claims of run ids (constructs/pipeline/run_claim.py), kept with the data.
        self.runs_table = RunsTable(self, "Runs", removal_policy=data_removal_policy(config)).table
        # The runs' MLflow server, where config tracking_server asks for one (constructs/storage/tracking.py).
        if config.tracking_server:
            tracking = TrackingServer(
                self,
                "Tracking",
                environment=config.name,
                bucket=self.bucket,
                size=config.tracking_server,
                removal_policy=data_removal_policy(config),
            )
            cdk.CfnOutput(self, "TrackingServerArn", value=tracking.server.attr_tracking_server_arn)
        cdk.CfnOutput(self, "BucketName", value=self.bucket.bucket_name)
        cdk.CfnOutput(self, RUNS_TABLE_OUTPUT, value=self.runs_table.table_name)  # `pipeline_cli list` reads it
        cdk.CfnOutput(self, "FileSystemId", value=self.file_system.file_system_id)
        cdk.CfnOutput(
            self,
            "MountCommand",
            value=cdk.Fn.join(
                "",
                [
                    "mount -t lustre -o relatime,flock ",
                    self.file_system.dns_name,
                    "@tcp:/",
                    self.file_system.mount_name,
                    f" {FSX_MOUNT_PATH}",
                ],
            ),
        )
