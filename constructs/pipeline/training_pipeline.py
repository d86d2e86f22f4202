"""The training pipeline: validate the run, sanity-check the nodes, compile (Trainium), train, validate, approve.

One Step Functions state machine (JSONPath, one JSONata state for patterns). Its input is documented in
docs/pipeline.md and defined by the run contract (contracts/run.py), which also gives every stage's timeout.
Every job runs through a `JobRunner` (the seam to Batch, EKS or SageMaker); every Task has a timeout and a Catch that
notifies the alerts topic before failing; every AWS call of the pipeline's own retries throttling and 5xx.
"""

from dataclasses import dataclass, field
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.compute.backend import TRAINING, VALIDATION, JobRunner
from constructs.nag import acknowledge, acknowledge_iam, acknowledge_log_group_encryption, shown_arn
from constructs.pipeline.dataset_check import dataset_check
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.initial_model import InitialModel
from constructs.pipeline.input_checks import input_validation
from constructs.pipeline.job_stages import (
    COMPILE_RETRIES as COMPILE_RETRIES,
)
from constructs.pipeline.job_stages import (
    SANITY_RETRIES,
    JobStages,
    TrainingRetry,
)
from constructs.pipeline.model_registry import acknowledge_registry
from constructs.pipeline.quarantine import QUARANTINE_RETRIES, Quarantine
from constructs.pipeline.reservation_end import Reservation, reservation_end
from constructs.pipeline.run_claim import RunClaim
from constructs.pipeline.run_cost import run_cost, training_ended
from constructs.pipeline.run_quote import run_quote
from constructs.pipeline.verdict import VerdictBranch
from contracts.quote import QuoteTerms
from contracts.run import CAPACITY_RETRY_MINUTES, QUEUE_WAIT_MINUTES, execution_seconds

# COMPILE_RETRIES, SANITY_RETRIES and TrainingRetry: job_stages.py's, named here too (tests/test_docs_contract.py).


@dataclass(frozen=True)
class PipelineOptions:
    """What tunes a pipeline beyond its resources (PipelineStack gives the environment's).

    `reservation`: the environment's reservation with an end, read as a run starts (reservation_end.py).
    `capacity_retries`: how many times a stage asks again for capacity that was not there, every
    CAPACITY_RETRY_MINUTES (contracts.run.capacity_retries), before the run ends as CapacityUnavailable.
    `compiles_ahead`: Trainium compiles every graph before it trains, in a Compile state of its own.
    `initial_models`: whether runs may start from an approved model (`init_from`; initial_model.py).
    `quote`: the terms a run is quoted and held to its budget by (run_quote.py); None: no quote.
    `workers_per_node`: the instance's workers, against which the first state judges a run's layout degrees."""

    training_retry: TrainingRetry = field(default_factory=TrainingRetry)
    sanity_retry_interval: cdk.Duration | None = None
    train_attempt_hours: int = 72
    compiles_ahead: bool = False
    initial_models: bool = True
    capacity_retries: int = QUEUE_WAIT_MINUTES // CAPACITY_RETRY_MINUTES
    reservation: Reservation | None = None
    quote: QuoteTerms | None = None
    workers_per_node: int | None = None


# One stage of the pipeline: its first state, and the state after which the next stage starts (None: it ends the run).
Stage = tuple[sfn.IChainable, sfn.INextable | None]


def _one(state: sfn.IChainable) -> Stage:
    """A stage of one state or chain: it starts and goes on there (every State and Chain is INextable)."""
    return state, cast(sfn.INextable, state)


