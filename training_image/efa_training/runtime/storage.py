"""JSON documents at a local path or at s3://bucket/key (reports, baselines, verdicts), and files written whole.

S3 is written directly with boto3: the Step Functions pipeline reads verdicts with s3:GetObject,
and an FSx-to-S3 export would arrive asynchronously, possibly after the read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from efa_training.runtime.errors import UsageError


def split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key:
        raise UsageError("s3 uri", uri, "needs a bucket and a key", "s3://bucket/key")
    return bucket, key


def read_json(location: str) -> dict | None:
    """The JSON document at `location`, or None if there is none."""
    if location.startswith("s3://"):
        import boto3
        from botocore.exceptions import ClientError

        bucket, key = split_s3(location)
        try:
            body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise  # AccessDenied, NoSuchBucket...: an error, not "no document yet"
        return json.loads(body)
    path = Path(location)
    return json.loads(path.read_text()) if path.exists() else None


def write_json(location: str, doc: dict) -> None:
    text = json.dumps(doc, indent=2, allow_nan=False) + "\n"  # NaN/Infinity: not JSON, refused here
    if location.startswith("s3://"):
        import boto3

        bucket, key = split_s3(location)
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=text.encode(), ContentType="application/json")
        return
    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a document


def under_prefix(prefix: str, run_id: str, name: str) -> str:
    """`<prefix><run_id>/<name>` for an s3:// or local prefix (a missing trailing '/' is added)."""
    return f"{prefix if prefix.endswith('/') else prefix + '/'}{run_id}/{name}"


def write_atomically(path: Path, header: bytes, body: bytes) -> None:
    """A shard file written under a temporary name, fsynced, then renamed: a reader never sees half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
