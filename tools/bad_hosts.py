"""A run's bad hosts, as `pipeline_cli describe` shows them: the records under `runs/<run_id>/bad-hosts/`.

A host the training named bad (training_image/efa_training/runtime/bad_hosts.py) waits under `pending/` until the
pipeline takes it out before the retry (constructs/pipeline/quarantine.py), which moves its record up one level.
"""

import json

from config.layout import BAD_HOSTS_PENDING, BAD_HOSTS_PREFIX, RUNS_PREFIX

MAX_SHOWN = 20  # a run that named more has a bigger problem than this list shows


def lines(s3, bucket: str, run_id: str) -> list[str]:
    """One line per recorded host: its id, whether it was taken out, why and the first evidence; [] for none."""
    from botocore.exceptions import BotoCoreError, ClientError

    prefix = f"{RUNS_PREFIX}{run_id}/{BAD_HOSTS_PREFIX}"
    try:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
        shown = [_line(key, s3.get_object(Bucket=bucket, Key=key)["Body"].read(16 * 1024)) for key in keys[:MAX_SHOWN]]
    except (ClientError, BotoCoreError) as error:
        return [f"bad hosts  not read: {error}"]
    more = len(keys) - MAX_SHOWN
    return shown + ([f"bad host   ... and {more} more under s3://{bucket}/{prefix}"] if more > 0 else [])


def _line(key: str, body: bytes) -> str:
    try:
        record = json.loads(body)
    except ValueError:
        record = {}
    record = record if isinstance(record, dict) else {}
    state = "pending" if f"/{BAD_HOSTS_PENDING}" in key else "taken out"
    evidence = record.get("evidence") if isinstance(record.get("evidence"), list) else []
    detail = f" ({evidence[0]})" if evidence else ""
    return f"bad host   {key.rsplit('/', 1)[-1]}  {state}: {record.get('why', 'no reason recorded')}{detail}"
