"""Before a multi-node job on EKS: the run's training nodes in service, or the submission ends saying why.

A Job's pods wait Pending while no node fits them, and EC2 Auto Scaling retries a launch refused for capacity until
an instance comes (AWS re:Post, "EKS insufficient capacity errors": neither it nor the scheduler gives up), so a run
EC2 cannot serve would spend its attempts at the Job's activeDeadlineSeconds. Instead, before each multi-node job the
pipeline reads the training node group's Auto Scaling group (EKS API reference, DescribeNodegroup:
resources.autoScalingGroups) once a minute, until as many of its instances are InService as the run has nodes
(EC2 Auto Scaling API reference, DescribeAutoScalingGroups: Instance.LifecycleState). After `minutes` without them,
the group's latest failed launch since the wait began (DescribeScalingActivities, newest first: StatusCode Failed,
StartTime, StatusMessage; an older run's failure says nothing of this one) says why: EC2's "We currently do not have
sufficient <type> capacity" (EC2 Auto Scaling user guide, "Troubleshoot: EC2 instance launch failures", Insufficient
capacity) ends the submission as `no_capacity`, which the pipeline asks again
without spending an attempt, as on Batch; anything else, or no failure at all, as `failed` with that message.
A shortage first sets the group's desired size to 0: the nodes that did come would otherwise idle through every
capacity retry (hours of `capacity_wait_hours`, at the type's hourly price each); the next try's wait finds the group
below the run's nodes and sizes it again (UpdateNodegroupConfig). The lease stays with the run meanwhile.
The wait only advises: a read that fails after its retries (throttling, an SCP denying Describe*) lets the job be
submitted as before the wait existed, where the pods wait Pending until the Job's deadline.
"""

from dataclasses import dataclass

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct

POLL = cdk.Duration.minutes(1)
# A node group in the middle of another update answers ResourceInUseException (EKS API reference,
# UpdateNodegroupConfig): waited for, UPDATE_TRIES times UPDATE_WAIT (10 minutes).
IN_USE = "Eks.ResourceInUseException"
UPDATE_WAIT = cdk.Duration.seconds(30)
UPDATE_TRIES = 20
KEEP = "{% $states.input %}"  # every state hands its input on: the job's submission reads it next
# A launch refused for capacity, as EC2 words it in the activity's StatusMessage (any case).
CAPACITY_MESSAGE = "/sufficient.*capacity/i"
# DescribeNodegroup's throttling and 5xx (constructs/compute/eks/node_scaling.py TRANSIENT); Auto Scaling's throttling
# has no modeled exception (its base one) and ResourceContentionFault is its modeled busy answer (API reference), which
# Step Functions names after the Java SDK's class, ResourceContentionException.
TRANSIENT = (
    "Eks.ServerException",
    "Eks.ServiceUnavailableException",
    "Eks.EksException",
    "AutoScaling.AutoScalingException",
    "AutoScaling.ResourceContentionException",
    "States.Timeout",
)


@dataclass(frozen=True)
class TrainingGroup:
    """The training node group the wait reads and sizes: its cluster, the group, its maximum size."""

    cluster_name: str
    nodegroup: eks.Nodegroup
    max_size: int


