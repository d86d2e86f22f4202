"""A run's quote before it starts, and whether the environment's monthly budget can pay for it.

    make quote ENV=dev RUN=examples/run.json     (.venv/bin/python -m tools.pipeline_cli quote dev examples/run.json)

The arithmetic is contracts/quote.py's, which the pipeline's QuoteRun state uses too, at the same MFU: the one this
environment's runs measured (the EfaTraining MFU metric over the last 14 days: the runs of the run's own model size,
else every run, contracts.quote.measured_mfu_query), else the assumed one, so `start` refuses exactly what the
pipeline would; beside a measured quote, the one at the assumption, for the reader. The budget is AWS Budgets'
(DescribeBudget: BudgetLimit and CalculatedSpend.ActualSpend). `start` prints the same lines and refuses a run over
budget with the pipeline's line, unless the run says `may_exceed_budget: true`. What cannot be read (no credentials,
no budget, no metrics) is said in one line and leaves the quote at the assumption; it never stops a start, as the
pipeline does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from botocore.exceptions import BotoCoreError, ClientError

from config import EnvironmentConfig
from contracts.quote import Quote, QuoteTerms, about_usd, budget_refusal, priced_model, quote, unread_budget_refusal
from contracts.run import WorkloadSchemas, filled
from contracts.workload import schemas
from tools.pipeline_session import _json_object

BUDGETS_REGION = "us-east-1"  # AWS Budgets' one endpoint, budgets.amazonaws.com (AWS General Reference)


@dataclass(frozen=True)
class Budget:
    limit_usd: float
    spent_usd: float


@dataclass(frozen=True)
class Priced:
    """A run's quote, the budget it was held to (None: not read, `notes` say why) and the refusal, if any."""

    quote: Quote  # at the measured MFU, else the assumed one: the pipeline's own quote, which the budget is held to
    assumed: Quote | None  # at the assumed MFU, where `quote` is at a measured one
    budget: Budget | None
    refusal: str | None
    notes: tuple[str, ...]
    unread_refusal: str | None = None  # the budget could not be read: start refuses with this line, quote only says it

    def lines(self) -> list[str]:
        lines = [self.quote.line()]
        if self.assumed is not None:
            lines.append(f"  at the assumed MFU: {self.assumed.line().removeprefix('quote: ')}")
        if self.budget is not None:
            left = self.budget.limit_usd - self.budget.spent_usd
            lines.append(f"budget: ${max(left, 0):,.2f} left of ${self.budget.limit_usd:,.2f} this month")
        return lines + list(self.notes)


def read_budget(session, account: str, name: str) -> Budget:
    budgets = session.client("budgets", region_name=BUDGETS_REGION)
    found = budgets.describe_budget(AccountId=account, BudgetName=name)["Budget"]
    spent = found.get("CalculatedSpend", {}).get("ActualSpend", {}).get("Amount", "0")  # none yet on a new budget
    return Budget(float(found["BudgetLimit"]["Amount"]), float(spent))


def price(run: dict, config: EnvironmentConfig, session, registered: WorkloadSchemas | None = None) -> Priced:
    """The quote of a valid run (a run file as `load_run` read it) in `config`'s environment; `registered`: the
    registered schema of its workload (tools.pipeline_workloads.registered_schemas), whose cost model prices it."""
    from tools.token_cost import measured_mfus  # imports the training image's model sizes

    notes: list[str] = []
    terms = QuoteTerms.of(config)
    workloads = {**schemas(config.declared_workloads), **(registered or {})}
    valid = filled(run, config.nodes, workloads)
    mfu, on_model = None, False
    try:
        cloudwatch = session.client("cloudwatch", region_name=config.region)
        mfu, on_model = measured_mfus(cloudwatch, config.name, priced_model(valid, workloads))
    except (BotoCoreError, ClientError) as error:
        notes.append(f"measured MFU not read ({_first_line(error)}): the quote assumes one")
    q = quote(valid, terms, mfu, on_model, workloads)  # at the measured MFU where there is one, as QuoteRun
    assumed = quote(valid, terms, workloads=workloads) if mfu else None
    budget, unread = None, None
    try:
        account = session.client("sts", region_name=config.region).get_caller_identity()["Account"]
        budget = read_budget(session, account, terms.budget_name)
    except (BotoCoreError, ClientError) as error:
        why = _first_line(error)
        unread = None if run.get("may_exceed_budget", False) else unread_budget_refusal(terms.budget_name, why)
        notes.append(f"budget {terms.budget_name} not read ({why}): the run is not held to it here; " + (
            "start and the pipeline refuse it unless it sets may_exceed_budget: true" if unread else "it may exceed it"
        ))  # fmt: skip
    refusal = None
    if budget is not None and not run.get("may_exceed_budget", False):
        refusal = budget_refusal(q, budget.limit_usd, budget.spent_usd)
    return Priced(q, assumed, budget, refusal, tuple(notes), unread)


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# The pipeline's job states (a declared workload's are `<state>-<workload>`): multi-node, then single-node.
MULTI_NODE_STATES = ("SanityCheck", "Compile", "Train")
SINGLE_NODE_STATES = ("Validate",)


def state_seconds(events: list[dict]) -> dict[str, float]:
    """Seconds from entering to leaving each job state in an execution's history, retries and their waits included."""
    entered: dict[str, datetime] = {}
    spent: dict[str, float] = {}
    for event in events:
        if name := event.get("stateEnteredEventDetails", {}).get("name"):
            entered[name] = event["timestamp"]
        name = event.get("stateExitedEventDetails", {}).get("name")
        if name in entered and _kind(name):
            since = entered.pop(name)
            spent[name] = spent.get(name, 0.0) + (event["timestamp"] - since).total_seconds()
    return spent


def _kind(state: str) -> str | None:
    for kind, names in (("multi", MULTI_NODE_STATES), ("single", SINGLE_NODE_STATES)):
        if any(state == n or state.startswith(f"{n}-") for n in names):
            return kind
    return None


def quote_and_actual(events: list[dict], nodes: int, config: EnvironmentConfig) -> list[str]:
    """`describe`'s lines: the quote the pipeline recorded, and what the job states' durations cost at the quote's
    prices (an upper bound: a state's time includes queue waits and retry backoffs, when not every node bills)."""
    lines = []
    for event in events:
        details = event.get("stateExitedEventDetails", {})
        if details.get("name") == "QuoteRun":
            recorded = _json_object(details.get("output")).get("run", {}).get("quote", {})
            q = Quote(recorded.get("usd"), recorded.get("hours"), str(recorded.get("basis", "")))
            lines.append(f"quote      {q.line().removeprefix('quote: ')}")
    terms = QuoteTerms.of(config)
    spent = state_seconds(events)
    if not spent or terms.node_usd_per_hour is None or terms.validation_usd_per_hour is None:
        return lines
    usd = sum(
        seconds / 3600 * (nodes * terms.node_usd_per_hour if _kind(state) == "multi" else terms.validation_usd_per_hour)
        for state, seconds in spent.items()
    )
    parts = ", ".join(f"{state} {seconds / 3600:.2f} h" for state, seconds in spent.items())
    lines.append(f"actual     {about_usd(usd)} at most ({parts}; {nodes} x {config.instance_type}, waits included)")
    return lines
