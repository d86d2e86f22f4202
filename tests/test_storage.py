"""Storage stack: a locked-down versioned bucket and FSx for Lustre linked to it, in the training subnet."""

import pytest
from aws_cdk.assertions import Match


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
