"""The training run's contract: its fields, types, limits, defaults, known models and strategies, stage timeouts.

One source for every run fact. The state machine's input checks are generated from these tables
(constructs/pipeline/input_checks.py), the operator CLI validates a run file with `validate_run`, the Batch job
definitions and the state machine read the stage timeouts, so none of them can disagree.
"""

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from config.layout import DATASETS_PREFIX
from contracts.stage_timing import (
    CAPACITY_RETRY_MINUTES as CAPACITY_RETRY_MINUTES,
)
from contracts.stage_timing import (
    FAILURE_REASON_MARKER as FAILURE_REASON_MARKER,
)
from contracts.stage_timing import (
    JOB_END_MARGIN_SECONDS as JOB_END_MARGIN_SECONDS,
)

# The stage timeouts and exit codes live in stage_timing.py; re-exported: the contract is read from here.
from contracts.stage_timing import (
    MAX_ATTEMPTS as MAX_ATTEMPTS,
)
from contracts.stage_timing import (
    MAX_EXECUTION_SECONDS as MAX_EXECUTION_SECONDS,
)
from contracts.stage_timing import (
    PHASES as PHASES,
)
from contracts.stage_timing import (
    QUEUE_WAIT_MINUTES as QUEUE_WAIT_MINUTES,
)
from contracts.stage_timing import (
    REFUSED_EXIT_CODES as REFUSED_EXIT_CODES,
)
from contracts.stage_timing import (
    WINDOW_ENDED_EXIT_CODE as WINDOW_ENDED_EXIT_CODE,
)
from contracts.stage_timing import (
    Stage as Stage,
)
from contracts.stage_timing import (
    capacity_retries as capacity_retries,
)
from contracts.stage_timing import (
    execution_seconds as execution_seconds,
)
from contracts.stage_timing import (
    phases as phases,
)
from contracts.stage_timing import (
    stages as stages,
)
from contracts.stage_timing import (
    train_state_seconds as train_state_seconds,
)

if TYPE_CHECKING:
    from contracts.workload_cost import CostModel

REQUIRED = object()  # the default of a field the input must give
# The default of a field that may be left out and has no value then: the state machine keeps this marker (a string
# where the field is a number), so a later state can tell "left out" apart (baseline: pipeline/initial_model.py).
NOT_GIVEN = "<missing>"

# ---- identifiers -------------------------------------------------------------------------------------
# Names built from the run id and their limits: Batch job names `<run_id>-validate` (128 characters, letters,
# digits, '-', '_': API_SubmitJob), the CLI's execution name `<run_id>-<UTC time>` (80: API_StartExecution),
# S3 keys `runs/<run_id>/...` (1024 bytes), and a SageMaker training job name for a backend to come
# (63 characters, letters, digits and '-' only: API_CreateTrainingJob), which needs room for a phase and an
# attempt suffix. So: 1-40 ASCII letters, digits and '-', starting and ending with a letter or digit.
RUN_ID_MAX_LENGTH = 40
RUN_ID_CHARACTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-"
RUN_ID_PATTERN = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38}[A-Za-z0-9])?"
RUN_ID_RULE = f"1-{RUN_ID_MAX_LENGTH} ASCII letters, digits and '-', starting and ending with a letter or digit"

# A dataset is a folder under datasets/ in the data bucket (= /fsx/datasets/...): segments of ASCII letters,
# digits, '_', '-' and single inner dots, so no '..', no empty segment, no control character, no escape.
DATASET_PREFIX = DATASETS_PREFIX
DATASET_MAX_LENGTH = 256
_SEGMENT = r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*"
DATASET_PATTERN = rf"{re.escape(DATASET_PREFIX)}{_SEGMENT}(?:/{_SEGMENT})*/?"
DATASET_RULE = (
    f"a folder under {DATASET_PREFIX} in the data bucket like {DATASET_PREFIX}wikitext/: at most "
    f"{DATASET_MAX_LENGTH} characters, segments of ASCII letters, digits, '_', '-' and inner dots "
    "(no '..', no empty segment)"
)

