"""TrainingStorage alone, in a bare stack: a locked-down versioned bucket and FSx for Lustre linked to it, in one
subnet, kept or deleted on `cdk destroy` as the environment says."""

from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import pytest
from aws_cdk.assertions import Match, Template

from constructs.storage.training_storage import TrainingStorage


def _storage(
    deployment_type: str = "SCRATCH_2",
    storage_gib: int = 1200,
    throughput_per_tib: int = 125,
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
) -> Template:
    stack = cdk.Stack()
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0)
    subnet = ec2.PrivateSubnet(
        stack, "TrainingSubnet", vpc_id=vpc.vpc_id, availability_zone="us-east-1a", cidr_block="10.0.224.0/19"
    )
    group = ec2.SecurityGroup(stack, "LustreSecurityGroup", vpc=vpc)
    TrainingStorage(
        stack,
        "Storage",
        vpc=vpc,
        subnet=subnet,
        security_group=group,
        deployment_type=deployment_type,
        storage_gib=storage_gib,
        throughput_per_tib=throughput_per_tib,
        removal_policy=removal_policy,
    )
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def scratch() -> Template:
    return _storage()


@pytest.fixture(scope="module")
def persistent_kept() -> Template:
    return _storage("PERSISTENT_2", 4800, 500, cdk.RemovalPolicy.RETAIN)


def _data_bucket(template: Template) -> Mapping[str, Any]:
    return next(v for k, v in template.find_resources("AWS::S3::Bucket").items() if "Data" in k)


def _file_system(template: Template) -> Mapping[str, Any]:
    (file_system,) = template.find_resources("AWS::FSx::FileSystem").values()
    return file_system


def test_bucket_is_encrypted_versioned_and_private(scratch):
    # Datasets, checkpoints and models: encrypted at rest, versioned, no public access.
    props = _data_bucket(scratch)["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }


def test_bucket_refuses_plain_http(scratch):
    # TLS only: a Deny on aws:SecureTransport=false.
    scratch.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )


def test_bucket_logs_access_to_a_separate_bucket(scratch):
    # Server access logs (cdk-nag S1) go to their own bucket.
    logging = _data_bucket(scratch)["Properties"]["LoggingConfiguration"]
    assert "AccessLogs" in logging["DestinationBucketName"]["Ref"]


def test_persistent_file_system_has_the_configured_throughput(persistent_kept):
    # PERSISTENT_2 (prod in cdk.json): the capacity and the MB/s per TiB tier asked for, Lustre 2.15.
    persistent_kept.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "FileSystemType": "LUSTRE",
            "FileSystemTypeVersion": "2.15",
            "StorageCapacity": 4800,
            "LustreConfiguration": Match.object_like(
                {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 500}
            ),
        },
    )


def test_scratch_file_system_has_no_throughput_tier(scratch):
    # SCRATCH_2 rejects PerUnitStorageThroughput, so it must be absent.
    lustre = _file_system(scratch)["Properties"]["LustreConfiguration"]
    assert lustre["DeploymentType"] == "SCRATCH_2"
    assert "PerUnitStorageThroughput" not in lustre


def test_file_system_sits_in_exactly_one_subnet(scratch):
    # EFA and FSx share one AZ: the file system gets the training subnet only.
    subnets = _file_system(scratch)["Properties"]["SubnetIds"]
    assert len(subnets) == 1 and "TrainingSubnet" in str(subnets[0])


def test_file_system_uses_the_lustre_security_group(scratch):
    # The group that admits 988 and 1018-1023 from training nodes.
    assert "LustreSecurityGroup" in str(_file_system(scratch)["Properties"]["SecurityGroupIds"])


def test_bucket_is_linked_both_ways_through_a_data_repository_association(scratch):
    # Import datasets from S3 and export checkpoints and models back, continuously.
    events = ["NEW", "CHANGED", "DELETED"]
    scratch.has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "FileSystemPath": "/",
            "BatchImportMetaDataOnCreate": True,
            "S3": {"AutoImportPolicy": {"Events": events}, "AutoExportPolicy": {"Events": events}},
        },
    )


# ---- `cdk destroy`: DESTROY (dev) leaves nothing billable; RETAIN (prod) keeps the data --------------------------


@pytest.mark.parametrize("kind", ["AWS::S3::Bucket", "AWS::FSx::FileSystem", "AWS::FSx::DataRepositoryAssociation"])
def test_destroyed_storage_deletes_and_kept_storage_retains(scratch, persistent_kept, kind):
    for template, expected in ((scratch, "Delete"), (persistent_kept, "Retain")):
        resources = template.find_resources(kind).values()
        policies = {(r.get("DeletionPolicy"), r.get("UpdateReplacePolicy")) for r in resources}
        assert policies == {(expected, expected)}, (kind, expected)


def test_destroyed_buckets_are_emptied_before_deletion(scratch):
    # A non-empty bucket cannot be deleted: the auto-delete custom resource empties each one.
    buckets = scratch.find_resources("AWS::S3::Bucket")
    assert len(buckets) == 2  # data and access logs
    assert len(scratch.find_resources("Custom::S3AutoDeleteObjects")) == len(buckets)


def test_kept_buckets_are_never_emptied(persistent_kept):
    # Retained buckets keep their contents: no auto-delete custom resource.
    assert persistent_kept.find_resources("Custom::S3AutoDeleteObjects") == {}


def test_a_destroyed_persistent_file_system_keeps_no_backups():
    # A destroyed dev file system leaves no billable backups, even on PERSISTENT_2.
    destroyed = _storage("PERSISTENT_2", 2400, 125, cdk.RemovalPolicy.DESTROY)
    assert _file_system(destroyed)["Properties"]["LustreConfiguration"]["AutomaticBackupRetentionDays"] == 0


def test_a_kept_file_system_keeps_a_week_of_backups(persistent_kept):
    # prod keeps its data: automatic daily backups for 7 days.
    assert _file_system(persistent_kept)["Properties"]["LustreConfiguration"]["AutomaticBackupRetentionDays"] == 7


def test_old_checkpoint_and_report_versions_expire_and_models_keep_theirs():
    # FSx exports every checkpoint write and prune; a versioned bucket keeps each replaced or deleted object as a
    # noncurrent version (S3 user guide, "Deleting object versions from a versioning-enabled bucket").
    (bucket,) = [
        b["Properties"]
        for b in _storage().find_resources("AWS::S3::Bucket").values()
        if b["Properties"].get("VersioningConfiguration")
    ]
    rules = {rule["Prefix"]: rule for rule in bucket["LifecycleConfiguration"]["Rules"]}
    assert set(rules) == {"checkpoints/", "runs/"}  # models/ and datasets/ keep every version
    for rule in rules.values():
        assert rule["Status"] == "Enabled"
        assert rule["NoncurrentVersionExpiration"] == {"NoncurrentDays": 7}
        assert rule["ExpiredObjectDeleteMarker"] is True
        assert rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
