"""What `cdk destroy` leaves behind: nothing billable in dev; the data bucket and its contents in prod."""

import pytest


def _policies(template, kind):
    return [(r.get("DeletionPolicy"), r.get("UpdateReplacePolicy")) for r in template.find_resources(kind).values()]


@pytest.mark.parametrize("unit,kind", [
    ("storage", "AWS::S3::Bucket"), ("storage", "AWS::FSx::FileSystem"), ("registry", "AWS::ECR::Repository"),
    ("network", "AWS::Logs::LogGroup"), ("alerts", "AWS::KMS::Key")])
def test_dev_deletes(synth, unit, kind):
    # dev: everything goes on destroy.
    assert set(_policies(synth().template(unit), kind)) == {("Delete", "Delete")}


def test_dev_buckets_are_emptied_before_deletion(synth):
    # A non-empty bucket cannot be deleted: the auto-delete custom resource empties each one.
    storage = synth().template("storage")
    assert len(storage.find_resources("Custom::S3AutoDeleteObjects")) == len(storage.find_resources("AWS::S3::Bucket"))


def test_dev_repositories_are_emptied_before_deletion(synth):
    # ECR refuses to delete a repository with images unless EmptyOnDelete is set.
    for repository in synth().template("registry").find_resources("AWS::ECR::Repository").values():
        assert repository["Properties"]["EmptyOnDelete"] is True


def test_dev_persistent_file_system_keeps_no_backups(synth):
    # A destroyed dev file system leaves no billable backups, even on PERSISTENT_2.
    storage = synth(fsx_deployment_type="PERSISTENT_2").template("storage")
    fs = next(iter(storage.find_resources("AWS::FSx::FileSystem").values()))["Properties"]
    assert fs["LustreConfiguration"]["AutomaticBackupRetentionDays"] == 0


def test_prod_file_system_keeps_a_week_of_backups(synth):
    # prod keeps its data: automatic daily backups for 7 days.
    fs = next(iter(synth(env="prod").template("storage").find_resources("AWS::FSx::FileSystem").values()))
    assert fs["Properties"]["LustreConfiguration"]["AutomaticBackupRetentionDays"] == 7


@pytest.mark.parametrize("unit,kind", [
    ("storage", "AWS::S3::Bucket"), ("storage", "AWS::FSx::FileSystem"), ("registry", "AWS::ECR::Repository")])
def test_prod_retains(synth, unit, kind):
    # prod: data, models and images survive `cdk destroy`.
    assert set(_policies(synth(env="prod").template(unit), kind)) == {("Retain", "Retain")}


def test_prod_buckets_are_never_emptied(synth):
    # Retained buckets keep their contents: no auto-delete custom resource in prod.
    assert synth(env="prod").template("storage").find_resources("Custom::S3AutoDeleteObjects") == {}
