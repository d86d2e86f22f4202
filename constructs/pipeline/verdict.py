"""After validation: read the verdict, then approve and record the model, or reject it, or fail on a bad verdict.

Approval is recorded once per run, in the run's item of the runs table, where no job can write (approval_record.py):
a retried step or a resumed run that finds it recorded publishes the recorded one, so the SSM parameter never names a
different approval; `models/<run_id>/approval.json` is its copy.
Once the model is approved and recorded, a notification that still fails does not turn the run into a failure, nor
does a model registry that cannot be reached (constructs/pipeline/model_registry.py).
"""

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import MODELS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.pipeline.approval_record import record_approval as record_approval_once
from constructs.pipeline.aws_calls import CALL_TIMEOUT, NOTIFICATION_ERRORS, retry_transient
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.model_registry import register_approved

C = sfn.Condition
J = sfn.JsonPath
VERDICT_FIELDS = ("metric", "value", "baseline", "relative_delta", "tolerance")


class VerdictBranch:
    """`start` reads `runs/<run_id>/verdict.json`; the branch ends in RunSucceeded, ValidationFailed or the failure
    path. `approved_model_parameter` is the SSM parameter that names the last approved model."""

    def __init__(
        self,
        scope: Construct,
        *,
        environment: str,
        bucket: s3.IBucket,
        table: dynamodb.ITable,
        topic: sns.ITopic,
        failures: FailurePath,
        approved_model_parameter: str,
    ) -> None:
        self._scope, self._bucket, self._topic, self._table = scope, bucket, topic, table
        self._environment, self._failures = environment, failures
        self._parameter = approved_model_parameter
        read_verdict = self._s3_call(
            "ReadVerdict",
            "getObject",
            "$.paths.verdict_key",
            f"{RUNS_PREFIX}*/verdict.json",
            "s3:GetObject",
            result_selector={"report": J.string_to_json(J.string_at("$.Body"))},
            result_path="$.verdict",
        )
        failures.catch(read_verdict, "ReadVerdict", "VerdictUnreadable")
        passed = "$.verdict.report.passed"
        self.start = read_verdict.next(
            sfn.Choice(scope, "IsModelAccepted")
            .when(C.and_(C.is_present(passed), C.is_boolean(passed), C.boolean_equals(passed, True)), self._approve())
            .when(C.and_(C.is_present(passed), C.is_boolean(passed)), self._reject())
            .otherwise(
                sfn.Pass(
                    scope,
                    "OnMalformedVerdict",
                    parameters={
                        "run.$": "$.run",
                        "failure": {
                            "state": "ReadVerdict",
                            "error": "VerdictMalformed",
                            "detail": "VerdictMalformed",
                            "cause.$": "States.JsonToString($.verdict.report)",
                        },
                    },
                ).next(failures.notify)
            )
        )

    def _approve(self) -> sfn.IChainable:
        """Copy the verdict to models/, record the approval once, publish it in SSM, register it (model_registry.py),
        notify, succeed."""
        scope, failures = self._scope, self._failures
        copy_verdict = self._s3_call(
            "CopyVerdictToModels",
            "copyObject",
            "$.paths.model_verdict_key",
            f"{MODELS_PREFIX}*",
            "s3:PutObject",
            before_key={"CopySource": J.string_at("$.paths.verdict_source")},
            additional_iam_statements=[
                iam.PolicyStatement(
                    actions=["s3:GetObject"], resources=[self._bucket.arn_for_objects(f"{RUNS_PREFIX}*/verdict.json")]
                )
            ],
        )
        failures.catch(copy_verdict, "CopyVerdictToModels", "ApprovalNotRecorded")
        describe_model = sfn.Pass(
            scope,
            "DescribeApprovedModel",
            result_path="$.approval",
            parameters={
                "run_id.$": "$.run.run_id",
                "model.$": "$.paths.model_uri",
                "checkpoints.$": "$.paths.checkpoints_uri",
                "verdict.$": "$.verdict.report",
                "execution.$": "$$.Execution.Id",
                "approved_at.$": "$$.State.EnteredTime",
            },
        )
        publish_model = self._publish_model()
        record_approval = record_approval_once(
            scope, table=self._table, bucket=self._bucket, failures=failures, then=publish_model
        )
        succeeded = sfn.Succeed(scope, "RunSucceeded")
        notify_approved = self._notify(
            "NotifyApproved",
            "model approved",
            "APPROVED",
            {
                "model": J.string_at("$.paths.model_uri"),
                "verdict": J.object_at("$.verdict.report"),
                "parameter": self._parameter,
                "registry": J.object_at("$.registry"),
            },
        )
        notify_approved.add_catch(
            sfn.Pass(scope, "ApprovedButNotNotified").next(succeeded), result_path="$.notification_error"
        )
        register, registered = register_approved(scope, self._environment)
        publish_model.next(register)
        registered.next(notify_approved).next(succeeded)
        return copy_verdict.next(describe_model).next(record_approval)

    def _publish_model(self) -> tasks.CallAwsService:
        stack = cdk.Stack.of(self._scope)
        parameter_arn = stack.format_arn(service="ssm", resource="parameter", resource_name=self._parameter.lstrip("/"))
        publish = tasks.CallAwsService(
            self._scope,
            "PublishApprovedModel",
            service="ssm",
            action="putParameter",
            parameters={
                "Name": self._parameter,
                "Type": "String",
                "Overwrite": True,
                "Value": J.json_to_string(J.object_at("$.approval")),
                "Description": "The model the training pipeline approved last (JSON)",
            },
            iam_resources=[parameter_arn],
            iam_action="ssm:PutParameter",
            result_path=J.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(publish)
        self._failures.catch(publish, "PublishApprovedModel", "ApprovalNotRecorded")
        return publish

    def _reject(self) -> sfn.IChainable:
        """Notify, then fail with ValidationFailed and the verdict's figures as the cause."""
        rejected = sfn.Fail(
            self._scope,
            "ValidationFailed",
            error="ValidationFailed",
            cause_path=J.format(
                "{} = {} against baseline {}: relative delta {} is beyond the tolerance {}",
                *(J.string_at(f"$.verdict.report.{k}") for k in VERDICT_FIELDS),
            ),
        )
        notify_rejected = self._notify(
            "NotifyRejected", "validation failed", "REJECTED", {"verdict": J.object_at("$.verdict.report")}
        )
        notify_rejected.add_catch(rejected, result_path="$.notification_error")
        return notify_rejected.next(rejected)

    def _notify(self, id_: str, subject: str, outcome: str, fields: dict) -> tasks.SnsPublish:
        notify = tasks.SnsPublish(
            self._scope,
            id_,
            topic=self._topic,
            result_path=J.DISCARD,
            subject=f"EFA training {self._environment}: {subject}",
            message=sfn.TaskInput.from_object(
                {
                    "environment": self._environment,
                    "outcome": outcome,
                    "run_id": J.string_at("$.run.run_id"),
                    **fields,
                    "execution": J.execution_id,
                }
            ),
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(notify, NOTIFICATION_ERRORS)
        return notify

    def _s3_call(
        self,
        id_: str,
        action: str,
        key_path: str,
        objects: str,
        iam_action: str,
        *,
        before_key: dict | None = None,
        after_key: dict | None = None,
        result_selector: dict | None = None,
        result_path: str = J.DISCARD,
        additional_iam_statements: list | None = None,
    ) -> tasks.CallAwsService:
        """One S3 call on the data bucket's key at `key_path`, with the pipeline's transient retries."""
        call = tasks.CallAwsService(
            self._scope,
            id_,
            service="s3",
            action=action,
            parameters={
                "Bucket": self._bucket.bucket_name,
                **(before_key or {}),
                "Key": J.string_at(key_path),
                **(after_key or {}),
            },
            iam_resources=[self._bucket.arn_for_objects(objects)],
            iam_action=iam_action,
            additional_iam_statements=additional_iam_statements,
            result_selector=result_selector,
            result_path=result_path,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(call)
        return call
