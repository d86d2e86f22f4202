"""Proves the path an alarm takes to an inbox: `make check-alerts ENV=<env>` (DRY_RUN=1: the plan, no AWS call).

It reports the alerts topic's subscriptions in every state (none confirmed, pending, placeholder addresses:
tools/preflight.py), then sets the environment's `<prefix>-pipeline-broken` alarm to ALARM for a moment with
SetAlarmState ("temporarily sets the state of an alarm for testing purposes ... the action configured for the
appropriate state is invoked", CloudWatch API reference, SetAlarmState): its action publishes to the KMS-encrypted
alerts topic, which mails every confirmed subscription, so an e-mail "ALARM: <prefix>-pipeline-broken" arriving proves
CloudWatch → KMS (the key policy's grant to CloudWatch) → SNS → inbox. The alarm goes back to the state its metrics
give at its next evaluation (5 minutes); the OK transition has no action, so nothing else is sent.
"""

from __future__ import annotations

import argparse
import sys

from tools import preflight
from tools.deploy import _config

REASON = "efa-training check-alerts: a test of the alert path, nothing is broken"


def alarm_name(config) -> str:
    return f"{config.stack_prefix}-pipeline-broken"  # constructs/observability/alarms.py names it so


def check(env: str, *, dry_run: bool) -> list[str]:
    """The lines to print; raises PreflightError (one line) where the alarm cannot be tripped."""
    config = _config(env, None, [])
    alarm, topic_stack = alarm_name(config), f"{config.stack_prefix}-Alerts"
    if dry_run:
        return [
            f"check-alerts plan for {env} (dry run: no AWS call)",
            f"would list {topic_stack}'s topic subscriptions and say whether any is confirmed, which are pending, "
            f"and flag placeholder addresses ({', '.join(config.alert_emails) or 'alert_emails is empty'})",
            f"would set {alarm} to ALARM (CloudWatch SetAlarmState): its action mails every confirmed subscription",
        ]
    lines = [*preflight.placeholder_emails(config.alert_emails)]
    lines += preflight.unconfirmed_subscriptions(config.region, topic_stack)
    cloudwatch = preflight.client("cloudwatch", config.region)
    found = cloudwatch.describe_alarms(AlarmNames=[alarm])["MetricAlarms"]
    if not found or not found[0].get("AlarmActions"):
        raise preflight.PreflightError(
            f"no alarm {alarm} with an action in {config.region}: deploy {env} first (make deploy ENV={env})"
        )
    cloudwatch.set_alarm_state(AlarmName=alarm, StateValue="ALARM", StateReason=REASON)
    return [
        *lines,
        f"set {alarm} to ALARM: look for the e-mail 'ALARM: \"{alarm}\"' in every confirmed inbox within a few "
        "minutes; none means the path is broken (the topic key's policy, the subscription, the mailbox's filters). "
        "The alarm goes back to its own state at its next evaluation.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", help="an environment of cdk.json (dev, prod, ...)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan: no credentials, no AWS call")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def run() -> None:
        for line in check(args.env, dry_run=args.dry_run):
            print(f"check-alerts: {line}", flush=True)

    return preflight.one_line(run)


if __name__ == "__main__":
    sys.exit(main())
