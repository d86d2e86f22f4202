"""Alerts: one encrypted SNS topic per environment, with the configured e-mail subscriptions.

Who publishes, and how each is allowed (the topic's policy replaces SNS's default one, so every AWS service
that publishes needs its own statement, and the key policy must let it use the topic's KMS key):
- CloudWatch alarms of this account: a service-principal statement scoped to this account's alarm ARNs;
- AWS Budgets: a service-principal statement scoped to this account's budgets;
- the pipeline's state machine: its IAM role (TrainingPipeline grants it), no topic statement needed.
Nothing else (no EventBridge rule) targets the topic.
"""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_kms as kms
import aws_cdk.aws_sns as sns
import aws_cdk.aws_sns_subscriptions as subscriptions

from config import EnvironmentConfig
from constructs import Construct
from stacks.policies import data_removal_policy

CLOUDWATCH = "cloudwatch.amazonaws.com"
BUDGETS = "budgets.amazonaws.com"
# The publishers whose KMS requests for an encrypted topic carry aws:SourceAccount/aws:SourceArn, so the key policy can
# hold them to this account's sources too: CloudWatch alarms (AWS's Modern Data Architecture Accelerator,
# grantCloudWatchAlarmsTopicAccess, after SNS's "compatibility-with-aws-services"). AWS Budgets documents the
# conditions for the topic policy only (budgets-sns-policy.html), not for the key: a condition its requests do not
# carry would drop every budget alert without an error, so its key statement has none (its topic statement does).
KEY_SOURCE_CONDITIONS = (CLOUDWATCH,)


def publishers(stack: cdk.Stack) -> dict[str, str]:
    """Each publishing service and the source ARN pattern (aws:SourceArn) it may publish from."""
    # CloudWatch alarm ARNs: arn:aws:cloudwatch:<region>:<account>:alarm:<name> (CloudWatch user guide,
    # Notify_Users_Alarm_Changes.html, SNS access policy for alarms). Budgets: arn:aws:budgets::<account>:*
    # (AWS Budgets user guide, budgets-sns-policy.html, "Creating an Amazon SNS topic for budget notifications").
    return {
        CLOUDWATCH: stack.format_arn(
            service="cloudwatch", resource="alarm", resource_name="*", arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME
        ),
        BUDGETS: stack.format_arn(
            service="budgets", region="", resource="*", arn_format=cdk.ArnFormat.NO_RESOURCE_NAME
        ),
    }


class AlertsStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self.key = kms.Key(
            self,
            "AlertsKey",
            enable_key_rotation=True,
            removal_policy=data_removal_policy(config),
            description=f"Encrypts the {config.name} training alerts topic",
        )
        self.topic = sns.Topic(
            self,
            "AlertsTopic",
            master_key=self.key,
            enforce_ssl=True,
            display_name=f"EFA training alerts ({config.name})",
        )
        for service, source_arn in publishers(self).items():
            # Confused-deputy guard (SNS developer guide, "Example cases for Amazon SNS access control":
            # aws:SourceAccount and aws:SourceArn): only this account's alarms/budgets may publish.
            conditions = {"StringEquals": {"aws:SourceAccount": self.account}, "ArnLike": {"aws:SourceArn": source_arn}}
            name = service.split(".")[0].capitalize()
            self.topic.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=f"Allow{name}Publish",
                    principals=[iam.ServicePrincipal(service)],
                    actions=["sns:Publish"],
                    resources=[self.topic.topic_arn],
                    conditions=conditions,
                )
            )
            # Publishing to an encrypted topic needs the key (SNS developer guide, sns-key-management.html,
            # "compatibility between event sources from AWS services and encrypted topics"), with the same guard
            # where the service documents it for its KMS requests (KEY_SOURCE_CONDITIONS).
            self.key.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=f"Allow{name}UseForTheTopic",
                    principals=[iam.ServicePrincipal(service)],
                    actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                    resources=["*"],
                    conditions=conditions if service in KEY_SOURCE_CONDITIONS else None,
                )
            )
        for email in config.alert_emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        cdk.CfnOutput(self, "AlertsTopicArn", value=self.topic.topic_arn)
