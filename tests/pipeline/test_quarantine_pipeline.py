"""Bad hosts kept out of the next attempt, on Batch, in the emulated pipeline (constructs/pipeline/quarantine.py).

A failed attempt whose job named a host bad (runs/<run_id>/bad-hosts/pending/<instance id>, as
training_image/efa_training/runtime/bad_hosts.py writes it) has that instance terminated in moto's EC2 before the
retry, its record moved to the run's and the environment's lists, and the retry does not count against the run.
"""

import json

import boto3
import pytest

from tests.pipeline.runs import ACCEPTED, RUN, approved_model, messages
from tests.sfn_emulator import REGION

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)


@pytest.fixture
def host(emulator) -> str:
    """One running instance of this environment's compute environments (their instance tags: app.py's Project and
    Environment, which the pipeline's ec2:TerminateInstances is conditioned on)."""
    ec2 = boto3.client("ec2", region_name=REGION)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    tags = [{"Key": "Project", "Value": "efa-training"}, {"Key": "Environment", "Value": "dev"}]
    (instance,) = ec2.run_instances(
        ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=[{"ResourceType": "instance", "Tags": tags}]
    )["Instances"]
    return instance["InstanceId"]


def state_of(instance_id: str) -> str:
    (reservation,) = boto3.client("ec2", region_name=REGION).describe_instances(InstanceIds=[instance_id])[
        "Reservations"
    ]
    return reservation["Instances"][0]["State"]["Name"]


def keys(emulator, prefix: str) -> list[str]:
    return [o["Key"] for o in emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix=prefix).get("Contents", [])]


def test_a_host_the_training_named_bad_is_terminated_before_the_retry(emulator, host):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [1, True]}
    emulator.bad_hosts = {"train": [[host]]}
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert state_of(host) in ("shutting-down", "terminated")
    assert emulator.submitted_kinds() == ["sanity", "train", "train", "validate"]
    assert approved_model(emulator) is not None


def test_the_bad_hosts_record_moves_to_the_runs_and_the_environments_list(emulator, host):
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [1, True]}
    emulator.bad_hosts = {"train": [[host]]}
    run_id = RUN["run_id"]
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert keys(emulator, f"runs/{run_id}/bad-hosts/pending/") == []
    assert keys(emulator, f"runs/{run_id}/bad-hosts/") == [f"runs/{run_id}/bad-hosts/{host}"]
    kept = emulator.s3.get_object(Bucket=emulator.bucket, Key=f"bad-hosts/{host}")
    assert json.loads(kept["Body"].read())["evidence"] == ["Xid 79 on GPU 3"]


def test_a_quarantine_retry_does_not_count_against_the_runs_attempts(emulator, host):
    # The run's 3 retries of failed attempts are all still there after the quarantine (like a capacity wait).
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [1, False, False, False, True]}
    emulator.bad_hosts = {"train": [[host]]}
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert emulator.submitted_kinds() == ["sanity"] + ["train"] * 5 + ["validate"]


def test_a_sanity_check_that_named_a_bad_host_is_retried_on_a_fresh_one(emulator, host):
    # Sanity has one retry of its own (SANITY_RETRIES); a quarantine leaves it untouched.
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"sanity": [1, False, True]}
    emulator.bad_hosts = {"sanity": [[host]]}
    result = emulator.run(RUN)
    assert result["status"] == "SUCCEEDED", result
    assert state_of(host) in ("shutting-down", "terminated")
    assert emulator.submitted_kinds()[:3] == ["sanity"] * 3


def test_a_host_that_cannot_be_terminated_still_ends_in_the_record_and_the_run_goes_on(emulator):
    # An id EC2 does not know (already gone and forgotten): TerminateInstances fails, the record still moves.
    emulator.verdict = ACCEPTED
    emulator.outcomes = {"train": [1, True]}
    emulator.bad_hosts = {"train": [["i-0123456789abcdef0"]]}
    assert emulator.run(RUN)["status"] == "SUCCEEDED"
    assert keys(emulator, "bad-hosts/i-0123456789abcdef0") == ["bad-hosts/i-0123456789abcdef0"]


def test_quarantines_are_bounded(emulator, host):
    # A job that names a bad host on every attempt is not retried for ever: after QUARANTINE_RETRIES (2) quarantines
    # the run fails, its alert naming the quarantine.
    emulator.outcomes = {"train": [1]}
    emulator.bad_hosts = {"train": [[host]] * 20}
    result = emulator.run(RUN)
    assert result["status"] == "FAILED" and result.get("error") == "TrainingFailed"
    assert emulator.submitted_kinds().count("train") == 1 + 2
    (alert,) = messages(emulator)
    assert alert["detail"] == "HostsQuarantined"
