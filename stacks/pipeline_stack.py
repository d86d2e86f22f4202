"""Pipeline: the Step Functions state machine that takes one training run from input to approved model.

The compute backend supplies the jobs (`ComputeBackend.job_runner`) and may add what it needs next to the state
machine (`attach_pipeline`: EKS sizes its node group with the executions). The operator CLI (tools/pipeline_cli.py)
finds the state machine by this stack's `StateMachineArn` output.
"""

import aws_cdk as cdk

from config import Accelerator, EnvironmentConfig
from config.layout import (
    BAD_HOSTS_PENDING,
    BAD_HOSTS_PREFIX,
    DATASET_MANIFEST,
    DATASETS_PREFIX,
    MODELS_PREFIX,
    RUN_COST,
    RUN_RECORD,
    RUNS_PREFIX,
)
from constructs import Construct
from constructs.compute.backend import ComputeBackend
from constructs.pipeline.reservation_end import Reservation
from constructs.pipeline.training_pipeline import PipelineOptions, TrainingPipeline
from contracts.quote import QuoteTerms
from contracts.run import phases
from stacks.alerts_stack import AlertsStack
from stacks.policies import data_removal_policy, log_retention
from stacks.storage_stack import StorageStack

# The object patterns the state machine reads or writes, and why (each a cdk-nag finding on its role).
BUCKET_OBJECTS = (
    (f"{RUNS_PREFIX}*/verdict.json", "reads the verdict of the run being validated"),
    (f"{RUNS_PREFIX}*/{RUN_RECORD}", "writes a readable copy of the run's claim (the claim is the runs table's)"),
    (f"{RUNS_PREFIX}*/{RUN_COST}", "records a validated run's quote beside what its jobs cost (run_cost.py)"),
    (f"{MODELS_PREFIX}*/approval.json", "reads the approval recorded for a run"),
    (f"{MODELS_PREFIX}*", "records an approved run's verdict and approval in models/<run_id>/"),
    (f"{DATASETS_PREFIX}*/{DATASET_MANIFEST}", "checks that the run's dataset is prepared before any instance starts"),
    (f"{RUNS_PREFIX}*/{BAD_HOSTS_PENDING}*", "reads and clears the hosts a failed attempt named bad (quarantine.py)"),
    (f"{RUNS_PREFIX}*/{BAD_HOSTS_PREFIX}*", "keeps the run's record of the hosts it took out"),
    (f"{BAD_HOSTS_PREFIX}*", "keeps the environment's record of the hosts it took out, one object per host id"),
)


class PipelineStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        config: EnvironmentConfig,
        storage: StorageStack,
        alerts: AlertsStack,
        compute: ComputeBackend,
        **kwargs,
    ) -> None:
        super().__init__(scope, id_, **kwargs)
        runner = compute.job_runner
        # Trainium compiles its graphs ahead of time (the Neuron compiler is slow; no run should wait on it).
        compiles_ahead = config.instance.accelerator is Accelerator.NEURON
        pipeline = TrainingPipeline(
            self,
            "TrainingPipeline",
            environment=config.name,
            max_nodes=config.nodes,
            bucket=storage.data_access.bucket(self),
            runs_table=storage.runs_table,
            topic=alerts.topic,
            runner=runner,
            log_retention=log_retention(config),
            removal_policy=data_removal_policy(config),
            options=PipelineOptions(
                train_attempt_hours=config.batch_train_timeout_hours,
                compiles_ahead=compiles_ahead,
                # SageMaker jobs reading their dataset from S3 mount no file system, where other runs' checkpoints are.
                initial_models=not (config.compute == "sagemaker" and config.sagemaker_data_source == "s3"),
                capacity_retries=config.capacity_retries,
                reservation=_reservation(config, getattr(runner, "subnet_zone", None)),
                quote=QuoteTerms.of(config),
                workers_per_node=config.instance.workers_per_node,
            ),
        )
        compute.attach_pipeline(self, pipeline.state_machine, alerts.topic)
        for objects, why in BUCKET_OBJECTS:
            storage.data_access.acknowledge_objects(
                pipeline.state_machine.role,
                objects,
                f"The pipeline {why}; run ids are chosen at run time, so only the key pattern is fixed",
            )
        self.state_machine = pipeline.state_machine
        self.log_group = pipeline.log_group
        self.approved_model_parameter = pipeline.approved_model_parameter
        cdk.CfnOutput(self, "StateMachineArn", value=self.state_machine.state_machine_arn)
        cdk.CfnOutput(self, "ExecutionLogGroup", value=self.log_group.log_group_name)
        cdk.CfnOutput(self, "ApprovedModelParameter", value=self.approved_model_parameter)
        cdk.CfnOutput(self, "MaxNodes", value=str(config.nodes))
        cdk.CfnOutput(self, "MinNodes", value=str(config.min_nodes))
        cdk.CfnOutput(self, "TrainingRetries", value=str(pipeline.training_retry.max_attempts))
        # The phases a run passes through on this backend: the CLI's progress counts them.
        cdk.CfnOutput(self, "Phases", value=",".join(phases(runner.sanity_in_training, compiles_ahead)))


def _reservation(config: EnvironmentConfig, subnet_zone: str | None) -> Reservation | None:
    """The reservation whose end the pipeline reads as a run starts: a Capacity Block, an On-Demand reservation by
    id, or a training plan (a reservation group has no one end), with when this backend's provider takes it away;
    `subnet_zone`: the training subnet's zone where the runner names it (SageMaker: a plan's capacity must be there)."""
    found = config.reservation
    if found is None or (found.id is None and found.training_plan is None):
        return None
    lead, by = found.taken_away(config.compute)  # the backend's provider (config/capacity.py TAKEN_AWAY)
    return Reservation(
        capacity_reservation_id=found.id,
        training_plan_arn=found.training_plan,
        lead_seconds=lead,
        taken_by=by,
        subnet_zone=subnet_zone,
    )
