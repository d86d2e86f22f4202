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
from typing import TYPE_CHECKING

import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.pipeline.hyperparameter_check import hyperparameter_check
from constructs.pipeline.workload_record import workload_record
from contracts.run import NOT_GIVEN, Field, defaults, fields, top_level

if TYPE_CHECKING:
    from constructs.pipeline.failure_path import FailurePath

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
    table: dynamodb.ITable,
    failures: "FailurePath",
    min_nodes: int = 1,
    workers_per_node: int | None = None,
) -> tuple[sfn.IChainable, sfn.Pass]:
    """The validation states: (first state, the Pass reached by valid input, holding `$.run` with its workload's
    record at `$.run.registered`). The run's own fields first (the same states for every workload), then its
    workload's record (a built-in one's from the template, a registered one's from `table`: workload_record.py) and
    one generic check of its hyperparameters against it (hyperparameter_check.py). `workers_per_node`: the instance's,
    against which a workload's layout degrees are judged (contracts.run.layout_problem); None: not judged."""
    read = sfn.Pass(scope, "ReadInput", parameters={"input.$": "$", "shape.$": "States.JsonToString($)"})
    states = _InputStates(scope, max_nodes=max_nodes, min_nodes=min_nodes)
    resolve, resolved = workload_record(scope, table=table, failures=failures)
    check, checked = hyperparameter_check(scope, per_node=workers_per_node)
    states.check_fields(then=states.check_values(resolve))
    resolved.next(check)
    not_object = states.fail(
        "input", "NotObject", f"the input must be a JSON object with the fields {', '.join(f.name for f in states.top)}"
    )
    read.next(_is_object(scope, "IsObject", not_object, states.start))
    return read, checked


class _InputStates:
    """1. shape and defaults, 2. presence, types, ranges and known values, 3. integers as written, patterns: the
    run's own fields (its hyperparameters are its workload's: hyperparameter_check.py)."""

    def __init__(self, scope: Construct, *, max_nodes: int, min_nodes: int) -> None:
        self.scope = scope
        self.top = top_level(fields(max_nodes, min_nodes))
        self.table = self.top
        self.run_defaults = {k: v for k, v in defaults(max_nodes).items() if k != "hyperparameters"}
        self.start, self.counted = self.complete_run()

    def fail(self, field: str, problem: str, cause: str) -> sfn.Fail:
        return sfn.Fail(self.scope, _state_name(field, problem), error=INVALID, cause=cause)

    def invalid(self, f: Field, problem: str) -> sfn.Fail:
        return self.fail(f.name, problem, f"{f.name} is not valid; expected {f.allowed()}")

    def complete_run(self) -> tuple[sfn.Pass, sfn.Pass]:
        """ApplyDefaults .. CountFields: the input with every default applied, and its field counts."""
        scope, top = self.scope, self.top
        apply_defaults = sfn.Pass(
            scope,
            "ApplyDefaults",
            parameters={
                "input.$": "$.input",
                "defaults": {
                    **{f.name: MISSING for f in top if f.required},
                    **self.run_defaults,
                    "hyperparameters": {},
                },
            },
        )
        merge = sfn.Pass(
            scope,
            "MergeDefaults",
            parameters={
                "run.$": "States.JsonMerge($.defaults, $.input, false)",
            },
        )
        inspect_hyper = sfn.Pass(
            scope,
            "InspectHyperparameters",
            parameters={"run.$": "$.run", "shape.$": "States.JsonToString($.run.hyperparameters)"},
        )
        project = sfn.Pass(
            scope,
            "KeepKnownFields",
            parameters={
                "given.$": "$.run",
                "run": {f"{f.name}.$": f"$.run.{f.name}" for f in top},
            },
        )
        count = sfn.Pass(
            scope,
            "CountFields",
            parameters={
                "run.$": "$.run",
                "field_count": {"given.$": _count("$.given"), "known.$": _count("$.run")},
            },
        )
        hyper_field = next(f for f in top if f.name == "hyperparameters")
        apply_defaults.next(merge).next(inspect_hyper).next(
            _is_object(scope, "HyperparametersIsObject", self.invalid(hyper_field, "NotObject"), project)
        )
        project.next(count)
        return apply_defaults, count

    def check_fields(self, *, then: sfn.IChainable) -> None:
        """ValidateInput: no unknown field, every required one, each of its type, range or choice; after
        CountFields."""
        check = sfn.Choice(self.scope, "ValidateInput")
        self.counted.next(check)
        check.when(
            C.number_greater_than_json_path("$.field_count.given", "$.field_count.known"),
            self.fail(
                "unknown",
                "Field",
                f"the input has an unknown field; expected only {', '.join(f.name for f in self.top)}",
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
        check.otherwise(then)

    def check_values(self, valid: sfn.IChainable) -> sfn.Pass:
        """MeasureIntegers .. ValidateValues: integers written without a fraction, patterns and lengths (JSONata);
        on to `valid`. Returns the first of them."""
        scope = self.scope
        integers = [f for f in self.table if f.kind == "integer"]
        patterned = [f for f in self.table if f.pattern]
        measure = sfn.Pass(
            scope,
            "MeasureIntegers",
            parameters={
                "run.$": "$.run",
                # The hyperparameters' numbers as the run wrote them, before a JSONata state holds 2.0 as 2
                # (hyperparameter_check.py reads them).
                "raw.$": "States.JsonToString($.run.hyperparameters)",
                "fraction_parts": {
                    f.name + ".$": f"States.ArrayLength(States.StringSplit(States.Format('{{}}', $.run.{f.name}), "
                    "'.eE'))"
                    for f in integers
                },
            },
        )
        match = sfn.Pass.jsonata(
            scope,
            "MatchPatterns",
            outputs={
                "run": "{% $states.input.run %}",
                "raw": "{% $states.input.raw %}",
                "fraction_parts": "{% $states.input.fraction_parts %}",
                "patterns": {
                    f.name: _matches_whole(f"$states.input.run.{f.name}", f.pattern, f.max_length, f.default == "")
                    for f in patterned
                },
            },
        )
        values = sfn.Choice(scope, "ValidateValues")
        for f in integers:
            values.when(C.number_greater_than(f"$.fraction_parts.{f.name}", 1), self.invalid(f, "NotInteger"))
        for f in patterned:
            values.when(C.not_(C.boolean_equals(f"$.patterns.{f.name}", True)), self.invalid(f, "Pattern"))
        values.otherwise(valid)
        measure.next(match).next(values)
        return measure


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
