"""The pipeline's job stages, in the order a run meets them: the run's job values, a registered workload's jobs, the
sanity check, Trainium's compile, training, validation (TrainingPipeline's, constructs/pipeline/training_pipeline.py).

Each job runs through the backend's `JobRunner` inside a classified block (train_attempt.py) with the pipeline's own
Retry and Catch: attempt failures retried, refusals not, capacity waited for apart from the attempts. Where the run's
workload is a registered one, the same stage's second state runs it (`_per_workload`: one Choice on the record's
`platform`, however many workloads are registered).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import aws_cdk as cdk
import aws_cdk.aws_stepfunctions as sfn

from config.layout import CHECKPOINTS_PREFIX, MODELS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.compute.backend import JobKind, JobRunner, PipelineNodes
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.quarantine import HOSTS_QUARANTINED, QUARANTINE_RETRIES, Quarantine
from constructs.pipeline.reservation_end import Reservation
from constructs.pipeline.train_attempt import (
    ATTEMPT_FAILED,
    NO_CAPACITY,
    WINDOW_ENDED,
    classified_training,
    train_result,
)
from contracts.run import (
    CAPACITY_RETRY_MINUTES,
    JOB_PARAMETERS,
    JOB_VALUES,
    STOP_BY_NONE,
    WORKLOAD_JOB_PARAMETERS,
    stages,
    train_state_seconds,
)

C = sfn.Condition
PLATFORM_FLAG = "$.run.registered.platform"  # the run's workload is one of the platform's trainers (workload_record.py)
SANITY_RETRIES = 1  # one more submission (fresh placement) after a failed sanity check
COMPILE_RETRIES = 1  # one more compile job after a failed one that did not refuse the run (exit 2/4/5)
# The run's error when no capacity came within the environment's capacity_wait_hours: not a failure of the run.
CAPACITY_UNAVAILABLE = "CapacityUnavailable"
# The run's error when its training stopped, after a checkpoint, because the reservation ends: resumable.
RESERVATION_ENDED = "ReservationEnded"


@dataclass(frozen=True)
class TrainingRetry:
    """Step Functions Retry of a failed training job; each attempt resumes from the last checkpoint."""

    max_attempts: int = 3  # retries after the first attempt
    interval: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(2))
    backoff_rate: float = 2.0
    max_delay: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(30))


class JobStages(Construct):
    """TrainingPipeline's job stages: its base, so that `self` is the pipeline, the scope of every state; the
    attributes below are the pipeline's (TrainingPipeline.__init__ sets them)."""

    _runner: JobRunner
    _failures: FailurePath
    _quarantine: Quarantine
    _nodes: PipelineNodes | None
    _reservation: Reservation | None
    _train_attempt_hours: int
    _capacity_retries: int
    training_retry: TrainingRetry

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
