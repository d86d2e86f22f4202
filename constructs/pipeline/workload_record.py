"""The run's workload, read as data: the built-in trainers' records from the template, a registered one's from the
runs table (contracts/workload_registry.py), in the same four states however many workloads are registered.

A run names `workload` and optionally `workload_version` (0, the default: the newest). The table is read with a
strongly consistent GetItem (DynamoDB developer guide, "Read consistency"), so a workload registered a moment before
the run starts is found. A name nobody registered, or a retired workload's newest version, refuses the run before
anything is claimed or spent; a version once registered is never rewritten, so a run keeps the declaration it started
with whatever is registered after it.
"""

import json
from typing import TYPE_CHECKING

import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import RUNS_TABLE_KEY
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, DYNAMODB_TRANSIENT, retry_transient
from constructs.pipeline.hyperparameter_check import INVALID
from contracts.workload import BUILT_IN_ROOT, built_in_workloads
from contracts.workload_registry import NEWEST, RECORD, RETIRED, WORKLOAD_PREFIX, record

if TYPE_CHECKING:
    from constructs.pipeline.failure_path import FailurePath

C = sfn.Condition
J = sfn.JsonPath
NAME, VERSION = "$.run.workload", "$.run.workload_version"
REGISTER = "pipeline_cli workload register <env> decl.json"


def built_in_records() -> dict[str, dict]:
    """The platform's own trainers' records, as the deploy that ships their code writes them into the template."""
    records = {}
    for workload in built_in_workloads():
        source = json.loads((BUILT_IN_ROOT / workload.name.replace("-", "_") / "workload.json").read_text())
        # what the pipeline reads of it: the declaration as given (`source`) is the CLI's, and only adds to the template
        records[workload.name] = {k: v for k, v in record(workload, source, NEWEST).items() if k != "source"}
    return records


def workload_record(
    scope: Construct, *, table: dynamodb.ITable, failures: "FailurePath"
) -> tuple[sfn.Choice, sfn.Pass]:
    """(first, resolved): from `{run, raw}` (its own fields valid) to `resolved`, whose output is
    `{run, raw, registered}`
    (`registered`: the workload's record). The table's read is retried when throttled; it fails the run otherwise,
    through `failures`, before anything is claimed."""
    records = built_in_records()
    resolved = sfn.Pass(
        scope, "WorkloadResolved", parameters={"run.$": "$.run", "raw.$": "$.raw", "registered.$": "$.registered"}
    )
    built_in = sfn.Pass.jsonata(
        scope,
        "BuiltInWorkload",
        outputs={
            "run": "{% $states.input.run %}",
            "raw": "{% $states.input.raw %}",
            "registered": f"{{% $lookup({json.dumps(records)}, $states.input.run.workload) %}}",
        },
    )
    which = sfn.Choice(scope, "WhichWorkloadRecord")
    which.when(C.or_(*(C.string_equals(NAME, name) for name in records)), built_in.next(resolved))
    which.otherwise(_registered(scope, table, resolved, failures))
    return which, resolved


def _registered(
    scope: Construct, table: dynamodb.ITable, resolved: sfn.Pass, failures: "FailurePath"
) -> sfn.IChainable:
    """The newest version (the `workload#<name>` item) or the one named (`workload#<name>#<version>`)."""
    key = sfn.Pass.jsonata(
        scope,
        "WorkloadKey",
        outputs={
            "run": "{% $states.input.run %}",
            "raw": "{% $states.input.raw %}",
            "key": f"{{% '{WORKLOAD_PREFIX}' & $states.input.run.workload & ($states.input.run.workload_version = "
            f"{NEWEST} ? '' : '#' & $string($states.input.run.workload_version)) %}}",
        },
    )
    read = tasks.DynamoGetItem(
        scope,
        "ReadWorkload",
        table=table,
        key={RUNS_TABLE_KEY: tasks.DynamoAttributeValue.from_string(J.string_at("$.key"))},
        consistent_read=True,
        result_path="$.found",
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(read, DYNAMODB_TRANSIENT)
    failures.catch(read, "ReadWorkload", "RunNotStarted")
    unknown = sfn.Fail(
        scope,
        "WorkloadNotRegistered",
        error=INVALID,
        cause_path=J.format(
            "workload={} (version {}) is not valid; expected gpt, ctr-ps or a workload registered in this environment "
            f"({REGISTER}; pipeline_cli workload list <env> names them)",
            J.string_at(NAME),
            J.string_at(VERSION),  # a number: States.Format writes it as the run gave it
        ),
    )
    retired = sfn.Fail(
        scope,
        "WorkloadRetired",
        error=INVALID,
        cause_path=J.format(
            "workload={} is not valid; expected a workload that is not retired (register it again to use it)",
            J.string_at(NAME),
        ),
    )
    parse = sfn.Pass(
        scope,
        "ParseWorkload",
        parameters={
            "run.$": "$.run",
            "raw.$": "$.raw",
            "registered.$": f"States.StringToJson($.found.Item.{RECORD}.S)",
        },
    )
    flag = f"$.found.Item.{RETIRED}.BOOL"
    key.next(read).next(
        sfn.Choice(scope, "IsWorkloadRegistered")
        .when(C.is_not_present("$.found.Item"), unknown)
        # a resume keeps the workload it ran with, retired since or not (docs/workloads.md)
        .when(
            C.and_(C.is_present(flag), C.boolean_equals(flag, True), C.boolean_equals("$.run.resume", False)), retired
        )
        .otherwise(parse.next(resolved))
    )
    return key
