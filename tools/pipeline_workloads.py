"""`pipeline_cli workload register|list|show|retire`: an environment's workloads as data in its runs table
(contracts/workload_registry.py: a pointer item per workload, one item per version, none ever rewritten), and the
registered schema `start` and `quote` check a run naming one against (registered_schemas).

A version is written with its pointer in one transaction, so a registration that fails halfway leaves nothing: a
pointer always names a version that exists, and no orphaned version blocks the next registration.
"""

import argparse
import json
import re
from pathlib import Path

from config import Accelerator
from config.layout import RUN_INPUT, RUNS_TABLE_KEY, workload_repository_name
from contracts.run import WorkloadSchema, known_workloads
from contracts.workload import NAME_PATTERN, Workload, WorkloadError
from contracts.workload_registry import (
    NEWEST,
    RECORD,
    RETIRED,
    VERSION,
    WORKLOAD_PREFIX,
    digest,
    pointer_key,
    record,
    registrable,
    schema,
    version_key,
)
from tools.pipeline_describe import runs_table
from tools.pipeline_session import CliError, Pipeline, _json_object, _one_line, call, environment_config

# A DynamoDB item holds at most 400 KB, its attribute names and values together (DynamoDB developer guide, "Service,
# account, and table quotas": item size); the pointer holds the record, its key and two small attributes.
# The record travels in the execution's state beside the run (constructs/pipeline/workload_record.py), whose input or
# output holds at most 256 KiB (Step Functions quotas, "Maximum input or output size for a task, state, or
# execution"): half of it, well under a DynamoDB item's 400 KB.
MAX_ITEM_BYTES, ITEM_OVERHEAD_BYTES = 128 * 1024, 0
# A SageMaker job's Environment value holds at most 512 characters (API_CreateTrainingJob Environment; botocore's
# TrainingEnvironmentValue), and the declaration reaches the job as WORKLOAD.
SAGEMAKER_ENVIRONMENT_VALUE = 512
MAX_DECLARATION_BYTES = 256 * 1024


def add_commands(add, region: argparse.ArgumentParser) -> None:
    """`workload <action>` in the CLI's parser (`add`: its add_parser; `region`: the --region parent)."""
    workload = add("workload", help="register, list, show or retire a workload (data in the runs table, no deploy)")
    actions = workload.add_subparsers(dest="action", required=True)
    register = actions.add_parser("register", parents=[region], help="check a declaration and register it, versioned")
    register.add_argument("env")
    register.add_argument("declaration", help="one declaration as cdk.json's workloads.<name> value (JSON)")
    register.add_argument("--name", help="the workload's name (default: the file's \"name\", else its stem)")
    list_ = actions.add_parser("list", parents=[region], help="the registered workloads: newest version, image")
    list_.add_argument("env")
    show = actions.add_parser("show", parents=[region], help="a registered version's record, as JSON")
    show.add_argument("env")
    show.add_argument("name")
    show.add_argument("--version", type=_version_number, help="this version (default: the newest)")
    retire = actions.add_parser("retire", parents=[region], help="refuse new runs of a workload; versions stay")
    retire.add_argument("env")
    retire.add_argument("name")


def _version_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version; expected an integer from 1")
    return int(text)


def cmd_workload(args, pipeline: Pipeline, out) -> int:
    actions = {"register": _register, "list": _list, "show": _show, "retire": _retire}
    return actions[args.action](args, pipeline, out)


# ---- register ------------------------------------------------------------------------------------


def checked_declaration(args) -> tuple[str, dict, Workload]:
    """The declaration `register` writes, its name and the workload it parses to, checked before any AWS call."""
    name, source = _declaration(args.declaration, args.name)
    try:
        workload = registrable(name, source)
    except WorkloadError as error:
        raise CliError(f"{args.declaration}: {error}") from None
    _pullable(args.declaration, name, workload.image_uri or "", args.env)
    config = environment_config(args.env)
    if config.instance.accelerator is not Accelerator.NVIDIA:  # as cdk.json's workloads are refused at synth
        raise CliError(
            f"{args.declaration}: {args.env} trains on {config.instance.name} (Trainium); expected a GPU environment: "
            "this release runs your own training code on GPU instances (docs/workloads.md, 'Where it runs')"
        )
    if config.compute == "sagemaker" and len(workload.variable) > SAGEMAKER_ENVIRONMENT_VALUE:
        raise CliError(
            f"{args.declaration}: the declaration reaches the job as WORKLOAD, {len(workload.variable)} characters "
            f"of JSON; expected at most {SAGEMAKER_ENVIRONMENT_VALUE} on SageMaker (one Environment value): shorten "
            "the commands or the metrics' regular expressions"
        )
    return name, source, workload


