"""Operate the training pipeline: start a run, watch it, list runs, describe one.

    .venv/bin/python -m tools.pipeline_cli start dev examples/run.json --watch
    .venv/bin/python -m tools.pipeline_cli watch dev gpt-tiny-001-20261121T083000
    .venv/bin/python -m tools.pipeline_cli list dev
    .venv/bin/python -m tools.pipeline_cli describe dev gpt-tiny-001-20261121T083000
    .venv/bin/python -m tools.pipeline_cli quote dev examples/run.json

The environment's region comes from cdk.json (or --region); the state machine from the output
`StateMachineArn` of the stack `EfaTraining-<env>-Pipeline`; the runs table `list` reads (every claimed run id, with
the execution holding it) from the output `RunsTableName` of `EfaTraining-<env>-Storage`. `start` validates the run
file with the same rules as the state machine (the run contract, contracts/run.py) and prints its quote
(tools/quote.py), refusing a run the monthly budget cannot pay for, before starting anything. Exit codes:
0 success (or a run that succeeded), 1 a run that failed, 2 a usage or environment error.
"""

import argparse
import functools
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from config.layout import (
    DATASET_MANIFEST,
    RUN_HOLDER,
    RUN_SINCE,
    RUNS_PREFIX,
    RUNS_TABLE_KEY,
    RUNS_TABLE_OUTPUT,
    dashboard_name,
    stack_name,
)
from contracts import run as schema
from tools import bad_hosts, model_registry

# Every AWS client: bounded waits and a few retries, so an endpoint that accepts and never answers costs about
# 3 attempts x 8 s of reading (5 s to connect) before one line says so, well within a minute (botocore "Config":
# connect_timeout, read_timeout, retries; standard mode retries timeouts, throttling and 5xx with backoff).
ATTEMPTS = 3


def client_config():
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=8, retries={"max_attempts": ATTEMPTS, "mode": "standard"})


ROOT = Path(__file__).resolve().parent.parent
# The states a successful run passes through, in order: the stack output `Phases` wins; older stacks had no such
# output, a sanity job and no Compile state.
STAGES = schema.phases(sanity_in_training=False)
RESULT_CODES = {"SUCCEEDED": 0, "RUNNING": 1, "FAILED": 1, "TIMED_OUT": 1, "ABORTED": 1, "PENDING_REDRIVE": 1}


class CliError(Exception):
    """One line for the operator; exit code 2."""


# ---- AWS access --------------------------------------------------------------------------------


def _environment(env: str) -> dict:
    environments = json.loads((ROOT / "cdk.json").read_text())["context"]["environments"]
    if env not in environments:
        raise CliError(f"unknown environment {env!r}; expected one of {', '.join(environments)} (from cdk.json)")
    return environments[env]


def region_of(env: str, override: str | None) -> str:
    return override or _environment(env)["region"]


def declared_workloads(env: str) -> schema.WorkloadSchemas:
    """The environment's declared workloads (cdk.json), whose hyperparameters a run naming one is checked against;
    the deployed pipeline's first state checks the same (its own copy, from the last deploy)."""
    from contracts.workload import WorkloadError, parse_workloads, schemas

    try:
        return schemas(parse_workloads(_environment(env).get("workloads", {}), ROOT))
    except WorkloadError as error:
        raise CliError(f"environment {env!r} in cdk.json: {error}") from None


