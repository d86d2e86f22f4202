"""The run's quote and the monthly budget, executed in moto (tests/sfn_emulator.py): the pipeline prices the run with
contracts/quote.py's arithmetic at the MFU the environment's runs measured (else the assumed one), records the quote in
the run's record, and refuses a run its budget cannot pay for before any claim or job, unless the run may exceed it
(constructs/pipeline/run_quote.py); once validated, the run's quote beside what its jobs cost (run_cost.py)."""

import contextlib
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from config import load_config
from contracts.quote import Quote, QuoteTerms, budget_refusal, measured_mfu_query, quote, unread_budget_refusal
from contracts.run import filled
from tests.pipeline.runs import ACCEPTED, RUN, messages
from tests.pipeline.test_pipeline_cli import Deployed
from tests.sfn_emulator import ACCOUNT, PREPARED_DATASET, REGION
from tests.synthesis import context
from tools.pipeline_cli import main

pytestmark = pytest.mark.slow  # the pipeline executed in moto (tests/sfn_emulator.py)

LARGE = {**RUN, "run_id": "gpt-large-001", "hyperparameters": {"model": "1.3b", "max_steps": 20000}}


@pytest.fixture(scope="module")
def terms() -> QuoteTerms:
    return QuoteTerms.of(load_config(context()))


def _budget(limit: str, spent: str | None) -> dict:
    """DescribeBudget's answer (AWS Budgets API reference, Budget); a new budget has no CalculatedSpend yet."""
    budget = {"BudgetName": "efa-training-dev-monthly-2", "BudgetLimit": {"Amount": limit, "Unit": "USD"},
              "TimeUnit": "MONTHLY", "BudgetType": "COST"}  # fmt: skip
    if spent is not None:
        budget["CalculatedSpend"] = {"ActualSpend": {"Amount": spent, "Unit": "USD"}}
    return {"Budget": budget}


def _validated(run: dict) -> dict:
    return filled(run, 2)


def _recorded_quote(emulator, run_id: str) -> dict:
    body = emulator.s3.get_object(Bucket=emulator.bucket, Key=f"runs/{run_id}/run.json")["Body"].read()
    return json.loads(body)["run"]["quote"]


def test_the_pipeline_quotes_the_run_as_the_cli_does_and_records_it(emulator, terms):
    emulator.answers["budgets.describe_budget"] = _budget("100000", "12.5")
    emulator.verdict = ACCEPTED
    assert emulator.run(LARGE)["status"] == "SUCCEEDED"
    recorded = _recorded_quote(emulator, LARGE["run_id"])
    expected = quote(_validated(LARGE), terms)
    assert expected.usd is not None and expected.usd > 1
    assert recorded["usd"] == pytest.approx(expected.usd, rel=1e-9)
    assert recorded["hours"] == pytest.approx(expected.hours, rel=1e-9)
    assert recorded["basis"] == expected.basis
    assert (recorded["budget_limit_usd"], recorded["budget_spent_usd"]) == (100000, 12.5)


def test_a_run_quoted_above_what_is_left_is_refused_with_the_clis_line(emulator, terms):
    expected = quote(_validated(LARGE), terms)
    assert expected.usd is not None
    limit = round(expected.usd) + 40.25  # $40.25 plus the quote: less than the quote is left after $45.10 spent
    emulator.answers["budgets.describe_budget"] = _budget(f"{limit:.2f}", "45.10")
    result = emulator.run(LARGE)
    assert result["status"] == "FAILED" and result.get("error") == "OverBudget"
    assert emulator.submitted == []
    assert result["cause"] == budget_refusal(expected, limit, 45.10)
    (alert,) = messages(emulator)
    assert alert["state"] == "ReadBudget" and "may_exceed_budget: true" in alert["cause"]
    assert emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix="runs/").get("KeyCount", 0) == 0


def test_a_run_that_may_exceed_the_budget_runs(emulator):
    emulator.answers["budgets.describe_budget"] = _budget("10", "9.99")
    emulator.verdict = ACCEPTED
    assert emulator.run({**LARGE, "may_exceed_budget": True})["status"] == "SUCCEEDED"