# Incremental training: a run may start from an approved model instead of from scratch: "approved" (the environment's
# last approved model, the pipeline's SSM parameter) or the id of an approved run (models/<run_id>/approval.json).
INIT_FROM_APPROVED = "approved"
INIT_FROM_PATTERN = rf"(?:{RUN_ID_PATTERN})?"
INIT_FROM_RULE = (
    f"empty (train from scratch), {INIT_FROM_APPROVED!r} (the environment's last approved model) or the run id of an "
    "approved model, not this run's own"
)
# What the train job receives when the run starts from scratch (a Batch job parameter cannot be an empty string).
NO_INITIAL_MODEL = "none"

# What a run trains: a workload, each declared with its hyperparameters' schema (contracts/workload.py): the
# platform's own trainers beside their code (training_image/efa_training/workloads/<name>/workload.json), and an
# environment's own (cdk.json `workloads`). A run that names none trains this one, the built-in language model.
DEFAULT_WORKLOAD = "gpt"
BUILT_IN_NAMES = ("gpt", "ctr-ps")  # training_image/efa_training/workloads/<name>/ (tests hold the two equal)
# A workload's name (contracts/workload.py NAME_PATTERN, tests hold the two equal).
WORKLOAD_NAME_PATTERN = r"[a-z](?:[a-z0-9-]{0,22}[a-z0-9])?"