class Pipeline:
    """The deployed pipeline of one environment: its stack outputs and clients."""

    def __init__(self, env: str, region: str, session=None) -> None:
        import boto3

        self.env, self.region = env, region
        self.session = session or boto3.Session(region_name=region)
        self.sfn = self._client("stepfunctions")
        outputs = self._outputs()
        if "StateMachineArn" not in outputs:
            raise CliError(
                f"environment {env!r}: stack {stack_name(env, 'Pipeline')} has no StateMachineArn output; "
                "redeploy the pipeline stack"
            )
        self.state_machine_arn = outputs["StateMachineArn"]
        self.max_nodes = int(outputs.get("MaxNodes", 1))
        self.min_nodes = int(outputs.get("MinNodes", 1))
        # This backend's phases (no SanityCheck where the training job checks its own hosts); older stacks: all.
        self.phases = tuple(outputs["Phases"].split(",")) if outputs.get("Phases") else STAGES
        self.log_group = outputs.get("ExecutionLogGroup")
        self.parameter = outputs.get("ApprovedModelParameter")

    def _client(self, service: str):
        return self.session.client(service, region_name=self.region, config=client_config())

    @functools.cached_property
    def _storage(self) -> dict[str, str]:
        """The storage stack's outputs ({} where it cannot be read)."""
        try:
            return self._outputs(stack_name(self.env, "Storage"))
        except CliError:
            return {}

    @property
    def bucket(self) -> str | None:
        """The data bucket: output `BucketName` of the environment's storage stack."""
        return self._storage.get("BucketName")

    @property
    def runs_table(self) -> str | None:
        """The runs table, where the pipeline claims run ids: output `RunsTableName` of the storage stack."""
        return self._storage.get(RUNS_TABLE_OUTPUT)

    def _outputs(self, stack: str | None = None) -> dict[str, str]:
        stack = stack or stack_name(self.env, "Pipeline")
        try:
            described = call(self._client("cloudformation").describe_stacks, StackName=stack)
        except CliError as error:
            if "does not exist" in str(error):
                raise CliError(
                    f"environment {self.env!r} is not deployed: no stack {stack} in {self.region} "
                    f"(deploy it with `cdk deploy -c env={self.env} {stack}`)"
                ) from None
            raise
        return {o["OutputKey"]: o["OutputValue"] for o in described["Stacks"][0].get("Outputs", [])}

    def execution_arn(self, execution: str) -> str:
        if execution.startswith("arn:"):
            return execution
        return self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{execution}"

    def history(self, execution_arn: str, token: str | None = None) -> tuple[list[dict], str | None]:
        kwargs = {"executionArn": execution_arn, "maxResults": 1000, **({"nextToken": token} if token else {})}
        page = call(self.sfn.get_execution_history, **kwargs)
        return page["events"], page.get("nextToken")

    def all_history(self, execution_arn: str) -> list[dict]:
        events, token = self.history(execution_arn)
        while token:
            more, token = self.history(execution_arn, token)
            events += more
        return events


def call(method, **kwargs):
    """Call boto3, turning credential and API errors into one-line CliErrors."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        ReadTimeoutError,
    )

    try:
        return method(**kwargs)
    except NoCredentialsError:
        raise CliError("no AWS credentials found: set AWS_PROFILE, run `aws configure` or `aws sso login`") from None
    except NoRegionError:
        raise CliError("no AWS region: pass --region or set AWS_REGION") from None
    except ClientError as error:
        code, message = error.response["Error"].get("Code", ""), error.response["Error"].get("Message", "")
        if code in ("ExpiredToken", "ExpiredTokenException", "UnrecognizedClientException", "InvalidClientTokenId"):
            raise CliError(f"AWS credentials were refused ({code}): refresh them (`aws sso login`)") from None
        if code == "ExecutionDoesNotExist":
            raise CliError(f"no such execution: {kwargs.get('executionArn')}") from None
        raise CliError(_one_line(f"{code}: {message}")) from None
    except (ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError) as error:
        raise CliError(f"AWS did not answer after {ATTEMPTS} attempts: {_one_line(error)}") from None
    except BotoCoreError as error:
        raise CliError(_one_line(error)) from None


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


# ---- run files ---------------------------------------------------------------------------------

MAX_RUN_FILE_BYTES = 256 * 1024  # Step Functions' limit on an execution's input (256 KiB)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def load_run(path: str, max_nodes: int, min_nodes: int = 1, workloads: schema.WorkloadSchemas | None = None) -> dict:
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
    problems = schema.validate_run(run, max_nodes, min_nodes, workloads)
    if problems:
        raise CliError(f"{path}: " + "; ".join(problems))
    return run


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


def environment_config(env: str):
    """The environment's configuration, from cdk.json as `cdk synth` reads it."""
    from config import ConfigError, load_config

    try:
        return load_config({**json.loads((ROOT / "cdk.json").read_text())["context"], "env": env})
    except ConfigError as error:
        raise CliError(str(error)) from None


def quoted(run: dict, env: str, session, out):
    """The run's quote and budget printed (tools/quote.py); the run is refused if the budget cannot pay for it."""
    from tools.quote import price

    priced = price(run, environment_config(env), session)
    print("\n".join(priced.lines()), file=out)
    if priced.refusal:
        raise CliError(priced.refusal)