def test_a_run_without_an_estimate_is_refused_only_once_the_budget_is_spent(emulator):
    ps = {**RUN, "run_id": "ctr-001", "workload": "ctr-ps", "hyperparameters": {"model": "ctr-tiny", "strategy": "ps"}}
    assert quote(_validated(ps), QuoteTerms.of(load_config(context()))) == Quote(
        None, None, "no FLOPs model for this workload"
    )
    emulator.answers["budgets.describe_budget"] = _budget("10", "10.00")
    result = emulator.run(ps)
    assert result["status"] == "FAILED" and result["cause"] == budget_refusal(Quote(None, None, ""), 10, 10)
    emulator.answers["budgets.describe_budget"] = _budget("10", "9.00")
    emulator.verdict = ACCEPTED
    assert emulator.run(ps)["status"] == "SUCCEEDED"


def test_a_budget_the_pipeline_cannot_read_refuses_the_run_unless_it_may_exceed_it(emulator):
    # No budget in this Region, or Budgets down after the retries: an unreadable budget passed every run (issue 47);
    # now it is refused in one line as OverBudget is; a run that may exceed the budget goes on, its quote saying why.
    name = load_config(context()).budget_name
    emulator.faults["budgets.describe_budget"] = ["NotFoundException"]
    refused = emulator.run({**RUN, "run_id": "unread-001", "dataset": PREPARED_DATASET})
    assert refused["status"] == "FAILED" and refused["error"] == "OverBudget"
    # The error's name: Step Functions' "Budgets.NotFoundException"; moto names it "budgets.budgetsException".
    assert refused["cause"] == unread_budget_refusal(name, "budgets.budgetsException")
    emulator.faults["budgets.describe_budget"] = ["NotFoundException"]
    emulator.verdict = ACCEPTED
    run = {**RUN, "run_id": "unread-002", "dataset": PREPARED_DATASET, "may_exceed_budget": True}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    assert _recorded_quote(emulator, "unread-002")["budget"].lower().startswith("not read: budgets.")
    assert emulator.refused_requests == []


@contextlib.contextmanager
def _spent(amount: str) -> Iterator[None]:
    """The month's actual spend so far, as AWS Budgets would report it, then none again (moto has no UpdateBudget;
    it keeps the CalculatedSpend a CreateBudget gives)."""
    budgets = boto3.client("budgets", region_name=REGION)
    name = load_config(context()).budget_name

    def spend(value: str) -> None:
        budget = budgets.describe_budget(AccountId=ACCOUNT, BudgetName=name)["Budget"]
        budget["CalculatedSpend"] = {"ActualSpend": {"Amount": value, "Unit": "USD"}}
        budgets.delete_budget(AccountId=ACCOUNT, BudgetName=name)
        budgets.create_budget(AccountId=ACCOUNT, Budget=budget)

    spend(amount)
    try:
        yield
    finally:
        spend("0")


def _run_file(tmp_path, name: str, run: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(run))
    return str(path)


