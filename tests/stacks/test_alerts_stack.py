"""AlertsStack alone: one encrypted topic per environment that this account's alarms and budgets may publish to."""

import pytest
from aws_cdk.assertions import Template

from tests.alone import StacksAlone


@pytest.fixture(scope="module")
def alerts() -> Template:
    environment = StacksAlone()
    return environment.template(environment.alerts())


def _topic_statements(alerts: Template) -> list[dict]:
    (policy,) = alerts.find_resources("AWS::SNS::TopicPolicy").values()
    return policy["Properties"]["PolicyDocument"]["Statement"]


@pytest.mark.parametrize(
    ("service", "source_arn"),
    [
        # CloudWatch user guide (Notify_Users_Alarm_Changes.html): alarms publish as cloudwatch.amazonaws.com.
        ("cloudwatch.amazonaws.com", ["arn:aws:cloudwatch:us-east-1:", {"Ref": "AWS::AccountId"}, ":alarm:*"]),
        # AWS Budgets user guide (budgets-sns-policy.html): budgets publish as budgets.amazonaws.com.
        ("budgets.amazonaws.com", ["arn:aws:budgets::", {"Ref": "AWS::AccountId"}, ":*"]),
    ],
)
def test_alerts_topic_lets_this_accounts_alarms_and_budgets_publish(alerts, service, source_arn):
    # The topic policy replaces SNS's default: each publishing service has its own statement, scoped to this
    # account (aws:SourceAccount) and to its own kind of source (aws:SourceArn), or notifications are denied.
    (statement,) = [s for s in _topic_statements(alerts) if s.get("Principal") == {"Service": service}]
    assert statement["Effect"] == "Allow" and statement["Action"] == "sns:Publish"
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert statement["Condition"]["ArnLike"] == {"aws:SourceArn": {"Fn::Join": ["", source_arn]}}


def test_alerts_topic_grants_no_other_publisher(alerts):
    # Only CloudWatch and Budgets get statements; the pipeline publishes with its own role, nothing else may.
    principals = [s["Principal"] for s in _topic_statements(alerts) if s["Effect"] == "Allow"]
    assert sorted(p["Service"] for p in principals) == ["budgets.amazonaws.com", "cloudwatch.amazonaws.com"]


def test_alerts_key_lets_the_publishing_services_use_it(alerts):
    # An encrypted topic: CloudWatch and Budgets need kms:Decrypt and kms:GenerateDataKey* on its key.
    (key,) = alerts.find_resources("AWS::KMS::Key").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    granted = {
        service
        for s in statements
        if {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(s["Action"])
        for service in _services(s["Principal"])
    }
    assert {"cloudwatch.amazonaws.com", "budgets.amazonaws.com"} <= granted


def _services(principal: dict) -> list[str]:
    services = principal.get("Service", [])
    return [services] if isinstance(services, str) else services


def _key_statement(alerts: Template, service: str) -> dict:
    (key,) = alerts.find_resources("AWS::KMS::Key").values()
    (statement,) = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if service in _services(s["Principal"])]
    return statement


def test_alerts_key_holds_cloudwatch_to_this_accounts_alarms(alerts):
    # Confused-deputy guard on the key too, for the service whose KMS requests carry the source (CloudWatch alarms:
    # SNS developer guide, sns-key-management.html, compatibility with AWS services).
    statement = _key_statement(alerts, "cloudwatch.amazonaws.com")
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert statement["Condition"]["ArnLike"]["aws:SourceArn"] == {
        "Fn::Join": ["", ["arn:aws:cloudwatch:us-east-1:", {"Ref": "AWS::AccountId"}, ":alarm:*"]]
    }


def test_alerts_key_lets_budgets_use_it_without_a_source_condition(alerts):
    # AWS Budgets documents aws:SourceAccount/aws:SourceArn for the topic policy only (budgets-sns-policy.html): a
    # condition its KMS requests may not carry would drop every budget alert silently; its topic statement has them.
    assert "Condition" not in _key_statement(alerts, "budgets.amazonaws.com")


def test_the_configured_addresses_are_subscribed(alerts):
    # dev's alert_emails from cdk.json, one e-mail subscription each.
    alerts.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml-platform-dev@example.com"}
    )
