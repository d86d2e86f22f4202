"""Alerts: one encrypted SNS topic per environment, with the configured e-mail subscriptions.

The pipeline notifies it; alarms and budgets publish to it.
"""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_kms as kms
import aws_cdk.aws_sns as sns
import aws_cdk.aws_sns_subscriptions as subscriptions
from constructs import Construct

from config import EnvironmentConfig
from stacks.policies import data_removal_policy


class AlertsStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        self.key = kms.Key(self, "AlertsKey", enable_key_rotation=True, removal_policy=data_removal_policy(config),
                           description=f"Encrypts the {config.name} training alerts topic")
        # CloudWatch alarms and AWS Budgets publish to the topic, so they must be able to use its key.
        for service in ("cloudwatch.amazonaws.com", "budgets.amazonaws.com"):
            self.key.grant(iam.ServicePrincipal(service), "kms:Decrypt", "kms:GenerateDataKey*")
        self.topic = sns.Topic(self, "AlertsTopic", master_key=self.key, enforce_ssl=True,
                               display_name=f"EFA training alerts ({config.name})")
        self.topic.grant_publish(iam.ServicePrincipal("budgets.amazonaws.com"))
        for email in config.alert_emails:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        cdk.CfnOutput(self, "AlertsTopicArn", value=self.topic.topic_arn)
