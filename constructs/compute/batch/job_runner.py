"""The pipeline's jobs on AWS Batch: one `batch:submitJob.sync` Task state per job, and the grants it needs."""

import json
from collections.abc import Mapping

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import batch_name, stack_name
from constructs import Construct
from constructs.compute.backend import MULTI_NODE_JOBS, JobKind, task_timeout
from constructs.compute.batch.job_definitions import HOST_LOST, RETRY_RULES
from constructs.compute.shared.bad_hosts import acknowledge_terminate, grant_terminate, terminate_instance
from constructs.nag import acknowledge, acknowledge_iam, shown_arn
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient
from constructs.pipeline.train_attempt import BATCH_CAPACITY_REASON, FailureEnds

# What RegisterJobDefinition takes of a described definition (API_RegisterJobDefinition request members; the rest of
# a DescribeJobDefinitions entry, its ARN, revision and status, is Batch's own).
_REGISTERED_FIELDS = (
    "Type", "Parameters", "RetryStrategy", "Timeout", "Tags", "PropagateTags", "PlatformCapabilities",
    "SchedulingPriority", "ContainerProperties", "NodeProperties",
)  # fmt: skip
# Throttling and 5xx of Batch's API through the AWS SDK integration (its exceptions are named Batch.<Exception>).
BATCH_TRANSIENT = ("Batch.ServerException", "Batch.TooManyRequestsException", "Batch.BatchException", "States.Timeout")


def _host_loss_rules() -> list[dict]:
    """The Batch job definitions' own EvaluateOnExit rules (constructs/compute/batch/job_definitions.py), in ASL.

    A SubmitJob RetryStrategy replaces the job definition's, so the run's `max_attempts` comes with the same
    rules: retry when the host or the container start failed, exit when the code failed or on anything else.
    """
    keys = {"on_status_reason": "OnStatusReason", "on_reason": "OnReason", "on_exit_code": "OnExitCode"}
    return [{**{keys[k]: v for k, v in on.items()}, "Action": action.value} for action, on in RETRY_RULES]


SPOT_JOB_FAILED = "SpotJobFailed"  # a single-node job failed on Spot by itself: its error out of the fallback block


def _for_capacity(scope: Construct, id_: str, on_demand: sfn.IChainable) -> sfn.Choice:
    """Where a failed Spot job goes (its DescribeJobs entry in `$.spot_failure.Cause`): on demand when its queue
    cancelled it for want of capacity (BATCH_CAPACITY_REASON) or its last attempt lost its host (a Spot reclaim:
    HOST_LOST, the job definitions' own retry rule); else its failure again, as it came."""
    cause = "$.spot_failure.Cause"
    # Its Cause as it came; a Fail state's error may not be one of the States.* names (ASL, "Errors").
    failed = sfn.Fail(scope, f"{id_}FailedOnSpot", error=SPOT_JOB_FAILED, cause_path=cause)
    # Beside the run's state, which the on-demand submission reads as the Spot one did.
    parse = sfn.Pass(
        scope,
        f"{id_}ReadSpotFailure",
        parameters={"job.$": f"States.StringToJson({cause})"},
        result_path="$.spot_read",
    )
    attempts = "$.spot_read.job.Attempts"
    last = sfn.Pass(
        scope,
        f"{id_}SpotLastAttempt",
        parameters={"last.$": f"States.ArrayGetItem({attempts}, States.MathAdd(States.ArrayLength({attempts}), -1))"},
        result_path="$.spot_read",
    )
    host_lost = sfn.Choice(scope, f"{id_}WasSpotHostLost")
    host_lost.when(_matches("$.spot_read.last.StatusReason", HOST_LOST), on_demand).otherwise(failed)
    parse.next(
        sfn.Choice(scope, f"{id_}WasSpotOutOfCapacity")
        .when(_matches("$.spot_read.job.StatusReason", BATCH_CAPACITY_REASON), on_demand)
        .when(sfn.Condition.is_present(f"{attempts}[0]"), last.next(host_lost))
        .otherwise(failed)
    )
    is_json = sfn.Condition.and_(sfn.Condition.is_string(cause), sfn.Condition.string_matches(cause, "{*}"))
    return sfn.Choice(scope, f"{id_}IsSpotFailureReadable").when(is_json, parse).otherwise(failed)


def _matches(path: str, pattern: str) -> sfn.Condition:
    """`path` is there, a string, and matches `pattern` (Choice rules fail on a missing or non-string variable)."""
    return sfn.Condition.and_(
        sfn.Condition.is_present(path), sfn.Condition.is_string(path), sfn.Condition.string_matches(path, pattern)
    )


