"""The run's quote and the monthly budget, executed in moto (tests/sfn_emulator.py): the pipeline prices the run with
contracts/quote.py's arithmetic, records the quote in the run's record, and refuses a run its budget cannot pay for
before any claim or job, unless the run may exceed it (constructs/pipeline/run_quote.py)."""

import contextlib
import io
import json
from collections.abc import Iterator

import boto3
import pytest

from config import load_config
from contracts.quote import Quote, QuoteTerms, budget_refusal, quote
from contracts.run import filled
from tests.pipeline.runs import ACCEPTED, RUN, messages
from tests.pipeline.test_pipeline_cli import Deployed
from tests.sfn_emulator import ACCOUNT, PREPARED_DATASET, REGION
from tests.synthesis import context
from tools.pipeline_cli import main

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
    ps = {**RUN, "run_id": "ctr-001", "hyperparameters": {"model": "ctr-tiny", "strategy": "ps"}}
    assert quote(_validated(ps), QuoteTerms.of(load_config(context()))) == Quote(
        None, None, "no FLOPs model for this workload"
    )
    emulator.answers["budgets.describe_budget"] = _budget("10", "10.00")
    result = emulator.run(ps)
    assert result["status"] == "FAILED" and result["cause"] == budget_refusal(Quote(None, None, ""), 10, 10)
    emulator.answers["budgets.describe_budget"] = _budget("10", "9.00")
    emulator.verdict = ACCEPTED
    assert emulator.run(ps)["status"] == "SUCCEEDED"


def test_a_budget_the_pipeline_cannot_read_does_not_stop_the_run(emulator):
    # No budget in this Region, or Budgets down after the retries: the budget's own alerts still watch the month.
    emulator.faults["budgets.describe_budget"] = ["NotFoundException"]
    emulator.verdict = ACCEPTED
    run = {**RUN, "run_id": "unread-001", "dataset": PREPARED_DATASET}
    assert emulator.run(run)["status"] == "SUCCEEDED"
    # The error's name: Step Functions' "Budgets.NotFoundException"; moto names it "budgets.budgetsException".
    assert _recorded_quote(emulator, "unread-001")["budget"].lower().startswith("not read: budgets.")
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
