"""The pipeline's JobRunner on EKS: each job is a batch/v1 Indexed Job run with Step Functions `eks:runJob.sync`.

`eks:runJob.sync` creates a Job through the cluster's public endpoint, waits for it and fails the state when the
Job fails; it knows only batch/v1 Jobs, so the pipeline runs Indexed Jobs (one pod per node, rank from the
completion index, rank 0 found through the `training-workers` headless service) rather than TrainJobs.
A CustomState: CDK's tasks.EksCall takes the v1 aws_eks cluster type, not aws_eks_v2's.

The pipeline sizes the node groups itself around these jobs (`node_scaling`, node_scaling.py): training nodes for
the multi-node jobs, one validation node (the catalogue's small type, no EFA) for validation. Pods wait in Pending
while the nodes join, and the job's Task stays a plain `eks:runJob.sync` state, so its errors reach the pipeline's
Retry and Catch.

Validation is tried once more when the platform failed it (a node lost, a pod never scheduled, the API server's
throttling or 5xx), never when the validation did (its container's own exit code): `retried_for_the_platform`.

Job parameters become launcher flags after the phase: {"run_id": "$.job.run_id"} -> `train --run-id <value>`.
The Kubernetes name is `<phase>-<uuid>` (run ids may hold capitals and '_', which names may not, and every retry
needs a fresh name); the pipeline's job name is kept in the annotation `efa-training/job-name`.
"""

import copy
import json
from collections.abc import Mapping
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_iam as iam
import aws_cdk.aws_stepfunctions as sfn

from config import InstanceType
from constructs import Construct
from constructs.compute.backend import task_timeout
from constructs.compute.eks.node_scaling import EksNodeScaling
from constructs.compute.eks.training_workspace import QUARANTINE_GROUP
from constructs.compute.shared.bad_hosts import acknowledge_terminate, grant_terminate, terminate_instance
from constructs.pipeline.train_attempt import EKS_EXIT_CODE, FailureEnds
from contracts.eks.job_spec import NAMESPACE, Site
from contracts.eks.job_templates import indexed_job
from contracts.run import REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE, stages

