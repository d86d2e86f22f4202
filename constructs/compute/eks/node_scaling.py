"""EKS node groups sized by the pipeline itself, and a reconciler that brings them to zero when no run holds them.

Nothing in the cluster scales the accelerator nodes (no Cluster Autoscaler: it cannot predict
`vpc.amazonaws.com/efa` on a node group at zero). EventBridge delivers Step Functions' execution status changes
"best effort" and not in order (EventBridge user guide, "Events from AWS services"), so the node groups follow the
pipeline's own states instead, in `EksNodeScaling`, and one run at a time holds them through the lease in the runs
table (node_lease.py):
- `hold`: a run takes the lease before it claims its run id, or is refused in one line naming the holder;
- `size`: the training group gets the run's nodes once the run is claimed; before validation the training group
  goes to 0 and the validation group to 1; after it, the validation group to 0, and the run gives the lease back
  (`release_lease`: it needs no node any more);
- `release`: on every failure the pipeline brings both groups to 0 unless another execution holds the lease, then
  gives its lease back.
What no state can catch (an execution timed out or aborted, a lost release) is the `EksNodeReconciler`'s: a state
machine run every few minutes and on every ended execution, which releases a lease whose holder is no longer RUNNING,
then brings each group to 0 while no execution holds the lease. It reads the group first and the lease again right
before each update, so it never stops a run that started meanwhile for longer than one read-then-update. A group
tagged `HoldUntil` with a later time is left alone by every release (jobs run by hand, docs/eks.md).
"""

from dataclasses import dataclass

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct
from constructs.compute.backend import TRAINING
from constructs.compute.eks.node_lease import HOLDER, NodeLease
from constructs.compute.eks.node_wait import IN_USE, UPDATE_TRIES, UPDATE_WAIT, TrainingGroup, training_nodes_wait

C = sfn.Condition
J = sfn.JsonPath
# EKS API errors worth another try: 5xx and throttling (modelled, and the service's base exception).
TRANSIENT = ("Eks.ServerException", "Eks.ServiceUnavailableException", "Eks.EksException", "States.Timeout")
CALL_TIMEOUT = cdk.Duration.minutes(2)
# A node group tagged HoldUntil=<UTC time like 2026-11-27T18:00:00Z> (`aws eks tag-resource`) is left up until then:
# jobs run by hand (docs/eks.md).
HOLD_TAG = "HoldUntil"


@dataclass(frozen=True)
class SizedGroup:
    nodegroup: eks.Nodegroup
    max_size: int


def _retry_transient(task: tasks.CallAwsService, errors: tuple[str, ...] = TRANSIENT) -> tasks.CallAwsService:
    task.add_retry(errors=list(errors), interval=cdk.Duration.seconds(2), backoff_rate=2, max_attempts=5)
    return task


