"""Bad hosts kept out of the next attempt: what the pipeline does with the hosts a failed attempt named bad.

A training container records a host that failed its health check or held the others up (the rank that hung first)
as `runs/<run_id>/bad-hosts/pending/<host id>` (training_image/efa_training/runtime/bad_hosts.py; the id is the EC2
instance id on Batch, the Kubernetes node name on EKS, the host name on SageMaker). After a failed sanity, compile or
training attempt, before its failure is classified, these states list the run's pending records. Where there are
any, each host is taken out by the backend (JobRunner.quarantine_host: Batch terminates the instance, so its compute
environment launches a fresh one; EKS cordons and taints the node, then terminates its instance, which the node
group replaces, even when the cordon fails; SageMaker does nothing, as each job gets fresh instances), its record is
moved to the run's list (`runs/<run_id>/bad-hosts/<id>`) and the environment's (`bad-hosts/<id>`), and the attempt
fails as HostsQuarantined, which the pipeline retries 30 seconds later without counting it among the run's failed
attempts (at most QUARANTINE_RETRIES times a stage).

Quarantine never stops a run: a listing that fails leaves the failure to be classified as before, and a host the
backend could not take out (already gone, a refused call) still has its record moved, with the error beside it.
"""

import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import BAD_HOSTS_PENDING, BAD_HOSTS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.compute.backend import JobRunner
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient

J = sfn.JsonPath
HOSTS_QUARANTINED = "HostsQuarantined"
# Retries of a stage after a quarantine, apart from its failed-attempt retries (each Retrier counts its own).
QUARANTINE_RETRIES = 2
# `runs/<run_id>/bad-hosts/pending/<id>` split on '/': the id is the fifth segment (a run id holds no '/').
HOST_ID_SEGMENT = len(f"{RUNS_PREFIX}x/{BAD_HOSTS_PENDING}".split("/")) - 1
MAX_HOSTS_AT_ONCE = 8


class Quarantine:
    """The quarantine states for one classified job state; `check(scope, id_, then)` is where its Catch goes."""

    def __init__(self, *, bucket: s3.IBucket, runner: JobRunner) -> None:
        self._bucket, self._runner = bucket, runner

    def check(self, scope: Construct, id_: str, then: sfn.IChainable) -> sfn.IChainable:
        """List the run's pending records; none (or no listing): `then`; else take each host out and fail."""
        listing = tasks.CallAwsService(
            scope,
            f"{id_}ListBadHosts",
            service="s3",
            action="listObjectsV2",
            iam_action="s3:ListBucket",
            iam_resources=[self._bucket.bucket_arn],
            parameters={
                "Bucket": self._bucket.bucket_name,
                "Prefix": J.format(f"{RUNS_PREFIX}{{}}/{BAD_HOSTS_PENDING}", J.string_at("$.run.run_id")),
            },
            result_path="$.bad_hosts",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(listing)
        listing.add_catch(then, errors=["States.ALL"], result_path="$.bad_hosts_unread")
        quarantined = sfn.Fail(
            scope,
            f"{id_}HostsQuarantined",
            error=HOSTS_QUARANTINED,
            cause_path=J.format(
                "The failed attempt named bad hosts; they are kept out of the next attempt (records under "
                f"{RUNS_PREFIX}{{}}/{BAD_HOSTS_PREFIX}), which does not count against the run",
                J.string_at("$.run.run_id"),
            ),
        )
        hosts = sfn.Map(
            scope,
            f"{id_}QuarantineHosts",
            items_path="$.bad_hosts.Contents",
            item_selector={
                "key.$": "$$.Map.Item.Value.Key",
                "host.$": f"States.ArrayGetItem(States.StringSplit($$.Map.Item.Value.Key, '/'), {HOST_ID_SEGMENT})",
                "run_id.$": "$.run.run_id",
            },
            max_concurrency=MAX_HOSTS_AT_ONCE,
            result_path=J.DISCARD,
        )
        hosts.item_processor(self._one_host(scope, id_))
        hosts.add_catch(quarantined, errors=["States.ALL"], result_path="$.bad_hosts_unmoved")
        any_pending = sfn.Choice(scope, f"{id_}AnyBadHosts")
        any_pending.when(
            sfn.Condition.and_(
                sfn.Condition.is_present("$.bad_hosts.KeyCount"),
                sfn.Condition.number_greater_than("$.bad_hosts.KeyCount", 0),
            ),
            hosts.next(quarantined),
        )
        return listing.next(any_pending.otherwise(then))

    def _one_host(self, scope: Construct, id_: str) -> sfn.IChainable:
        """The backend's action on `$.host` (its failure kept beside the record), then the record moved."""
        moved = self._move(scope, id_)
        action = self._runner.quarantine_host(scope, f"{id_}TakeOutHost")
        if action is None:
            return moved
        guarded = sfn.Parallel(scope, f"{id_}TakeOut", result_path=J.DISCARD)
        guarded.branch(action)
        guarded.add_catch(moved, errors=["States.ALL"], result_path="$.not_taken_out")
        return guarded.next(moved)

    def _move(self, scope: Construct, id_: str) -> sfn.IChainable:
        """Copy the record to the run's and the environment's list, then delete the pending one."""
        source = J.format(f"{self._bucket.bucket_name}/{{}}", J.string_at("$.key"))
        to_run = self._s3(
            scope,
            f"{id_}RecordBadHost",
            "copyObject",
            "s3:PutObject",
            f"{RUNS_PREFIX}*/{BAD_HOSTS_PREFIX}*",
            {
                "CopySource": source,
                "Key": J.format(
                    f"{RUNS_PREFIX}{{}}/{BAD_HOSTS_PREFIX}{{}}", J.string_at("$.run_id"), J.string_at("$.host")
                ),
            },
        )
        to_environment = self._s3(
            scope,
            f"{id_}ListBadHostForEnvironment",
            "copyObject",
            "s3:PutObject",
            f"{BAD_HOSTS_PREFIX}*",
            {"CopySource": source, "Key": J.format(f"{BAD_HOSTS_PREFIX}{{}}", J.string_at("$.host"))},
        )
        done = self._s3(
            scope,
            f"{id_}ClearPendingBadHost",
            "deleteObject",
            "s3:DeleteObject",
            f"{RUNS_PREFIX}*/{BAD_HOSTS_PENDING}*",
            {"Key": J.string_at("$.key")},
        )
        return to_run.next(to_environment).next(done)

    def _s3(
        self, scope: Construct, id_: str, action: str, iam_action: str, objects: str, parameters: dict
    ) -> tasks.CallAwsService:
        # CopyObject reads its source too (S3 API reference, CopyObject: s3:GetObject on the source, s3:PutObject on
        # the destination).
        reads = [self._bucket.arn_for_objects(f"{RUNS_PREFIX}*/{BAD_HOSTS_PENDING}*")] if action == "copyObject" else []
        call = tasks.CallAwsService(
            scope,
            id_,
            service="s3",
            action=action,
            iam_action=iam_action,
            iam_resources=[self._bucket.arn_for_objects(objects)],
            additional_iam_statements=[iam.PolicyStatement(actions=["s3:GetObject"], resources=reads)]
            if reads
            else None,
            parameters={"Bucket": self._bucket.bucket_name, **parameters},
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(call)
        return call