def cmd_quote(args, session, out) -> int:
    config = environment_config(args.env)
    run = load_run(args.run_file, config.nodes, workloads=declared_workloads(args.env))
    if session is None:
        import boto3

        session = boto3.Session(region_name=region_of(args.env, args.region))
    quoted(run, args.env, session, out)
    return 0


def cmd_start(args, pipeline: Pipeline, out) -> int:
    run = load_run(args.run_file, pipeline.max_nodes, pipeline.min_nodes, declared_workloads(pipeline.env))
    require_prepared(pipeline, run["dataset"])
    quoted(run, pipeline.env, pipeline.session, out)  # before anything starts: the pipeline would refuse it too
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


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _is_job(event: dict) -> bool:
    """A job submission (`...sync`: Batch, EKS, SageMaker), not one of the calls around it (the quarantine's)."""
    return str(event.get("taskScheduledEventDetails", {}).get("resource", "")).endswith(".sync")


def _progress(done: int, total: int) -> str:
    return "[" + "#" * done + "-" * (total - done) + f"] {done}/{total}"


class _Progress:
    """What `watch` prints for each history event: the phases, where the run ends, retries and failures."""

    def __init__(self, out, phases: tuple[str, ...] = STAGES) -> None:
        self.out, self.phases = out, phases
        self.attempts: dict[str | None, int] = {}
        self.done: set[str] = set()
        self.start = None
        self.phase: str | None = None
        self.task: str | None = None

    def show(self, event: dict) -> None:
        self.start = self.start or event["timestamp"]
        elapsed = _elapsed((event["timestamp"] - self.start).total_seconds())
        kind = event["type"]
        if kind.endswith("StateEntered"):
            self._entered(elapsed, kind, event["stateEnteredEventDetails"]["name"])
        elif kind == "TaskScheduled" and self.task and _is_job(event):
            self.attempts[self.task] = self.attempts.get(self.task, 0) + 1
            if self.attempts[self.task] > 1:
                self._print(elapsed, f"{self.task} attempt {self.attempts[self.task]}")
        elif kind in ("TaskFailed", "TaskTimedOut"):
            details = event.get("taskFailedEventDetails") or event.get("taskTimedOutEventDetails") or {}
            print(
                f"{elapsed}  {' ' * len(_progress(len(self.phases), len(self.phases)))}  {self.task} attempt "
                f"{self.attempts.get(self.task, 1)} failed: {details.get('error', '')}",
                file=self.out,
            )

    def _entered(self, elapsed: str, kind: str, name: str) -> None:
        # The phases of the run, and where it ends; the checks and reshaping states in between are quiet, and so
        # are the states inside a phase (Train's job and its failure kinds, Validate's Spot and on-demand
        # submissions): their attempts count for the phase.
        inside = bool(self.phase) and name != self.phase and name.startswith(self.phase or "")
        self.task = self.phase if inside else name
        if name in self.phases:
            self.phase = self.task = name
            self.done.add(name)
            self._print(elapsed, name)
        elif kind in ("SucceedStateEntered", "FailStateEntered") and not inside:
            self._print(elapsed, name)

    def _print(self, elapsed: str, text: str) -> None:
        print(f"{elapsed}  {_progress(len(self.done), len(self.phases))}  {text}", file=self.out)


def _final_line(described: dict) -> str:
    stop = described.get("stopDate") or datetime.now(UTC)
    line = f"{described['status']} after {_elapsed((stop - described['startDate']).total_seconds())}"
    if described.get("error"):
        line += f": {described['error']}: {described.get('cause', '')[:300]}"
    return line


def watch(pipeline: Pipeline, execution_arn: str, out, interval: float = 10.0) -> int:
    """Print states as they pass, with attempts, elapsed time and progress; return the run's exit code."""
    progress, last_id = _Progress(out, pipeline.phases), 0
    while True:
        # Status first, then history: every event before a final status is in the history read after it.
        described = call(pipeline.sfn.describe_execution, executionArn=execution_arn)
        # History has no "since" parameter: page through it and skip the events already shown.
        events = [event for event in pipeline.all_history(execution_arn) if event["id"] > last_id]
        last_id = events[-1]["id"] if events else last_id
        for event in events:
            progress.show(event)
        if described["status"] != "RUNNING":
            print(_final_line(described), file=out)
            return RESULT_CODES.get(described["status"], 1)
        time.sleep(interval)


