"""A monthly AWS Budgets cost budget over one cost-allocation tag, notifying an SNS topic.

AWS Budgets has no L2 construct in aws-cdk-lib, so this wraps the L1 `CfnBudget`. The tag filter only
matches once the tag is activated as a cost-allocation tag in the Billing console (a one-time, per-payer
step that CloudFormation cannot do), and only covers costs incurred after activation.
"""

import aws_cdk.aws_budgets as budgets
import aws_cdk.aws_sns as sns

from constructs import Construct

# Actual spend past 80 % (a warning) and past 100 % (the budget is spent), and a forecast past 100 %.
ACTUAL_PERCENTS = (80.0, 100.0)
FORECASTED_PERCENT = 100.0


class CostBudget(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        budget_name: str,
        monthly_limit_usd: float,
        tag_key: str,
        tag_value: str,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, id_)
        subscribers = [budgets.CfnBudget.SubscriberProperty(subscription_type="SNS", address=topic.topic_arn)]

        def notify(kind: str, percent: float) -> budgets.CfnBudget.NotificationWithSubscribersProperty:
            return budgets.CfnBudget.NotificationWithSubscribersProperty(
                notification=budgets.CfnBudget.NotificationProperty(
                    notification_type=kind,
                    comparison_operator="GREATER_THAN",
                    threshold=percent,
                    threshold_type="PERCENTAGE",
                ),
                subscribers=subscribers,
            )

        self.budget = budgets.CfnBudget(
            self,
            "Budget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_name=budget_name,
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=monthly_limit_usd, unit="USD"),
                # User-defined cost-allocation tags are named "user:<key>"; "$" separates key and value.
                cost_filters={"TagKeyValue": [f"user:{tag_key}${tag_value}"]},
            ),
            # E-mail recipients are the topic's subscribers, so each person gets one message, not two.
            notifications_with_subscribers=[
                *(notify("ACTUAL", percent) for percent in ACTUAL_PERCENTS),
                notify("FORECASTED", FORECASTED_PERCENT),
            ],
        )
