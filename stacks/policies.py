"""What happens to data on `cdk destroy`, per environment: dev loses everything, prod keeps its data."""

import aws_cdk as cdk
import aws_cdk.aws_logs as logs

from config import EnvironmentConfig

_RETENTION = {
    1: "ONE_DAY",
    3: "THREE_DAYS",
    5: "FIVE_DAYS",
    7: "ONE_WEEK",
    14: "TWO_WEEKS",
    30: "ONE_MONTH",
    60: "TWO_MONTHS",
    90: "THREE_MONTHS",
    120: "FOUR_MONTHS",
    150: "FIVE_MONTHS",
    180: "SIX_MONTHS",
    365: "ONE_YEAR",
    400: "THIRTEEN_MONTHS",
    545: "EIGHTEEN_MONTHS",
    731: "TWO_YEARS",
    1096: "THREE_YEARS",
    1827: "FIVE_YEARS",
    2192: "SIX_YEARS",
    2557: "SEVEN_YEARS",
    2922: "EIGHT_YEARS",
    3288: "NINE_YEARS",
    3653: "TEN_YEARS",
}


def data_removal_policy(config: EnvironmentConfig) -> cdk.RemovalPolicy:
    return cdk.RemovalPolicy.RETAIN if config.retain_data else cdk.RemovalPolicy.DESTROY


def log_retention(config: EnvironmentConfig) -> logs.RetentionDays:
    """CloudWatch Logs retention from the config's day count (the config validates the allowed values)."""
    return getattr(logs.RetentionDays, _RETENTION[config.log_retention_days])
