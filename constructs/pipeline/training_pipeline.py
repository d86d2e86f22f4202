"""The training pipeline: validate the run, sanity-check the nodes, compile (Trainium), train, validate, approve.

One Step Functions state machine (JSONPath, one JSONata state for patterns). Its input is documented in
docs/pipeline.md and defined by the run contract (contracts/run.py), which also gives every stage's timeout.
Every job runs through a `JobRunner` (the seam to Batch, EKS or SageMaker); every Task has a timeout and a Catch that
notifies the alerts topic before failing; every AWS call of the pipeline's own retries throttling and 5xx.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from config.layout import CHECKPOINTS_PREFIX, MODELS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.compute.backend import TRAINING, VALIDATION, JobKind, JobRunner
from constructs.nag import acknowledge, acknowledge_iam, acknowledge_log_group_encryption, shown_arn
from constructs.pipeline.dataset_check import dataset_check
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.initial_model import InitialModel
from constructs.pipeline.input_checks import input_validation
from constructs.pipeline.model_registry import acknowledge_registry
from constructs.pipeline.quarantine import HOSTS_QUARANTINED, QUARANTINE_RETRIES, Quarantine
from constructs.pipeline.reservation_end import Reservation, reservation_end
from constructs.pipeline.run_claim import RunClaim
from constructs.pipeline.run_cost import run_cost, training_ended
from constructs.pipeline.run_quote import run_quote
from constructs.pipeline.train_attempt import (
    ATTEMPT_FAILED,
    NO_CAPACITY,
    WINDOW_ENDED,
    classified_training,
    train_result,
)
from constructs.pipeline.verdict import VerdictBranch
from contracts.quote import QuoteTerms
from contracts.run import (
    CAPACITY_RETRY_MINUTES,
    JOB_PARAMETERS,
    JOB_VALUES,
    QUEUE_WAIT_MINUTES,
    STOP_BY_NONE,
    WORKLOAD_JOB_PARAMETERS,
    execution_seconds,
    stages,
    train_state_seconds,
)

C = sfn.Condition
PLATFORM_FLAG = "$.run.registered.platform"  # the run's workload is one of the platform's trainers (workload_record.py)


@dataclass(frozen=True)
class TrainingRetry:
    """Step Functions Retry of a failed training job; each attempt resumes from the last checkpoint."""

    max_attempts: int = 3  # retries after the first attempt
    interval: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(2))
    backoff_rate: float = 2.0
    max_delay: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(30))


SANITY_RETRIES = 1  # one more submission (fresh placement) after a failed sanity check
# The run's error when no capacity came within the environment's capacity_wait_hours: not a failure of the run.
CAPACITY_UNAVAILABLE = "CapacityUnavailable"
# The run's error when its training stopped, after a checkpoint, because the reservation ends: resumable.
RESERVATION_ENDED = "ReservationEnded"
COMPILE_RETRIES = 1  # one more compile job after a failed one that did not refuse the run (exit 2/4/5)


class TrainingPipeline(Construct):
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
        training_retry: TrainingRetry | None = None,
        sanity_retry_interval: cdk.Duration | None = None,
        train_attempt_hours: int = 72,
        compiles_ahead: bool = False,
        initial_models: bool = True,
        capacity_retries: int = QUEUE_WAIT_MINUTES // CAPACITY_RETRY_MINUTES,
        reservation: Reservation | None = None,
        quote: QuoteTerms | None = None,
        workers_per_node: int | None = None,
    ) -> None:
        """`reservation`: the environment's reservation with an end, read as a run starts (reservation_end.py).
        `capacity_retries`: how many times a stage asks again for capacity that was not there, every
        CAPACITY_RETRY_MINUTES (contracts.run.capacity_retries), before the run ends as CapacityUnavailable.
        `compiles_ahead`: Trainium compiles every graph before it trains, in a Compile state of its own.
        `initial_models`: whether runs may start from an approved model (`init_from`; initial_model.py).
        A run's workload is data (workload_record.py): the built-in trainers' jobs run the platform's image, a
        registered workload's the same states with its image and declaration (`$.run.registered`).
        `workers_per_node`: the instance's workers, against which the first state judges a run's layout degrees."""
        super().__init__(scope, id_)
        self._environment = environment
        self.training_retry = training_retry or TrainingRetry()
        self._runner, self._train_attempt_hours = runner, train_attempt_hours
        self._compiles_ahead, self._capacity_retries = compiles_ahead, capacity_retries
        self._reservation = reservation
        # Hosts a failed attempt named bad are taken out before the retry, which does not count (quarantine.py).
        self._quarantine = Quarantine(bucket=bucket, runner=runner)
        stack = cdk.Stack.of(self)
        # A fixed name, so that the role may describe this state machine's executions (the holder of a run
        # being resumed) without naming the state machine itself, which would be a circular reference.
        self.state_machine_name = f"{stack.stack_name}-{id_}"[:80]
        self.approved_model_parameter = f"/efa-training/{environment}/approved-model"
        self._nodes = runner.node_scaling
        # Where the pipeline sizes nodes itself, every failure first releases them (unless another execution holds
        # their lease) and gives the run's lease back.
        release = self._nodes.release(self, "ReleaseNodes") if self._nodes else None
        self._failures = FailurePath(self, environment=environment, topic=topic, release=release)

        # 1. the input (pure ASL, before anything is submitted); a backend whose multi-node jobs have a fixed size
        # takes runs of exactly that size. 2. the run id names one run (runs_table conditional writes) unless resumed.
        validation_start, validated = input_validation(
            self,
            max_nodes=max_nodes,
            table=runs_table,
            failures=self._failures,
            min_nodes=max_nodes if runner.fixed_node_count else 1,
            workers_per_node=workers_per_node,
        )
        claim = RunClaim(
            self,
            bucket=bucket,
            table=runs_table,
            execution_arns=stack.format_arn(
                service="states",
                resource="execution",
                resource_name=f"{self.state_machine_name}:*",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            ),
            failures=self._failures,
            nodes=self._nodes,  # where the pipeline sizes nodes itself, the run takes their lease first
        )
        # 3. sanity check, training, validation job; 4. the verdict: approve, reject or fail.
        verdict = VerdictBranch(
            self,
            environment=environment,
            bucket=bucket,
            topic=topic,
            failures=self._failures,
            approved_model_parameter=self.approved_model_parameter,
        )
        # The initial model (init_from) is resolved before the run id is claimed: a missing model costs no claim.
        initial = InitialModel(
            self,
            bucket=bucket,
            failures=self._failures,
            environment=environment,
            supported=initial_models,
        )
        # The dataset is checked first of all: a typo costs no claim and no instance.
        dataset_start, dataset_ready = dataset_check(self, bucket=bucket, failures=self._failures)
        validated.next(dataset_start)
        dataset_ready.next(initial.start)
        chosen: sfn.INextable = initial.chosen
        if quote is not None:  # the quote and the budget, before the claim: a refused run spends nothing
            quoted, chosen = run_quote(self, quote, self._failures)
            initial.chosen.next(quoted)
        if reservation is None:
            chosen.next(claim.start)
        else:  # the reservation's end, before the claim: a window too short refuses the run with nothing spent
            window, read = reservation_end(self, reservation, self._failures)
            chosen.next(window)
            read.next(claim.start)
        prepared = self._sized(
            claim.claimed.next(self._prepare(bucket.bucket_name)).next(self._workload_jobs()),
            "ForTraining",
            {TRAINING: "$.run.nodes"},
        )
        # A backend whose training job checks its own hosts first gets no separate sanity job.
        checked = prepared if runner.sanity_in_training else prepared.next(self._sanity_check(sanity_retry_interval))
        compiled = checked.next(self._compile()) if compiles_ahead else checked
        trained = self._sized(
            compiled.next(self._train()).next(training_ended(self)), "ForValidation", {TRAINING: 0, VALIDATION: 1}
        )
        validated_model = self._sized(trained.next(self._validate()), "AfterValidation", {VALIDATION: 0})
        if self._nodes is not None:  # no node needed any more: the lease back, the next run may take the nodes
            validated_model = validated_model.next(self._nodes.release_lease(self, "ReleaseNodeLease"))
        if quote is None:
            validated_model.next(verdict.start)
        else:  # the quote beside what the jobs cost, in the run's record and on the dashboard
            costed, recorded = run_cost(self, quote, bucket)
            validated_model.next(costed)
            recorded.next(verdict.start)

        # Under /aws/vendedlogs/: log delivery for a group outside it adds to the account's one CloudWatch Logs
        # resource policy, which has a size limit (Step Functions developer guide, "Avoiding CloudWatch Logs resource
        # policy size restrictions"). The stack's id in the name: a group kept by a destroyed prod stack never
        # collides with the next deploy's.
        stack_id = cdk.Fn.select(2, cdk.Fn.split("/", cdk.Stack.of(self).stack_id))
        self.log_group = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=cdk.Fn.join("", [f"/aws/vendedlogs/states/{self.state_machine_name}-", stack_id]),
            retention=log_retention,
            removal_policy=removal_policy,
        )
        acknowledge_log_group_encryption(self.log_group)
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(sfn.Chain.start(validation_start)),
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

    def _sized(self, chain: sfn.Chain, stage: str, desired: dict[str, int | str]) -> sfn.Chain:
        """`chain`, then (where the pipeline sizes nodes) the node counts `desired` for what comes next."""
        if self._nodes is None:
            return chain
        sizing, calls = self._nodes.size(self, stage, desired)
        for call in calls:
            self._failures.catch(call, call.node.id, "NodesNotSized")
        return chain.next(sizing)

    def _prepare(self, bucket_name: str) -> sfn.IChainable:
        """PrepareRun: the jobs' string parameters, the run's S3 keys and the Train state's timeout, from the
        validated run (every workload's jobs take the same values: contracts.run.JOB_VALUES)."""
        return self._prepare_state("PrepareRun", JOB_VALUES, bucket_name)

    def _prepare_state(self, id_: str, job_values: dict[str, str], bucket_name: str) -> sfn.Pass:
        def run_key(prefix: str, key: str) -> str:
            return f"States.Format('{prefix}{{}}/{key}', $.run.run_id)"

        job = {f"{name}.$": path for name, path in job_values.items()}
        if self._reservation is None and "stop_by" in job_values:  # nothing reads an end: the job gets none
            del job["stop_by.$"]
            job["stop_by"] = STOP_BY_NONE
        return sfn.Pass(
            self,
            id_,
            parameters={
                "run.$": "$.run",
                "clock": {"prepared": {"at.$": "$$.State.EnteredTime"}},  # the run's nodes from here (run_cost.py)
                # Job parameters are strings (Batch job Parameters, launcher flags on EKS).
                "job": job,
                "paths": {
                    "verdict_key.$": run_key(RUNS_PREFIX, "verdict.json"),
                    "verdict_source.$": run_key(f"{bucket_name}/{RUNS_PREFIX}", "verdict.json"),
                    "model_verdict_key.$": run_key(MODELS_PREFIX, "verdict.json"),
                    "model_uri.$": run_key(f"s3://{bucket_name}/{MODELS_PREFIX}", ""),
                    "checkpoints_uri.$": run_key(f"s3://{bucket_name}/{CHECKPOINTS_PREFIX}", ""),
                    "approval_key.$": run_key(MODELS_PREFIX, "approval.json"),
                },
                # A backend may make `max_attempts` attempts inside one training submission: the Train state waits
                # for all of them, each with its queue wait (Task state `TimeoutSecondsPath`:
                # https://docs.aws.amazon.com/step-functions/latest/dg/state-task.html).
                "timeouts": {
                    "train.$": "States.ArrayGetItem(States.Array("
                    f"{', '.join(map(str, train_state_seconds(self._train_attempt_hours)))}), "
                    "$.run.max_attempts)"
                },
            },
        )

    def _submit(self, id_: str, job: JobKind, declared: bool = False, **options) -> sfn.CustomState | sfn.Parallel:
        """The job's state: the platform's own job, or (`declared`) the run's registered workload's."""
        names = WORKLOAD_JOB_PARAMETERS[job] if declared else JOB_PARAMETERS[job]
        return self._runner.submit(
            self,
            id_,
            job=job,
            parameters={name: f"$.job.{name}" for name in names},
            job_name=f"States.Format('{{}}-{job}', $.run.run_id)",
            declared=declared,
            **options,
        )

    def _per_workload(self, id_: str, build: Callable[[bool], sfn.State]) -> sfn.IChainable:
        """`build(declared)`: the stage's state for the platform's own trainers (False) and for a registered
        workload (True: its image and declaration from `$.run.registered`), behind one Choice on the record's
        `platform`: the same two states however many workloads are registered. Each is retried and caught on its
        own, so no job's failure has to cross a Parallel state's boundary to reach them."""
        which = sfn.Choice(self, f"{id_}Workload")
        which.when(C.boolean_equals(PLATFORM_FLAG, False), build(True))
        return which.otherwise(build(False)).afterwards()

    def _workload_jobs(self) -> sfn.IChainable:
        """Where a backend prepares a registered workload's jobs per run (Batch: its job definitions), that first."""
        prepared = self._runner.workload_jobs(self)
        ready = sfn.Pass(self, "WorkloadJobsReady")
        if prepared is None:
            return ready
        chain, calls = prepared
        for call in calls:
            self._failures.catch(call, call.node.id, "RunNotStarted")
        which = sfn.Choice(self, "PrepareWorkloadJobs")
        which.when(C.boolean_equals(PLATFORM_FLAG, False), chain.next(ready))
        return which.otherwise(ready).afterwards()

    def _sanity_check(self, retry_interval: cdk.Duration | None) -> sfn.Parallel:
        """On the run's nodes; once more (fresh placement) if it fails, not if it refused the run (exit 2); capacity
        that is not there is waited for, as for training."""
        sanity = classified_training(
            self,
            "SanityCheck",
            self._submit(
                "SanityCheckJob",
                "sanity",
                nodes="$.run.nodes",
                result_path="$",
                timeout=cdk.Duration.seconds(stages(self._train_attempt_hours)["sanity"].state_seconds()),
            ),
            result_path="$.jobs.sanity",
            reader=self._runner,
            rejected_errors=self._runner.rejected_errors,
            quarantine=self._quarantine,
            job="sanity",
            before=self._training_nodes("SanityCheck"),
        )
        self._retry_classified(
            sanity, attempts=SANITY_RETRIES, interval=retry_interval or cdk.Duration.minutes(1), backoff_rate=1
        )
        self._catch_classified(sanity, "SanityCheck", "SanityCheckFailed")
        return sanity

    def _training_nodes(self, id_: str) -> tuple[sfn.State, sfn.INextable] | None:
        """Where the pipeline sizes the nodes itself (EKS), a multi-node job first waits for the training nodes: a
        shortage is waited for as capacity, not spent as an attempt at the Job's deadline."""
        if self._nodes is None:
            return None
        return self._nodes.wait_for_training(self, id_, errors=(NO_CAPACITY, ATTEMPT_FAILED))

    def _retry_classified(self, state: sfn.Parallel, *, attempts: int, **options) -> None:
        """A classified job state's Retries: never a rejected request; a failed attempt `attempts` times (`options`:
        the interval, backoff); capacity that was not there every CAPACITY_RETRY_MINUTES, `capacity_retries` times,
        apart from the attempts' own retries (each Retrier counts its own: ASL "Retrying after an error")."""
        if self._runner.rejected_errors:
            state.add_retry(errors=list(self._runner.rejected_errors), max_attempts=0)
        state.add_retry(errors=[ATTEMPT_FAILED], max_attempts=attempts, **options)
        state.add_retry(errors=[HOSTS_QUARANTINED], max_attempts=QUARANTINE_RETRIES, interval=cdk.Duration.seconds(30))
        state.add_retry(
            errors=[NO_CAPACITY],
            interval=cdk.Duration.minutes(CAPACITY_RETRY_MINUTES),
            max_attempts=self._capacity_retries,
            backoff_rate=1,
        )

    def _catch_classified(self, state: sfn.Parallel, name: str, error: str) -> None:
        """No capacity after every retry ends the run as CapacityUnavailable; a training that stopped for its
        reservation's end as ReservationEnded (resumable, not retried); anything else as `error`."""
        self._failures.catch(state, name, CAPACITY_UNAVAILABLE, errors=[NO_CAPACITY], record_id=f"{name}NoCapacity")
        self._failures.catch(state, name, RESERVATION_ENDED, errors=[WINDOW_ENDED], record_id=f"{name}WindowEnded")
        self._failures.catch(state, name, error)

    def _compile(self) -> sfn.Parallel:
        """Trainium: neuron_parallel_compile fills the shared compile cache on the run's nodes before training
        (training_image/efa_training/runtime/launch/neuron_compile.py). Its own timeout; one retry of a failed attempt,
        capacity waited for as for training, a refused run (bad flags: exit 2) not retried."""
        compile_ = classified_training(
            self,
            "Compile",
            self._submit(
                "CompileJob",
                "compile",
                nodes="$.run.nodes",
                result_path="$",
                timeout=cdk.Duration.seconds(stages(self._train_attempt_hours)["compile"].state_seconds()),
            ),
            result_path="$.jobs.compile",
            reader=self._runner,
            rejected_errors=self._runner.rejected_errors,
            quarantine=self._quarantine,
            job="compile",
            before=self._training_nodes("Compile"),
        )
        self._retry_classified(compile_, attempts=COMPILE_RETRIES, interval=cdk.Duration.minutes(2), backoff_rate=1)
        self._catch_classified(compile_, "Compile", "CompilationFailed")
        return compile_

    def _train(self) -> sfn.IChainable:
        return self._per_workload("Train", self._train_state)

    def _train_state(self, declared: bool) -> sfn.Parallel:
        """A retry resumes from the run's checkpoints; retried only when the job failed for a reason other than
        the run itself (its exit code says which), never when the backend rejected the request."""
        runner, retry = self._runner, self.training_retry
        suffix = "-workload" if declared else ""
        train = classified_training(
            self,
            f"Train{suffix}",
            self._submit(
                f"TrainJob{suffix}",
                "train",
                declared,
                nodes="$.run.nodes",
                result_path="$",
                attempts="$.run.max_attempts" if runner.restarts_lost_hosts else None,
                timeout="$.timeouts.train",
            ),
            result_path="$.jobs.train",
            reader=runner,
            rejected_errors=runner.rejected_errors,
            quarantine=self._quarantine,
            before=self._training_nodes(f"Train{suffix}"),
            kept=train_result(runner),  # SageMaker: the model artifact, for the validation (its job runner)
        )
        self._retry_classified(
            train,
            attempts=retry.max_attempts,
            interval=retry.interval,
            backoff_rate=retry.backoff_rate,
            max_delay=retry.max_delay,
            jitter_strategy=sfn.JitterType.FULL,
        )
        self._catch_classified(train, f"Train{suffix}", "TrainingFailed")
        return train

    def _validate(self) -> sfn.IChainable:
        return self._per_workload("Validate", self._validate_state)

    def _validate_state(self, declared: bool) -> sfn.CustomState | sfn.Parallel:
        suffix = "-workload" if declared else ""
        validate = self._submit(
            f"Validate{suffix}",
            "validate",
            declared,
            result_path="$.jobs.validate",
            timeout=cdk.Duration.seconds(stages(self._train_attempt_hours)["validate"].state_seconds()),
        )
        self._failures.catch(validate, f"Validate{suffix}", "ValidationJobFailed")
        return validate

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
