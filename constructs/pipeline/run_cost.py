"""The run's quote beside what it cost, once its jobs are done: in its record and on the dashboard.

After validation, CostOfRun prices the time the run's jobs took at the quote's prices (contracts/quote.py's
QuoteTerms): the run's nodes from the run's preparation to the end of training (the sanity check, compile, training
and every retry and wait between them) and one validation node after it. Waits in a queue or for nodes count though
not every node bills then, as in the CLI's `describe` (tools/quote.py); what it leaves out: a resumed run's earlier
executions (each execution records its own), and on EKS the minutes a node group takes to scale down after a stage.
WriteRunCost records both in `runs/<run_id>/cost.json`; PublishRunCost puts them in CloudWatch (config.layout's
RUN_QUOTED_METRIC and RUN_ACTUAL_METRIC, dimensions Environment and RunId), which the dashboard lists per run. Neither
can fail the run: a failed write or metric is logged in the execution's history, and the verdict goes on.
"""

import json

import aws_cdk.aws_s3 as s3
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import RUN_ACTUAL_METRIC, RUN_COST, RUN_QUOTED_METRIC, RUNS_PREFIX, TRAINING_METRICS_NAMESPACE
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, TRANSIENT_ERRORS, retry_transient
from constructs.pipeline.run_quote import CLOUDWATCH_TRANSIENT
from contracts.quote import QuoteTerms

# {"at": an ISO 8601 instant, $$.State.EnteredTime} in the state's input, set by PrepareRun and TrainingEnded.
PREPARED, TRAINED = "$.clock.prepared", "$.clock.trained"
KEEP = "{% $states.input %}"  # each call's output, and a failed call's: the state's input as it was


def training_ended(scope: Construct) -> sfn.Pass:
    """The instant training ended (its last submission succeeded), for CostOfRun."""
    return sfn.Pass(scope, "TrainingEnded", parameters={"at.$": "$$.State.EnteredTime"}, result_path=TRAINED)


def run_cost(scope: Construct, terms: QuoteTerms, bucket: s3.IBucket) -> tuple[sfn.State, sfn.INextable]:
    """(start, last): the cost states, between validation and the verdict."""
    priced = sfn.Pass.jsonata(
        scope, "CostOfRun", outputs=f"{{% $merge([$states.input, {{'cost': {_cost(terms)}}}]) %}}"
    )
    record = tasks.CallAwsService.jsonata(
        scope,
        "WriteRunCost",
        service="s3",
        action="putObject",
        parameters={
            "Bucket": bucket.bucket_name,
            "Key": f"{{% '{RUNS_PREFIX}' & $states.input.run.run_id & '/{RUN_COST}' %}}",
            "ContentType": "application/json",
            "Body": "{% $string($states.input.cost) %}",
        },
        iam_resources=[bucket.arn_for_objects(f"{RUNS_PREFIX}*/{RUN_COST}")],
        iam_action="s3:PutObject",
        outputs=KEEP,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(record, TRANSIENT_ERRORS)
    published = tasks.CallAwsService.jsonata(
        scope,
        "PublishRunCost",
        service="cloudwatch",
        action="putMetricData",
        # Service Authorization Reference, Amazon CloudWatch: PutMetricData has no resource types.
        iam_resources=["*"],
        parameters={"Namespace": TRAINING_METRICS_NAMESPACE, "MetricData": _metric_data(terms.environment)},
        outputs=KEEP,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(published, CLOUDWATCH_TRANSIENT)
    # Only into its own namespace (Service Authorization Reference, Amazon CloudWatch: PutMetricData takes the
    # condition key cloudwatch:namespace). The task renders its statement without conditions and takes none, so the
    # condition goes on that statement itself.
    for statement in published._task_policies or ():
        statement.add_condition("StringEquals", {"cloudwatch:namespace": TRAINING_METRICS_NAMESPACE})
    done = sfn.Pass(scope, "RunCostRecorded")
    record.add_catch(published, errors=["States.ALL"], outputs=KEEP)
    published.add_catch(done, errors=["States.ALL"], outputs=KEEP)
    priced.next(record).next(published).next(done)
    return priced, done


def _cost(terms: QuoteTerms) -> str:
    """JSONata: {quoted_usd, actual_usd, training_hours, validation_hours, basis}; actual_usd null without prices."""
    hours = "($toMillis(%s) - $toMillis(%s)) / 3600000"
    training = hours % ("$states.input.clock.trained.at", "$states.input.clock.prepared.at")
    validation = hours % ("$now()", "$states.input.clock.trained.at")
    if terms.node_usd_per_hour is None or terms.validation_usd_per_hour is None:
        actual = "null"
    else:
        actual = f"$states.input.run.nodes * $t * {terms.node_usd_per_hour} + $v * {terms.validation_usd_per_hour}"
    basis = json.dumps(
        "this execution's jobs: the run's nodes from its preparation to the end of training, one validation node "
        f"after, waits included; {terms.price_basis}"
    )
    return (
        f"($t := {training}; $v := {validation}; {{'quoted_usd': $states.input.run.quote.usd, 'actual_usd': {actual}, "
        f"'training_hours': $t, 'validation_hours': $v, 'quote_basis': $states.input.run.quote.basis, "
        f"'basis': {basis}}})"
    )


def _metric_data(environment: str) -> str:
    """JSONata: the run's two figures as MetricDatum (CloudWatch API reference), each only where it is a number."""
    dimensions = (
        f"[{{'Name': 'Environment', 'Value': '{environment}'}}, {{'Name': 'RunId', 'Value': $states.input.run.run_id}}]"
    )
    datum = (
        "($exists(%s) and $type(%s) = 'number') ? "
        "[{'MetricName': '%s', 'Dimensions': %s, 'Value': %s, 'Unit': 'None'}] : []"
    )
    quoted, actual = "$states.input.cost.quoted_usd", "$states.input.cost.actual_usd"
    return (
        f"{{% $append({datum % (quoted, quoted, RUN_QUOTED_METRIC, dimensions, quoted)}, "
        f"{datum % (actual, actual, RUN_ACTUAL_METRIC, dimensions, actual)}) %}}"
    )
