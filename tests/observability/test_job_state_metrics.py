"""JobStateMetrics alone, in a bare stack: Batch job state changes of the given queues, counted per status."""

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
from aws_cdk.assertions import Match, Template

from constructs.observability.job_state_metrics import METRIC_NAME, JobStateMetrics

QUEUE = "arn:aws:batch:us-east-1:111111111111:job-queue/q"


def test_job_state_metrics_count_batch_state_changes_by_status():
    # Batch job state changes of our queues reach a log group whose metric filter counts them per Status.
    stack = cdk.Stack()
    JobStateMetrics(
        stack,
        "Jobs",
        job_queue_arns=[QUEUE],
        namespace="EfaTraining/dev/Batch",
        retention=logs.RetentionDays.ONE_WEEK,
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.batch"],
                "detail-type": ["Batch Job State Change"],
                "detail": {"jobQueue": [QUEUE]},
            }
        },
    )
    template.has_resource_properties(
        "AWS::Logs::MetricFilter",
        {
            "MetricTransformations": [
                Match.object_like(
                    {
                        "MetricName": METRIC_NAME,
                        "MetricNamespace": "EfaTraining/dev/Batch",
                        "Dimensions": Match.array_with([{"Key": "Status", "Value": "$.detail.status"}]),
                    }
                )
            ]
        },
    )
    template.resource_count_is("AWS::Logs::ResourcePolicy", 1)
    template.resource_count_is("AWS::Lambda::Function", 0)