# A private ECR image: <account>.dkr.ecr.<region>.amazonaws.com/<repository>(:<tag>|@<digest>).
_ECR_URI = r"\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/([a-z0-9._/-]+?)(?::[\w.-]+|@sha256:[0-9a-f]{64})"


def _pullable(path: str, name: str, uri: str, env: str) -> None:
    """A private ECR image only from the environment's workload repository: the one the jobs' roles may pull from
    without a deploy (constructs/compute/shared/workload_pull.py); a public image from anywhere."""
    private = re.fullmatch(_ECR_URI, uri)
    if private and private.group(1) != workload_repository_name(env):
        raise CliError(
            f"{path}: workloads.{name}.image.uri={uri!r} is not valid; expected an image in "
            f"{workload_repository_name(env)} (the repository {env}'s jobs may pull from: make push-workload "
            f"ENV={env} NAME={name} DIR=<folder> pushes it there) or a public one"
        )


def _register(args, pipeline: Pipeline, out) -> int:
    name, source, workload = checked_declaration(args)
    pointer = _item(pipeline, pointer_key(name))
    newest = _version_of(pointer) if pointer else NEWEST
    if pointer and _record(pointer).get("digest") == digest(workload, source) and not _retired(pointer):
        print(f"workload {name} version {newest} is already registered (same declaration)", file=out)
        return 0
    text = json.dumps(record(workload, source, newest + 1), separators=(",", ":"))
    if len(text.encode()) + ITEM_OVERHEAD_BYTES > MAX_ITEM_BYTES:
        raise CliError(
            f"{args.declaration}: its record is {len(text.encode())} bytes; expected at most "
            f"{MAX_ITEM_BYTES - ITEM_OVERHEAD_BYTES} (it travels in the run's state, which Step Functions holds to 256 "
            "KiB): declare fewer hyperparameters or shorter rules"
        )
    _write_version(pipeline, name, newest + 1, text)
    print(f"registered workload {name} version {newest + 1} ({workload.image_uri})", file=out)
    print(f'a run names it as "workload": "{name}" (its newest version; "workload_version" picks one)', file=out)
    return 0


