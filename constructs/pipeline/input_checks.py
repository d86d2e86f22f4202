"""Input validation in ASL, generated from the run contract (contracts/run.py), before any job exists.

The states, in order; every refusal is a Fail with error `InvalidInput` and a cause naming the field and what
is allowed:
1. the input is a JSON object (`States.JsonToString` starts with `{`), then defaults are merged under it and
   `hyperparameters` is checked to be an object the same way before its own defaults are merged;
2. unknown fields are found by counting: the merged input and the same object rebuilt from the known fields
   only are serialized and split on ':'; every extra key makes the first longer;
3. one Choice checks presence, types (`IsString`, `IsNumeric`, `IsBoolean`), ranges and known values;
4. integers: a count must reach the job as written, so its `States.Format` text may hold no '.', 'e' or 'E'
   (2.0 and 1e3 are refused: Batch would pass "2.0" to an integer flag);
5. patterns and lengths: JSONPath has no regular expressions or string lengths, so one JSONata Pass
   (Step Functions allows JSONata states in a JSONPath state machine: "Transforming data with JSONata in
   Step Functions", https://docs.aws.amazon.com/step-functions/latest/dg/transforming-data.html) evaluates
   `$length` and `$match(value, /regex/)` with the contract's own patterns.
"""

import dataclasses
import json

import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from contracts.run import (
    DEFAULT_WORKLOAD,
    HYPERPARAMETERS_MAX_CHARACTERS,
    HYPERPARAMETERS_RULE,
    NOT_GIVEN,
    Field,
    WorkloadSchemas,
    defaults,
    fields,
    hyperparameters,
    known_workloads,
    top_level,
)

C = sfn.Condition
INVALID = "InvalidInput"
# CDK drops None from state JSON, so a required field's default is this marker: still there after the merge
# means the input left the field out.
MISSING = NOT_GIVEN  # the marker of a field left out (a required one: refused; baseline: resolved later)


def _count(path: str) -> str:
    return f"States.ArrayLength(States.StringSplit(States.JsonToString({path}), ':'))"


def _state_name(field: str, problem: str) -> str:
    words = field.replace("hyperparameters.", "").split("_")
    return "Invalid" + "".join(w.capitalize() for w in words) + problem


def _is_object(scope: Construct, id_: str, fail: sfn.Fail, then: sfn.IChainable) -> sfn.Choice:
    """A Choice that goes on only when `$.shape` (States.JsonToString of the value) is a JSON object."""
    return sfn.Choice(scope, id_).when(C.not_(C.string_matches("$.shape", "{*")), fail).otherwise(then)


def _matches_whole(path: str, pattern: str | None, max_length: int | None, empty_allowed: bool = False) -> str:
    """JSONata: the value is at most `max_length` long and the contract's pattern matches all of it. Anchored at
    the start only, and compared with the value: a `$` anchor would also match before a trailing newline in
    Java's and Python's regular expressions. An empty value is compared directly where the field allows it ($match
    reports no zero-length match)."""
    assert pattern is not None and max_length is not None, path  # only fields with a pattern reach here
    regex = "/^" + pattern.replace("/", "\\/") + "/"
    empty = f"{path} = '' or " if empty_allowed else ""
    return f"{{% {empty}($length({path}) <= {max_length} and $match({path}, {regex})[0].match = {path}) %}}"


def input_validation(
    scope: Construct,
    *,
    max_nodes: int,
    min_nodes: int = 1,
    workloads: WorkloadSchemas | None = None,
    workers_per_node: int | None = None,
) -> tuple[sfn.IChainable, sfn.Pass]:
    """The validation states: (first state, the Pass reached by valid input, holding `$.run`). Every workload
    (the built-in ones and the environment's) gets the same checks with its own hyperparameters, in states named
    `<state>-<workload>`; the default workload's are named `<state>`. `workers_per_node`: the instance's, against
    which a workload's layout degrees are judged (contracts.run.layout_problem); None: not judged."""
    read = sfn.Pass(scope, "ReadInput", parameters={"input.$": "$", "shape.$": "States.JsonToString($)"})
    valid = sfn.Pass(scope, "InputValid", parameters={"run.$": "$.run"})
    known = known_workloads(workloads)
    chains = {
        name: _InputStates(
            scope, max_nodes=max_nodes, min_nodes=min_nodes, workloads=known, workload=name, per_node=workers_per_node
        )
        for name in known
    }
    for states in chains.values():
        states.check_fields(then=states.check_values(valid))
    default = chains.pop(DEFAULT_WORKLOAD)
    # The run's `workload` picks whose hyperparameters apply; a run that names none, or a workload nobody declares,
    # goes to the default workload's checks, whose rule for `workload` refuses an unknown one (its choices name all).
    which = sfn.Choice(scope, "WhichWorkload")
    for name, states in chains.items():
        path = "$.input.workload"
        which.when(C.and_(C.is_present(path), C.is_string(path), C.string_equals(path, name)), states.start)
    start = which.otherwise(default.start)
    not_object = default.fail(
        "input",
        "NotObject",
        f"the input must be a JSON object with the fields {', '.join(f.name for f in default.top)}",
    )
    read.next(_is_object(scope, "IsObject", not_object, start))
    return read, valid


