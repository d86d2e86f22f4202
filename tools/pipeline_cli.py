"""Operate the training pipeline: start a run, watch it, list runs, describe one.

    .venv/bin/python -m tools.pipeline_cli start dev examples/run.json --watch
    .venv/bin/python -m tools.pipeline_cli watch dev gpt-tiny-001-20261121T083000
    .venv/bin/python -m tools.pipeline_cli list dev
    .venv/bin/python -m tools.pipeline_cli describe dev gpt-tiny-001-20261121T083000
    .venv/bin/python -m tools.pipeline_cli quote dev examples/run.json
    .venv/bin/python -m tools.pipeline_cli workload register dev my-llm.json [--name my-llm]
    .venv/bin/python -m tools.pipeline_cli workload list dev
    .venv/bin/python -m tools.pipeline_cli workload show dev my-llm [--version 2]
    .venv/bin/python -m tools.pipeline_cli workload retire dev my-llm

The environment's region comes from cdk.json (or --region); the state machine from the output
`StateMachineArn` of the stack `EfaTraining-<env>-Pipeline`; the runs table `list` reads (every claimed run id, with
the execution holding it) from the output `RunsTableName` of `EfaTraining-<env>-Storage`. `start` validates the run
file with the same rules as the state machine (the run contract, contracts/run.py) and prints its quote
(tools/quote.py), refusing a run the monthly budget cannot pay for, before starting anything. Exit codes:
0 success (or a run that succeeded), 1 a run that failed, 2 a usage or environment error.

`workload register` checks a declaration (one file: cdk.json's `workloads.<name>` value, its image an image URI;
the name is --name, else the file's "name", else its stem) and writes it as the workload's next version into the
runs table, with no deploy (registering the same declaration again writes nothing); a run names it with
`"workload": "<name>"` and may pin `"workload_version"`. `start` and `quote` check such a run's hyperparameters
against the registered version. `workload retire` refuses new runs of it; its versions stay, so runs in flight and
resumes keep theirs.

This module holds the entry point, run files, `start` and `quote`; tools/pipeline_session.py the access to AWS and
cdk.json, tools/pipeline_watch.py `watch`, tools/pipeline_describe.py `list` and `describe`,
tools/pipeline_workloads.py `workload`.
"""

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from config.layout import DATASET_MANIFEST
from contracts import run as schema
from tools.pipeline_describe import cmd_describe, cmd_list
from tools.pipeline_session import ATTEMPTS as ATTEMPTS
from tools.pipeline_session import (
    RESULT_CODES,
    CliError,
    Pipeline,
    _one_line,
    call,
    declared_workloads,
    environment_config,
    region_of,
)
from tools.pipeline_session import client_config as client_config
from tools.pipeline_watch import _Progress as _Progress
from tools.pipeline_watch import watch
from tools.pipeline_workloads import (
    add_commands,
    checked_declaration,
    cmd_workload,
    in_registry,
    registered_schemas,
    resumed_version,
)

# The `name as name` imports: names the tests import from here (as tools/dataset.py imports CliError, Pipeline, call
# and region_of); tools/pipeline_session.py and tools/pipeline_watch.py hold them.

# ---- run files ---------------------------------------------------------------------------------

MAX_RUN_FILE_BYTES = 256 * 1024  # Step Functions' limit on an execution's input (256 KiB)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def load_run(
    path: str,
    max_nodes: int,
    min_nodes: int = 1,
    workloads: schema.WorkloadSchemas | None = None,
    workers_per_node: int | None = None,
    registry: Callable[[dict], schema.WorkloadSchemas] | None = None,
) -> dict:
    """A valid run from its file; `registry`: the registered schema of the workload the run names
    (tools.pipeline_workloads.registered_schemas), read once the file is known to be a JSON object."""
    run = read_run(path)
    if registry is not None and isinstance(run, dict):
        workloads = {**(workloads or {}), **registry(run)}
    return checked_run(path, run, max_nodes, min_nodes, workloads, workers_per_node)