def _cli(emulator, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    session = Deployed({"StateMachineArn": emulator.state_machine_arn, "MaxNodes": "2", "BucketName": emulator.bucket})
    return main(list(argv), out=out, err=err, session=session), out.getvalue(), err.getvalue()


def test_the_cli_quotes_a_run_file_and_the_budget_left(emulator, terms, tmp_path):
    with _spent("250.00"):
        code, out, err = _cli(emulator, "quote", "dev", _run_file(tmp_path, "run.json", LARGE))
    expected = quote(_validated(LARGE), terms)
    assert (code, err) == (0, "")
    assert out.splitlines() == [expected.line(), "budget: $1,750.00 left of $2,000.00 this month"]  # dev: $2,000


def test_start_refuses_a_run_over_budget_in_one_line_and_starts_nothing(emulator, terms, tmp_path):
    may = _run_file(tmp_path, "may.json", {**LARGE, "may_exceed_budget": True})
    with _spent("1999.00"):
        code, _, err = _cli(emulator, "start", "dev", _run_file(tmp_path, "run.json", LARGE))
        allowed, out, _ = _cli(emulator, "start", "dev", may, "--name", "may-exceed")
    expected = quote(_validated(LARGE), terms)
    assert (code, err) == (2, f"error: {budget_refusal(expected, 2000, 1999)}\n")
    assert allowed == 0 and "started may-exceed" in out
    (started,) = emulator.sfn.list_executions(stateMachineArn=emulator.state_machine_arn)["executions"]
    assert started["name"] == "may-exceed"
    # Its end, before the next test: a run still going would take that test's injected faults (one per call).
    emulator.wait(started["executionArn"])


def _reported_mfu(env: tuple[float, ...] = (), model: tuple[float, ...] = ()) -> dict:
    """GetMetricData's answer to ReadMeasuredMfu's queries (contracts.quote.measured_mfu_query; CloudWatch API
    reference, MetricDataResult): per query id, one series (AVG over the runs' SEARCH), a value per hour."""

    def series(key: str, values: tuple[float, ...]) -> dict:
        stamps = [f"2026-11-26T{hour:02d}:00:00Z" for hour in range(len(values))]
        return {"Id": key, "Label": key, "StatusCode": "Complete", "Values": list(values), "Timestamps": stamps}

    return {"MetricDataResults": [series("env", env), series("model", model)], "Messages": []}


def _queries(emulator, execution_arn: str) -> list[dict]:
    """The MetricDataQueries ReadMeasuredMfu sent (its TaskScheduled event's parameters)."""
    for event in emulator.history(execution_arn):
        details = event.get("taskScheduledEventDetails")
        if details and details["resource"] == "getMetricData":
            return json.loads(details["parameters"])["MetricDataQueries"]
    raise AssertionError("no GetMetricData call")


def test_the_pipeline_quotes_at_the_mfu_this_environments_runs_measured(emulator, terms):
    emulator.answers["cloudwatch.get_metric_data"] = _reported_mfu(env=(30.0, 36.5))  # a mean of 33.25: halfway
    emulator.answers["budgets.describe_budget"] = _budget("100000", "0")
    emulator.verdict = ACCEPTED
    run = {**LARGE, "run_id": "gpt-measured-001"}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    recorded, expected = _recorded_quote(emulator, run["run_id"]), quote(_validated(run), terms, 33.25)
    assert (
        recorded["usd"] == pytest.approx(expected.usd, rel=1e-9) and expected.usd != quote(_validated(LARGE), terms).usd
    )
    assert recorded["basis"] == expected.basis and recorded["basis"].startswith("MFU 33.3% measured")
    assert emulator.refused_requests == []  # the GetMetricData request checked by botocore's model


def test_an_mfu_the_pipeline_cannot_read_leaves_the_quote_at_the_assumption(emulator, terms):
    emulator.faults["cloudwatch.get_metric_data"] = ["AccessDenied"] * 6  # the first call and its five retries
    emulator.answers["budgets.describe_budget"] = _budget("100000", "0")
    emulator.verdict = ACCEPTED
    run = {**LARGE, "run_id": "gpt-unmeasured-001"}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    assert _recorded_quote(emulator, run["run_id"])["basis"] == quote(_validated(LARGE), terms).basis


def test_a_validated_run_records_its_quote_beside_what_its_jobs_cost(emulator, terms):
    emulator.answers["budgets.describe_budget"] = _budget("100000", "0")
    emulator.verdict = ACCEPTED
    run = {**LARGE, "run_id": "gpt-costed-001"}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    key = f"runs/{run['run_id']}/cost.json"
    cost = json.loads(emulator.s3.get_object(Bucket=emulator.bucket, Key=key)["Body"].read())
    assert cost["quoted_usd"] == pytest.approx(quote(_validated(run), terms).usd, rel=1e-9)
    assert 0 <= cost["training_hours"] < 0.1 and 0 <= cost["validation_hours"] < 0.1  # seconds in the emulator
    assert cost["actual_usd"] == pytest.approx(
        2 * cost["training_hours"] * terms.node_usd_per_hour + cost["validation_hours"] * terms.validation_usd_per_hour
    )
    assert (
        cost["basis"].startswith("this execution's jobs") and cost["quote_basis"] == quote(_validated(run), terms).basis
    )
    # The same two figures as metrics, per run (the dashboard's "Run cost" table; constructs/pipeline/run_cost.py).
    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    dimensions = [{"Name": "Environment", "Value": "dev"}, {"Name": "RunId", "Value": run["run_id"]}]
    for name, value in (("RunQuotedUsd", cost["quoted_usd"]), ("RunActualUsd", cost["actual_usd"])):
        (point,) = cloudwatch.get_metric_statistics(
            Namespace="EfaTraining", MetricName=name, Dimensions=dimensions, Statistics=["Maximum"], Period=60,
            StartTime=datetime.now(UTC) - timedelta(hours=1), EndTime=datetime.now(UTC) + timedelta(minutes=5),
        )["Datapoints"]  # fmt: skip
        assert point["Maximum"] == pytest.approx(value, rel=1e-9), name
    assert emulator.refused_requests == []


def test_a_cost_that_cannot_be_recorded_never_fails_the_run(emulator):
    emulator.answers["budgets.describe_budget"] = _budget("100000", "0")
    emulator.faults["s3.put_object"] = [None] + ["AccessDenied"] * 6  # the run's record, then its cost past the retries
    emulator.faults["cloudwatch.put_metric_data"] = ["InternalServiceError"] * 6  # CloudWatch down past the retries
    emulator.verdict = ACCEPTED
    run = {**LARGE, "run_id": "gpt-uncosted-001"}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    assert emulator.faulted.count("cloudwatch.put_metric_data:InternalServiceError") == 6
    assert emulator.faulted.count("s3.put_object:AccessDenied") == 6
    listed = emulator.s3.list_objects_v2(Bucket=emulator.bucket, Prefix=f"runs/{run['run_id']}/")
    assert "cost.json" not in {item["Key"].rsplit("/", 1)[1] for item in listed.get("Contents", [])}


def test_the_cli_quotes_at_the_measured_mfu_as_the_pipeline_does(emulator, terms, tmp_path, monkeypatch):
    # The CLI's own read of the metric is tools/token_cost.measured_mfu (tests/test_token_cost.py, stubbed CloudWatch:
    # moto has no SEARCH); given the same figure (a halfway one), the CLI prints the quote the pipeline records.
    monkeypatch.setattr("tools.token_cost.measured_mfus", lambda client, environment, model: (33.25, True))
    with _spent("250.00"):
        code, out, err = _cli(emulator, "quote", "dev", _run_file(tmp_path, "run.json", LARGE))
    emulator.answers["cloudwatch.get_metric_data"] = _reported_mfu(env=(20.0,), model=(33.25,))
    emulator.answers["budgets.describe_budget"] = _budget("100000", "0")
    emulator.verdict = ACCEPTED
    run = {**LARGE, "run_id": "gpt-cli-measured-001"}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    recorded = _recorded_quote(emulator, run["run_id"])
    pipeline_line = Quote(recorded["usd"], recorded["hours"], recorded["basis"]).line()
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        pipeline_line,
        f"  at the assumed MFU: {quote(_validated(LARGE), terms).line().removeprefix('quote: ')}",
        "budget: $1,750.00 left of $2,000.00 this month",
    ]
    assert "MFU 33.3% measured on 1.3b runs" in pipeline_line


def test_the_pipeline_prefers_the_mfu_of_the_runs_own_model_size(emulator, terms):
    # The image puts MFU by Environment and Model too (training_image .../runtime/metrics.py): a 1.3b run is quoted
    # at what 1.3b runs reached here, not at every model's average, and says so.
    emulator.answers["cloudwatch.get_metric_data"] = _reported_mfu(env=(20.0,), model=(30.0, 36.5))
    emulator.answers["budgets.describe_budget"] = _budget("100000", "0")
    emulator.verdict = ACCEPTED
    run = {**LARGE, "run_id": "gpt-model-mfu-001"}
    result = emulator.run(run)
    assert result["status"] == "SUCCEEDED"
    recorded, expected = _recorded_quote(emulator, run["run_id"]), quote(_validated(run), terms, 33.25, True)
    assert recorded["usd"] == pytest.approx(expected.usd, rel=1e-9)
    assert recorded["basis"] == expected.basis and recorded["basis"].startswith("MFU 33.3% measured on 1.3b runs")
    queries = {q["Id"]: q["Expression"] for q in _queries(emulator, result["executionArn"])}
    assert queries == {"env": measured_mfu_query("dev"), "model": measured_mfu_query("dev", "1.3b")}
    assert emulator.refused_requests == []