class EksNodeScaling:
    """The pipeline's node-group states (implements constructs.compute.backend.PipelineNodes)."""

    def __init__(
        self, *, cluster_name: str, groups: dict[str, SizedGroup], lease: NodeLease, training_wait_minutes: int = 20
    ) -> None:
        self._cluster, self._groups, self._training_wait = cluster_name, groups, training_wait_minutes
        self._lease = lease

    @property
    def training_wait_seconds(self) -> int:
        return self._training_wait * 60

    def wait_for_training(
        self, scope: Construct, id_: str, *, errors: tuple[str, str]
    ) -> tuple[sfn.State, sfn.INextable]:
        """The training nodes in service before a multi-node job (node_wait.py), `training_wait_minutes` at most."""
        training = self._groups[TRAINING]
        return training_nodes_wait(
            scope,
            id_,
            group=TrainingGroup(self._cluster, training.nodegroup, training.max_size),
            minutes=self._training_wait,
            errors=errors,
        )

    def hold(
        self, scope: Construct, *, execution_arns: str, error: str
    ) -> tuple[sfn.State, sfn.INextable, list[sfn.TaskStateBase]]:
        """(first, held, calls): the run takes the node groups' lease (node_lease.py), or fails with `error` and one
        line naming the execution that holds it; `calls` for the caller's failure path."""
        return self._lease.take(scope, execution_arns=execution_arns, error=error)

    def release_lease(self, scope: Construct, id_: str) -> sfn.Chain:
        """The lease given back, where this execution holds it (never fails)."""
        return self._lease.released(scope, id_)

    def _update(self, scope: Construct, id_: str, role: str, desired: int | str) -> tasks.CallAwsService:
        group = self._groups[role]
        task = tasks.CallAwsService(
            scope,
            id_,
            service="eks",
            action="updateNodegroupConfig",
            parameters={
                "ClusterName": self._cluster,
                "NodegroupName": group.nodegroup.nodegroup_name,
                "ScalingConfig": {
                    "MinSize": 0,
                    "MaxSize": group.max_size,
                    "DesiredSize": J.number_at(desired) if isinstance(desired, str) else desired,
                },
            },
            iam_resources=[group.nodegroup.nodegroup_arn],
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        return _retry_transient(task)

    def size(
        self, scope: Construct, id_: str, desired: dict[str, int | str]
    ) -> tuple[sfn.Chain, list[sfn.TaskStateBase]]:
        """The updates setting each group in `desired` (role -> count or JSONPath to it), in order, and the tasks;
        each state is named `Size<Role>Nodes<id_>` (id_: ForTraining, ForValidation, AfterValidation).
        The run holds the groups (its lease), so an update in progress is its own: waited for."""
        updates: list[sfn.TaskStateBase] = []
        for role, count in desired.items():
            update = self._update(scope, f"Size{role.capitalize()}Nodes{id_}", role, count)
            update.add_retry(errors=[IN_USE], interval=UPDATE_WAIT, max_attempts=UPDATE_TRIES, backoff_rate=1)
            updates.append(update)
        chain = sfn.Chain.start(updates[0])
        for later in updates[1:]:
            chain = chain.next(later)
        return chain, updates

    def release(self, scope: Construct, id_: str) -> tuple[sfn.Chain, sfn.Map]:
        """(chain, its Map state for a Catch), from inside the pipeline: every group to 0 unless another execution
        holds the lease, then this execution's lease given back (groups first: no run sizes them meanwhile)."""
        chain, release = self._groups_to_zero(scope, id_)
        return chain.next(self._lease.released(scope, f"{id_}Lease")), release

    def reconcile(self, scope: Construct, id_: str, *, execution_arns: str) -> sfn.State:
        """The reconciler's: a lease whose holder (one of `execution_arns`) is no longer RUNNING released, then every
        group to 0 unless an execution holds the lease; a RUNNING holder's groups are left alone."""
        first, free, held = self._lease.release_stale(scope, f"{id_}Lease", execution_arns=execution_arns)
        free.next(self._groups_to_zero(scope, id_)[0])
        held.next(sfn.Succeed(scope, f"{id_}LeftToTheHolder"))
        return first

    def _groups_to_zero(self, scope: Construct, id_: str) -> tuple[sfn.Chain, sfn.Map]:
        """Per group: read its size; if above 0, read the lease; if no other execution holds it (absent, or held by
        this one), update; if another update is in progress, wait and start over (at most UPDATE_TRIES times)."""
        groups = sfn.Pass(
            scope,
            f"{id_}Groups",
            result_path="$.release",
            parameters={
                "groups": [{"name": g.nodegroup.nodegroup_name, "max": g.max_size} for g in self._groups.values()]
            },
        )
        release = sfn.Map(
            scope,
            id_,
            items_path="$.release.groups",
            item_selector={
                "group.$": "$$.Map.Item.Value",
                "execution.$": "$$.Execution.Id",
                "now.$": "$$.State.EnteredTime",
                "tries": 0,
            },
            result_path=J.DISCARD,
        )
        release.item_processor(self._release_group(scope, id_))
        return groups.next(release), release

    def _release_group(self, scope: Construct, id_: str) -> sfn.IChainable:
        describe = _retry_transient(
            tasks.CallAwsService(
                scope,
                f"{id_}Describe",
                service="eks",
                action="describeNodegroup",
                parameters={"ClusterName": self._cluster, "NodegroupName": J.string_at("$.group.name")},
                iam_resources=[g.nodegroup.nodegroup_arn for g in self._groups.values()],
                result_selector={"group.$": "$.Nodegroup"},
                result_path="$.described",
                task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
            )
        )
        leased = self._lease.read(scope, f"{id_}ReadLease")
        down = _retry_transient(
            tasks.CallAwsService(
                scope,
                f"{id_}ScaleToZero",
                service="eks",
                action="updateNodegroupConfig",
                parameters={
                    "ClusterName": self._cluster,
                    "NodegroupName": J.string_at("$.group.name"),
                    "ScalingConfig": {"MinSize": 0, "MaxSize": J.number_at("$.group.max"), "DesiredSize": 0},
                },
                iam_resources=[g.nodegroup.nodegroup_arn for g in self._groups.values()],
                iam_action="eks:UpdateNodegroupConfig",
                result_path=J.DISCARD,
                task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
            )
        )
        done = sfn.Succeed(scope, f"{id_}Done")
        again = sfn.Pass(
            scope,
            f"{id_}TryAgain",
            parameters={
                "group.$": "$.group",
                "execution.$": "$.execution",
                "now.$": "$.now",
                "tries.$": "States.MathAdd($.tries, 1)",
            },
        )
        wait = sfn.Wait(scope, f"{id_}WaitForUpdate", time=sfn.WaitTime.duration(UPDATE_WAIT))
        down.add_catch(again, errors=[IN_USE], result_path="$.in_use")
        again.next(
            sfn.Choice(scope, f"{id_}TriesLeft")
            .when(C.number_less_than("$.tries", UPDATE_TRIES), wait.next(describe))
            .otherwise(done)
        )
        hold = f"$.described.group.Tags.{HOLD_TAG}"
        describe.next(
            sfn.Choice(scope, f"{id_}IsUp")
            .when(  # held by hand: tagged HoldUntil=<a later UTC time, ...Z>; UTC timestamps compare as strings
                C.and_(C.is_present(hold), C.is_timestamp(hold), C.string_greater_than_json_path(hold, "$.now")),
                done,
            )
            .when(
                C.number_greater_than("$.described.group.ScalingConfig.DesiredSize", 0),
                leased.next(
                    sfn.Choice(scope, f"{id_}IsHeld")  # by another execution: its nodes
                    .when(C.and_(C.is_present(HOLDER), C.not_(C.string_equals_json_path(HOLDER, "$.execution"))), done)
                    .otherwise(down)
                ),
            )
            .otherwise(done)
        )
        down.next(done)
        return describe
