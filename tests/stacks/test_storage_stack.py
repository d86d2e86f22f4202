"""StorageStack alone (with the network it sits in): the environment's TrainingStorage (tests/storage/), the data
bucket's one export, the outputs operators read, and the file system's revision."""

import pytest
from aws_cdk.assertions import Match

from config import load_config
from stacks.storage_stack import file_system_revision
from tests.alone import StacksAlone
from tests.synthesis import context


@pytest.fixture(scope="module")
def prod():
    environment = StacksAlone(env="prod")
    return environment.template(environment.storage())


def test_the_environment_sizes_the_file_system(prod):
    # prod's deployment type, capacity and throughput from cdk.json.
    prod.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "StorageCapacity": 4800,
            "LustreConfiguration": Match.object_like(
                {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 500}
            ),
        },
    )


def test_the_data_buckets_arn_is_exported_once_by_name(prod):
    # Compute and pipeline stacks reach the bucket through one named export (constructs/storage/data_bucket_access.py).
    exports = [o["Export"]["Name"] for o in prod.to_json()["Outputs"].values() if "Export" in o]
    assert exports == ["EfaTraining-prod-Storage-DataBucketArn"]


@pytest.mark.parametrize("output", ["BucketName", "FileSystemId", "MountCommand"])
def test_operators_find_the_storage_in_the_outputs(prod, output):
    prod.has_output(output, {"Value": Match.any_value()})


def test_revision_ignores_changes_that_keep_the_file_system():
    # Throughput and capacity change in place (no new names): no host roll for them; a new VPC range moves it.
    base = load_config(context(env="prod"))
    bigger = load_config(context(env="prod", fsx_storage_gib=9600, fsx_throughput_per_tib=1000))
    moved = load_config(context(env="prod", vpc_cidr="10.9.0.0/16"))
    assert file_system_revision(base, "p") == file_system_revision(bigger, "p") != file_system_revision(moved, "p")
