"""The run's quote, and the month's budget asked whether it can pay for it, before the run claims its id.

ReadMeasuredMfu asks CloudWatch for the MFU this environment's runs reported (contracts.quote.measured_mfu_query, the
CLI's own query); QuoteRun prices the run with contracts/quote.py's arithmetic at that MFU, or at the assumed one where
none was reported or it could not be read, into `$.run.quote`, which the claim writes into the run's record
(`runs/<run_id>/run.json`) beside the run. ReadBudget then reads the environment's AWS Budgets budget
(DescribeBudget: its BudgetLimit and CalculatedSpend.ActualSpend, AWS Budgets API reference, "Budget"), and a run
quoted above what is left, or any run once nothing is left, fails `OverBudget` with one line, unless it says
`may_exceed_budget: true`. A budget that cannot be read (none of that name, AccessDenied, the API down after the
transient retries) refuses the run `OverBudget` too, unless it says `may_exceed_budget: true` (then its quote records
why the budget was not read): a run the pipeline cannot hold to its budget is not started on the assumption it fits.
The spend is as fresh as AWS Budgets' own ("AWS updates your budget status several times a day", AWS Budgets API
reference): a run started just after another is held to a spend without it.
"""

import json

import aws_cdk as cdk
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient
from constructs.pipeline.failure_path import FailurePath
from contracts.quote import (
    ASSUMED_MFU_PERCENT,
    MEASURED_DAYS,
    VALIDATION_MINUTES,
    QuoteTerms,
    measured_mfu_query,
    unread_budget_refusal,
)

C = sfn.Condition
OVER_BUDGET = "OverBudget"
# DescribeBudget's throttling and internal errors (AWS Budgets API reference, DescribeBudget "Errors"), named
# ServiceName.ErrorName as Step Functions names an AWS SDK integration's errors.
BUDGETS_TRANSIENT = ("Budgets.ThrottlingException", "Budgets.InternalErrorException", "States.Timeout")
# CloudWatch's throttling (no modeled exception: the service's base one) and 5xx (the InternalServiceFault shape,
# which Step Functions names after the Java SDK's class, InternalServiceException: "AWS SDK integrations", errors).
CLOUDWATCH_TRANSIENT = ("CloudWatch.CloudWatchException", "CloudWatch.InternalServiceException", "States.Timeout")