class TrainingPipeline(JobStages):
    """The state machine: its stages in the order a run meets them (`_stages`), each built by its own module or
    method over the same resources; a run's workload is data (workload_record.py), so no stage depends on which."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        environment: str,
        max_nodes: int,
        bucket: s3.IBucket,
        runs_table: dynamodb.ITable,
        topic: sns.ITopic,
        runner: JobRunner,
        log_retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
        options: PipelineOptions | None = None,
    ) -> None:
        super().__init__(scope, id_)
        self._options = options = options or PipelineOptions()
        self._environment, self._max_nodes, self._bucket, self._table = environment, max_nodes, bucket, runs_table
        self.training_retry = options.training_retry
        self._runner, self._train_attempt_hours = runner, options.train_attempt_hours
        self._compiles_ahead, self._capacity_retries = options.compiles_ahead, options.capacity_retries
        self._reservation = options.reservation
        # Hosts a failed attempt named bad are taken out before the retry, which does not count (quarantine.py).
        self._quarantine = Quarantine(bucket=bucket, runner=runner)
        # A fixed name, so that the role may describe this state machine's executions (the holder of a run
        # being resumed) without naming the state machine itself, which would be a circular reference.
        self.state_machine_name = f"{cdk.Stack.of(self).stack_name}-{id_}"[:80]
        self.approved_model_parameter = f"/efa-training/{environment}/approved-model"
        self._nodes = runner.node_scaling
        # Where the pipeline sizes nodes itself, every failure first releases them (unless another execution holds
        # their lease) and gives the run's lease back.
        release = self._nodes.release(self, "ReleaseNodes") if self._nodes else None
        self._failures = FailurePath(self, environment=environment, topic=topic, release=release)
        stages = self._stages(topic)
        for (_, last), (first, _) in zip(stages, stages[1:], strict=False):
            assert last is not None, "only the last stage ends the run"
            last.next(first)
        self.log_group = self._execution_logs(log_retention, removal_policy)
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(sfn.Chain.start(stages[0][0])),
            comment=f"EFA training pipeline ({environment}): validate input, sanity check, train, validate, approve",
            state_machine_name=self.state_machine_name,
            timeout=cdk.Duration.seconds(self._execution_seconds()),
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        )
        runner.grant(self.state_machine)
        if topic.master_key is not None:  # an encrypted topic: publishing needs its key
            topic.master_key.grant(self.state_machine, "kms:Decrypt", "kms:GenerateDataKey")
        self._acknowledge()

    def _stages(self, topic: sns.ITopic) -> list[Stage]:
        """In the order a run meets them. Everything before the claim spends nothing: the input, the dataset, the
        initial model, the quote and budget, the reservation's window; then the claim, the jobs, the verdict."""
        options, runner = self._options, self._runner
        stages = [self._input(), dataset_check(self, bucket=self._bucket, failures=self._failures)]
        initial = InitialModel(
            self,
            table=self._table,
            failures=self._failures,
            environment=self._environment,
            supported=options.initial_models,
        )
        stages.append((initial.start, initial.chosen))
        if options.quote is not None:
            stages.append(run_quote(self, options.quote, self._failures))
        if options.reservation is not None:
            stages.append(reservation_end(self, options.reservation, self._failures))
        claim = self._claim()
        stages += [(claim.start, claim.claimed), _one(self._prepare(self._bucket.bucket_name))]
        stages += [_one(self._workload_jobs()), *self._sizing("ForTraining", {TRAINING: "$.run.nodes"})]
        if not runner.sanity_in_training:  # where the training job checks its own hosts first, no separate job
            stages.append(_one(self._sanity_check(options.sanity_retry_interval)))
        if options.compiles_ahead:
            stages.append(_one(self._compile()))
        stages += [_one(self._train()), _one(training_ended(self))]
        stages += [*self._sizing("ForValidation", {TRAINING: 0, VALIDATION: 1}), _one(self._validate())]
        stages += self._sizing("AfterValidation", {VALIDATION: 0})
        if self._nodes is not None:  # no node needed any more: the lease back, the next run may take the nodes
            stages.append(_one(self._nodes.release_lease(self, "ReleaseNodeLease")))
        if options.quote is not None:  # the quote beside what the jobs cost, in the run's record and on the dashboard
            stages.append(run_cost(self, options.quote, self._bucket))
        verdict = VerdictBranch(
            self,
            environment=self._environment,
            bucket=self._bucket,
            table=self._table,
            topic=topic,
            failures=self._failures,
            approved_model_parameter=self.approved_model_parameter,
        )
        return [*stages, (verdict.start, None)]

    def _input(self) -> Stage:
        """The input (before anything is submitted); a backend whose multi-node jobs have a fixed size takes runs of
        exactly that size."""
        return input_validation(
            self,
            max_nodes=self._max_nodes,
            table=self._table,
            failures=self._failures,
            min_nodes=self._max_nodes if self._runner.fixed_node_count else 1,
            workers_per_node=self._options.workers_per_node,
        )

    def _claim(self) -> RunClaim:
        """The run id names one run (the runs table's conditional writes) unless resumed; where the pipeline sizes
        nodes itself, the run takes their lease first."""
        return RunClaim(
            self,
            bucket=self._bucket,
            table=self._table,
            execution_arns=cdk.Stack.of(self).format_arn(
                service="states",
                resource="execution",
                resource_name=f"{self.state_machine_name}:*",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            ),
            failures=self._failures,
            nodes=self._nodes,
        )

    def _execution_logs(self, retention: logs.RetentionDays, removal_policy: cdk.RemovalPolicy) -> logs.LogGroup:
        """Under /aws/vendedlogs/: log delivery for a group outside it adds to the account's one CloudWatch Logs
        resource policy, which has a size limit (Step Functions developer guide, "Avoiding CloudWatch Logs resource
        policy size restrictions"). The stack's id in the name: a group kept by a destroyed prod stack never
        collides with the next deploy's."""
        stack_id = cdk.Fn.select(2, cdk.Fn.split("/", cdk.Stack.of(self).stack_id))
        group = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=cdk.Fn.join("", [f"/aws/vendedlogs/states/{self.state_machine_name}-", stack_id]),
            retention=retention,
            removal_policy=removal_policy,
        )
        acknowledge_log_group_encryption(group)
        return group

    def _sizing(self, stage: str, desired: dict[str, int | str]) -> list[Stage]:
        """Where the pipeline sizes nodes, the node counts `desired` for what comes next (none elsewhere)."""
        if self._nodes is None:
            return []
        sizing, calls = self._nodes.size(self, stage, desired)
        for call in calls:
            self._failures.catch(call, call.node.id, "NodesNotSized")
        return [_one(sizing)]

    def _execution_seconds(self) -> int:
        """Every stage at its longest (the Train state's at the most attempts a run may ask for)."""
        retry = self.training_retry
        # each stage may also be submitted again after a quarantine (QUARANTINE_RETRIES, not counted as attempts)
        sanity = 0 if self._runner.sanity_in_training else 1 + SANITY_RETRIES + QUARANTINE_RETRIES
        compile_ = 1 + COMPILE_RETRIES + QUARANTINE_RETRIES if self._compiles_ahead else 0
        train = 1 + retry.max_attempts + QUARANTINE_RETRIES
        # where the pipeline waits for the training nodes before each submission (EKS: node_wait.py)
        node_waits = (self._nodes.training_wait_seconds if self._nodes else 0) * (sanity + compile_ + train)
        return execution_seconds(
            self._train_attempt_hours,
            sanity_submissions=sanity,
            compile_submissions=compile_,
            train_submissions=train,
            # the attempts' backoff, and each stage's capacity waits (a submission waits at most QUEUE_WAIT_MINUTES)
            train_backoff_seconds=retry.max_attempts * int(retry.max_delay.to_seconds())
            + 3 * self._capacity_retries * (QUEUE_WAIT_MINUTES + CAPACITY_RETRY_MINUTES) * 60,
            calls_seconds=3600 + node_waits,
        )

    def _acknowledge(self) -> None:
        """cdk-nag: the one wildcard finding that belongs to the state machine itself (bucket and job
        wildcards are acknowledged where their resources are named: PipelineStack, the job runner)."""
        acknowledge(
            self.state_machine.role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray (PutTraceSegments, PutTelemetryRecords, GetSampling*) and CloudWatch Logs delivery "
            "(logs:CreateLogDelivery ...) allow no resource-level permissions; nor do the job runners' "
            "status polling (batch:DescribeJobs), the SageMaker integration's sagemaker:ListTags, reading a "
            "capacity reservation's end (ec2:DescribeCapacityReservations), the runs' measured MFU "
            "(cloudwatch:GetMetricData), each run's cost (cloudwatch:PutMetricData) and, on EKS, the training nodes' "
            "Auto Scaling group (autoscaling:DescribeAutoScalingGroups, DescribeScalingActivities), and finding the "
            "model registry's group (sagemaker:ListModelPackageGroups)",
        )
        acknowledge_registry(self.state_machine.role, self._environment)
        executions = shown_arn(cdk.Stack.of(self), "states", f"execution:{self.state_machine_name}:*")
        acknowledge(
            self.state_machine.role,
            f"AwsSolutions-IAM5[Resource::{executions}]",
            "A resumed run describes the execution that holds it (is it still running?); execution "
            "names are chosen at start, so only this state machine's prefix is fixed",
        )
        acknowledge_iam(
            self.state_machine.role,
            "RESOURCE_MISMATCH",
            "states:DescribeExecution",
            "the reference lists execution and express as DescribeExecution's resource types, one per workflow "
            "type; this Standard state machine's executions are `execution` ARNs, which the grant names",
            formats=("arn:*:states:*:*:express:*:*:*",),
        )
