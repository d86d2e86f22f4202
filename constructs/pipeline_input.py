"""Input validation in pure ASL: defaults merged in, unknown fields found, every value checked.

ASL has no "list the keys" function, so unknown fields are found by counting: the input with
defaults merged in, and the same object rebuilt from the known fields only, are turned into
JSON strings and split on ':'. Both hold the same values, so every extra key (at the top level or
in `hyperparameters`) makes the first split longer. The Choice then checks each field in turn and
ends in a Fail with error `InvalidInput` and a cause naming the field, before any job exists.
"""

import aws_cdk.aws_stepfunctions as sfn
from constructs import Construct

from constructs.pipeline_schema import (DATASET_PREFIX, HYPERPARAMETERS, RUN_FIELDS, STRATEGIES, NumberRule,
                                        fixed_nodes_message, number_rules, run_defaults)

C = sfn.Condition
INVALID = "InvalidInput"
# CDK drops None from state JSON, so a required field's default is this marker: still there after the merge
# means the input left the field out.
MISSING = "<missing>"


def _count(path: str) -> str:
    return f"States.ArrayLength(States.StringSplit(States.JsonToString({path}), ':'))"


def _state_name(field: str, problem: str) -> str:
    words = field.replace("hyperparameters.", "").split("_")
    return "Invalid" + "".join(w.capitalize() for w in words) + problem


def input_validation(scope: Construct, *, max_nodes: int, min_nodes: int = 1) -> tuple[sfn.IChainable, sfn.Pass]:
    """The validation states: (first state, the Pass reached by valid input, holding `$.run`)."""
    apply_defaults = sfn.Pass(scope, "ApplyDefaults", parameters={
        "input.$": "$",
        "defaults": {key: MISSING if value is None else value for key, value in run_defaults(max_nodes).items()},
        "hyperparameter_defaults": HYPERPARAMETERS,
    })
    merge = sfn.Pass(scope, "MergeDefaults", parameters={
        "run.$": "States.JsonMerge($.defaults, $.input, false)",
        "hyperparameter_defaults.$": "$.hyperparameter_defaults",
    })
    merge_hyper = sfn.Pass(scope, "MergeHyperparameters", parameters={
        "given.$": "$.run",
        "merged": {"hyperparameters.$": "States.JsonMerge($.hyperparameter_defaults, $.run.hyperparameters, false)"},
    })
    complete = sfn.Pass(scope, "CompleteInput", parameters={"given.$": "States.JsonMerge($.given, $.merged, false)"})
    project = sfn.Pass(scope, "KeepKnownFields", parameters={
        "given.$": "$.given",
        "run": {
            **{f"{key}.$": f"$.given.{key}" for key in RUN_FIELDS if key != "hyperparameters"},
            "hyperparameters": {f"{key}.$": f"$.given.hyperparameters.{key}" for key in HYPERPARAMETERS},
        },
    })
    count = sfn.Pass(scope, "CountFields", parameters={
        "run.$": "$.run", "field_count": {"given.$": _count("$.given"), "known.$": _count("$.run")},
    })

    def fail(field: str, problem: str, cause: str) -> sfn.Fail:
        return sfn.Fail(scope, _state_name(field, problem), error=INVALID, cause=cause)

    check = sfn.Choice(scope, "ValidateInput")
    check.when(C.number_greater_than_json_path("$.field_count.given", "$.field_count.known"), fail(
        "unknown", "Field", f"the input has an unknown field; expected only {', '.join(RUN_FIELDS)} and, in "
                            f"hyperparameters, {', '.join(HYPERPARAMETERS)}"))
    for key in ("run_id", "dataset", "baseline"):
        check.when(C.or_(C.is_null(f"$.run.{key}"), C.string_equals(f"$.run.{key}", MISSING)),
                   fail(key, "Missing", f"{key} is missing; it is required"))
    for key in ("run_id", "dataset", "hyperparameters.model", "hyperparameters.strategy"):
        check.when(C.not_(C.is_string(f"$.run.{key}")), fail(key, "NotString", f"{key} must be a string"))
    check.when(C.not_(C.and_(C.string_matches("$.run.dataset", f"{DATASET_PREFIX}*"),
                             C.not_(C.string_equals("$.run.dataset", DATASET_PREFIX)))),
               fail("dataset", "Path", f"dataset must be a path under {DATASET_PREFIX} in the data bucket, "
                                       f"like {DATASET_PREFIX}wikitext/"))
    for rule in number_rules(max_nodes, min_nodes):
        _check_number(check, rule, fail, max_nodes)
    check.when(C.not_(C.or_(*(C.string_equals("$.run.hyperparameters.strategy", s) for s in STRATEGIES))),
               fail("hyperparameters.strategy", "Value", f"hyperparameters.strategy must be {' or '.join(STRATEGIES)}"))
    valid = sfn.Pass(scope, "InputValid", parameters={"run.$": "$.run"})
    check.otherwise(valid)
    apply_defaults.next(merge).next(merge_hyper).next(complete).next(project).next(count).next(check)
    return apply_defaults, valid


def _check_number(check: sfn.Choice, rule: NumberRule, fail, max_nodes: int) -> None:
    path = f"$.run.{rule.field}"
    check.when(C.not_(C.is_numeric(path)), fail(rule.field, "NotNumber", f"{rule.field} must be a number"))
    ranged = rule.maximum is not None and rule.minimum != float("-inf") and rule.field != "nodes"
    if rule.minimum != float("-inf"):
        below = (C.number_less_than_equals if rule.exclusive_minimum else C.number_less_than)(path, rule.minimum)
        bound = f"greater than {rule.minimum:g}" if rule.exclusive_minimum else f"at least {rule.minimum:g}"
        cause = (f"{rule.field} is out of range; it must be from {rule.minimum:g} to {rule.maximum:g}" if ranged
                 else f"{rule.field} must be {bound}")
        if rule.field == "nodes" and rule.minimum == max_nodes > 1:
            cause = fixed_nodes_message(max_nodes)
        check.when(below, fail(rule.field, "TooSmall", cause))
    if rule.maximum is not None:
        if rule.field == "nodes":
            cause = f"nodes is above this environment's maximum of {max_nodes} nodes"
        else:
            cause = f"{rule.field} is out of range; it must be from {rule.minimum:g} to {rule.maximum:g}"
        check.when(C.number_greater_than(path, rule.maximum), fail(rule.field, "TooLarge", cause))
