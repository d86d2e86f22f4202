"""CostBudget alone, in a bare stack: a monthly cost budget on the environment's tag, notifying the topic."""

import aws_cdk as cdk
import aws_cdk.aws_sns as sns
import pytest
from aws_cdk.assertions import Match, Template

from constructs.observability.cost_budget import CostBudget


@pytest.fixture(scope="module")
def budget() -> Template:
    stack = cdk.Stack()
    CostBudget(
        stack,
        "Budget",
        budget_name="EfaTraining-prod-monthly",
        monthly_limit_usd=250000,
        tag_key="Environment",
        tag_value="prod",
        topic=sns.Topic(stack, "Alerts"),
    )
    return Template.from_stack(stack)


def test_budget_is_monthly_cost_filtered_to_the_environment_tag(budget):
    # The budget counts only costs tagged Environment=<env> (user-defined cost-allocation tag), per month.
    budget.has_resource_properties(
        "AWS::Budgets::Budget",
        {
            "Budget": Match.object_like(
                {
                    "BudgetName": "EfaTraining-prod-monthly",
                    "BudgetType": "COST",
                    "TimeUnit": "MONTHLY",
                    "BudgetLimit": {"Amount": 250000, "Unit": "USD"},
                    "CostFilters": {"TagKeyValue": ["user:Environment$prod"]},
                }
            )
        },
    )


def test_budget_notifies_the_topic_on_actual_80_and_100_and_forecast_100(budget):
    # Three notifications, ACTUAL > 80 % (a warning), ACTUAL > 100 % (spent) and FORECASTED > 100 %, to the topic.
    (found,) = budget.find_resources("AWS::Budgets::Budget").values()
    (topic,) = budget.find_resources("AWS::SNS::Topic")
    notifications = found["Properties"]["NotificationsWithSubscribers"]
    kinds = {(n["Notification"]["NotificationType"], n["Notification"]["Threshold"]) for n in notifications}
    assert kinds == {("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)}
    for n in notifications:
        assert n["Notification"]["ThresholdType"] == "PERCENTAGE"
        assert n["Subscribers"] == [{"SubscriptionType": "SNS", "Address": {"Ref": topic}}]