def training_nodes_wait(
    scope: Construct, id_: str, *, group: TrainingGroup, minutes: int, errors: tuple[str, str]
) -> tuple[sfn.State, sfn.INextable]:
    """(first, ready): states named `<id_>...`; `ready` goes on to the submission; `errors`: (no capacity, failed)."""
    nodegroup = group.nodegroup
    read = _call(
        scope,
        f"{id_}ReadTrainingNodeGroup",
        "eks",
        "describeNodegroup",
        {"ClusterName": group.cluster_name, "NodegroupName": nodegroup.nodegroup_name},
        [nodegroup.nodegroup_arn],
        {
            "group": "{% $states.result.Nodegroup.Resources.AutoScalingGroups[0].Name %}",
            "desired": "{% $states.result.Nodegroup.ScalingConfig.DesiredSize %}",
            "polls": 0,
            "started": "{% $toMillis($states.context.State.EnteredTime) %}",
        },
    )
    count = _call(
        scope,
        f"{id_}CountTrainingNodes",
        "autoscaling",
        "describeAutoScalingGroups",
        {"AutoScalingGroupNames": ["{% $group %}"]},
        ["*"],  # Service Authorization Reference, EC2 Auto Scaling: Describe* have no resource types
        {"in_service": "{% $count($states.result.AutoScalingGroups[0].Instances[LifecycleState = 'InService']) %}"},
    )
    launches = _call(
        scope,
        f"{id_}ReadLaunchFailures",
        "autoscaling",
        "describeScalingActivities",
        {"AutoScalingGroupName": "{% $group %}", "MaxRecords": 20},
        ["*"],
        {
            "failure": "{% ($f := $states.result.Activities[StatusCode = 'Failed' and $toMillis(StartTime) >= "
            "$started][0]; $exists($f) ? $f.StatusMessage : 'no failed launch reported since the wait began') %}"
        },  # fmt: skip
    )
    ready = sfn.Pass(scope, f"{id_}TrainingNodesInService")
    wait = sfn.Wait.jsonata(scope, f"{id_}WaitForTrainingNodes", time=sfn.WaitTime.duration(POLL),
                            assign={"polls": "{% $polls + 1 %}"})  # fmt: skip
    no_capacity, failed = errors
    line = (
        f"{{% 'the training nodes were not in service after {minutes} minutes (' & $string($in_service) & ' of ' "
        "& $string($states.input.run.nodes) & '); latest failed launch in the node group: ' & $failure %}"
    )
    unavailable = sfn.Fail.jsonata(scope, f"{id_}TrainingNodesUnavailable", error=no_capacity, cause=line)
    # Nobody trains until the capacity comes: the nodes that did launch go too, and the next try sizes the group again.
    to_zero = _resize(scope, f"{id_}ReleaseWaitingNodes", group, "0")
    to_zero.add_catch(unavailable, errors=["States.ALL"], outputs=KEEP)  # the reconciler's, if this fails
    why = (
        sfn.Choice.jsonata(scope, f"{id_}IsCapacityShort")
        .when(
            sfn.Condition.jsonata(f"{{% $contains($failure, {CAPACITY_MESSAGE}) %}}"),
            to_zero.next(unavailable),
        )
        .otherwise(sfn.Fail.jsonata(scope, f"{id_}TrainingNodesFailed", error=failed, cause=line))
    )
    up = sfn.Choice.jsonata(scope, f"{id_}AreTrainingNodesUp")
    up.when(sfn.Condition.jsonata("{% $in_service >= $states.input.run.nodes %}"), ready)
    up.when(sfn.Condition.jsonata(f"{{% $polls >= {minutes} %}}"), launches.next(why))
    up.otherwise(wait.next(count))
    for call in (read, count, launches):  # a read that cannot be made: submit as if there were no wait
        call.add_catch(ready, errors=["States.ALL"], outputs=KEEP)
    to_size = _resize(scope, f"{id_}SizeWaitingNodes", group, "$states.input.run.nodes")
    to_size.add_catch(
        sfn.Fail.jsonata(
            scope,
            f"{id_}TrainingNodesNotSized",
            error=failed,
            cause="{% 'the training node group could not be sized again: ' & $states.errorOutput.Cause %}",
        ),
        errors=["States.ALL"],
    )
    sized = sfn.Choice.jsonata(scope, f"{id_}IsTrainingGroupSized")
    sized.when(sfn.Condition.jsonata("{% $desired < $states.input.run.nodes %}"), to_size.next(count))
    read.next(sized.otherwise(count))
    count.next(up)
    return read, ready


def _resize(scope: Construct, id_: str, group: TrainingGroup, desired: str) -> tasks.CallAwsService:
    """UpdateNodegroupConfig's desired size to the JSONata expression `desired`; an update in progress waited for
    (EKS API reference, UpdateNodegroupConfig: ResourceInUseException)."""
    update = _call(
        scope,
        id_,
        "eks",
        "updateNodegroupConfig",
        {
            "ClusterName": group.cluster_name,
            "NodegroupName": group.nodegroup.nodegroup_name,
            "ScalingConfig": {"MinSize": 0, "MaxSize": group.max_size, "DesiredSize": f"{{% {desired} %}}"},
        },
        [group.nodegroup.nodegroup_arn],
    )
    update.add_retry(errors=[IN_USE], interval=UPDATE_WAIT, max_attempts=UPDATE_TRIES, backoff_rate=1)
    return update


def _call(
    scope: Construct,
    id_: str,
    service: str,
    action: str,
    arguments: dict,
    resources: list[str],
    assign: dict | None = None,
) -> tasks.CallAwsService:
    task = tasks.CallAwsService.jsonata(
        scope,
        id_,
        service=service,
        action=action,
        parameters=arguments,
        iam_resources=resources,
        assign=assign,
        outputs=KEEP,
        task_timeout=sfn.Timeout.duration(cdk.Duration.minutes(2)),
    )
    task.add_retry(
        errors=list(TRANSIENT),
        interval=cdk.Duration.seconds(2),
        backoff_rate=2,
        max_attempts=5,
        jitter_strategy=sfn.JitterType.FULL,
    )
    return task