def cmd_list(args, pipeline: Pipeline, out) -> int:
    """Every claimed run id (the runs table), newest claim first, with the status of the execution holding it."""
    shown = 0
    for run in sorted(claimed_runs(pipeline), key=lambda item: item.get(RUN_SINCE, ""), reverse=True):
        if shown == args.max:
            break
        holder = run.get(RUN_HOLDER, "")
        status = holder_status(pipeline, holder)
        if args.status and status != args.status:
            continue
        since = run.get(RUN_SINCE, "")[:16].replace("T", " ")
        print(f"{run[RUNS_TABLE_KEY]:<40} {status:<10} {since:<16} {holder.rsplit(':', 1)[-1]}", file=out)
        shown += 1
    if not shown:
        print("no runs yet" if not args.status else f"no {args.status} runs", file=out)
    return 0


def claimed_runs(pipeline: Pipeline) -> list[dict[str, str]]:
    """Every item of the runs table, its string attributes as plain values (a Scan, page by page)."""
    table = pipeline.runs_table
    if table is None:
        raise CliError(
            f"environment {pipeline.env!r}: stack {stack_name(pipeline.env, 'Storage')} has no {RUNS_TABLE_OUTPUT} "
            "output; redeploy the storage stack"
        )
    dynamodb, runs, start = pipeline._client("dynamodb"), [], None
    # Not the runs' inputs (up to 256 KiB each): the key, the holder and when.
    names = {"#k": RUNS_TABLE_KEY, "#h": RUN_HOLDER, "#s": RUN_SINCE}
    shown = {"ProjectionExpression": "#k, #h, #s", "ExpressionAttributeNames": names}
    # A Scan answers at most 1 MB a call; LastEvaluatedKey starts the next page (DynamoDB API reference, Scan).
    while True:
        page = call(dynamodb.scan, TableName=table, **shown, **({"ExclusiveStartKey": start} if start else {}))
        runs += [{name: value["S"] for name, value in item.items() if "S" in value} for item in page["Items"]]
        start = page.get("LastEvaluatedKey")
        if not start:
            return runs


def holder_status(pipeline: Pipeline, execution_arn: str) -> str:
    """The status of the execution holding a run; EXPIRED once Step Functions no longer keeps it."""
    try:
        return call(pipeline.sfn.describe_execution, executionArn=execution_arn)["status"]
    except CliError as error:
        if str(error).startswith("no such execution"):
            return "EXPIRED"
        raise