@dataclass(frozen=True)
class Field:
    """One input field. `kind`: string, integer, number, boolean or object; integers are whole JSON numbers
    written without a fraction or exponent (2.0 and 1e3 are refused: the job would receive "2.0")."""

    name: str  # dotted for nested fields: hyperparameters.max_steps
    kind: str
    default: object = REQUIRED
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    max_length: int | None = None
    rule: str = ""  # what is allowed, in words
    # A declared hyperparameter's relations to the others (contracts/workload.py "requires", "divides"): a value
    # other than the default needs each named one to be one of its values; the value divides the number the named
    # string hyperparameter's value maps to. Judged once every value is valid alone (relation_problem).
    requires: tuple[tuple[str, tuple[str, ...]], ...] = ()
    divides: tuple[str, tuple[tuple[str, int], ...]] | None = None
    # A degree of parallelism over the run's workers (contracts/workload.py "layout"): "node", its groups are
    # consecutive ranks inside one node (it divides a node's workers); "run", anywhere. The degrees together divide
    # the run's workers, nodes x a node's workers (layout_problem).
    layout: str = ""

    @property
    def key(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def allowed(self) -> str:
        if self.rule:
            return self.rule
        if self.choices:
            return "one of " + ", ".join(self.choices)
        kind = {"integer": "an integer", "number": "a number"}.get(self.kind, f"a {self.kind}")
        if self.minimum is None:
            return kind if self.maximum is None else f"{kind} up to {_num(self.maximum)}"
        low = f"greater than {_num(self.minimum)}" if self.exclusive_minimum else f"from {_num(self.minimum)}"
        return f"{kind} {low} to {_num(self.maximum)}" if self.maximum is not None else f"{kind} {low}"


@dataclass(frozen=True)
class WorkloadSchema:
    """What the contract knows of a workload: its hyperparameters (dotted names: hyperparameters.<name>), whether it is
    one of the platform's own trainers (run by the platform's jobs; the only ones a run may start from an approved
    model with `init_from`), and its cost model."""

    hyperparameters: tuple[Field, ...]
    built_in: bool = False
    cost: "CostModel | None" = None


# Each workload's schema by its name (contracts.workload.schemas: the built-in ones and an environment's own).
WorkloadSchemas = Mapping[str, WorkloadSchema]


def known_workloads(workloads: WorkloadSchemas | None = None) -> dict[str, WorkloadSchema]:
    """The built-in workloads' schemas and `workloads` (an environment's declared ones)."""
    from contracts.workload import schemas  # the declarations import this module's fields

    return {**schemas(()), **(workloads or {})}


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def fields(
    max_nodes: int, min_nodes: int = 1, workloads: WorkloadSchemas | None = None, workload: str = DEFAULT_WORKLOAD
) -> tuple[Field, ...]:
    """Every field with its rule, hyperparameters those of `workload` (a built-in one or one of `workloads`).
    `nodes` defaults to the environment's maximum; a backend whose multi-node jobs have a fixed size (Batch) takes
    exactly that many (min_nodes == max_nodes)."""
    known = known_workloads(workloads)
    nodes_rule = (
        f"exactly {max_nodes}: this backend's multi-node job definitions fix the node count"
        if min_nodes == max_nodes
        else f"an integer from {min_nodes} to {max_nodes} (this environment's maximum)"
    )
    return (
        Field("run_id", "string", pattern=RUN_ID_PATTERN, max_length=RUN_ID_MAX_LENGTH, rule=RUN_ID_RULE),
        Field("dataset", "string", pattern=DATASET_PATTERN, max_length=DATASET_MAX_LENGTH, rule=DATASET_RULE),
        Field("nodes", "integer", max_nodes, min_nodes, max_nodes, rule=nodes_rule),
        Field(
            "baseline",
            "number",
            NOT_GIVEN,
            minimum=-1e12,
            maximum=1e12,
            rule="a finite number from -1e12 to 1e12: the validation metric the model must match (left out: the "
            "initial model's with init_from; the run's own on an environment's first run, which nothing approved yet)",
        ),
        Field("init_from", "string", "", pattern=INIT_FROM_PATTERN, max_length=RUN_ID_MAX_LENGTH, rule=INIT_FROM_RULE),
        Field("tolerance", "number", 0.001, 0.0, 1.0),  # 0.1%: the seeds accept a model within 0.1% of the baseline
        # The backend's own attempts per training submission: Batch SubmitJob RetryStrategy.attempts (1-10,
        # API_RetryStrategy); SageMaker RetryStrategy.MaximumRetryAttempts = attempts - 1, at least 1.
        Field("max_attempts", "integer", 2, 1, MAX_ATTEMPTS),
        Field("resume", "boolean", False, rule="true or false: true resumes an earlier run with this run_id"),
        Field(
            "may_exceed_budget",
            "boolean",
            False,
            rule="true or false: true runs even when the quote exceeds what is left of the monthly budget",
        ),
        Field("hyperparameters", "object", {}, rule="an object with only the hyperparameters listed"),
        Field(
            "workload",
            "string",
            DEFAULT_WORKLOAD,
            pattern=WORKLOAD_NAME_PATTERN,
            max_length=24,
            rule=f"a workload's name: {', '.join(BUILT_IN_NAMES)} (the platform's trainers) or one registered in this "
            "environment (pipeline_cli workload list)",
        ),
        # contracts/workload_registry.py: a registered workload's versions count from 1; 0 is its newest.
        Field("workload_version", "integer", 0, 0, 1_000_000, rule="0 (the newest) or a registered version number"),
    ) + (known[workload].hyperparameters if workload in known else ())


def top_level(all_fields: tuple[Field, ...]) -> tuple[Field, ...]:
    return tuple(f for f in all_fields if "." not in f.name)


def hyperparameters(all_fields: tuple[Field, ...]) -> tuple[Field, ...]:
    return tuple(f for f in all_fields if f.name.startswith("hyperparameters."))


def defaults(
    max_nodes: int, workloads: WorkloadSchemas | None = None, workload: str = DEFAULT_WORKLOAD
) -> dict[str, object]:
    """The run's defaults, hyperparameters included (required fields left out)."""
    table = fields(max_nodes, workloads=workloads, workload=workload)
    run = {f.name: f.default for f in top_level(table) if not f.required}
    run["hyperparameters"] = {f.key: f.default for f in hyperparameters(table) if not f.required}
    return run


# ---- what each job receives from a run: job parameter -> where the state machine reads its value. Values are
# strings (Batch job Parameters, `Ref::name` in the job definitions; launcher flags on EKS); tests hold the Batch
# job definitions' placeholders and the training image's flags to these names.
def filled(run: dict, max_nodes: int, workloads: WorkloadSchemas | None = None) -> dict:
    """A valid run with every default filled in, as the pipeline holds it after its input checks."""
    base = defaults(max_nodes, workloads, run.get("workload", DEFAULT_WORKLOAD))
    given = run.get("hyperparameters", {})
    return {**base, **run, "hyperparameters": {**base["hyperparameters"], **given}}  # type: ignore[dict-item]


def _as_string(path: str) -> str:
    return f"States.Format('{{}}', {path})"


# Every workload's jobs take the same values: its hyperparameters travel whole, as JSON text. A declared workload's
# launcher gives them to its code as HYPERPARAMETERS_FILE (docs/workloads.md); the platform's own trainers take them
# as flags (training_image/efa_training/runtime/launch/hyperparameters.py).
JOB_VALUES = {
    "run_id": "$.run.run_id",
    "dataset": "$.run.dataset",
    "hyperparameters": "States.JsonToString($.run.hyperparameters)",
    "baseline": _as_string("$.run.baseline"),
    # The resolved initial model's run id, or NO_INITIAL_MODEL (constructs/pipeline/initial_model.py sets it).
    "init_from": "$.run.init_run",
    "tolerance": _as_string("$.run.tolerance"),
    # When the training must have stopped and saved: the moment the provider takes the environment's reservation away
    # (its end less the provider's lead, ISO-8601 UTC), or STOP_BY_NONE (constructs/pipeline/reservation_end.py sets
    # it; the launcher reads it: runtime/launch/stop_by.py).
    "stop_by": "$.run.stop_by",
}
STOP_BY_NONE = "none"
JOB_PARAMETERS = {
    "sanity": ("run_id",),
    "train": ("run_id", "dataset", "hyperparameters", "init_from", "stop_by"),
    "validate": ("run_id", "dataset", "hyperparameters", "baseline", "tolerance"),
}
# The strictest backend's limit on that text: a SageMaker hyperparameter value holds at most 2,500 characters
# (botocore's SageMaker model, HyperParameterValue: max 2500; API_CreateTrainingJob HyperParameters).
HYPERPARAMETERS_MAX_CHARACTERS = 2500
HYPERPARAMETERS_RULE = (
    f"hyperparameters (defaults merged) of at most {HYPERPARAMETERS_MAX_CHARACTERS} characters as compact "
    "JSON: they reach the job as one value, and a SageMaker hyperparameter holds no more"
)
# A declared workload's jobs: the same, less the initial model, which only the platform's own trainers take.
WORKLOAD_JOB_PARAMETERS = {
    **JOB_PARAMETERS,
    "train": tuple(name for name in JOB_PARAMETERS["train"] if name != "init_from"),
}
# Trainium's compile job runs a few steps of the same training
# (training_image/efa_training/runtime/launch/neuron_compile.py), so it takes the
# train job's parameters; the image replaces the step count and moves checkpoints and metrics aside.
JOB_PARAMETERS["compile"] = JOB_PARAMETERS["train"]

# ---- validation (the state machine checks the same, and stops at the first problem) ------------------


def validate_run(
    run: object,
    max_nodes: int,
    min_nodes: int = 1,
    workloads: WorkloadSchemas | None = None,
    workers_per_node: int | None = None,
) -> list[str]:
    """Every problem with a run, one line each, naming the field, the value and what is allowed; its hyperparameters
    are those of the workload it names (`workloads`: the environment's declared ones). `workers_per_node`: the
    environment's (the catalogue's), against which the workload's layout degrees are judged; None: not judged."""
    if not isinstance(run, dict):
        return [f"the run must be a JSON object, not {_json_type(run)}"]
    known = known_workloads(workloads)
    workload = run.get("workload", DEFAULT_WORKLOAD)
    if not isinstance(workload, str) or workload not in known:
        # Its hyperparameters cannot be judged: the workload that declares them is unknown.
        named = next(f for f in fields(max_nodes, workloads=known) if f.name == "workload")
        return [check_value(named, workload) or f"workload={_show(workload)} is not valid; expected {named.allowed()}"]
    table = fields(max_nodes, min_nodes, known, workload)
    allowed = {f.name for f in top_level(table)}
    problems = [
        f"unknown field {key!r}; expected only {', '.join(sorted(allowed))}" for key in run if key not in allowed
    ]
    hyper = run.get("hyperparameters", {})
    if not isinstance(hyper, dict):
        problems.append(f"hyperparameters={_show(hyper)} is not valid; expected an object")
        hyper = {}
    names = ", ".join(f.key for f in hyperparameters(table)) or "none (this workload declares no hyperparameters)"
    problems += [
        f"unknown hyperparameter {key!r}; expected only {names}" for key in hyper if key not in names.split(", ")
    ]
    if known[workload].built_in and run.get("workload_version", 0) != 0:  # the pipeline's first state says the same
        problems.append(
            f"workload_version={_show(run['workload_version'])} is not valid for workload {workload!r}; expected 0: "
            "the platform's trainers have one version, the deployed one"
        )
    for f in table:
        if f.kind != "object":
            problem = _field_problem(f, hyper if f.name.startswith("hyperparameters.") else run)
            problems += [problem] if problem else []
    merged = {f.key: f.default for f in hyperparameters(table) if not f.required} | hyper
    if not problems:  # relations, once every value is valid alone
        problems += [p for f in hyperparameters(table) if (p := relation_problem(f, merged))]
    if not problems and workers_per_node:
        nodes = run.get("nodes", max_nodes)
        problems += [p] if (p := layout_problem(hyperparameters(table), merged, nodes, workers_per_node)) else []
    # judged once every value is (a huge integer has no JSON text to measure)
    if not problems and len(json.dumps(merged, separators=(",", ":"))) > HYPERPARAMETERS_MAX_CHARACTERS:
        problems.append(f"hyperparameters is not valid; expected {HYPERPARAMETERS_RULE}")
    if run.get("init_from") and not known[workload].built_in:
        problems.append(
            f"init_from={_show(run['init_from'])} is not valid for workload {workload!r}; expected empty: a "
            "declared workload starts from its own code (the platform gives it no initial model yet)"
        )
    return problems


def relation_problem(f: Field, values: Mapping[str, object]) -> str | None:
    """The problem of hyperparameter `f`'s value with those it relates to (`requires`, `divides`), or None."""
    value = values.get(f.key)
    for other, allowed in f.requires:
        if value != f.default and values.get(other) not in allowed:
            return (
                f"{f.name}={_show(value)} is not valid with {other}={_show(values.get(other))}; expected {f.allowed()}"
            )
    if f.divides is not None:
        by, table = f.divides
        number = dict(table).get(str(values.get(by)))
        if number is not None and isinstance(value, int) and value > 0 and number % value:
            return f"{f.name}={_show(value)} is not valid with {by}={_show(values.get(by))}; expected {f.allowed()}"
    return None


def layout_problem(table: tuple[Field, ...], values: Mapping[str, object], nodes: object, per_node: int) -> str | None:
    """The problem of the run's layout degrees (Field.layout) on `nodes` nodes of `per_node` workers, or None."""
    degrees = [(f, v) for f in table if f.layout and isinstance(v := values.get(f.key), int) and v >= 1]
    for f, value in degrees:
        if f.layout == "node" and per_node % value:
            divisors = ", ".join(str(d) for d in range(1, per_node + 1) if per_node % d == 0)
            return (
                f"{f.name}={value} is not valid; expected a divisor of a node's {per_node} workers ({divisors}): "
                "its groups stay inside one node"
            )
    product = math.prod(v for _, v in degrees)
    if degrees and isinstance(nodes, int) and (nodes * per_node) % product:
        named = " x ".join(f"{f.key} {v}" for f, v in degrees)
        return (
            f"hyperparameters {named} = {product} is not valid with nodes={nodes}; expected a divisor of the run's "
            f"{nodes * per_node} workers ({nodes} nodes x {per_node})"
        )
    return None


def _field_problem(f: Field, source: dict) -> str | None:
    """The problem with field `f` in `source` (the run or its hyperparameters); an absent optional field is fine."""
    if f.key not in source or (f.required and source[f.key] is None):
        return f"{f.name} is missing; expected {f.allowed()}" if f.required else None
    if f.name == "init_from" and source[f.key] and source[f.key] == source.get("run_id"):
        return f"init_from={_show(source[f.key])} is not valid; expected {f.allowed()}"
    return check_value(f, source[f.key])


def check_value(f: Field, value: object) -> str | None:
    """The one-line problem with one value, or None."""
    bad = f"{f.name}={_show(value)} is not valid; expected {f.allowed()}"
    if f.kind == "string":
        if not isinstance(value, str):
            return bad
        if f.max_length is not None and len(value) > f.max_length:
            return bad
        if f.pattern is not None and not re.fullmatch(f.pattern, value):
            return bad
        if f.choices and value not in f.choices:
            return bad
        return None
    if f.kind == "boolean":
        return None if isinstance(value, bool) else bad
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return bad
    if isinstance(value, float) and not math.isfinite(value):
        return bad
    if f.kind == "integer" and not isinstance(value, int):
        return bad  # 2.0 would reach the job as "2.0"
    too_low = f.minimum is not None and (value < f.minimum or (f.exclusive_minimum and value == f.minimum))
    too_high = f.maximum is not None and value > f.maximum
    return bad if too_low or too_high else None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "an array", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _show(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 64:  # repr() of a huge int may raise
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
