"""The pipeline's JobRunner on EKS: each job is a batch/v1 Indexed Job run with Step Functions `eks:runJob.sync`.

`eks:runJob.sync` creates a Job through the cluster's public endpoint, waits for it and fails the state when the
Job fails; it knows only batch/v1 Jobs, so the pipeline runs Indexed Jobs (one pod per node, rank from the
completion index, rank 0 found through the `training-workers` headless service) rather than TrainJobs.
A CustomState: CDK's tasks.EksCall takes the v1 aws_eks cluster type, not aws_eks_v2's.

Accelerator nodes scale from 0 and nothing in the cluster scales them on demand (no Cluster Autoscaler: it cannot
predict `vpc.amazonaws.com/efa` on a node group at zero). The pipeline's executions drive the node group instead:
an EventBridge rule on the pipeline's execution status changes starts a small state machine that sets the desired
size to the run's `nodes` (default: the environment's maximum) when an execution starts, and to 0 when it ends,
however it ends (success, failure, timeout, abort). Pods wait in Pending while the nodes join, and the job's
Task stays a plain `eks:runJob.sync` state, so its errors reach the pipeline's Retry and Catch unchanged.
One pipeline execution at a time: the node group belongs to the running execution.

Job parameters become launcher flags after the phase: {"run_id": "$.job.run_id"} -> `train --run-id <value>`.
The Kubernetes name is `<phase>-<uuid>` (run ids may hold capitals and '_', which names may not, and every retry
needs a fresh name); the pipeline's job name is kept in the annotation `efa-training/job-name`.
"""

from collections.abc import Mapping

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks
from constructs import Construct

from config import InstanceType
from constructs.eks_job_spec import NAMESPACE, Site
from constructs.eks_job_templates import indexed_job

JOB_NAME_ANNOTATION = "efa-training/job-name"
SINGLE_NODE_JOBS = frozenset({"validate"})


def launcher_flag(parameter: str) -> str:
    return "--" + parameter.replace("_", "-")


