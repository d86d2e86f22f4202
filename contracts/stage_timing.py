"""The pipeline's timing contract: how long each stage's jobs may take and wait, the states that wait for them, the
execution's deadline, and the exit codes a stage's failure reason carries (re-exported by contracts/run.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The backend's own attempts per training submission: Batch SubmitJob RetryStrategy.attempts (1-10, API_RetryStrategy).
MAX_ATTEMPTS = 10


# ---- stage timeouts: the job definitions' attempt timeouts and the states that wait for them --------

# A job waiting for instance capacity is cancelled after this long (the Batch queues' job state time limit);
# each Batch attempt of a stage may wait this long before it runs.
QUEUE_WAIT_MINUTES = 60
# No capacity for a job's instances is asked for again this often, for as long as the environment's
# `capacity_wait_hours` allows, without counting as a failed attempt (constructs/pipeline/train_attempt.py NO_CAPACITY).
CAPACITY_RETRY_MINUTES = 5
# A job that ends itself (SageMaker's MaxWaitTimeInSeconds, a Kubernetes Job's activeDeadlineSeconds) does so this
# long before its state's timeout: time to create the job before, and to upload its output after.
JOB_END_MARGIN_SECONDS = 30 * 60


@dataclass(frozen=True)
class Stage:
    """One job's attempt timeout (Batch job definition `timeout`) and how many attempts Batch makes per
    submission (job definition `retryStrategy.attempts`; the run's `max_attempts` for training)."""

    attempt_seconds: int
    attempts: int

    def state_seconds(self, attempts: int | None = None) -> int:
        """How long the state that submits the job waits: every Batch attempt, each after its queue wait."""
        return (attempts or self.attempts) * (self.attempt_seconds + QUEUE_WAIT_MINUTES * 60)

    @property
    def deadline_seconds(self) -> int:
        """How long one attempt may take from its submission, waiting for capacity included, when the job ends
        itself: inside one attempt's share of the state's wait, so the job's own end (an attempt failure, retried)
        comes before the state's timeout (which is not)."""
        return self.attempt_seconds + QUEUE_WAIT_MINUTES * 60 - JOB_END_MARGIN_SECONDS


def capacity_retries(wait_hours: int, submission_wait_minutes: int) -> int:
    """How many times a stage asks again for capacity within `wait_hours`, when each submission waits up to
    `submission_wait_minutes` for it before the backend gives up (a Batch queue's time limit; 0 where the backend
    answers at once, as SageMaker's CapacityError does)."""
    return math.ceil(wait_hours * 60 / (submission_wait_minutes + CAPACITY_RETRY_MINUTES))


def stages(train_attempt_hours: int) -> dict[str, Stage]:
    """Each stage's timeouts; `train_attempt_hours` is the environment's `batch_train_timeout_hours`."""
    return {
        "sanity": Stage(attempt_seconds=3600, attempts=2),
        # Trainium's ahead-of-time compilation: a short trial run, then the Neuron compiler over every graph (hours
        # for the largest models); one Batch attempt per submission, the pipeline's own Retry makes another.
        "compile": Stage(attempt_seconds=4 * 3600, attempts=1),
        "train": Stage(attempt_seconds=train_attempt_hours * 3600, attempts=5),
        "validate": Stage(attempt_seconds=2 * 3600, attempts=3),
    }


# The states every successful run passes through, in order (a new run and a resume both reach RunClaimed):
# what the CLI's progress counts; a test holds them to the synthesized definition.
PHASES = (
    "ValidateInput",
    "RunClaimed",
    "SanityCheck",
    "Compile",
    "Train",
    "Validate",
    "ReadVerdict",
    "IsModelAccepted",
    "RecordApproval",
    "PublishApprovedModel",
    "NotifyApproved",
)


def phases(sanity_in_training: bool, compiles_ahead: bool = False) -> tuple[str, ...]:
    """The phases on one backend and instance type: where the training job checks its own hosts there is no
    SanityCheck state; only Trainium (compiles_ahead) has a Compile state."""
    left_out = {"SanityCheck"} if sanity_in_training else set()
    return tuple(p for p in PHASES if p not in left_out and (compiles_ahead or p != "Compile"))


# Step Functions Standard workflows run for at most one year (Step Functions quotas).
MAX_EXECUTION_SECONDS = 365 * 24 * 3600


def train_state_seconds(train_attempt_hours: int) -> list[int]:
    """The Train state's timeout for each `max_attempts` (index 0 unused): the state reads it from this table."""
    train = stages(train_attempt_hours)["train"]
    return [0] + [train.state_seconds(attempts) for attempts in range(1, MAX_ATTEMPTS + 1)]


def execution_seconds(
    train_attempt_hours: int,
    *,
    sanity_submissions: int,
    train_submissions: int,
    train_backoff_seconds: int,
    calls_seconds: int,
    validate_submissions: int = 2,
    compile_submissions: int = 0,
) -> int:
    """The execution's timeout: every stage's worst case (each submission at its longest), within the quota.
    Validation may be submitted twice: on Spot, then on demand (BatchJobRunner's on-demand path)."""
    table = stages(train_attempt_hours)
    worst = (
        sanity_submissions * table["sanity"].state_seconds()
        + compile_submissions * table["compile"].state_seconds()
        + train_submissions * train_state_seconds(train_attempt_hours)[-1]
        + train_backoff_seconds
        + validate_submissions * table["validate"].state_seconds()
        + calls_seconds
    )
    return min(worst, MAX_EXECUTION_SECONDS)


# ---- how a training job ends: exit codes the training image uses for a failure of the run itself
# (training_image/efa_training/runtime/errors.py; tests/training/test_run_contract.py keeps the two equal). Retrying
# them on new hosts
# repeats the failure at the price of booting every node again, so the pipeline stops at the first one.
# Where a backend reports no exit code (SageMaker: DescribeTrainingJob's FailureReason is the start of the file
# /opt/ml/output/failure), launch.py writes one line starting with this marker and the code: "<marker>4: ...".
# training_image/efa_training/runtime/errors.py holds the same text (tests keep them equal).
FAILURE_REASON_MARKER = "efa-training exit code "
# The training stopped itself, after a checkpoint, because its reservation ends (runtime/launch/stop_by.py): the run
# ends ReservationEnded, resumable in the next window; neither a refusal nor an attempt failure (tests: equal).
WINDOW_ENDED_EXIT_CODE = 7
REFUSED_EXIT_CODES = {
    2: "a bad flag, dataset or checkpoint folder",
    4: "the loss diverged",
    5: "another job writes to the run's checkpoint folder",
}