def read_run(path: str) -> object:
    """The run file's JSON value, or one line saying why it is none."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RUN_FILE_BYTES + 1)
    except OSError as error:
        raise CliError(f"{path}: cannot read the run file ({error.strerror or error})") from None
    if len(data) > MAX_RUN_FILE_BYTES:
        raise CliError(f"{path}: larger than {MAX_RUN_FILE_BYTES} bytes, Step Functions' limit on an input")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CliError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8 JSON") from None
    try:  # NaN and Infinity are not JSON, though Python's parser takes them
        run = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise CliError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    except (ValueError, RecursionError) as error:  # NaN, a number of thousands of digits, nesting too deep
        reason = "nested too deeply" if isinstance(error, RecursionError) else _one_line(error)
        raise CliError(f"{path}: not a valid run file ({reason})") from None
    return run


def checked_run(
    path: str,
    run: object,
    max_nodes: int,
    min_nodes: int = 1,
    workloads: schema.WorkloadSchemas | None = None,
    workers_per_node: int | None = None,
) -> dict:
    problems = schema.validate_run(run, max_nodes, min_nodes, workloads, workers_per_node)
    if problems:
        raise CliError(f"{path}: " + "; ".join(problems))
    return cast(dict, run)  # validate_run refuses anything but an object


# ---- commands ----------------------------------------------------------------------------------


def require_prepared(pipeline: Pipeline, dataset: str) -> None:
    """The check the pipeline's first states make (constructs/pipeline/dataset_check.py), before anything starts:
    prepare_data.py writes `<dataset>/dataset.json` last, so without it the dataset is missing or incomplete."""
    bucket = pipeline.bucket
    if bucket is None:
        return  # no storage stack output to look in: the pipeline's own check still refuses it
    key = f"{dataset.rstrip('/')}/{DATASET_MANIFEST}"
    try:
        call(pipeline._client("s3").head_object, Bucket=bucket, Key=key)
    except CliError as error:
        if "404" not in str(error) and "Not Found" not in str(error):
            raise
        raise CliError(
            f"dataset {dataset!r} is not prepared: no s3://{bucket}/{key}; prepare it with "
            f"`make dataset ENV={pipeline.env} NAME=<name> INPUT=<text files>` (or name a prepared one)"
        ) from None


def quoted(run: dict, env: str, session, out, workloads: schema.WorkloadSchemas | None = None, starting: bool = True):
    """The run's quote and budget printed (tools/quote.py); the run is refused if the budget cannot pay for it, and
    when `starting`, if the budget cannot be read (as the pipeline refuses it). `workloads`: the registered schema
    of the run's workload, whose cost model prices it."""
    from tools.quote import price

    priced = price(run, environment_config(env), session, workloads)
    print("\n".join(priced.lines()), file=out)
    refusal = priced.refusal or (priced.unread_refusal if starting else None)
    if refusal:
        raise CliError(refusal)


def cmd_quote(args, session, out) -> int:
    config, declared = environment_config(args.env), declared_workloads(args.env)
    if session is None:
        import boto3

        session = boto3.Session(region_name=region_of(args.env, args.region))

    def registry(run: dict) -> schema.WorkloadSchemas:  # the deployed pipeline's runs table, only where needed
        if not in_registry(run):
            return {}
        return registered_schemas(Pipeline(args.env, region_of(args.env, args.region), session=session), run)

    run = load_run(
        args.run_file,
        config.nodes,
        config.min_nodes,  # what the deployed pipeline's MinNodes says, so the quote refuses what start refuses
        workloads=declared,
        workers_per_node=config.instance.workers_per_node,
        registry=registry,
    )
    quoted(run, args.env, session, out, registry(run), starting=False)  # offline too: it says what start would do
    return 0


