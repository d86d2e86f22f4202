"""`pipeline_cli describe`'s bad-host lines (tools/bad_hosts.py) from the records under runs/<run_id>/bad-hosts/."""

import json

import boto3
from moto import mock_aws

from tools import bad_hosts


@mock_aws
def test_a_host_still_pending_and_one_taken_out_are_told_apart():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="data")
    record = {"why": "hung first: held stopped by the kernel", "evidence": ["rank 3 pid 7"]}
    s3.put_object(Bucket="data", Key="runs/r-1/bad-hosts/pending/n-2", Body=json.dumps(record).encode())
    s3.put_object(Bucket="data", Key="runs/r-1/bad-hosts/i-0123456789abcdef0", Body=b"not json")
    assert bad_hosts.lines(s3, "data", "r-1") == [
        "bad host   i-0123456789abcdef0  taken out: no reason recorded",
        "bad host   n-2  pending: hung first: held stopped by the kernel (rank 3 pid 7)",
    ]
    assert bad_hosts.lines(s3, "data", "r-2") == []


@mock_aws
def test_a_bucket_that_cannot_be_read_is_one_line():
    s3 = boto3.client("s3", region_name="us-east-1")
    (line,) = bad_hosts.lines(s3, "no-such-bucket", "r-1")
    assert line.startswith("bad hosts  not read: ") and "NoSuchBucket" in line