JOB_NAME_ANNOTATION = "efa-training/job-name"
# The API server's throttling and server errors, as eks:call names them ("EKS." + the HTTP status).
TRANSIENT_CALL_ERRORS = ("EKS.429", "EKS.500", "EKS.502", "EKS.503", "EKS.504")
# The taint a quarantined node carries (no pod of the pipeline tolerates it).
QUARANTINE_TAINT = "efa-training/quarantined"
SINGLE_NODE_JOBS = frozenset({"validate"})
# The validate Job's pod failure policy after the run-ending codes' rule (Kubernetes docs, "Jobs", Pod failure policy:
# rules are evaluated in order, the first match wins): a pod the platform disrupted (DisruptionTarget: its node lost,
# drained or its pod evicted; Kubernetes docs, "Disruptions", Pod disruption conditions) counts towards the backoff
# limit, so the Job fails as BackoffLimitExceeded; any other non-zero exit of the container fails it by FailJob, whose
# message names the code (job_templates.POD_FAILURE_POLICY): the validation's own failure.
VALIDATION_FAILURE_RULES = (
    {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
)
# The Cause of a Job its pod failure policy failed for the container's exit code, whatever the code (EKS_EXIT_CODE).
CONTAINER_EXIT = EKS_EXIT_CODE.replace("%d", "*")
# The same names as SageMaker's validation block (constructs/compute/sagemaker/validation.py): the pipeline's failure
# path records them alike.
VALIDATION_PLATFORM_FAILED = "ValidationInfrastructureFailed"
VALIDATION_FAILED = "ValidationJobFailed"
# One more submission: the pipeline's execution timeout allows two validation submissions (contracts/stage_timing.py
# execution_seconds, validate_submissions). A lost node is replaced by its Auto Scaling group meanwhile, and the new
# pod waits for it in Pending within the Job's deadline.
VALIDATION_RETRY: dict = {
    "errors": [VALIDATION_PLATFORM_FAILED],
    "interval": cdk.Duration.minutes(1),
    "max_attempts": 1,
}


def launcher_flag(parameter: str) -> str:
    return "--" + parameter.replace("_", "-")


class EksJobRunner:
    # A run may use fewer nodes than the node group's maximum: the Job's completions follow the run's `nodes`.
    fixed_node_count = False
    # eks:runJob names a failed request after the API server's HTTP status (Step Functions developer guide, "Call
    # Amazon EKS": EKS.401 ...). These say the request itself is refused: unauthenticated or forbidden (access entry,
    # RBAC), no such namespace or API, a Job of that name already there, an invalid Job. Resubmitting cannot help and
    # would keep the nodes up through every backoff: the run ends under the error's own name.
    rejected_errors: tuple[str, ...] = ("EKS.400", "EKS.401", "EKS.403", "EKS.404", "EKS.409", "EKS.422")
    # A Job that lost a pod is not restarted in place (backoffLimit 0, Kubernetes docs "Jobs", Pod backoff failure
    # policy: https://kubernetes.io/docs/concepts/workloads/controllers/job/): each pipeline retry is a fresh Job.
    restarts_lost_hosts = False
    # The pipeline runs a sanity job on the run's nodes before the training job (its SanityCheck state).
    sanity_in_training = False

    def __init__(
        self,
        *,
        cluster: eks.ICluster,
        instance: InstanceType,
        image: str,
        max_nodes: int,
        validation_instance: InstanceType | None = None,
        node_scaling: EksNodeScaling | None = None,
        runs_uri: str | None = None,
        models_uri: str | None = None,
        site: Site = Site(),
        train_attempt_hours: int = 72,
    ) -> None:
        """`validation_instance`: the single-node jobs' type (default: `instance`); `node_scaling`: the node-group
        states the pipeline runs around the jobs (None: something else sizes the nodes)."""
        self.cluster = cluster
        self.validation_instance = validation_instance or instance
        self.node_scaling = node_scaling
        self._stages = stages(train_attempt_hours)
        self.site = site
        # s3://<bucket>/runs/: the sanity report and the verdict go straight to S3, where the pipeline reads
        # the verdict (FSx's export to S3 is asynchronous, so /fsx/runs/ could still be empty there).
        self.runs_uri = runs_uri
        self.models_uri = models_uri  # s3://<bucket>/models/: what an approval registers (MODELS_PREFIX)
        self.instance = instance
        self.image = image
        self.max_nodes = max_nodes

    def job_manifest(
        self, *, job: str, parameters: Mapping[str, str], job_name: str, nodes: str | None, declared: bool = False
    ) -> dict:
        """The Job as an ASL payload template: static fields, plus `.$` fields resolved per execution; a registered
        workload's pod (`declared`) runs its image with its declaration in WORKLOAD."""
        instance = self.validation_instance if job in SINGLE_NODE_JOBS else self.instance
        manifest = indexed_job(
            instance, image=self.image, phase=job, nodes=self.max_nodes, name="placeholder", site=self.site
        )
        metadata, spec = manifest["metadata"], manifest["spec"]
        metadata.pop("name")
        metadata["name.$"] = f"States.Format('{job}-{{}}', States.UUID())"
        metadata["annotations"] = {f"{JOB_NAME_ANNOTATION}.$": job_name}
        if job in SINGLE_NODE_JOBS or nodes is None:
            count: int | None = 1
        else:
            count = None
            for field in ("completions", "parallelism"):
                spec.pop(field)
                spec[f"{field}.$"] = nodes
        if count is not None:
            spec["completions"] = spec["parallelism"] = count
        # One attempt's time, scale-up from zero and image pull included: a hung collective ends here, not after
        # days (Kubernetes docs, "Jobs": activeDeadlineSeconds "applies to the duration of the job, no matter how
        # many Pods are created"; once reached, its Pods are terminated and the Job fails: an attempt failure).
        spec["activeDeadlineSeconds"] = self._stages[job].deadline_seconds
        if job == "validate":
            spec["podFailurePolicy"]["rules"] += copy.deepcopy(list(VALIDATION_FAILURE_RULES))
        container = spec["template"]["spec"]["containers"][0]
        flags = []
        for name, value in parameters.items():
            flags += [f"'{launcher_flag(name)}'", value]
        container.pop("args")
        container["args.$"] = f"States.Array('{job}', {', '.join(flags)})" if flags else f"States.Array('{job}')"
        if declared:  # the run's registered workload: its image, its declaration in WORKLOAD (workload_record.py)
            container.pop("image")
            container["image.$"] = "$.run.registered.image"
            container["env"].append({"name": "WORKLOAD", "value.$": "$.run.registered.workload"})
        if self.runs_uri:
            container["env"] += [
                {"name": "REPORT_PREFIX", "value": self.runs_uri},
                {"name": "VERDICT_PREFIX", "value": self.runs_uri},
            ]
        if self.models_uri:
            container["env"].append({"name": "MODELS_PREFIX", "value": self.models_uri})
        for variable in container["env"]:
            if variable["name"] == "PET_NNODES":
                if count is not None:
                    variable["value"] = str(count)
                else:
                    variable.pop("value")
                    variable["value.$"] = f"States.Format('{{}}', {nodes})"
        return manifest

    def workload_jobs(
        self, scope: Construct
    ) -> tuple[sfn.Chain, list[sfn.TaskStateBase | sfn.CustomState | sfn.Parallel]] | None:
        """Nothing: the Job manifest carries the workload's image and declaration."""
        return None

    def submit(
        self,
        scope: Construct,
        id_: str,
        *,
        job: str,
        parameters: Mapping[str, str],
        job_name: str,
        nodes: str | None = None,
        attempts: str | None = None,
        result_path: str = sfn.JsonPath.DISCARD,
        timeout: cdk.Duration | str | None = None,
        declared: bool = False,
    ) -> sfn.CustomState | sfn.Parallel:
        if attempts is not None:
            raise ValueError("EksJobRunner runs each job once (backoffLimit 0); the pipeline's Retry restarts it")
        validate = job == "validate"
        state: dict = {
            "Type": "Task",
            "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::eks:runJob.sync",
            "Parameters": {
                "ClusterName": self.cluster.cluster_name,
                "CertificateAuthority": self.cluster.cluster_certificate_authority_data,
                "Endpoint": self.cluster.cluster_endpoint,
                "Namespace": NAMESPACE,
                "Job": self.job_manifest(
                    job=job, parameters=parameters, job_name=job_name, nodes=nodes, declared=declared
                ),
            },
            "ResultSelector": {
                "JobId.$": "$.ResponseBody.metadata.uid",
                "JobName.$": "$.ResponseBody.metadata.name",
                "Status": "SUCCEEDED",
            },  # .sync fails the state unless the Job completed
            "ResultPath": "$" if validate else result_path,
        }
        submission = sfn.CustomState(
            scope, f"{id_}Job" if validate else id_, state_json={**state, **task_timeout(timeout)}
        )
        return self.retried_for_the_platform(scope, id_, submission, result_path) if validate else submission

    def retried_for_the_platform(
        self, scope: Construct, id_: str, submission: sfn.CustomState, result_path: str
    ) -> sfn.Parallel:
        """`submission` (the validate Job, its result at `$`) in a block tried once more when the platform failed it
        (VALIDATION_RETRY); its result `{"JobId", "JobName", "Status"}` at `result_path`. A Retry cannot read why a
        `.sync` task failed, so its Catch reads the Cause (Step Functions developer guide, "Call Amazon EKS", Run a
        Job: the integration waits for the batch/v1 Job; the Cause of a failed Job is not documented, here assumed to
        be the Job with its Failed condition, as train_attempt.EKS_EXIT_CODE is): a request the API server refused
        (`rejected_errors`) or a Job failed for its container's exit code (CONTAINER_EXIT, by VALIDATION_FAILURE_RULES
        or the run-ending codes' rule) leaves the block as VALIDATION_FAILED; anything else (a disrupted pod's
        BackoffLimitExceeded, a pod never scheduled before activeDeadlineSeconds, eks:runJob's throttling or 5xx, a
        Cause of another shape) as VALIDATION_PLATFORM_FAILED, which the block retries. A timed-out task leaves it as
        States.Timeout, not retried."""
        cause = "$.caught.Cause"
        own = [sfn.Condition.string_equals("$.caught.Error", error) for error in self.rejected_errors]
        own.append(
            sfn.Condition.and_(
                sfn.Condition.is_present(cause),
                sfn.Condition.is_string(cause),
                sfn.Condition.string_matches(cause, CONTAINER_EXIT),
            )
        )
        reading = (
            sfn.Choice(scope, f"{id_}IsPlatformFailure")
            .when(sfn.Condition.or_(*own), sfn.Fail(scope, f"{id_}Failed", error=VALIDATION_FAILED, cause_path=cause))
            .otherwise(sfn.Fail(scope, f"{id_}PlatformFailed", error=VALIDATION_PLATFORM_FAILED, cause_path=cause))
        )
        submission.add_catch(reading, errors=["States.TaskFailed"], result_path="$.caught")
        block = sfn.Parallel(
            scope,
            id_,
            result_path=result_path,
            result_selector={key: f"$[0].{key[:-2]}" for key in ("JobId.$", "JobName.$", "Status.$")},
            comment="validation: tried once more when the platform failed it, never when the validation did",
        )
        block.branch(submission)
        block.add_retry(**VALIDATION_RETRY)
        return block

    def read_failed_job(self, ends: FailureEnds) -> sfn.State:
        """A Job its pod failure policy failed for a run-ending exit code (contracts/eks/job_templates.py
        POD_FAILURE_POLICY) says so in its Failed condition's message, in the eks:runJob.sync task's Cause; any other
        failure is an attempt failure (Step Functions does not document that Cause: where it lacks the Job's status,
        the failure stays retried)."""
        scope, id_, cause = ends.scope, ends.id_, "$.caught.Cause"
        by_pod = sfn.Choice(scope, f"{id_}IsRunRefusedByPod")
        for exit_code in sorted(REFUSED_EXIT_CODES):
            by_pod.when(
                sfn.Condition.string_matches(cause, EKS_EXIT_CODE % exit_code), ends.refused_with(exit_code, "Pod")
            )
        window = sfn.Condition.string_matches(cause, EKS_EXIT_CODE % WINDOW_ENDED_EXIT_CODE)
        return by_pod.when(window, ends.window_ended).otherwise(ends.attempt_failed)

    def quarantine_host(self, scope: Construct, id_: str) -> sfn.Chain:
        """Cordon and taint the bad node (`$.host`, its name), then terminate its instance. Cordoned alone it would
        hold one of the node group's `nodes` places and leave the retry's pods Pending (node auto repair replaces
        only what the node monitoring agent flags: EKS user guide, "Automatically repair nodes in EKS clusters"); its
        Auto Scaling group replaces a terminated instance, and the cordon keeps pods off it until it is gone.
        The node is read, then written back whole (PUT with application/json, the Kubernetes API's plain update)
        with spec.unschedulable set (what `kubectl cordon` sets) and QUARANTINE_TAINT added once, through Step
        Functions' eks:call (Step Functions developer guide, "Call Amazon EKS"); its instance id is the last part of
        spec.providerID (aws:///<zone>/<instance id>). A cordon that fails (409 Conflict: the node changed between the
        GET and the PUT, or any other error after the call's retries) still goes on to the termination, its error at
        `not_cordoned` beside `instance`: the instance is what holds the node group's place. A node gone at the read
        (404) ends the chain there, and quarantine.py moves its record with the error (its Catch)."""
        taint = {"key": QUARANTINE_TAINT, "value": "bad-host", "effect": "NoSchedule"}
        kept = f"$filter($n.spec.taints, function($t) {{ $t.key != '{QUARANTINE_TAINT}' }})"
        updated = (
            "{% ($n := $states.input.node; $merge([$n, {'spec': $merge([$n.spec, {'unschedulable': true, "
            f"'taints': $append($exists($n.spec.taints) ? {kept} : [], [{json.dumps(taint)}])}}])}}])) %}}"
        )
        node = "$states.result.ResponseBody"
        read = self._call(
            scope,
            f"{id_}Read",
            "GET",
            Output=f"{{% $merge([$states.input, {{'node': {node}, "
            f"'instance': $split({node}.spec.providerID, '/')[-1]}}]) %}}",
        )
        terminate = terminate_instance(scope, f"{id_}Terminate", "$.instance")
        # In the state's own JSON: CDK renders a Catch's Output only for a JSONata state machine, and this state
        # alone is JSONata. A JSONata Catch's Output may read $states.input and $states.errorOutput (Step Functions
        # developer guide, "Transforming data with JSONata in Step Functions", Reserved variable $states).
        not_cordoned = "{% $merge([$states.input, {'not_cordoned': $states.errorOutput}]) %}"
        catch = [{"ErrorEquals": ["States.ALL"], "Next": terminate.state_id, "Output": not_cordoned}]
        cordon = self._call(
            scope, f"{id_}Cordon", "PUT", RequestBody=updated, Output="{% $states.input %}", catch=catch
        )
        return sfn.Chain.start(read).next(cordon).next(terminate)

    def _call(
        self, scope: Construct, id_: str, method: str, catch: list[dict] | None = None, **fields: str
    ) -> sfn.CustomState:
        """One eks:call on the node `$states.input.host`; `fields`: RequestBody (an argument) and Output; `catch`:
        the state's Catch, as ASL."""
        body = {"RequestBody": fields.pop("RequestBody")} if "RequestBody" in fields else {}
        arguments = {
            "ClusterName": self.cluster.cluster_name,
            "CertificateAuthority": self.cluster.cluster_certificate_authority_data,
            "Endpoint": self.cluster.cluster_endpoint,
            "Method": method,
            "Path": "{% '/api/v1/nodes/' & $states.input.host %}",
            **body,
        }
        return sfn.CustomState(
            scope,
            id_,
            state_json={
                "Type": "Task",
                "QueryLanguage": "JSONata",
                "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::eks:call",
                "Arguments": arguments,
                "TimeoutSeconds": 120,
                # eks:call names a failed call after the API server's HTTP status (as eks:runJob: rejected_errors):
                # throttling and 5xx are retried; any other error goes to `catch`, or to quarantine.py's catch.
                "Retry": [
                    {
                        "ErrorEquals": [*TRANSIENT_CALL_ERRORS, "States.Timeout"],
                        "IntervalSeconds": 2,
                        "MaxAttempts": 3,
                        "BackoffRate": 2,
                        "JitterStrategy": "FULL",
                    }
                ],  # fmt: skip
                **({"Catch": catch} if catch else {}),
                **fields,
            },
        )

    def grant(self, principal: iam.IGrantable) -> None:
        """Kubernetes access for the state machine's role: edit rights in the training namespace only."""
        iam.Grant.add_to_principal(
            grantee=principal, actions=["eks:DescribeCluster"], resource_arns=[self.cluster.cluster_arn]
        )
        role = cast(iam.IRole, principal.grant_principal)  # the state machine's role
        # In the principal's stack: the pipeline stack already depends on the EKS stack, not the reverse.
        access = eks.AccessEntry(
            cdk.Stack.of(role) if isinstance(role, Construct) else cdk.Stack.of(self.cluster),
            "EksJobRunnerAccess",
            cluster=self.cluster,
            principal=role.role_arn,
            access_policies=[
                eks.AccessPolicy.from_access_policy_name(
                    "AmazonEKSEditPolicy", access_scope_type=eks.AccessScopeType.NAMESPACE, namespaces=[NAMESPACE]
                )
            ],
        )
        # The group that may cordon nodes (training_workspace.node_quarantine_rbac). The L2 AccessEntry has no
        # kubernetesGroups; KubernetesGroups is not create-only (AWS::EKS::AccessEntry schema): an update in place.
        entry = cast(eks.CfnAccessEntry, access.node.default_child)
        entry.kubernetes_groups = [QUARANTINE_GROUP]
        grant_terminate(principal, self.site.environment)  # a bad node's instance (quarantine_host)
        if isinstance(role, Construct):
            acknowledge_terminate(role)