class _InputStates:
    """1. shape and defaults, 2. presence, types, ranges and known values, 3. integers as written, patterns."""

    def __init__(
        self,
        scope: Construct,
        *,
        max_nodes: int,
        min_nodes: int,
        workloads: WorkloadSchemas | None,
        workload: str,
        per_node: int | None,
    ) -> None:
        self.scope, self.workload, self.per_node = scope, workload, per_node
        self.built_in = known_workloads(workloads)[workload].built_in
        self.suffix = "" if workload == DEFAULT_WORKLOAD else f"-{workload}"
        self.table = fields(max_nodes, min_nodes, workloads, workload)
        self.top, self.hyper = top_level(self.table), hyperparameters(self.table)
        self.run_defaults = defaults(max_nodes, workloads, workload)
        self.start, self.counted = self.complete_run()

    def id(self, name: str) -> str:
        return name + self.suffix

    def fail(self, field: str, problem: str, cause: str) -> sfn.Fail:
        return sfn.Fail(self.scope, self.id(_state_name(field, problem)), error=INVALID, cause=cause)

    def invalid(self, f: Field, problem: str) -> sfn.Fail:
        return self.fail(f.name, problem, f"{f.name} is not valid; expected {f.allowed()}")

    def complete_run(self) -> tuple[sfn.Pass, sfn.Pass]:
        """ApplyDefaults .. CountFields: the input with every default applied, and its field counts."""
        scope, top, hyper = self.scope, self.top, self.hyper
        apply_defaults = sfn.Pass(
            scope,
            self.id("ApplyDefaults"),
            parameters={
                "input.$": "$.input",
                "defaults": {
                    **{f.name: MISSING for f in top if f.required},
                    **{k: v for k, v in self.run_defaults.items() if k != "hyperparameters"},
                    "hyperparameters": {},
                },
                # A required hyperparameter (a declared workload's, without a default) is the marker until given.
                "hyperparameter_defaults": {
                    **{f.key: MISSING for f in hyper if f.required},
                    **self.run_defaults["hyperparameters"],  # type: ignore[dict-item]
                },
            },
        )
        merge = sfn.Pass(
            scope,
            self.id("MergeDefaults"),
            parameters={
                "run.$": "States.JsonMerge($.defaults, $.input, false)",
                "hyperparameter_defaults.$": "$.hyperparameter_defaults",
            },
        )
        inspect_hyper = sfn.Pass(
            scope,
            self.id("InspectHyperparameters"),
            parameters={
                "run.$": "$.run",
                "hyperparameter_defaults.$": "$.hyperparameter_defaults",
                "shape.$": "States.JsonToString($.run.hyperparameters)",
            },
        )
        merge_hyper = sfn.Pass(
            scope,
            self.id("MergeHyperparameters"),
            parameters={
                "given.$": "$.run",
                "merged": {
                    "hyperparameters.$": "States.JsonMerge($.hyperparameter_defaults, $.run.hyperparameters, false)"
                },
            },
        )
        complete = sfn.Pass(
            scope, self.id("CompleteInput"), parameters={"given.$": "States.JsonMerge($.given, $.merged, false)"}
        )
        project = sfn.Pass(
            scope,
            self.id("KeepKnownFields"),
            parameters={
                "given.$": "$.given",
                "run": {
                    **{f"{f.name}.$": f"$.given.{f.name}" for f in top if f.kind != "object"},
                    "hyperparameters": {f"{f.key}.$": f"$.given.hyperparameters.{f.key}" for f in hyper},
                },
            },
        )
        count = sfn.Pass(
            scope,
            self.id("CountFields"),
            parameters={
                "run.$": "$.run",
                "field_count": {"given.$": _count("$.given"), "known.$": _count("$.run")},
            },
        )
        hyper_field = next(f for f in top if f.name == "hyperparameters")
        apply_defaults.next(merge).next(inspect_hyper).next(
            _is_object(scope, self.id("HyperparametersIsObject"), self.invalid(hyper_field, "NotObject"), merge_hyper)
        )
        merge_hyper.next(complete).next(project).next(count)
        return apply_defaults, count

    def check_fields(self, *, then: sfn.IChainable) -> None:
        """ValidateInput: no unknown field, every required one, each of its type, range or choice; after
        CountFields."""
        check = sfn.Choice(self.scope, self.id("ValidateInput"))
        self.counted.next(check)
        check.when(
            C.number_greater_than_json_path("$.field_count.given", "$.field_count.known"),
            self.fail(
                "unknown",
                "Field",
                f"the input has an unknown field; expected only {', '.join(f.name for f in self.top)} and, "
                f"in hyperparameters, {', '.join(f.key for f in self.hyper)}",
            ),
        )
        for f in self.table:
            if f.required:
                missing = C.or_(C.is_null(f"$.run.{f.name}"), C.string_equals(f"$.run.{f.name}", MISSING))
                check.when(missing, self.fail(f.name, "Missing", f"{f.name} is missing; expected {f.allowed()}"))
        for f in self.table:
            if f.kind != "object":
                _check_field(check, f, self.invalid(f, "Type"))
        # A run cannot start from its own model (contracts.run._field_problem says the same).
        init_from = next(f for f in self.table if f.name == "init_from")
        check.when(
            C.and_(
                C.not_(C.string_equals("$.run.init_from", "")),
                C.string_equals_json_path("$.run.init_from", "$.run.run_id"),
            ),
            self.invalid(init_from, "Self"),
        )
        if not self.built_in:
            # contracts.run.validate_run says the same.
            check.when(
                C.not_(C.string_equals("$.run.init_from", "")),
                self.fail(
                    "init_from",
                    "ForWorkload",
                    f"init_from is not valid for workload {self.workload!r}; expected empty: a declared workload "
                    "starts from its own code (the platform gives it no initial model yet)",
                ),
            )
        check.otherwise(then)

    def check_values(self, valid: sfn.Pass) -> sfn.Pass:
        """MeasureIntegers .. ValidateValues: integers written without a fraction, patterns and lengths (JSONata);
        on to `valid`. Returns the first of them."""
        scope = self.scope
        integers = [f for f in self.table if f.kind == "integer"]
        patterned = [f for f in self.table if f.pattern]
        related = [f for f in self.table if f.requires or f.divides]
        degrees = [f for f in self.table if f.layout]
        measure = sfn.Pass(
            scope,
            self.id("MeasureIntegers"),
            parameters={
                "run.$": "$.run",
                "fraction_parts": {
                    f.name.replace(".", "_") + ".$": f"States.ArrayLength(States.StringSplit(States.Format('{{}}', "
                    f"$.run.{f.name}), '.eE'))"
                    for f in integers
                },
            },
        )
        match = sfn.Pass.jsonata(
            scope,
            self.id("MatchPatterns"),
            outputs={
                "run": "{% $states.input.run %}",
                "fraction_parts": "{% $states.input.fraction_parts %}",
                "patterns": {
                    f.name: _matches_whole(f"$states.input.run.{f.name}", f.pattern, f.max_length, f.default == "")
                    for f in patterned
                },
                "relations": {f.key: _relation(f) for f in related},
                "layout": _layout(degrees, self.per_node) if degrees and self.per_node else True,
                # The hyperparameters travel as one JSON text (contracts.run.validate_run).
                "hyperparameters_length": "{% $length($string($states.input.run.hyperparameters)) %}",
            },
        )
        values = sfn.Choice(scope, self.id("ValidateValues"))
        for f in integers:
            values.when(
                C.number_greater_than(f"$.fraction_parts.{f.name.replace('.', '_')}", 1), self.invalid(f, "NotInteger")
            )
        for f in patterned:
            values.when(C.not_(C.boolean_equals(f"$.patterns.{f.name}", True)), self.invalid(f, "Pattern"))
        for f in related:  # contracts.run.relation_problem says the same
            values.when(C.not_(C.boolean_equals(f"$.relations.{f.key}", True)), self.invalid(f, "Relation"))
        if degrees and self.per_node:  # contracts.run.layout_problem says the same
            cause = _layout_rule(degrees, self.per_node)
            values.when(C.not_(C.boolean_equals("$.layout", True)), self.fail("hyperparameters", "Layout", cause))
        too_long = C.number_greater_than("$.hyperparameters_length", HYPERPARAMETERS_MAX_CHARACTERS)
        values.when(too_long, self.fail("hyperparameters", "Length", HYPERPARAMETERS_RULE))
        values.otherwise(valid)
        measure.next(match).next(values)
        return measure


