"""The seam between a compute backend and the rest of the app.

A backend stack (stacks/batch_stack.py, eks_stack.py, sagemaker_stack.py) implements `ComputeBackend`: the pipeline
stack takes its `job_runner` and lets it add what it needs next to the state machine; the observability stack takes
its metrics. The state machine asks the `JobRunner` for one Task state per job ("sanity", "compile" on Trainium,
"train", "validate")
and adds its own Retry, Catch and timeout to it. A new backend is one component under constructs/compute/,
one stack implementing `ComputeBackend` and one line in app.py's COMPUTE_STACKS.
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn

from constructs import Construct
from constructs.observability.accelerator_metrics import AcceleratorMetrics

if TYPE_CHECKING:
    from constructs.pipeline.train_attempt import FailureEnds

# "compile": Trainium's ahead-of-time compilation (training_image/efa_training/runtime/launch/neuron_compile.py), on the
# run's nodes.
JobKind = Literal["sanity", "compile", "train", "validate"]
MULTI_NODE_JOBS: frozenset[str] = frozenset({"sanity", "compile", "train"})
# The roles of the nodes a pipeline sizes itself (PipelineNodes): the run's training nodes, one validation node.
TRAINING, VALIDATION = "training", "validation"


def task_timeout(timeout: cdk.Duration | str | None) -> dict[str, int | str]:
    """A job Task state's timeout fields: a Duration, or a JSONPath to the seconds (Task state `TimeoutSecondsPath`,
    https://docs.aws.amazon.com/step-functions/latest/dg/state-task.html)."""
    if isinstance(timeout, str):
        return {"TimeoutSecondsPath": timeout}
    return {} if timeout is None else {"TimeoutSeconds": int(timeout.to_seconds())}


class PipelineNodes(Protocol):
    """Nodes the pipeline itself sizes, where nothing brings up hosts per job (EKS managed node groups): the run
    holds them alone, sizes them per stage, and releases them on every ending; roles TRAINING and VALIDATION."""

    def hold(
        self, scope: Construct, *, execution_arns: str, error: str
    ) -> tuple[sfn.State, sfn.INextable, list[sfn.TaskStateBase]]:
        """(first, held, calls): the run takes the nodes' lease, or fails with `error` and one line naming the
        execution (one of `execution_arns`) holding it; `held` goes on; `calls` are for the failure path."""
        ...

    def release_lease(self, scope: Construct, id_: str) -> sfn.Chain:
        """The lease given back where this execution holds it; never fails."""
        ...

    def size(
        self, scope: Construct, id_: str, desired: dict[str, int | str]
    ) -> tuple[sfn.Chain, list[sfn.TaskStateBase]]:
        """The states setting each role's node count (a number, or a JSONPath to one), and its tasks to catch on."""
        ...

    def release(self, scope: Construct, id_: str) -> tuple[sfn.Chain, sfn.Map]:
        """Every role to 0 unless another execution holds the lease, then the lease given back; (chain, state to
        catch on)."""
        ...

    @property
    def training_wait_seconds(self) -> int:
        """The longest `wait_for_training` waits before one multi-node submission."""
        ...

    def wait_for_training(
        self, scope: Construct, id_: str, *, errors: tuple[str, str]
    ) -> tuple[sfn.State, sfn.INextable]:
        """(first, ready): before a multi-node job, the run's TRAINING nodes in service (`ready` goes on to the
        job), or a Fail with errors[0] where capacity was short, errors[1] where the nodes failed otherwise."""
        ...