def run_quote(scope: Construct, terms: QuoteTerms, failures: FailurePath) -> tuple[sfn.State, sfn.Pass]:
    """(start, done): `start` takes {"run"}; a run the budget pays for (or that may exceed it) goes on at `done`.
    The run's workload's cost model is its record's (`$.run.registered.cost`: workload_record.py)."""
    measured = _measured_mfu(scope, terms.environment)
    quoted = sfn.Pass.jsonata(scope, "QuoteRun", outputs={"run": _quoted_run(terms)})
    measured.next(quoted)
    measured.add_catch(  # an MFU that cannot be read never stops a run: the quote assumes one and says so
        quoted, errors=["States.ALL"], outputs={"run": "{% $states.input.run %}", "mfu": None, "mfu_model": False}
    )
    read = tasks.CallAwsService(
        scope,
        "ReadBudget",
        service="budgets",
        action="describeBudget",
        # Service Authorization Reference, Amazon Budget Service, "API operations": DescribeBudget is ViewBudget.
        iam_action="budgets:ViewBudget",
        iam_resources=[f"arn:{cdk.Aws.PARTITION}:budgets::{cdk.Aws.ACCOUNT_ID}:budget/{terms.budget_name}"],
        parameters={"AccountId": cdk.Aws.ACCOUNT_ID, "BudgetName": terms.budget_name},
        result_path="$.budget",  # whole: a new budget has no CalculatedSpend yet, and a path to it would fail
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(read, BUDGETS_TRANSIENT)
    # A budget that cannot be read refuses the run (contracts.quote.unread_budget_refusal's line), unless it may exceed
    # the budget: then it goes on with the quote saying why the budget was not read.
    refusal = unread_budget_refusal(terms.budget_name, "' & $states.input.caught.Error & '")
    unread = sfn.Pass.jsonata(
        scope,
        "BudgetNotRead",
        outputs={
            "run": "{% $merge([$states.input.run, {'quote': $merge([$states.input.run.quote, "
            "{'budget': 'not read: ' & $states.input.caught.Error}])}]) %}",
            "refusal": "{% '" + refusal + "' %}",
        },
    )
    read.add_catch(unread, errors=["States.ALL"], result_path="$.caught")
    checked = sfn.Pass.jsonata(scope, "CompareQuoteWithBudget", outputs=_compared())
    refused = sfn.Pass(
        scope,
        "OnOverBudget",
        parameters={
            "run.$": "$.run",
            "failure": {"state": "ReadBudget", "error": OVER_BUDGET, "detail": OVER_BUDGET, "cause.$": "$.refusal"},
        },
    )
    done = sfn.Pass(scope, "BudgetChecked", parameters={"run.$": "$.run"})
    within = sfn.Choice(scope, "IsWithinBudget")
    within.when(
        C.and_(C.is_string("$.refusal"), C.boolean_equals("$.run.may_exceed_budget", False)),
        refused.next(failures.notify),
    ).otherwise(done)
    unread.next(within)
    quoted.next(read).next(checked).next(within)
    return measured, done


def _measured_mfu(scope: Construct, environment: str) -> tasks.CallAwsService:
    """{"run", "mfu"}: the mean of the environment's reported hourly MFU over MEASURED_DAYS, null where none."""
    read = tasks.CallAwsService.jsonata(
        scope,
        "ReadMeasuredMfu",
        service="cloudwatch",
        action="getMetricData",
        # Service Authorization Reference, Amazon CloudWatch: GetMetricData has no resource types.
        iam_resources=["*"],
        parameters={
            "MetricDataQueries": _mfu_queries(environment),
            "StartTime": f"{{% $fromMillis($millis() - {MEASURED_DAYS * 86400 * 1000}) %}}",
            "EndTime": "{% $now() %}",
        },
        # the run's own model size's MFU where its runs reported one, else every run's (tools/token_cost.py alike)
        outputs=(
            "{% ($v := function($id) { [$states.result.MetricDataResults[Id = $id].Values] }; "
            "$m := $v('model'); $e := $v('env'); "
            "{'run': $states.input.run, 'mfu_model': $count($m) > 0, "
            "'mfu': $count($m) > 0 ? $average($m) : $count($e) > 0 ? $average($e) : null}) %}"
        ),
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(read, CLOUDWATCH_TRANSIENT)
    return read


# JSONata: `$c` the run's workload's cost model (contracts/workload_cost.py CostModel.as_json) from its record, `$p` its
# model size: the run's value of the hyperparameter that picks the FLOPs, where there is one (a checked choice by now).
# The pipeline's bubble, (m+P-1)/m (contracts.workload_cost.CostModel.bubble): m the fewest equal parts of the batch
# that are at least P, else the batch; 1 without pipeline_stages or with 1 stage. $filter, $reduce, $map and the range
# [a..b] are JSONata 2.0 functions Step Functions evaluates ("Transforming data with JSONata in Step Functions":
# https://docs.aws.amazon.com/step-functions/latest/dg/transforming-data.html); tests/test_quote.py runs them.
_BUBBLE = (
    "($pp := $c.pipeline_stages ? $lookup($r.hyperparameters, $c.pipeline_stages) : 1; "
    "$bs := $lookup($r.hyperparameters, $c.batch_size); "
    "$dv := $pp > 1 ? $filter([$pp..$bs], function($v) {$bs % $v = 0}) : [1]; "
    "$mb := $exists($dv) ? $dv[0] : $bs; ($mb + $pp - 1) / $mb)"
)
_COST_OF_RUN = (
    "$r := $states.input.run; $c := $r.registered.cost; $t := $c.tflops_per_sample; "
    "$p := $type($t) = 'object' ? $lookup($r.hyperparameters, $t.by) : null; "
    "$sized := $type($p) = 'string' and $p in $keys($t.values); "
)


def _mfu_queries(environment: str) -> str:
    """JSONata: GetMetricData's queries, every run's MFU ("env") and, for a run of a model size (its workload's cost
    model picks its FLOPs by one), that size's ("model"; contracts.quote.priced_model: a declared choice only, so
    nothing else of a run's input reaches the expression)."""
    query = {"Id": "env", "Expression": measured_mfu_query(environment), "ReturnData": True}
    before, after = measured_mfu_query(environment, "\0").split("\0")
    of_model = f"{{'Id': 'model', 'Expression': {json.dumps(before)} & $p & {json.dumps(after)}, 'ReturnData': true}}"
    return "{% (" + _COST_OF_RUN + f"$append([{json.dumps(query)}], $sized ? [{of_model}] : [])) %}}"


def _quoted_run(terms: QuoteTerms) -> str:
    """JSONata: the run with `quote` {usd, hours, basis} at the measured MFU (`$states.input.mfu`) or the assumed
    one; usd and hours null where there is no estimate. contracts.quote.quote's arithmetic and words."""
    none = "{'usd': null, 'hours': null, 'basis': %s}"
    if terms.node_usd_per_hour is None or terms.validation_usd_per_hour is None:
        return (
            "{% $merge([$states.input.run, {'quote': "
            + none % json.dumps("no price known for this environment's instance types")
            + "}]) %}"
        )
    price = json.dumps(f", {terms.price_basis}")
    basis = (
        "($m ? 'MFU ' & $formatNumber($floor($m * 10 + 0.5) / 10, '0.0') & '% measured' "
        "& ($states.input.mfu_model ? ' on ' & $p & ' runs' : '') "
        f": 'MFU {ASSUMED_MFU_PERCENT:g}% assumed') & {price}"
    )
    no_model = none % json.dumps("no FLOPs model for this workload")
    # Only a workload with a cost model is priced: its steps and batch size are integer hyperparameters its
    # declaration names, checked by then (a JSONata error in a Pass would end the run); no other value is evaluated.
    priced = (
        "($f := $type($t) = 'number' ? $t : $sized ? $lookup($t.values, $p) : null; $f != null ? "
        "($h := $lookup($r.hyperparameters, $c.steps) * $lookup($r.hyperparameters, $c.batch_size) * $f "
        "/ ($c.split_by ? $reduce($map($c.split_by, function($n) {$lookup($r.hyperparameters, $n)}), "
        "function($a, $b) {$a * $b}, 1) : 1) * " + _BUBBLE + " "
        f"/ ({terms.peak_tflops_per_worker} * ($m ? $m : {ASSUMED_MFU_PERCENT}) / 100) / 3600; "
        f"{{'usd': $r.nodes * ($h + {terms.other_node_hours}) * {terms.node_usd_per_hour} "
        f"+ {VALIDATION_MINUTES / 60} * {terms.validation_usd_per_hour}, 'hours': $h, 'basis': {basis}}}) : {no_model})"
    )
    return (
        "{% (" + _COST_OF_RUN + "$m := $states.input.mfu; "
        f"$merge([$r, {{'quote': $exists($c) ? {priced} : {no_model}}}])) %}}"
    )


def _compared() -> str:
    """JSONata: the run with the budget in its quote, and `refusal`: contracts.quote.budget_refusal's line, or null."""
    return (
        "{% ($b := $states.input.budget.Budget; $r := $states.input.run; $q := $r.quote; "
        "$l := $number($b.BudgetLimit.Amount); "
        "$s := $exists($b.CalculatedSpend.ActualSpend.Amount) ? $number($b.CalculatedSpend.ActualSpend.Amount) : 0; "
        "$left := $l - $s; "
        "$spent := 'AWS Budgets: $' & $formatNumber($s, '#,##0.00') & ' of $' & $formatNumber($l, '#,##0.00') "
        "& ' spent this month'; "
        "{'run': $merge([$r, {'quote': $merge([$q, {'budget_limit_usd': $l, 'budget_spent_usd': $s}])}]), "
        "'refusal': ($q.usd = null and $left <= 0) ? 'the monthly budget is spent (' & $spent "
        "& '); set may_exceed_budget: true to run anyway' "
        ": ($q.usd != null and $q.usd > ($left < 0 ? 0 : $left)) ? 'the run is quoted at ~$' "
        "& $formatNumber($q.usd, '#,##0') "
        "& ' but the monthly budget has $' & $formatNumber($left < 0 ? 0 : $left, '#,##0.00') & ' left (' & $spent "
        "& '); lower max_steps or nodes, or set may_exceed_budget: true' : null}) %}"
    )
