"""Storage stack: a locked-down versioned bucket and FSx for Lustre linked to it, in the training subnet."""

import json

import pytest
from aws_cdk.assertions import Match

from tests.conftest import CDK_JSON_CONTEXT


@pytest.fixture(scope="module")
def dev(synth):
    return synth().template("storage")


@pytest.fixture(scope="module")
def prod(synth):
    return synth(env="prod").template("storage")


def _data_bucket(template):
    return next(v for k, v in template.find_resources("AWS::S3::Bucket").items() if "Data" in k)


def test_bucket_is_encrypted_versioned_and_private(dev):
    # Datasets, checkpoints and models: encrypted at rest, versioned, no public access.
    props = _data_bucket(dev)["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}


def test_bucket_refuses_plain_http(dev):
    # TLS only: a Deny on aws:SecureTransport=false.
    dev.has_resource_properties("AWS::S3::BucketPolicy", {"PolicyDocument": {"Statement": Match.array_with([
        Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})])}})


def test_bucket_logs_access_to_a_separate_bucket(dev):
    # Server access logs (cdk-nag S1) go to their own bucket.
    assert "LoggingConfiguration" in _data_bucket(dev)["Properties"]


def test_prod_file_system_is_persistent_2_with_configured_throughput(prod):
    # prod: PERSISTENT_2, 4800 GiB, 500 MB/s/TiB from cdk.json.
    prod.has_resource_properties("AWS::FSx::FileSystem", {
        "FileSystemType": "LUSTRE", "FileSystemTypeVersion": "2.15", "StorageCapacity": 4800,
        "LustreConfiguration": Match.object_like({"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 500}),
    })


def test_scratch_file_system_has_no_throughput_tier(dev):
    # dev: SCRATCH_2 rejects PerUnitStorageThroughput, so it must be absent.
    fs = next(iter(dev.find_resources("AWS::FSx::FileSystem").values()))["Properties"]
    assert fs["LustreConfiguration"]["DeploymentType"] == "SCRATCH_2"
    assert "PerUnitStorageThroughput" not in fs["LustreConfiguration"]


def test_file_system_sits_in_exactly_one_subnet(dev):
    # EFA and FSx share one AZ: the file system gets the training subnet only.
    fs = next(iter(dev.find_resources("AWS::FSx::FileSystem").values()))["Properties"]
    assert len(fs["SubnetIds"]) == 1
    assert "TrainingSubnet" in str(fs["SubnetIds"][0])


def test_file_system_uses_the_lustre_security_group(dev):
    # The group that admits 988 and 1018-1023 from training nodes.
    fs = next(iter(dev.find_resources("AWS::FSx::FileSystem").values()))["Properties"]
    assert "LustreSecurityGroup" in str(fs["SecurityGroupIds"])


def test_bucket_is_linked_both_ways_through_a_data_repository_association(dev):
    # Import datasets from S3 and export checkpoints and models back, continuously.
    events = ["NEW", "CHANGED", "DELETED"]
    dev.has_resource_properties("AWS::FSx::DataRepositoryAssociation", {
        "FileSystemPath": "/",
        "BatchImportMetaDataOnCreate": True,
        "S3": {"AutoImportPolicy": {"Events": events}, "AutoExportPolicy": {"Events": events}},
    })


# A replaced file system (new DNS and mount name) must reach every consumer in the same deploy: consumers read
# the names through Fn::GetStackOutput, which CloudFormation resolves only when the consumer itself is updated
# (CloudFormation template reference, "Fn::GetStackOutput"). The revision in their templates forces that update.
def test_replacing_the_file_system_changes_the_batch_hosts_launch_template(synth):
    def user_data(**overrides):
        raw = synth(compute="batch", **overrides).raw("compute")
        return {k: json.dumps(v["Properties"]["LaunchTemplateData"]["UserData"]) for k, v in raw["Resources"].items()
                if v["Type"] == "AWS::EC2::LaunchTemplate"}

    before, after = user_data(), user_data(fsx_deployment_type="PERSISTENT_2", fsx_storage_gib="2400")
    assert before.keys() == after.keys() and len(before) == 2
    assert all(before[k] != after[k] for k in before)  # both host templates follow the producer
    assert all("StorageLustre" in v and "GetStackOutput" in v for v in after.values())


def test_replacing_the_file_system_renames_the_eks_volume_and_claim(synth):
    # A PersistentVolume's CSI attributes and a claim's volumeName are immutable: new names, not a refused update.
    def claim(**overrides):
        raw = synth(compute="eks", instance_type="g5.12xlarge", **overrides).raw("compute")
        (output,) = [o["Value"] for k, o in raw["Outputs"].items() if k.startswith("WorkspaceFsxClaimName")]
        return output, json.dumps(raw)

    (before, _), (after, raw_after) = claim(), claim(fsx_deployment_type="PERSISTENT_2", fsx_storage_gib="2400")
    assert before != after and before.startswith("fsx-training-") and after.startswith("fsx-training-")
    assert raw_after.count(f'\\"claimName\\":\\"{after}\\"') >= 1  # the runtime's pods use the new claim


def test_revision_ignores_changes_that_keep_the_file_system():
    # Throughput and capacity change in place (no new names): no host roll for them.
    from config import load_config
    from stacks.storage_stack import file_system_revision
    base = load_config({**CDK_JSON_CONTEXT, "env": "prod"})
    bigger = load_config({**CDK_JSON_CONTEXT, "env": "prod", "fsx_storage_gib": "9600", "fsx_throughput_per_tib": "1000"})
    moved = load_config({**CDK_JSON_CONTEXT, "env": "prod", "vpc_cidr": "10.9.0.0/16"})
    assert file_system_revision(base, "p") == file_system_revision(bigger, "p") != file_system_revision(moved, "p")
