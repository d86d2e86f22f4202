"""Hosts to quarantine: one record per host that failed a health check or hung first, for the pipeline to act on.

After a failed sanity check or training attempt the pipeline lists `runs/<run_id>/bad-hosts/pending/`, terminates
each named EC2 instance (Batch) or cordons, taints and terminates each named Kubernetes node (EKS), and retries
without counting the attempt (config/layout.py BAD_HOSTS_PENDING; constructs/pipeline/quarantine.py).
The contract, kept exactly:
  where  `<REPORT_PREFIX><run_id>/bad-hosts/pending/<host_id>`, no extension: the pipeline takes the key's last
         segment as the host id. REPORT_PREFIX is `s3://<bucket>/runs/` on every backend (a folder in local runs).
  who    host_id: the EC2 instance id in the file INSTANCE_ID_FILE names (a Batch host writes it: containers cannot
         reach the instance metadata service), else NODE_NAME (EKS, the downward API), else the host name.
  what   JSON {"host_id", "hostname", "instance_id" (or null), "node_name" (or null), "why" (one line), "evidence"
         (one-line strings), "recorded_at" (ISO 8601 UTC, seconds, Z), "run_id"}.
Without REPORT_PREFIX or a run id (a hand run) nothing is written. A record that cannot be written costs one stderr
line, never the caller: it is written while a node is failing, and the failure's own exit code must stand.
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from efa_training.runtime.storage import under_prefix, write_json

PENDING = "bad-hosts/pending/"  # config/layout.py BAD_HOSTS_PENDING (tests hold the two equal)
REPORT_PREFIX_VARIABLE = "REPORT_PREFIX"
INSTANCE_ID_FILE_VARIABLE = "INSTANCE_ID_FILE"
NODE_NAME_VARIABLE = "NODE_NAME"
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
SETUP_FAILED = "setup-failed"  # config/layout.py HOST_SETUP_FAILED (tests hold the two equal)


def host_identity(env: Mapping[str, str]) -> dict:
    """This host's id (instance id, else node name, else host name) and each of the names it was chosen from."""
    instance_id = _instance_id(env.get(INSTANCE_ID_FILE_VARIABLE, ""))
    node_name = env.get(NODE_NAME_VARIABLE) or None
    hostname = socket.gethostname()
    return {"host_id": instance_id or node_name or hostname, "hostname": hostname, "instance_id": instance_id,
            "node_name": node_name}  # fmt: skip


def _instance_id(file: str) -> str | None:
    """The instance id in `file`; None if there is no such file or it holds anything else (a half-written file
    must not name some other object, which the pipeline would try to terminate)."""
    if not file:
        return None
    try:
        text = Path(file).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if INSTANCE_ID.fullmatch(text) else None


def setup_failure(env: Mapping[str, str]) -> str | None:
    """What failed in this host's preparation (the file a Batch host writes beside its instance id when a step
    fails: config/layout.py HOST_SETUP_FAILED), or None: a prepared host, or one that hands over nothing."""
    file = env.get(INSTANCE_ID_FILE_VARIABLE, "")
    if not file:
        return None
    try:
        return _one_line(Path(file).with_name(SETUP_FAILED).read_text(errors="replace")) or "a step failed"
    except OSError:
        return None


def record(
    env: Mapping[str, str], run_id: str | None, why: str, evidence: Iterable[str], identity: dict | None = None
) -> str | None:
    """This host's record (or that of `identity`, another rank's host_identity) under the run's pending bad hosts;
    where it was written, or None (a hand run, or lost)."""
    prefix = env.get(REPORT_PREFIX_VARIABLE, "")
    if not prefix or not run_id:
        return None
    try:
        identity = identity or host_identity(env)
        location = under_prefix(prefix, run_id, PENDING + identity["host_id"])
        recorded_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc = {**identity, "why": _one_line(why), "evidence": [_one_line(line) for line in evidence],
               "recorded_at": recorded_at, "run_id": run_id}  # fmt: skip
        write_json(location, doc)
    except Exception as exc:  # noqa: BLE001 - S3 ClientError, OSError...: lost, said, never raised (docstring)
        print(f"launch.py: bad host not recorded: {type(exc).__name__}: {_one_line(str(exc))}", file=sys.stderr,
              flush=True)  # fmt: skip
        return None
    return location


def _one_line(text: str) -> str:
    return " ".join(str(text).splitlines()).strip()  # the pipeline and the log read one line each
