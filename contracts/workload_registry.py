"""A registered workload: its declaration as the pipeline reads it at run time (docs/workloads.md "Registering").

A workload is data, not a deploy: `pipeline_cli workload register <env> decl.json` checks a declaration with the
same parser as cdk.json's (contracts/workload.py) and writes it, versioned, into the environment's runs table; the
pipeline's first state reads the version a run names (its newest by default) and checks the run's hyperparameters
against the record's rows (constructs/pipeline/hyperparameter_check.py), so a new workload, or a new version of one,
changes no template. The built-in trainers' records are the same shape, written into the template by the deploy that
ships their code (their schema changes with the platform's image, never apart from it).

Items (the table's key is RUNS_TABLE_KEY; no run id holds a '#', so none is a run's):
  `workload#<name>`            the newest version: {version, record, retired}
  `workload#<name>#<version>`  each version, never rewritten: {version, record}
"""

import hashlib
import json
from pathlib import Path

from contracts.run import REQUIRED, Field, WorkloadSchema
from contracts.workload import IMAGE_URI_PATTERN, Workload, WorkloadError, parse_workload

WORKLOAD_PREFIX = "workload#"
# A run naming no version takes the newest; versions count from 1 (contracts.run's `workload_version`).
NEWEST = 0
RECORD, VERSION, RETIRED = "record", "version", "retired"


def pointer_key(name: str) -> str:
    return f"{WORKLOAD_PREFIX}{name}"


def version_key(name: str, version: int) -> str:
    return f"{WORKLOAD_PREFIX}{name}#{version}"


def check_row(f: Field) -> dict:
    """One hyperparameter's rule as data: what the pipeline's generic check interprets (the run contract's Field)."""
    return {
        "key": f.key,
        "name": f.name,
        "kind": f.kind,
        "required": f.required,
        "default": None if f.required else f.default,
        "minimum": f.minimum,
        "maximum": f.maximum,
        "exclusive_minimum": f.exclusive_minimum,
        "choices": list(f.choices),
        "requires": [{"other": other, "values": list(values)} for other, values in f.requires],
        "divides": None if f.divides is None else {"by": f.divides[0], "values": dict(f.divides[1])},
        "layout": f.layout,
        "allowed": f.allowed(),
    }


def record(workload: Workload, source: dict, version: int) -> dict:
    """What the registry holds for one version: the declaration as given (`source`, for the CLI's own checks), what
    the jobs receive (image URI, the WORKLOAD variable) and what the first state and the quote interpret."""
    image = workload.image_uri or "platform"
    body = {
        "name": workload.name,
        "version": version,
        "platform": workload.platform,
        "image": image,
        "workload": workload.variable,
        "hyperparameters": [check_row(f) for f in workload.hyperparameters],
        "cost": workload.cost.as_json() if workload.cost else None,
        "source": source,
    }
    return {**body, "digest": digest(workload, source)}


def digest(workload: Workload, source: dict) -> str:
    """The declaration's identity (name, declaration, image): registering the same again is no new version."""
    text = json.dumps({"name": workload.name, "source": source}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def registrable(name: str, source: object) -> Workload:
    """A declaration a run can use without a deploy: checked as cdk.json's are, and its image a URI (a folder is
    built and pushed first: `make push-workload`, which prints the URI to register)."""
    image = source.get("image") if isinstance(source, dict) else None
    # A folder names no image yet (parse_workload, given no project to look in, would call it a missing folder).
    if isinstance(image, dict) and "directory" in image:
        raise WorkloadError(
            f'workloads.{name}.image={image!r} is not valid; expected {{"uri": <image URI matching '
            f"{IMAGE_URI_PATTERN}>}}: a registered workload runs an image already pushed (make push-workload "
            "NAME=... DIR=... prints it)"
        )
    workload = parse_workload(name, source, Path("/nonexistent"))
    if workload.image_uri is None:  # not reached: only the platform's own trainers may have no image of their own
        raise WorkloadError(f'workloads.{name}.image is not valid; expected {{"uri": <image URI>}}')
    return workload


def schema(rec: dict) -> WorkloadSchema:
    """The run contract's schema of a record (what the CLI's `start` and `quote` check a run against)."""
    fields = tuple(
        Field(
            row["name"],
            row["kind"],
            REQUIRED if row["required"] else row["default"],
            row["minimum"],
            row["maximum"],
            row["exclusive_minimum"],
            tuple(row["choices"]),
            rule=row["allowed"],
            requires=tuple((q["other"], tuple(q["values"])) for q in row["requires"]),
            divides=None if row["divides"] is None else (row["divides"]["by"], tuple(row["divides"]["values"].items())),
            layout=row["layout"],
        )
        for row in rec["hyperparameters"]
    )
    from contracts.workload_cost import parse_cost

    cost = parse_cost(_refuse, rec["source"].get("cost"), fields) if rec.get("source") else None
    return WorkloadSchema(fields, rec["platform"], cost)


def _refuse(field: str, value: object, allowed: str) -> Exception:
    return WorkloadError(f"{field}={value!r} is not valid; expected {allowed}")