class JobRunner(Protocol):
    """How the pipeline runs one job on a backend and waits for it."""

    @property
    def fixed_node_count(self) -> bool:
        """Whether the multi-node jobs always run the environment's node count (the pipeline refuses other sizes)."""
        ...

    @property
    def rejected_errors(self) -> tuple[str, ...]:
        """Errors by which the backend refuses a request outright: retrying the same request cannot help."""
        ...

    @property
    def restarts_lost_hosts(self) -> bool:
        """Whether one submission may itself restart a job after losing a host (`submit(attempts=...)`); where
        not, only the pipeline's Retry starts the job again."""
        ...

    @property
    def sanity_in_training(self) -> bool:
        """Whether the training job itself checks its hosts before it trains (the pipeline then submits no sanity
        job): where each attempt gets fresh hosts, only a check inside the job proves the hosts that train."""
        ...

    @property
    def node_scaling(self) -> PipelineNodes | None:
        """The nodes the pipeline sizes itself; None where each job brings up its own hosts (Batch, SageMaker)."""
        ...

    def submit(
        self,
        scope: Construct,
        id_: str,
        *,
        job: JobKind,
        parameters: Mapping[str, str],
        job_name: str,
        nodes: str | None = None,
        attempts: str | None = None,
        result_path: str = sfn.JsonPath.DISCARD,
        timeout: cdk.Duration | str | None = None,
        declared: bool = False,
    ) -> sfn.CustomState | sfn.Parallel:
        """A Task state that runs `job` and succeeds only when it succeeded.

        `parameters`: job parameter name -> JSONPath or intrinsic function giving its string value
        (Batch job Parameters, `Ref::name` in the job definition). `job_name`: JSONPath or
        intrinsic for the job's name. `nodes`: path to the run's node count (multi-node jobs).
        `attempts`: path to how many attempts the submission may make (only where `restarts_lost_hosts`).
        `timeout`: how long the state waits, or a JSONPath to it in seconds (`TimeoutSecondsPath`).
        `declared`: the run's registered workload's job (its image and declaration, `$.run.registered`:
        constructs/pipeline/workload_record.py) instead of the platform's own trainer.
        The state's result is `{"JobId", "JobName", "Status"}` at `result_path`.
        """
        ...

    def workload_jobs(
        self, scope: Construct
    ) -> tuple[sfn.Chain, list[sfn.TaskStateBase | sfn.CustomState | sfn.Parallel]] | None:
        """(chain, its calls to catch): states that make a registered workload's jobs runnable for this run, before
        its first job (Batch: its job definitions, at `$.job.definitions`); None where each submission carries the
        image itself."""
        ...

    def read_failed_job(self, ends: "FailureEnds") -> sfn.State:
        """The states that read a failed job's Cause (`$.caught`), in this backend's shape, into one of `ends`
        (constructs/pipeline/train_attempt.py): a run-ending exit code refuses the run, no capacity is waited for,
        a reservation's end stops it, anything else is an attempt failure. Only this backend's states."""
        ...

    def quarantine_host(self, scope: Construct, id_: str) -> sfn.Chain | None:
        """States that keep one host out of the run's next attempt; their input's `host` is the id a bad-host record
        names (constructs/pipeline/quarantine.py). None where every attempt gets fresh hosts anyway."""
        ...

    def grant(self, principal: iam.IGrantable) -> None:
        """Everything the states from `submit` and `quarantine_host` need, on the state machine's role."""
        ...


class ComputeBackend(Protocol):
    """What a compute backend stack offers the pipeline and observability stacks."""

    @property
    def job_runner(self) -> JobRunner: ...

    @property
    def accelerator_metrics(self) -> AcceleratorMetrics:
        """Where the backend's hosts publish accelerator and EFA metrics (the dashboard's and the alarms' source)."""
        ...

    @property
    def job_queue_names(self) -> Sequence[str]:
        """The job queues whose job-state changes the dashboard counts (Batch), by their fixed names (a consumer
        formats their ARNs in its own stack); empty where jobs have no queue."""
        ...

    def attach_pipeline(self, scope: Construct, state_machine: sfn.StateMachine, alerts: sns.ITopic) -> None:
        """Add, in the pipeline's stack, what the backend needs next to the pipeline (may add nothing); what fails
        there pages `alerts`."""
        ...