def _declaration(path: str, name: str | None) -> tuple[str, dict]:
    """The file's declaration and the workload's name: --name, else the file's top-level "name" (not part of the
    declaration, so removed), else the file's stem."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_DECLARATION_BYTES + 1)
        text = data.decode("utf-8")
    except OSError as error:
        raise CliError(f"{path}: cannot read the declaration ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise CliError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8 JSON") from None
    if len(data) > MAX_DECLARATION_BYTES:
        raise CliError(f"{path}: larger than {MAX_DECLARATION_BYTES} bytes; a declaration is much smaller")
    try:
        source = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise CliError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    except (ValueError, RecursionError) as error:  # NaN, a number of thousands of digits, nesting too deep
        reason = "nested too deeply" if isinstance(error, RecursionError) else _one_line(error)
        raise CliError(f"{path}: not a valid declaration ({reason})") from None
    if not isinstance(source, dict):
        raise CliError(f"{path}: not a declaration; expected a JSON object, as cdk.json's workloads.<name> value")
    given = source.pop("name", None)
    return str(name or given or Path(path).stem), source


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _write_version(pipeline: Pipeline, name: str, version: int, text: str) -> None:
    """The version's item (never there before) and the pointer moved to it (still at the version before, or absent
    for a first one), all or nothing: TransactWriteItems applies every action or none, cancelled when a condition
    fails (DynamoDB API reference, TransactWriteItems)."""
    table, was = runs_table(pipeline), version - 1
    names = {"#v": VERSION, "#r": RECORD, "#x": RETIRED}
    values = {":v": {"N": str(version)}, ":r": {"S": text}, ":no": {"BOOL": False}}
    # DynamoDB refuses an expression attribute name or value that no expression uses.
    if was:
        still, values = "#v = :was", {**values, ":was": {"N": str(was)}}
    else:
        still, names = "attribute_not_exists(#k)", {**names, "#k": RUNS_TABLE_KEY}
    item = {RUNS_TABLE_KEY: {"S": version_key(name, version)}, VERSION: {"N": str(version)}, RECORD: {"S": text}}
    new_version = {"TableName": table, "Item": item, "ConditionExpression": "attribute_not_exists(#k)"}
    pointer = {
        "TableName": table,
        "Key": {RUNS_TABLE_KEY: {"S": pointer_key(name)}},
        "UpdateExpression": "SET #v = :v, #r = :r, #x = :no",
        "ConditionExpression": still,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    actions = [{"Put": {**new_version, "ExpressionAttributeNames": {"#k": RUNS_TABLE_KEY}}}, {"Update": pointer}]
    try:
        call(pipeline._client("dynamodb").transact_write_items, TransactItems=actions)
    except CliError as error:
        # A condition failed, or another transaction wrote these items at the same time (TransactionConflict).
        reasons = ("ConditionalCheckFailed", "TransactionConflict")
        if str(error).startswith("TransactionCanceledException") and any(r in str(error) for r in reasons):
            raise CliError(f"another registration of {name} raced this one; run it again") from None
        raise


# ---- list, show, retire ------------------------------------------------------------------------------


def _list(args, pipeline: Pipeline, out) -> int:
    pointers = sorted(_pointers(pipeline), key=lambda item: item[RUNS_TABLE_KEY]["S"])
    for item in pointers:
        name = item[RUNS_TABLE_KEY]["S"].removeprefix(WORKLOAD_PREFIX)
        state = "retired" if _retired(item) else "active"
        image = _record(item).get("image", "?")
        print(f"{name:<24} version {_version_of(item):<4} {state:<8} {image}", file=out)
    if not pointers:
        print(f"no workloads registered in {pipeline.env}", file=out)
    return 0


def _pointers(pipeline: Pipeline) -> list[dict]:
    """Every workload's pointer item (a Scan of the keys starting workload#, page by page: a Scan answers at most
    1 MB a call and LastEvaluatedKey starts the next, DynamoDB API reference, Scan); versions hold a second '#'."""
    dynamodb, table, found, start = pipeline._client("dynamodb"), runs_table(pipeline), [], None
    scan = {
        "TableName": table,
        "FilterExpression": "begins_with(#k, :p)",
        "ExpressionAttributeNames": {"#k": RUNS_TABLE_KEY},
        "ExpressionAttributeValues": {":p": {"S": WORKLOAD_PREFIX}},
    }
    while True:
        page = call(dynamodb.scan, **scan, **({"ExclusiveStartKey": start} if start else {}))
        found += [item for item in page["Items"] if item[RUNS_TABLE_KEY]["S"].count("#") == 1]
        start = page.get("LastEvaluatedKey")
        if not start:
            return found


def _show(args, pipeline: Pipeline, out) -> int:
    key = version_key(args.name, args.version) if args.version else pointer_key(args.name)
    item = _item(pipeline, key)
    if item is None and args.version and _item(pipeline, pointer_key(args.name)) is not None:
        raise CliError(f"workload {args.name!r} has no version {args.version} in {pipeline.env}")
    if item is None:
        raise CliError(_not_registered(args.name, pipeline.env))
    print(json.dumps(_record(item), indent=2), file=out)
    return 0


def _retire(args, pipeline: Pipeline, out) -> int:
    try:
        updated = call(
            pipeline._client("dynamodb").update_item,
            TableName=runs_table(pipeline),
            Key={RUNS_TABLE_KEY: {"S": pointer_key(args.name)}},
            UpdateExpression="SET #x = :yes",
            ConditionExpression="attribute_exists(#k)",  # UpdateItem would otherwise create the item
            ExpressionAttributeNames={"#x": RETIRED, "#k": RUNS_TABLE_KEY},
            ExpressionAttributeValues={":yes": {"BOOL": True}},
            ReturnValues="ALL_NEW",
        )
    except CliError as error:
        if str(error).startswith("ConditionalCheckFailed"):
            raise CliError(_not_registered(args.name, pipeline.env)) from None
        raise
    version = _version_of(updated["Attributes"])
    print(
        f"retired workload {args.name} (newest version {version}): new runs naming it are refused; its versions "
        "stay, so runs in flight and resumes keep theirs",
        file=out,
    )
    return 0


# ---- what `start` and `quote` check a run against ------------------------------------------------------


def in_registry(run: object) -> bool:
    """Whether a run names a workload other than the built-in ones: one only the registry knows (the pipeline reads
    nothing else; cdk.json's `workloads` reach it by being registered). A name no workload may have is left to the
    run contract to refuse."""
    name = run.get("workload") if isinstance(run, dict) else None
    return isinstance(name, str) and bool(re.fullmatch(NAME_PATTERN, name)) and name not in known_workloads()


def registered_schemas(pipeline: Pipeline, run: dict) -> dict[str, WorkloadSchema]:
    """The registered schema of the workload the run names, by its name ({} for a built-in one): the version the run
    pins (`workload_version` > 0), else the newest."""
    if not in_registry(run):
        return {}
    name = run["workload"]
    try:
        return {name: schema(_registered_record(pipeline, name, run))}
    except (KeyError, TypeError, ValueError) as error:  # an item not written by `workload register`
        raise CliError(
            f"workload {name!r} in {pipeline.env}: its record is unreadable ({error!r}); register it again"
        ) from None


def _registered_record(pipeline: Pipeline, name: str, run: dict) -> dict:
    env, pointer = pipeline.env, _item(pipeline, pointer_key(name))
    if pointer is None:
        raise CliError(_not_registered(name, env))
    if _retired(pointer) and run.get("resume") is not True:  # a resume keeps the version it ran on
        raise CliError(
            f"workload {name!r} is retired in {env}: it takes no new runs; register it again to use it: "
            f"pipeline_cli workload register {env} decl.json"
        )
    version = run.get("workload_version", NEWEST)
    if not isinstance(version, int) or isinstance(version, bool) or version <= NEWEST:
        return _record(pointer)  # the newest (a bad workload_version is the run contract's to refuse)
    item = _item(pipeline, version_key(name, version))
    if item is None:
        raise CliError(
            f"workload_version={version} is not valid; expected a registered version of {name!r} in {env}, "
            f"1 to {_version_of(pointer)}"
        )
    return _record(item)


# ---- items -----------------------------------------------------------------------------------------


def _item(pipeline: Pipeline, key: str) -> dict | None:
    """One item of the runs table, or None; a strongly consistent read, so a registration just made is seen
    (DynamoDB API reference, GetItem: ConsistentRead)."""
    found = call(
        pipeline._client("dynamodb").get_item,
        TableName=runs_table(pipeline),
        Key={RUNS_TABLE_KEY: {"S": key}},
        ConsistentRead=True,
    )
    return found.get("Item")


def _record(item: dict) -> dict:
    return _json_object(item.get(RECORD, {}).get("S"))


def _version_of(item: dict) -> int:
    return int(item.get(VERSION, {}).get("N", NEWEST))


def _retired(item: dict) -> bool:
    return item.get(RETIRED, {}).get("BOOL") is True


def _not_registered(name: str, env: str) -> str:
    return f"workload {name!r} is not registered in {env}; register it: pipeline_cli workload register {env} decl.json"


def resumed_version(pipeline: Pipeline, run: dict, out) -> dict:
    """A resume of a registered workload's run that names no version: the version the run started with (its claim's
    input, `registered.version`), so its checkpoints meet the same code; printed. Anything else as given."""
    if run.get("resume") is not True or "workload_version" in run or not in_registry(run):
        return run
    item = _item(pipeline, run["run_id"])
    stored = _json_object(item.get(RUN_INPUT, {}).get("S")) if item else {}
    version = (stored.get("registered") or {}).get("version") if isinstance(stored, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version <= NEWEST:
        return run  # no claim yet, or one from before workloads were registered: the pipeline decides
    print(f"resuming {run['run_id']} on workload {run['workload']} version {version}, the one it ran with", file=out)
    return {**run, "workload_version": version}