class EksJobRunner:
    def __init__(self, *, cluster: eks.ICluster, instance: InstanceType, image: str, max_nodes: int,
                 nodegroup: eks.INodegroup | None = None, runs_uri: str | None = None,
                 log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
                 site: Site = Site()) -> None:
        self.cluster = cluster
        self.site = site
        # s3://<bucket>/runs/: the sanity report and the verdict go straight to S3, where the pipeline reads
        # the verdict (FSx's export to S3 is asynchronous, so /fsx/runs/ could still be empty there).
        self.runs_uri = runs_uri
        self.log_retention = log_retention
        self.nodegroup = nodegroup
        self.instance = instance
        self.image = image
        self.max_nodes = max_nodes

    def job_manifest(self, *, job: str, parameters: Mapping[str, str], job_name: str, nodes: str | None) -> dict:
        """The Job as an ASL payload template: static fields, plus `.$` fields resolved per execution."""
        manifest = indexed_job(self.instance, image=self.image, phase=job, nodes=self.max_nodes, name="placeholder",
                               site=self.site)
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
        container = spec["template"]["spec"]["containers"][0]
        flags = []
        for name, value in parameters.items():
            flags += [f"'{launcher_flag(name)}'", value]
        container.pop("args")
        container["args.$"] = f"States.Array('{job}', {', '.join(flags)})" if flags else f"States.Array('{job}')"
        if self.runs_uri:
            container["env"] += [{"name": "REPORT_PREFIX", "value": self.runs_uri},
                                 {"name": "VERDICT_PREFIX", "value": self.runs_uri}]
        for variable in container["env"]:
            if variable["name"] == "PET_NNODES":
                if count is not None:
                    variable["value"] = str(count)
                else:
                    variable.pop("value")
                    variable["value.$"] = f"States.Format('{{}}', {nodes})"
        return manifest

    def submit(self, scope: Construct, id_: str, *, job: str, parameters: Mapping[str, str], job_name: str,
               nodes: str | None = None, attempts: str | None = None, result_path: str = sfn.JsonPath.DISCARD,
               timeout: cdk.Duration | str | None = None) -> sfn.CustomState:
        # `attempts` (restarts after a lost host) has no Job equivalent here: backoffLimit 0, the pipeline retries.
        state: dict = {
            "Type": "Task",
            "Resource": f"arn:{cdk.Stack.of(scope).partition}:states:::eks:runJob.sync",
            "Parameters": {
                "ClusterName": self.cluster.cluster_name,
                "CertificateAuthority": self.cluster.cluster_certificate_authority_data,
                "Endpoint": self.cluster.cluster_endpoint,
                "Namespace": NAMESPACE,
                "Job": self.job_manifest(job=job, parameters=parameters, job_name=job_name, nodes=nodes),
            },
            "ResultSelector": {"JobId.$": "$.ResponseBody.metadata.uid",
                               "JobName.$": "$.ResponseBody.metadata.name",
                               "Status": "SUCCEEDED"},  # .sync fails the state unless the Job completed
            "ResultPath": result_path,
        }
        if isinstance(timeout, str):  # a JSONPath to the timeout, in seconds
            state["TimeoutSecondsPath"] = timeout
        elif timeout is not None:
            state["TimeoutSeconds"] = int(timeout.to_seconds())
        return sfn.CustomState(scope, id_, state_json=state)

    def _scale_with_executions(self, state_machine: sfn.IStateMachine) -> None:
        """Node group desired size: the run's nodes while an execution runs, 0 once it has ended."""
        scope = Construct(cdk.Stack.of(state_machine), "EksNodeScaling")

        def scale(id_: str, desired: str | int) -> tasks.CallAwsService:
            task = tasks.CallAwsService(
                scope, id_, service="eks", action="updateNodegroupConfig",
                parameters={"ClusterName": self.cluster.cluster_name, "NodegroupName": self.nodegroup.nodegroup_name,
                            "ScalingConfig": {"MinSize": 0, "MaxSize": self.max_nodes, "DesiredSize": desired}},
                iam_resources=[self.nodegroup.nodegroup_arn], result_path=sfn.JsonPath.DISCARD,
                task_timeout=sfn.Timeout.duration(cdk.Duration.minutes(2)))
            # One update at a time per node group: wait for the previous one.
            task.add_retry(errors=["Eks.ResourceInUseException"], interval=cdk.Duration.seconds(30),
                           max_attempts=20, backoff_rate=1)
            return task

        run_nodes = "$.input.nodes"
        read_input = sfn.Pass(scope, "ReadExecutionInput", parameters={
            "status.$": "$.detail.status", "input.$": "States.StringToJson($.detail.input)"})
        started = sfn.Condition.string_equals("$.status", "RUNNING")
        choice = (sfn.Choice(scope, "StartedOrEnded")
                  .when(sfn.Condition.and_(started, sfn.Condition.is_present(run_nodes),
                                           sfn.Condition.is_numeric(run_nodes)),
                        scale("ScaleToRunNodes", sfn.JsonPath.number_at(run_nodes)))
                  .when(started, scale("ScaleToMaxNodes", self.max_nodes))
                  .otherwise(scale("ScaleToZero", 0)))
        machine = sfn.StateMachine(
            scope, "StateMachine", definition_body=sfn.DefinitionBody.from_chainable(read_input.next(choice)),
            comment="Sizes the EKS accelerator node group for the training pipeline's running execution",
            timeout=cdk.Duration.hours(1), tracing_enabled=True,
            logs=sfn.LogOptions(destination=logs.LogGroup(scope, "Logs", retention=self.log_retention,
                                                          removal_policy=cdk.RemovalPolicy.DESTROY),
                                level=sfn.LogLevel.ALL))
        events.Rule(scope, "OnPipelineExecutionStatus",
                    description="Training pipeline execution started or ended: size the accelerator node group",
                    event_pattern=events.EventPattern(
                        source=["aws.states"], detail_type=["Step Functions Execution Status Change"],
                        detail={"stateMachineArn": [state_machine.state_machine_arn],
                                "status": ["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"]}),
                    targets=[targets.SfnStateMachine(machine)])
        self.scaling_state_machine = machine
        policy = machine.role.node.try_find_child("DefaultPolicy") or machine.role
        cdk.Validations.of(policy).acknowledge(cdk.Acknowledgment(
            id="AwsSolutions-IAM5[Resource::*]",
            reason="X-Ray (PutTraceSegments, PutTelemetryRecords, GetSampling*) and CloudWatch Logs delivery "
                   "(logs:CreateLogDelivery ...) allow no resource-level permissions"))

    def grant(self, principal: iam.IGrantable) -> None:
        """Kubernetes access for the state machine's role: edit rights in the training namespace only."""
        iam.Grant.add_to_principal(grantee=principal, actions=["eks:DescribeCluster"],
                                   resource_arns=[self.cluster.cluster_arn])
        if self.nodegroup is not None and isinstance(principal, sfn.StateMachine):
            self._scale_with_executions(principal)
        role = principal.grant_principal
        # In the principal's stack: the pipeline stack already depends on the EKS stack, not the reverse.
        eks.AccessEntry(cdk.Stack.of(role) if isinstance(role, Construct) else cdk.Stack.of(self.cluster),
                        "EksJobRunnerAccess", cluster=self.cluster, principal=role.role_arn,
                        access_policies=[eks.AccessPolicy.from_access_policy_name(
                            "AmazonEKSEditPolicy", access_scope_type=eks.AccessScopeType.NAMESPACE,
                            namespaces=[NAMESPACE])])
