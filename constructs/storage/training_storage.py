"""Training data storage: an S3 bucket and FSx for Lustre in the training subnet, linked both ways."""

from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_fsx as fsx
import aws_cdk.aws_s3 as s3

from config.layout import CHECKPOINTS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.nag import acknowledge, acknowledge_cdk_provider, acknowledge_iam

# Import what lands in S3 and export what training writes (checkpoints, models, reports), continuously.
_REPOSITORY_EVENTS = ["NEW", "CHANGED", "DELETED"]


# Prefixes rewritten on every run: FSx exports each checkpoint write and each pruned checkpoint's deletion, and a
# versioned bucket keeps every replaced or deleted object as a noncurrent version (S3 user guide, "Deleting object
# versions from a versioning-enabled bucket"). models/ and datasets/ keep their versions.
CHURN_PREFIXES = (CHECKPOINTS_PREFIX, RUNS_PREFIX)


def churn_rules(noncurrent_version_days: int) -> list[s3.LifecycleRule]:
    """Per churning prefix: noncurrent versions expire after `noncurrent_version_days`, delete markers left with no
    version behind them are removed, and so are multipart uploads a killed writer left incomplete (S3 user guide,
    "Lifecycle configuration elements": NoncurrentVersionExpiration, ExpiredObjectDeleteMarker,
    AbortIncompleteMultipartUpload)."""
    return [
        s3.LifecycleRule(
            id=f"expire-old-{prefix.rstrip('/')}",
            prefix=prefix,
            noncurrent_version_expiration=cdk.Duration.days(noncurrent_version_days),
            expired_object_delete_marker=True,
            abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
        )
        for prefix in CHURN_PREFIXES
    ]


def _acknowledge_auto_delete(bucket: s3.Bucket) -> None:
    """The IAM gate's findings on the statement CDK's auto_delete_objects adds to a bucket policy (for its own
    custom resource, which empties the bucket on `cdk destroy`): its wildcard actions expand to actions that take
    another resource type, and it may rewrite the policy (to stop new writes while it deletes)."""
    assert bucket.policy is not None  # auto_delete_objects gives the bucket a policy
    acknowledge_iam(
        bucket.policy,
        "RESOURCE_MISMATCH",
        "s3:List*",
        "CDK's auto-delete statement grants s3:List*; the ListBucket it uses takes the bucket, the other List "
        "actions it expands to take none, which grants nothing more",
    )
    acknowledge_iam(
        bucket.policy,
        "RESOURCE_POLICY_PRIVILEGE_ESCALATION",
        "s3:*",
        "CDK's auto-delete custom resource puts a deny-writes bucket policy before it empties the bucket on "
        "`cdk destroy` (dev only: retain_data=false); its role is the statement's only principal",
    )


class TrainingStorage(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        vpc: ec2.IVpc,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        deployment_type: str,
        storage_gib: int,
        throughput_per_tib: int,
        removal_policy: cdk.RemovalPolicy,
        noncurrent_version_days: int = 7,
    ) -> None:
        super().__init__(scope, id_)
        destroy = removal_policy == cdk.RemovalPolicy.DESTROY
        bucket_defaults: dict[str, Any] = dict(
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            removal_policy=removal_policy,
            auto_delete_objects=destroy,  # dev: `cdk destroy` empties the bucket so it can go
        )
        self.access_logs = s3.Bucket(
            self, "AccessLogs", **bucket_defaults, object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED
        )
        acknowledge(
            self.access_logs,
            "CKV_AWS_18",
            "It is the access-log bucket itself: logging its own log deliveries into it would log the logs without end",
        )
        acknowledge(
            self.access_logs,
            "CKV_AWS_21",
            "S3's log delivery writes each log object once and nothing rewrites it; versions would keep no "
            "earlier state",
        )
        self.bucket = s3.Bucket(
            self,
            "Data",
            **bucket_defaults,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            lifecycle_rules=churn_rules(noncurrent_version_days),
        )
        if destroy:
            for bucket in (self.access_logs, self.bucket):
                _acknowledge_auto_delete(bucket)
            acknowledge_cdk_provider(self, "S3AutoDeleteObjects", "CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117")

        persistent = deployment_type == "PERSISTENT_2"
        self.file_system = fsx.LustreFileSystem(
            self,
            "Lustre",
            vpc=vpc,
            vpc_subnet=subnet,
            security_group=security_group,
            storage_capacity_gib=storage_gib,
            file_system_type_version=fsx.FileSystemTypeVersion.V_2_15,
            lustre_configuration=fsx.LustreConfiguration(
                deployment_type=getattr(fsx.LustreDeploymentType, deployment_type),
                # Throughput tiers exist for persistent file systems only; SCRATCH_2 rejects the field.
                per_unit_storage_throughput=throughput_per_tib if persistent else None,
                data_compression_type=fsx.LustreDataCompressionType.LZ4,
                # Backups only where data is kept (scratch has none); a destroyed dev file system leaves nothing.
                automatic_backup_retention=cdk.Duration.days(7 if persistent and not destroy else 0)
                if persistent
                else None,
            ),
            removal_policy=removal_policy,
        )
        # No L2 for data repository associations; PERSISTENT_2 rejects auto_import_policy, so link S3 here.
        self.data_repository = fsx.CfnDataRepositoryAssociation(
            self,
            "S3Link",
            file_system_id=self.file_system.file_system_id,
            file_system_path="/",
            data_repository_path=f"s3://{self.bucket.bucket_name}/",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=_REPOSITORY_EVENTS),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=_REPOSITORY_EVENTS),
            ),
        )
        self.data_repository.apply_removal_policy(removal_policy)
