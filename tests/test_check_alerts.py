"""make check-alerts: the environment's pipeline-broken alarm set to ALARM (SetAlarmState) after the subscriptions
are reported; a missing alarm is one line and exit 2; the dry run calls nothing. AWS answers through botocore's
Stubber, which checks each request against the API's model."""

import pytest

from tools import check_alerts, preflight

ALARM = "EfaTraining-dev-pipeline-broken"


@pytest.fixture
def aws(stubbed):
    """tests/conftest.py's Stubbers; no Alerts stack: the subscription report then says nothing."""
    stubbed("cloudformation").add_client_error(
        "describe_stacks", "ValidationError", "Stack with id EfaTraining-dev-Alerts does not exist"
    )
    return stubbed


def _alarm(actions: list[str]) -> dict:
    return {"MetricAlarms": [{"AlarmName": ALARM, "AlarmActions": actions}]}


def test_the_alarm_is_set_to_alarm_so_its_action_mails_the_subscribers(aws, capsys):
    # CloudWatch API reference, SetAlarmState: a changed state invokes that state's actions.
    cloudwatch = aws("cloudwatch")
    cloudwatch.add_response("describe_alarms", _alarm(["arn:aws:sns:us-east-1:1:alerts"]), {"AlarmNames": [ALARM]})
    cloudwatch.add_response(
        "set_alarm_state", {}, {"AlarmName": ALARM, "StateValue": "ALARM", "StateReason": check_alerts.REASON}
    )
    assert check_alerts.main(["dev"]) == 0
    cloudwatch.assert_no_pending_responses()
    out = capsys.readouterr().out
    assert "documentation domain (RFC 2606)" in out  # dev ships @example.com placeholders
    assert "look for the e-mail" in out


def test_an_environment_without_the_alarm_is_one_line(aws, capsys):
    aws("cloudwatch").add_response("describe_alarms", {"MetricAlarms": []}, {"AlarmNames": [ALARM]})
    assert check_alerts.main(["dev"]) == 2
    assert capsys.readouterr().err.startswith(f"error: no alarm {ALARM} with an action")


def test_the_dry_run_calls_nothing(monkeypatch, capsys):
    monkeypatch.setattr(preflight, "client", lambda *a: pytest.fail("the dry run called AWS"))
    assert check_alerts.main(["dev", "--dry-run"]) == 0
    assert f"would set {ALARM} to ALARM" in capsys.readouterr().out