class BatchJobRunner:
    """Runs the pipeline's jobs on AWS Batch with `batch:submitJob.sync`.

    A CustomState rather than tasks.BatchSubmitJob: the pipeline needs a RetryStrategy with
    EvaluateOnExit and a job name built from the run id, which BatchSubmitJob cannot render.
    """

    # The multi-node job definitions fix the node count (their node range is the environment's `nodes`), and
    # Step Functions' Batch integration documents no NodeOverrides: a run uses exactly that many nodes.
    fixed_node_count = True
    # SubmitJob refuses the request itself (bad parameters, unknown definition): resubmitting cannot help.
    rejected_errors = ("Batch.ClientException",)
    # SubmitJob's RetryStrategy restarts a job whose host was lost, inside the one submission.
    restarts_lost_hosts = True
    # The pipeline runs a sanity job on the run's nodes before the training job (its SanityCheck state).
    sanity_in_training = False
    # Each job brings up its own hosts: the compute environments scale to what the queues hold.
    node_scaling = None

    def __init__(
        self,
        *,
        multi_node_queue: str,
        single_node_queue: str,
        job_definitions: Mapping[str, str],
        share_identifier: str | None = None,
        single_node_on_demand_queue: str | None = None,
        workload_templates: Mapping[str, str] | None = None,
        environment: str = "",
    ) -> None:
        """Queues and job definitions by their fixed names (config.layout.batch_name), never by a reference to the
        Batch stack: the pipeline's template then names what it submits to, a job definition's new revision needs
        no pipeline update (SubmitJob without a revision takes the latest active one), and the ARNs are formatted
        in the state machine's own stack. `workload_templates`: the "train" and "validate" definitions a registered
        workload's jobs copy (workload_jobs; its sanity job is the platform's)."""
        missing = {"sanity", "train", "validate"} - set(job_definitions)
        if missing:
            raise ValueError(f"job_definitions lacks {', '.join(sorted(missing))}; expected sanity, train, validate")
        self.multi_node_queue = multi_node_queue
        self.single_node_queue = single_node_queue
        # Where a single-node job runs when its (Spot) attempt failed: Batch documents no fall-through from one
        # compute environment of a queue to the next when EC2 has no Spot capacity, so the pipeline does it.
        self.single_node_on_demand_queue = single_node_on_demand_queue
        self.job_definitions = dict(job_definitions)
        # By their fixed names (BatchJobDefinitions.add_workload_templates) unless given.
        self.workload_templates = dict(
            workload_templates
            or {job: batch_name(environment or "manual", f"workload-{job}") for job in ("train", "validate")}
        )
        # Fair-share queues reject a SubmitJob without a share identifier.
        self.share_identifier = share_identifier
        # The compute environments' instance tags (computeResources.tags: Project and Environment, app.py), which
        # scope the hosts the pipeline may terminate to this environment's.
        self.environment = environment

    def read_failed_job(self, ends: FailureEnds) -> sfn.State:
        """A failed job's DescribeJobs entry (the .sync task's Cause): a job its queue cancelled while it waited for
        instances ended for want of capacity, whatever an earlier attempt did; else its last attempt's exit code (a
        multi-node job's is the main node's: Batch user guide, "Multi-node parallel jobs")."""
        scope, id_ = ends.scope, ends.id_
        last = sfn.Pass(
            scope,
            f"{id_}LastAttempt",
            parameters={
                "caught.$": "$.caught",
                "last.$": "States.ArrayGetItem($.job.Attempts, States.MathAdd(States.ArrayLength($.job.Attempts), -1))",
            },
        )
        cancelled = _matches("$.job.StatusReason", BATCH_CAPACITY_REASON)
        has_attempts = (
            sfn.Choice(scope, f"{id_}HasAttempts")
            .when(cancelled, ends.no_capacity)
            .when(
                sfn.Condition.is_present("$.job.Attempts[0]"), last.next(ends.by_exit_code("$.last.Container.ExitCode"))
            )
            .otherwise(ends.attempt_failed)
        )
        return ends.parsed(has_attempts)

    def quarantine_host(self, scope: Construct, id_: str) -> sfn.Chain:
        """Terminate the bad host (`$.host`, its instance id): its compute environment launches a fresh one for the
        next attempt."""
        return sfn.Chain.start(terminate_instance(scope, id_, "$.host"))

    def _queue(self, job: JobKind) -> str:
        return self.multi_node_queue if job in MULTI_NODE_JOBS else self.single_node_queue

    @staticmethod
    def _arn(scope: Construct, resource: str, name: str) -> str:
        return cdk.Stack.of(scope).format_arn(service="batch", resource=resource, resource_name=name)

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
        # A registered workload's job runs the revision workload_jobs registered for this run.
        definition = f"$.job.definitions.{job}" if declared else self.job_definitions[job]
        fallback = self.single_node_on_demand_queue if job not in MULTI_NODE_JOBS else None
        if fallback is None:
            return self._submit_state(
                scope,
                id_,
                self._queue(job),
                job=job,
                definition=definition,
                parameters=parameters,
                job_name=job_name,
                nodes=nodes,
                attempts=attempts,
                result_path=result_path,
                timeout=timeout,
            )
        # One state from the outside (the pipeline adds Retry/Catch to it): a Spot attempt, and when Spot failed it
        # (no Spot capacity within the queue's wait, a reclaimed host beyond the job's own retries) one more on
        # on-demand capacity, so a trained model is never left unvalidated for want of Spot. A job that failed by
        # itself (an exit code) fails the block as it is: on demand it would fail the same way, at a higher price.
        on_spot = self._submit_state(
            scope,
            f"{id_}OnSpot",
            self._queue(job),
            job=job,
            definition=definition,
            parameters=parameters,
            job_name=job_name,
            attempts=attempts,
            result_path="$",
            timeout=timeout,
        )
        on_demand = self._submit_state(
            scope,
            f"{id_}OnDemand",
            fallback,
            job=job,
            definition=definition,
            parameters=parameters,
            job_name=job_name,
            attempts=attempts,
            result_path="$",
            timeout=timeout,
        )
        on_spot.add_catch(
            _for_capacity(scope, id_, on_demand), errors=["States.TaskFailed"], result_path="$.spot_failure"
        )
        parallel = sfn.Parallel(
            scope,
            id_,
            result_path=result_path,
            result_selector={key: f"$[0].{key[:-2]}" for key in ("JobId.$", "JobName.$", "Status.$")},
            comment=f"{job}: on Spot, then on-demand if Spot had no capacity or lost the host",
        )
        parallel.branch(on_spot)
        return parallel

    def _submit_state(
        self,
        scope: Construct,
        id_: str,
        queue: str,
        *,
        job: JobKind,
        definition: str,
        parameters: Mapping[str, str],
        job_name: str,
        nodes: str | None = None,
        attempts: str | None = None,
        result_path: str = sfn.JsonPath.DISCARD,
        timeout: cdk.Duration | str | None = None,
    ) -> sfn.CustomState:
        request: dict = {
            "JobName.$": job_name,
            "JobQueue": self._arn(scope, "job-queue", queue),
            # The name without a revision: "the latest active revision is used" (Batch API reference, SubmitJob).
            **({"JobDefinition.$": definition} if definition.startswith("$.") else {"JobDefinition": definition}),
            # Per-run values travel as Batch job Parameters: multi-node jobs take no container overrides.
            "Parameters": {f"{name}.$": value for name, value in parameters.items()},
            "PropagateTags": True,
        }
        if self.share_identifier:
            request["ShareIdentifier"] = self.share_identifier
        if nodes is not None and job in MULTI_NODE_JOBS:
            # As the job parameter `nodes` (Ref::nodes): Step Functions' optimized Batch integration
            # documents no NodeOverrides (moto and LocalStack drop it), so the multi-node job definition
            # fixes the node count (the environment's `nodes`) and the job checks it against this value.
            request["Parameters"]["nodes.$"] = f"States.Format('{{}}', {nodes})"
        if attempts is not None:
            # Replaces the job definition's retry strategy for this submission (Batch SubmitJob API).
            request["RetryStrategy"] = {"Attempts.$": attempts, "EvaluateOnExit": _host_loss_rules()}
        state: dict = {
            "Type": "Task",
            "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::batch:submitJob.sync",
            "Parameters": request,
            # The .sync result is the whole DescribeJobs entry; keep what operators look for.
            "ResultSelector": {"JobId.$": "$.JobId", "JobName.$": "$.JobName", "Status.$": "$.Status"},
            "ResultPath": result_path,
        }
        return sfn.CustomState(scope, id_, state_json={**state, **task_timeout(timeout)})

    def _definition_names(self) -> list[str]:
        return list(dict.fromkeys([*self.job_definitions.values(), self._registered_prefix + "*"]))

    @property
    def _registered_prefix(self) -> str:
        """The registered workloads' definitions: `<env's prefix>-wl-<workload>-<job>` (workload_jobs)."""
        return batch_name(self.environment or "manual", "wl-")

    def workload_jobs(
        self, scope: Construct
    ) -> tuple[sfn.Chain, list[sfn.TaskStateBase | sfn.CustomState | sfn.Parallel]]:
        """A registered workload's "train" and "validate" definitions for this run: the templates' newest active
        revisions (DescribeJobDefinitions), registered again under the workload's own name with its image and its
        declaration in WORKLOAD (RegisterJobDefinition: a definition's image cannot be overridden at SubmitJob,
        API_ContainerOverrides), at `$.job.definitions.<job>`. No deploy: one revision per run. One Parallel around
        them: the register states are JSONata (they build the request from the described definition), and a JSONPath
        Parallel's Catch keeps the run's state for the failure path (a JSONata Catch's output would be the error
        alone)."""
        chain: sfn.Chain | None = None
        for job, template in self.workload_templates.items():
            kind = job.capitalize()
            describe = tasks.CallAwsService(
                scope,
                f"DescribeWorkload{kind}Template",
                service="batch",
                action="describeJobDefinitions",
                parameters={"JobDefinitionName": template, "Status": "ACTIVE"},
                iam_resources=["*"],  # DescribeJobDefinitions takes no resource-level permissions
                result_selector={"definitions.$": "$.JobDefinitions"},
                result_path="$.template",
                task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
            )
            retry_transient(describe, BATCH_TRANSIENT)
            register = sfn.CustomState(scope, f"RegisterWorkload{kind}", state_json=self._register_state(scope, job))
            retry_transient(register, BATCH_TRANSIENT)
            step = sfn.Chain.start(describe).next(register)
            chain = step if chain is None else chain.next(step)
        assert chain is not None  # workload_templates always names train and validate
        # The branch's output is the whole state, the definitions added (OutputPath picks it from the array).
        block = sfn.Parallel(scope, "RegisterWorkloadJobs", output_path="$[0]").branch(chain)
        return sfn.Chain.start(block), [block]

    def _register_state(self, scope: Construct, job: str) -> dict:
        """A JSONata Task: the template's newest revision with the workload's image and WORKLOAD, under its name. The
        AWS SDK integration names the action in camelCase and its members in PascalCase, both ways (Step Functions
        developer guide, "AWS SDK service integrations"; tests/sfn_emulator.py does the same)."""
        name = f"'{self._registered_prefix}' & $states.input.run.registered.name & '-{job}'"
        request = (
            "{% ($d := $states.input.template.definitions; $t := $d[Revision = $max($d.Revision)];"
            " $img := $states.input.run.registered.image; $w := $states.input.run.registered.workload;"
            " $c := function($c){ $merge([$c, {'Image': $img, 'Environment': $append($c.Environment[Name != "
            "'WORKLOAD'], [{'Name': 'WORKLOAD', 'Value': $w}])}]) };"
            " $merge([$sift($t, function($v, $k){ $k in " + json.dumps(list(_REGISTERED_FIELDS)) + " }),"
            f" {{'JobDefinitionName': {name}}},"
            " $t.ContainerProperties ? {'ContainerProperties': $c($t.ContainerProperties)} : {},"
            " $t.NodeProperties ? {'NodeProperties': $merge([$t.NodeProperties, {'NodeRangeProperties': "
            "[$map($t.NodeProperties.NodeRangeProperties, function($r){ $merge([$r, {'Container': $c($r.Container)}])"
            " })]}])} : {}])) %}"
        )
        return {
            "Type": "Task",
            "QueryLanguage": "JSONata",
            "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::aws-sdk:batch:registerJobDefinition",
            "Arguments": request,
            "Output": "{% $merge([$sift($states.input, function($v, $k){ $k != 'template' }), {'job': "
            f"$merge([$states.input.job, {{'definitions': $merge([$states.input.job.definitions ? "
            f"$states.input.job.definitions : {{}}, {{'{job}': $states.result.JobDefinitionArn}}])}}])}}]) %}}",
            "TimeoutSeconds": int(CALL_TIMEOUT.to_seconds()),
        }

    def _grant_registration(self, principal: iam.IGrantable, scope: cdk.Stack) -> None:
        """Registering a workload's definitions: its own names only, and passing the templates' roles on (a definition
        naming a job or execution role needs iam:PassRole on it: Batch user guide, "IAM roles for tasks")."""
        iam.Grant.add_to_principal(
            grantee=principal,
            actions=["batch:RegisterJobDefinition", "batch:TagResource"],
            resource_arns=[self._arn(scope, "job-definition", f"{self._registered_prefix}*")],
        )
        iam.Grant.add_to_principal(grantee=principal, actions=["batch:DescribeJobDefinitions"], resource_arns=["*"])
        iam.Grant.add_to_principal(
            grantee=principal,
            actions=["iam:PassRole"],
            resource_arns=[
                scope.format_arn(
                    service="iam",
                    region="",
                    resource="role",
                    resource_name=f"{stack_name(self.environment or 'manual', 'Batch')}-*",
                )
            ],
        )

    def grant(self, principal: iam.IGrantable) -> None:
        if not isinstance(principal, Construct):
            raise TypeError("BatchJobRunner.grant needs a principal that is a construct (the state machine)")
        scope = cdk.Stack.of(principal)
        queues = dict.fromkeys(
            q for q in (self.multi_node_queue, self.single_node_queue, self.single_node_on_demand_queue) if q
        )
        # Every revision of each definition (`name:*`): the request's ARN carries the revision that SubmitJob
        # resolved (Batch user guide, "Restrict job submission": "Accounting for job definition revisions"). And the
        # job it creates: the Service Authorization Reference lists `job` among SubmitJob's required resource types
        # next to the queue and the definition.
        iam.Grant.add_to_principal(
            grantee=principal,
            actions=["batch:SubmitJob"],
            resource_arns=[
                *(self._arn(scope, "job-queue", q) for q in queues),
                *(self._arn(scope, "job-definition", f"{d}:*") for d in self._definition_names()),
                self._arn(scope, "job", "*"),
            ],
        )
        if self.workload_templates:
            self._grant_registration(principal, scope)
        # .sync polls DescribeJobs (no resource-level permissions) and stops the job with TerminateJob
        # when the state times out or the execution is stopped.
        iam.Grant.add_to_principal(grantee=principal, actions=["batch:DescribeJobs"], resource_arns=["*"])
        iam.Grant.add_to_principal(
            grantee=principal,
            actions=["batch:TerminateJob"],
            resource_arns=[scope.format_arn(service="batch", resource="job", resource_name="*")],
        )
        role = getattr(principal, "role", None)  # a state machine's role carries the finding
        if isinstance(role, Construct):
            acknowledge(
                role,
                f"AwsSolutions-IAM5[Resource::{shown_arn(scope, 'batch', 'job/*')}]",
                "batch:TerminateJob (stopping the job when its state times out or the execution is "
                "stopped) can only name job/*: job ids exist only once the job is submitted",
            )
            acknowledge_iam(
                role,
                "RESOURCE_MISMATCH",
                "batch:SubmitJob",
                "parliament splits an ARN at ':' and cannot match job-definition/<name>:*, the form the Batch user "
                "guide prescribes for every revision ('Restrict job submission')",
                formats=("arn:*:batch:*:*:job-definition/*",),
            )
            acknowledge_terminate(role)
            if self.workload_templates:
                registered = shown_arn(scope, "batch", f"job-definition/{self._registered_prefix}*")
                acknowledge(
                    role,
                    f"AwsSolutions-IAM5[Resource::{registered}]",
                    "a registered workload's definitions are registered at run start under the workload's name, "
                    "which no deploy knows: only this environment's workload prefix",
                )
                roles = shown_arn(
                    scope, "iam", f"role/{stack_name(self.environment or 'manual', 'Batch')}-*", region=""
                )
                acknowledge(
                    role,
                    f"AwsSolutions-IAM5[Resource::{roles}]",
                    "registering a workload's definitions passes on the templates' job and execution roles, whose "
                    "names CloudFormation generates under the Batch stack's name",
                )
            for definition in self._definition_names():
                acknowledge(
                    role,
                    f"AwsSolutions-IAM5[Resource::{shown_arn(scope, 'batch', f'job-definition/{definition}:*')}]",
                    "batch:SubmitJob by name runs the latest active revision, which a redeploy renews: every "
                    "revision of this one definition",
                )
        grant_terminate(principal, self.environment)  # a bad host, before the retry (quarantine_host)
        # The managed rule through which Step Functions learns that a Batch job ended.
        iam.Grant.add_to_principal(
            grantee=principal,
            actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
            resource_arns=[
                scope.format_arn(
                    service="events", resource="rule", resource_name="StepFunctionsGetEventsForBatchJobsRule"
                )
            ],
        )