def _relation(f: Field) -> str:
    """JSONata: hyperparameter `f` agrees with those it relates to (contracts.run.relation_problem), over the
    hyperparameters with their defaults merged. `$lookup` of a valid choice always finds its number (the declaration's
    table holds every choice)."""
    h = "$states.input.run.hyperparameters"
    parts = [
        f"({h}.{f.key} = {json.dumps(f.default)} or {h}.{other} in {json.dumps(list(allowed))})"
        for other, allowed in f.requires
    ]
    if f.divides is not None:
        by, table = f.divides
        parts.append(f"($lookup({json.dumps(dict(table))}, {h}.{by}) % {h}.{f.key} = 0)")
    return "{% " + " and ".join(parts) + " %}"


def _layout(degrees: list[Field], per_node: int) -> str:
    """JSONata: the run's layout degrees fit its workers (contracts.run.layout_problem): each "node" degree divides
    a node's workers, and together they divide nodes x a node's workers."""
    h, run = "$states.input.run.hyperparameters", "$states.input.run"
    parts = [f"({per_node} % {h}.{f.key} = 0)" for f in degrees if f.layout == "node"]
    product = " * ".join(f"{h}.{f.key}" for f in degrees)
    parts.append(f"(({run}.nodes * {per_node}) % ({product}) = 0)")
    return "{% " + " and ".join(parts) + " %}"


