"""`pipeline_cli list` (the claimed runs, from the runs table) and `pipeline_cli describe` (one execution's verdict,
quote against actual, model, bad hosts, jobs and console links).
"""

import re
from urllib.parse import quote

from config.layout import (
    NODE_LEASE_PREFIX,
    RUN_HOLDER,
    RUN_SINCE,
    RUNS_PREFIX,
    RUNS_TABLE_KEY,
    RUNS_TABLE_OUTPUT,
    dashboard_name,
    stack_name,
    tracking_server_name,
)
from contracts import run as schema
from contracts.workload_registry import WORKLOAD_PREFIX
from tools import bad_hosts, model_registry
from tools.pipeline_session import RESULT_CODES, CliError, Pipeline, _json_object, call, environment_config

# The runs table's items that are no run: EKS's node lease and the registered workloads (no run id holds a '#').
NOT_RUNS = (NODE_LEASE_PREFIX, WORKLOAD_PREFIX)


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


def runs_table(pipeline: Pipeline) -> str:
    """The environment's runs table (the storage stack's output), or one line saying it has none."""
    table = pipeline.runs_table
    if table is None:
        raise CliError(
            f"environment {pipeline.env!r}: stack {stack_name(pipeline.env, 'Storage')} has no {RUNS_TABLE_OUTPUT} "
            "output; redeploy the storage stack"
        )
    return table


def claimed_runs(pipeline: Pipeline) -> list[dict[str, str]]:
    """Every run of the runs table (not EKS's node lease, nor the registered workloads), its string attributes as
    plain values (a Scan, page by page)."""
    table = runs_table(pipeline)
    dynamodb, runs, start = pipeline._client("dynamodb"), [], None
    # Not the runs' inputs (up to 256 KiB each): the key, the holder and when.
    names = {"#k": RUNS_TABLE_KEY, "#h": RUN_HOLDER, "#s": RUN_SINCE}
    shown = {"ProjectionExpression": "#k, #h, #s", "ExpressionAttributeNames": names}
    # A Scan answers at most 1 MB a call; LastEvaluatedKey starts the next page (DynamoDB API reference, Scan).
    while True:
        page = call(dynamodb.scan, TableName=table, **shown, **({"ExclusiveStartKey": start} if start else {}))
        items = [{name: value["S"] for name, value in item.items() if "S" in value} for item in page["Items"]]
        runs += [item for item in items if not item.get(RUNS_TABLE_KEY, "").startswith(NOT_RUNS)]
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
    events = pipeline.all_history(arn)
    jobs, verdict = _jobs_and_verdict(events)
    if verdict is None and run_id and re.fullmatch(schema.RUN_ID_PATTERN, run_id) and pipeline.bucket:
        verdict = _read_verdict(pipeline, run_id)
    print(_verdict_line(verdict), file=out)
    from tools.quote import quote_and_actual

    nodes = run["nodes"] if isinstance(run.get("nodes"), int) else pipeline.max_nodes
    for line in quote_and_actual(events, nodes, environment_config(pipeline.env)):
        print(line, file=out)
    for line in model_registry.lines(events):
        print(line, file=out)
    for line in _tracking_lines(environment_config(pipeline.env), run_id):
        print(line, file=out)
    if run_id and re.fullmatch(schema.RUN_ID_PATTERN, run_id) and pipeline.bucket:
        for line in bad_hosts.lines(pipeline._client("s3"), pipeline.bucket, run_id):
            print(line, file=out)
    _print_links(pipeline, arn, jobs, out)
    return RESULT_CODES.get(described["status"], 1) if described["status"] != "RUNNING" else 0


def _jobs_and_verdict(events: list[dict]) -> tuple[dict, object]:
    """From an execution's history: the job each state submitted, and the verdict ReadVerdict read (None if none)."""
    jobs, verdict = {}, None
    current = None
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
    return jobs, verdict


def _tracking_lines(config, run_id: str | None) -> list[str]:
    """The run's MLflow run (named by the run id in the environment's experiment), where tracking is on; for the
    managed server, how to open its UI (CreatePresignedMlflowTrackingServerUrl, a short-lived signed link)."""
    if not run_id or not (config.tracking_uri or config.tracking_server):
        return []
    server = tracking_server_name(config.name)
    where = config.tracking_uri or f"SageMaker managed server {server}"
    lines = [f"tracking   MLflow {where}: experiment {config.name!r}, run {run_id!r}"]
    if config.tracking_server:
        lines.append(
            "           open: aws sagemaker create-presigned-mlflow-tracking-server-url "
            f"--tracking-server-name {server}"
        )
    return lines


def _verdict_line(verdict: object) -> str:
    if isinstance(verdict, dict) and verdict:
        outcome = "accepted" if verdict.get("passed") else "rejected"
        return (
            f"verdict    {outcome}: {verdict.get('metric')} = {verdict.get('value')} (baseline "
            f"{verdict.get('baseline')}, relative delta {verdict.get('relative_delta')}, tolerance "
            f"{verdict.get('tolerance')})"
        )
    return "verdict    none yet"


def _print_links(pipeline: Pipeline, arn: str, jobs: dict, out) -> None:
    """The console's pages: each job, the environment's dashboard, the execution and its logs."""
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
