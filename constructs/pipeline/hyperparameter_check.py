"""One state checks any workload's hyperparameters: it interprets the workload's record as data.

The record (contracts/workload_registry.py) holds one row per hyperparameter (the run contract's Field as data). The
hyperparameters' JSON text comes along (`raw`: the numbers as the run wrote them, taken by input_checks' first JSONPath
Pass, since JSONata holds 2.0 and 2 as the same number and an integer must reach the job without a fraction); one
JSONata Pass (Step Functions allows
JSONata states in a JSONPath state machine: "Transforming data with JSONata in Step Functions",
https://docs.aws.amazon.com/step-functions/latest/dg/transforming-data.html) then merges the defaults and finds the
first problem, in the order contracts.run.validate_run finds them: an unknown name, a missing, mistyped or out-of-range
value, a relation (`requires`, `divides`), the layout on the environment's workers, the length; a Fail reports it
(its `CausePath`). However many workloads are registered, these are the same four states.
"""

import json

import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from contracts.run import HYPERPARAMETERS_MAX_CHARACTERS, HYPERPARAMETERS_RULE

INVALID = "InvalidInput"

# JSONata helpers over one row `$r` (contracts.workload_registry.check_row), the given values `$g`, the merged `$m`
# and the run's JSON text of them `$raw`.
_TEXT = (
    # the value's text as the run wrote it: "k": can only be the key (a quote inside a string value is escaped)
    "$text := function($k){ $trim($substringBefore($substringBefore($substringAfter($raw, '\"' & $k & '\":'), ','), "
    "'}')) };"
)
_BAD = "$bad := function($r){ $r.name & ' is not valid; expected ' & $r.allowed };"
_VALUE = (
    "$value := function($r){ ("
    "$v := $lookup($m, $r.key);"
    "$r.kind = 'string' ? ($type($v) != 'string' or ($count($r.choices) > 0 and $not($v in $r.choices))) :"
    "$r.kind = 'boolean' ? $type($v) != 'boolean' :"
    "$type($v) != 'number' or"
    " ($r.kind = 'integer' and $exists($lookup($g, $r.key)) and $contains($text($r.key), /[.eE]/)) or"
    " ($type($r.minimum) = 'number' and ($v < $r.minimum or ($r.exclusive_minimum and $v = $r.minimum))) or"
    " ($type($r.maximum) = 'number' and $v > $r.maximum)"
    ") };"
)
_MISSING = "$missing := function($r){ $r.required and $not($exists($lookup($g, $r.key))) };"
_RELATED = (
    "$related := function($r){ ("
    "$v := $lookup($m, $r.key);"
    "$req := $reduce($r.requires, function($ok, $q){"
    " $ok and ($v = $r.default or $lookup($m, $q.other) in $q.values) }, true);"
    "$div := $type($r.divides) = 'object' ? ($lookup($r.divides.values, $lookup($m, $r.divides.by)) % $v = 0) : true;"
    "$req and $div"
    ") };"
)


def _first(condition: str, message: str) -> str:
    """JSONata: the first row's `message` for which `condition` holds, or ''."""
    return f"$reduce($rows, function($p, $r){{ $p != '' ? $p : ({condition}) ? {message} : '' }}, '')"


def _layout(per_node: int | None) -> str:
    """JSONata: '' or the layout refusal (contracts.run.layout_problem; input_checks' rule in words)."""
    if not per_node:
        return "''"
    degrees = "$rows[layout != '']"
    return (
        f"($d := {degrees}; $count($d) = 0 ? '' : ("
        # [..]: no "node" degree is an empty array, which $reduce folds to its start (an undefined one would not)
        f"$inside := $reduce([$d[layout = 'node']], function($ok, $r){{ $ok and {per_node} % $lookup($m, $r.key) = 0"
        " }, true);"
        "$product := $reduce($d, function($p, $r){ $p * $lookup($m, $r.key) }, 1);"
        f"$inside and ($states.input.run.nodes * {per_node}) % $product = 0 ? '' : "
        "'hyperparameters is not valid; expected ' & ($count($d[layout = 'node']) > 0 ? "
        "$join($d[layout = 'node'].key, ' and ') & "
        f"\" dividing a node's {per_node} workers (its groups stay inside one node), \" : '') & "
        f"$join($d.key, ' x ') & \" dividing the run's workers (nodes x {per_node})\""
        "))"
    )