def _layout_rule(degrees: list[Field], per_node: int) -> str:
    """The refusal's cause: what the layout degrees must be, in words."""
    inside = [f.key for f in degrees if f.layout == "node"]
    node_rule = (
        f"{' and '.join(inside)} dividing a node's {per_node} workers (its groups stay inside one node), "
        if inside
        else ""
    )
    return (
        f"hyperparameters is not valid; expected {node_rule}{' x '.join(f.key for f in degrees)} dividing the run's "
        f"workers (nodes x {per_node})"
    )


class _Guarded:
    """A Choice whose every rule also needs `guard` to hold."""

    def __init__(self, check: sfn.Choice, guard: sfn.Condition) -> None:
        self.check, self.guard = check, guard

    def when(self, condition: sfn.Condition, target: sfn.IChainable) -> None:
        self.check.when(C.and_(self.guard, condition), target)


def _check_field(check: sfn.Choice, f: Field, invalid: sfn.Fail) -> None:
    """Choice rules refusing a value of the wrong type, range or choice: the type first, since rules are tried
    in order and a comparison is only meaningful on a value of its own type."""
    path = f"$.run.{f.name}"
    if f.default == MISSING:
        # Left out: the marker stays, and no other rule applies to it.
        given = C.not_(C.and_(C.is_string(path), C.string_equals(path, MISSING)))
        guarded = _Guarded(check, given)
        _check_field(guarded, dataclasses.replace(f, default=None), invalid)  # type: ignore[arg-type]
        return
    if f.kind == "string":
        check.when(C.not_(C.is_string(path)), invalid)
        if f.choices:
            check.when(C.not_(C.or_(*(C.string_equals(path, choice) for choice in f.choices))), invalid)
        return
    if f.kind == "boolean":
        check.when(C.not_(C.is_boolean(path)), invalid)
        return
    check.when(C.not_(C.is_numeric(path)), invalid)
    if f.minimum is not None:
        below = C.number_less_than_equals if f.exclusive_minimum else C.number_less_than
        check.when(below(path, f.minimum), invalid)
    if f.maximum is not None:
        check.when(C.number_greater_than(path, f.maximum), invalid)
