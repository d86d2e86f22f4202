"""Pipeline: the Step Functions state machine that takes one training run from input to approved model.

The compute stack supplies the jobs: a stack exposing `job_runner` (a constructs.pipeline_jobs.JobRunner)
is used as is; otherwise the Batch stack's queues and job definitions are wrapped in a BatchJobRunner.
The operator CLI (tools/pipeline_cli.py) finds the state machine by this stack's `StateMachineArn` output.
"""

import aws_cdk as cdk
import aws_cdk.aws_s3 as s3
from constructs import Construct

from config import EnvironmentConfig
from constructs.pipeline_jobs import BatchJobRunner, JobRunner
from config.layout import MODELS_PREFIX, RUNS_PREFIX
from constructs.training_pipeline import TrainingPipeline, acknowledge
from stacks.alerts_stack import AlertsStack
from stacks.policies import data_removal_policy, log_retention
from stacks.storage_stack import StorageStack


def can_run_on(compute: cdk.Stack) -> bool:
    """Whether the compute stack offers the jobs the pipeline needs (a runner, or Batch queues and definitions)."""
    return getattr(compute, "job_runner", None) is not None or all(
        hasattr(compute, name) for name in ("multi_node_queue", "single_node_queue", "job_definitions"))


def job_runner_for(compute: cdk.Stack) -> JobRunner:
    runner = getattr(compute, "job_runner", None)
    if runner is not None:
        return runner
    return BatchJobRunner(multi_node_queue=compute.multi_node_queue, single_node_queue=compute.single_node_queue,
                          job_definitions=compute.job_definitions,
                          share_identifier=getattr(compute, "pipeline_share", None),
                          single_node_on_demand_queue=getattr(compute, "single_node_on_demand_queue", None))


class PipelineStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, storage: StorageStack,
                 alerts: AlertsStack, compute: cdk.Stack, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        # The bucket's ARN through a named export (shared with the EKS stack): its cdk-nag findings get stable names.
        export = f"{storage.stack_name}-DataBucketArn"
        if storage.node.try_find_child(f"Export{export}") is None:
            storage.export_value(storage.bucket.bucket_arn, name=export)
        bucket = s3.Bucket.from_bucket_attributes(self, "DataBucket", bucket_arn=cdk.Fn.import_value(export),
                                                  bucket_name=storage.bucket.bucket_name)
        pipeline = TrainingPipeline(
            self, "TrainingPipeline",
            environment=config.name,
            max_nodes=config.nodes,
            bucket=bucket,
            topic=alerts.topic,
            runner=job_runner_for(compute),
            log_retention=log_retention(config),
            removal_policy=data_removal_policy(config),
            train_attempt_hours=config.batch_train_timeout_hours,
        )
        for objects, why in ((f"{RUNS_PREFIX}*/verdict.json", "reads the verdict of the run being validated"),
                             (f"{RUNS_PREFIX}*/run.json", "claims a run id with the run's record"),
                             (f"{MODELS_PREFIX}*/approval.json", "reads the approval recorded for a run"),
                             (f"{MODELS_PREFIX}*", "records an approved run's verdict and approval in models/<run_id>/")):
            acknowledge(pipeline.state_machine.role, f"AwsSolutions-IAM5[Resource::{export}/{objects}]",
                        f"The pipeline {why}; run ids are chosen at run time, so only the key pattern is fixed")
        self.state_machine = pipeline.state_machine
        self.log_group = pipeline.log_group
        self.approved_model_parameter = pipeline.approved_model_parameter
        cdk.CfnOutput(self, "StateMachineArn", value=self.state_machine.state_machine_arn)
        cdk.CfnOutput(self, "ExecutionLogGroup", value=self.log_group.log_group_name)
        cdk.CfnOutput(self, "ApprovedModelParameter", value=self.approved_model_parameter)
        cdk.CfnOutput(self, "MaxNodes", value=str(config.nodes))
        runner_fixed = getattr(job_runner_for(compute), "fixed_node_count", False)
        cdk.CfnOutput(self, "MinNodes", value=str(config.nodes if runner_fixed else 1))
        cdk.CfnOutput(self, "TrainingRetries", value=str(pipeline.training_retry.max_attempts))