def cmd_describe(args, pipeline: Pipeline, out) -> int:
    arn = pipeline.execution_arn(args.execution)
    described = call(pipeline.sfn.describe_execution, executionArn=arn)
    run = _json_object(described.get("input"))  # whoever started it may have given any JSON
    run_id = run.get("run_id") if isinstance(run.get("run_id"), str) else None
    shown = run_id or "(the input names no run id)"
    print(f"run        {shown}  ({described['name']})", file=out)
    print(f"status     {described['status']}", file=out)
    if described.get("error"):
        print(f"error      {described['error']}: {described.get('cause', '')[:500]}", file=out)
    if run_id and re.fullmatch(schema.RUN_ID_PATTERN, run_id) and pipeline.runs_table:
        print(f"claim      {_claim(pipeline, run_id, arn)}", file=out)
    jobs, verdict = {}, None
    current = None
    events = pipeline.all_history(arn)
    for event in events:
        if "stateEnteredEventDetails" in event:
            current = event["stateEnteredEventDetails"]["name"]
        details = event.get("taskSucceededEventDetails") or event.get("taskSubmittedEventDetails")
        if details and details.get("resource", "").startswith("submitJob"):
            output = _json_object(details.get("output"))
            jobs[current] = output.get("JobId") or output.get("jobId")
        if event["type"] == "TaskSucceeded" and current == "ReadVerdict":
            body = _json_object(event["taskSucceededEventDetails"].get("output")).get("Body")
            verdict = _json_object(body) if isinstance(body, str) else body
    if verdict is None and run_id and re.fullmatch(schema.RUN_ID_PATTERN, run_id) and pipeline.bucket:
        verdict = _read_verdict(pipeline, run_id)
    if isinstance(verdict, dict) and verdict:
        outcome = "accepted" if verdict.get("passed") else "rejected"
        print(
            f"verdict    {outcome}: {verdict.get('metric')} = {verdict.get('value')} (baseline "
            f"{verdict.get('baseline')}, relative delta {verdict.get('relative_delta')}, tolerance "
            f"{verdict.get('tolerance')})",
            file=out,
        )
    else:
        print("verdict    none yet", file=out)
    from tools.quote import quote_and_actual

    nodes = run["nodes"] if isinstance(run.get("nodes"), int) else pipeline.max_nodes
    for line in quote_and_actual(events, nodes, environment_config(pipeline.env)):
        print(line, file=out)
    for line in model_registry.lines(events):
        print(line, file=out)
    if run_id and re.fullmatch(schema.RUN_ID_PATTERN, run_id) and pipeline.bucket:
        for line in bad_hosts.lines(pipeline._client("s3"), pipeline.bucket, run_id):
            print(line, file=out)
    for state, job_id in jobs.items():
        print(
            f"job        {state:<12} {job_id}  {_console(pipeline.region, f'batch/home#jobs/detail/{job_id}')}",
            file=out,
        )
    dashboard = dashboard_name(pipeline.env)
    print(f"dashboard  {_console(pipeline.region, f'cloudwatch/home#dashboards/dashboard/{dashboard}')}", file=out)
    print(f"execution  {_console(pipeline.region, f'states/home#/v2/executions/details/{arn}')}", file=out)
    if pipeline.log_group:
        group = quote(quote(pipeline.log_group, safe=""), safe="")  # the console's double encoding
        print(
            f"logs       {_console(pipeline.region, f'cloudwatch/home#logsV2:log-groups/log-group/{group}')}", file=out
        )
    return RESULT_CODES.get(described["status"], 1) if described["status"] != "RUNNING" else 0


def _claim(pipeline: Pipeline, run_id: str, execution_arn: str) -> str:
    """Who holds the run id, from the runs table: this execution, another one (a resume took it over), or none."""
    try:
        found = call(
            pipeline._client("dynamodb").get_item,
            TableName=pipeline.runs_table,
            Key={RUNS_TABLE_KEY: {"S": run_id}},
            ConsistentRead=True,
        )
    except CliError as error:
        return f"unreadable ({error})"
    if "Item" not in found:
        return "none: the run id was never claimed"
    holder = found["Item"].get(RUN_HOLDER, {}).get("S", "")
    since = found["Item"].get(RUN_SINCE, {}).get("S", "")
    who = "this execution" if holder == execution_arn else f"execution {holder.rsplit(':', 1)[-1]}"
    return f"held by {who} since {since}"


def _json_object(text: object) -> dict:
    """A JSON object from text, or {} for anything else (an array, null, a string, text that is not JSON)."""
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _read_verdict(pipeline: Pipeline, run_id: str) -> dict | None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        body = pipeline._client("s3").get_object(Bucket=pipeline.bucket, Key=f"{RUNS_PREFIX}{run_id}/verdict.json")[
            "Body"
        ]
        return _json_object(body.read(64 * 1024).decode("utf-8", "replace"))
    except (ClientError, BotoCoreError):
        return None


def _console(region: str, fragment: str) -> str:
    path, _, anchor = fragment.partition("#")
    return f"https://{region}.console.aws.amazon.com/{path}?region={region}#{anchor}"


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
    return p


def _version() -> str:
    """The release, from the one file that holds it (copied into the training image as well)."""
    path = Path(__file__).resolve().parents[1] / "training_image" / "version.py"
    found = re.search(r'^VERSION = "([^"]+)"', path.read_text(), re.MULTILINE)
    return found.group(1) if found else "unknown"


COMMANDS = {"start": cmd_start, "watch": cmd_watch, "list": cmd_list, "describe": cmd_describe}


def main(argv: list[str] | None = None, *, session=None, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = parser().parse_args(argv)
    try:
        if args.command == "start":  # a malformed run file fails before any AWS call
            from config.environment import MAX_NODES

            load_run(args.run_file, max_nodes=MAX_NODES, workloads=declared_workloads(args.env))
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