def _expression(per_node: int | None) -> str:
    names = "$join($rows.key, ', ')"
    unknown = (
        "$u := $filter($keys($g), function($k){ $not($k in $rows.key) });"
        "$count($u) > 0 ? 'hyperparameters has an unknown field ' & $string($u[0]) & '; expected only ' & "
        f"({names} ? {names} : 'none (this workload declares no hyperparameters)') : ''"
    )
    platform_only = (
        "$not($rec.platform) and $states.input.run.init_from != '' ? \"init_from is not valid for workload '\" & "
        "$rec.name & \"'; expected empty: a declared workload starts from its own code (the platform gives it no "
        "initial model yet)\" : ''"
    )
    refusal = json.dumps(f"hyperparameters is not valid; expected {HYPERPARAMETERS_RULE}")
    too_long = f"$length($string($m)) > {HYPERPARAMETERS_MAX_CHARACTERS} ? {refusal} : ''"
    built_in_version = (
        '$rec.platform and $states.input.run.workload_version != 0 ? "workload_version is not valid for workload \'" & '
        "$rec.name & \"'; expected 0: the platform's trainers have one version, the deployed one\" : ''"
    )
    steps = [
        f"({built_in_version})",
        f"({unknown})",
        _first("$missing($r)", "$r.name & ' is missing; expected ' & $r.allowed"),
        _first("$value($r)", "$bad($r)"),
        _first("$not($related($r))", "$bad($r)"),
        _layout(per_node),
        f"({too_long})",
        f"({platform_only})",
    ]
    chain = " ; ".join(f"$p := $p != '' ? $p : {step}" for step in steps)
    return (
        "{% ($rec := $states.input.registered; $rows := $rec.hyperparameters; $g := $states.input.run.hyperparameters;"
        " $raw := $states.input.raw;"
        " $defaults := $merge($rows[required = false].{key: default});"
        " $m := $merge([$defaults, $g]);"
        f" {_TEXT} {_BAD} {_VALUE} {_MISSING} {_RELATED}"
        f" $p := ''; {chain};"
        " {'run': $merge([$states.input.run, {'hyperparameters': $m, 'workload_version': $rec.version,"
        " 'registered': {'name': $rec.name, 'version': $rec.version, 'platform': $rec.platform, 'image': $rec.image,"
        " 'workload': $rec.workload, 'cost': $rec.cost, 'digest': $rec.digest}}]), 'problem': $p}) %}"
    )


def hyperparameter_check(scope: Construct, *, per_node: int | None) -> tuple[sfn.Pass, sfn.Pass]:
    """(first, checked): from a state holding `run`, `raw` and `registered` (the workload's record) to `checked`, whose
    output is `{run}` with the hyperparameters' defaults merged and the record's summary at `run.registered`; a
    problem ends the run InvalidInput.
    `per_node`: the instance's workers, against which layout degrees are judged (None: not judged)."""
    measure = sfn.Pass(
        scope,
        "ReadHyperparameters",
        parameters={
            "run.$": "$.run",
            "registered.$": "$.registered",
            "raw.$": "$.raw",
        },
    )
    check = sfn.Pass.jsonata(scope, "CheckHyperparameters", outputs=_expression(per_node))
    refuse = sfn.Fail(scope, "InvalidHyperparameters", error=INVALID, cause_path="$.problem")
    # The run as the rest of the pipeline holds it: its workload's record inside (`registered`: whose jobs, which
    # image, its WORKLOAD variable, its cost model), so the claim records the exact version and image it used.
    checked = sfn.Pass(scope, "InputValid", parameters={"run.$": "$.run"})
    measure.next(check).next(
        sfn.Choice(scope, "HyperparametersOk")
        .when(sfn.Condition.not_(sfn.Condition.string_equals("$.problem", "")), refuse)
        .otherwise(checked)
    )
    return measure, checked