def cmd_start(args, pipeline: Pipeline, out) -> int:
    # The layout degrees are judged on the environment's instance (cdk.json), as its first state judges them.
    per_node = environment_config(pipeline.env).instance.workers_per_node
    registry = functools.partial(registered_schemas, pipeline)
    declared = declared_workloads(pipeline.env)
    run = load_run(args.run_file, pipeline.max_nodes, pipeline.min_nodes, declared, per_node, registry=registry)
    run = resumed_version(pipeline, run, out)  # a resume keeps the workload version it ran with
    require_prepared(pipeline, run["dataset"])
    # before anything starts: the pipeline would refuse it too (its QuoteRun prices by the same record)
    quoted(run, pipeline.env, pipeline.session, out, registry(run))
    name = args.name or f"{run['run_id']}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    started = call(
        pipeline.sfn.start_execution, stateMachineArn=pipeline.state_machine_arn, name=name[:80], input=json.dumps(run)
    )
    print(f"started {name}\n  {started['executionArn']}", file=out)
    if args.watch:
        return watch(pipeline, started["executionArn"], out, interval=args.interval)
    return 0


def cmd_watch(args, pipeline: Pipeline, out) -> int:
    return watch(pipeline, pipeline.execution_arn(args.execution), out, interval=args.interval)


# ---- entry point -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline_cli", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"efa-training {_version()}")
    p.add_argument("--region", help="AWS region (default: the environment's region in cdk.json)")
    # --region after the subcommand too: its default is SUPPRESS, so it overrides the value before only when given.
    region = argparse.ArgumentParser(add_help=False)
    region.add_argument("--region", default=argparse.SUPPRESS, help="AWS region (default: cdk.json's)")
    sub = p.add_subparsers(dest="command", required=True)
    add = functools.partial(sub.add_parser, parents=[region])
    start = add("start", help="validate a run file and start an execution")
    start.add_argument("env")
    start.add_argument("run_file")
    start.add_argument("--name", help="execution name (default: <run_id>-<UTC time>)")
    start.add_argument("--watch", action="store_true", help="then watch it; exit code = the run's result")
    start.add_argument("--interval", type=float, default=10.0, help=argparse.SUPPRESS)
    watch_ = add("watch", help="follow an execution until it ends; exit code = its result")
    watch_.add_argument("env")
    watch_.add_argument("execution", help="execution name or ARN")
    watch_.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default 10)")
    list_ = add("list", help="claimed runs (the runs table), newest first, with their executions' status")
    list_.add_argument("env")
    list_.add_argument("--status", choices=sorted({*RESULT_CODES, "EXPIRED"}), help="only runs whose execution is")
    list_.add_argument("--max", type=int, default=20, help="at most this many runs (default 20)")
    quote_ = add("quote", help="what a run file would cost, and whether the monthly budget pays for it")
    quote_.add_argument("env")
    quote_.add_argument("run_file")
    describe = add("describe", help="an execution's verdict, jobs and links")
    describe.add_argument("env")
    describe.add_argument("execution", help="execution name or ARN")
    add_commands(add, region)
    return p


def _version() -> str:
    """The release, from the one file that holds it (copied into the training image as well)."""
    path = Path(__file__).resolve().parents[1] / "training_image" / "version.py"
    found = re.search(r'^VERSION = "([^"]+)"', path.read_text(), re.MULTILINE)
    return found.group(1) if found else "unknown"


COMMANDS = {
    "start": cmd_start,
    "watch": cmd_watch,
    "list": cmd_list,
    "describe": cmd_describe,
    "workload": cmd_workload,
}


def main(argv: list[str] | None = None, *, session=None, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = parser().parse_args(argv)
    try:
        if args.command == "start":  # a malformed run file fails before any AWS call
            from config.environment import MAX_NODES

            run, declared = read_run(args.run_file), declared_workloads(args.env)
            if not in_registry(run):  # else its workload's hyperparameters are in the runs table
                checked_run(args.run_file, run, max_nodes=MAX_NODES, workloads=declared)
        if args.command == "workload" and args.action == "register":  # so does a bad declaration
            checked_declaration(args)
        if args.command == "quote":  # needs no deployed pipeline
            return cmd_quote(args, session, out)
        pipeline = Pipeline(args.env, region_of(args.env, args.region), session=session)
        return COMMANDS[args.command](args, pipeline, out)
    except CliError as error:
        print(f"error: {error}", file=err)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
