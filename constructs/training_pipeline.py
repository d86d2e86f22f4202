"""The training pipeline: validate the run, sanity-check the nodes, train, validate, approve or reject.

One Step Functions state machine (JSONPath). Its input is documented in docs/pipeline.md and
defined in constructs/pipeline_schema.py. Every job runs through a `JobRunner` (the seam to Batch
or EKS); every Task has a timeout and a Catch that notifies the alerts topic before failing.
"""

from dataclasses import dataclass, field

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sns as sns
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks
from constructs import Construct

from config.layout import CHECKPOINTS_PREFIX, MODELS_PREFIX, RUNS_PREFIX
from constructs.pipeline_input import input_validation
from constructs.pipeline_jobs import JobRunner


@dataclass(frozen=True)
class TrainingRetry:
    """Step Functions Retry of a failed training job; each attempt resumes from the last checkpoint."""
    max_attempts: int = 3  # retries after the first attempt
    interval: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(2))
    backoff_rate: float = 2.0
    max_delay: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(30))


@dataclass(frozen=True)
class StageTimeouts:
    sanity: cdk.Duration = field(default_factory=lambda: cdk.Duration.hours(1))
    train: cdk.Duration = field(default_factory=lambda: cdk.Duration.hours(72))  # per attempt
    validate: cdk.Duration = field(default_factory=lambda: cdk.Duration.hours(2))
    aws_call: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(2))  # S3, SSM, SNS calls


class TrainingPipeline(Construct):
    def __init__(self, scope: Construct, id_: str, *, environment: str, max_nodes: int, bucket: s3.IBucket,
                 topic: sns.ITopic, runner: JobRunner, log_retention: logs.RetentionDays,
                 removal_policy: cdk.RemovalPolicy, training_retry: TrainingRetry | None = None,
                 sanity_retry_interval: cdk.Duration | None = None, timeouts: StageTimeouts | None = None) -> None:
        super().__init__(scope, id_)
        self.training_retry = retry = training_retry or TrainingRetry()
        timeouts = timeouts or StageTimeouts()
        stack = cdk.Stack.of(self)
        self.approved_model_parameter = f"/efa-training/{environment}/approved-model"
        parameter_arn = stack.format_arn(service="ssm", resource="parameter",
                                         resource_name=self.approved_model_parameter.lstrip("/"))
        bucket_name = bucket.bucket_name

        # ---- failure path: every Task's Catch lands in an "On...Failure" Pass naming the stage.
        run_failed = sfn.Fail(self, "RunFailed", error_path="$.failure.error", cause_path="$.failure.cause")
        notify_failure = tasks.SnsPublish(
            self, "NotifyFailure", topic=topic, result_path=sfn.JsonPath.DISCARD,
            subject=sfn.JsonPath.format(f"EFA training {environment}: {{}}", sfn.JsonPath.string_at("$.failure.error")),
            message=sfn.TaskInput.from_object({
                "environment": environment, "outcome": "FAILED",
                "run_id": sfn.JsonPath.string_at("$.run.run_id"),
                "error": sfn.JsonPath.string_at("$.failure.error"),
                "state": sfn.JsonPath.string_at("$.failure.state"),
                "detail": sfn.JsonPath.string_at("$.failure.detail"),
                "cause": sfn.JsonPath.string_at("$.failure.cause"),
                "execution": sfn.JsonPath.execution_id,
            }),
            task_timeout=sfn.Timeout.duration(timeouts.aws_call),
        )
        # A failed notification must not hide the run's own error.
        notify_failure.add_catch(run_failed, result_path="$.notification_error")
        notify_failure.next(run_failed)

        def on_failure(task: sfn.TaskStateBase | sfn.CustomState | sfn.Parallel, state: str, error: str) -> None:
            record = sfn.Pass(self, f"On{state}Failure", parameters={
                "run.$": "$.run",
                "failure": {"state": state, "error": error,
                            "detail.$": "$.caught.Error", "cause.$": "$.caught.Cause"},
            })
            task.add_catch(record.next(notify_failure), errors=["States.ALL"], result_path="$.caught")

        # ---- 1. validate the input (pure ASL, before anything is submitted)
        # A backend whose multi-node jobs have a fixed size (Batch) takes runs of exactly that size.
        min_nodes = max_nodes if getattr(runner, "fixed_node_count", False) else 1
        validation_start, validated = input_validation(self, max_nodes=max_nodes, min_nodes=min_nodes)

        prepare = sfn.Pass(self, "PrepareRun", parameters={
            "run.$": "$.run",
            # Batch job Parameters are strings.
            "job": {
                "run_id.$": "$.run.run_id",
                "dataset.$": "$.run.dataset",
                "model.$": "$.run.hyperparameters.model",
                "strategy.$": "$.run.hyperparameters.strategy",
                **{f"{name}.$": f"States.Format('{{}}', $.run.hyperparameters.{name})"
                   for name in ("max_steps", "checkpoint_every", "seed", "lr", "batch_size")},
                "baseline.$": "States.Format('{}', $.run.baseline)",
                "tolerance.$": "States.Format('{}', $.run.tolerance)",
            },
            "paths": {
                "verdict_key.$": f"States.Format('{RUNS_PREFIX}{{}}/verdict.json', $.run.run_id)",
                "verdict_source.$": f"States.Format('{bucket_name}/{RUNS_PREFIX}{{}}/verdict.json', $.run.run_id)",
                "model_verdict_key.$": f"States.Format('{MODELS_PREFIX}{{}}/verdict.json', $.run.run_id)",
                "model_uri.$": f"States.Format('s3://{bucket_name}/{MODELS_PREFIX}{{}}/', $.run.run_id)",
                "checkpoints_uri.$": f"States.Format('s3://{bucket_name}/{CHECKPOINTS_PREFIX}{{}}/', $.run.run_id)",
            },
        })

        job_params = {name: f"$.job.{name}" for name in
                      ("run_id", "dataset", "model", "strategy", "max_steps", "checkpoint_every", "seed", "lr",
                       "batch_size", "baseline", "tolerance")}

        # ---- 2. sanity check on the run's nodes; once more (fresh placement) if it fails
        sanity = runner.submit(
            self, "SanityCheck", job="sanity", parameters={"run_id": "$.job.run_id"},
            job_name="States.Format('{}-sanity', $.run.run_id)", nodes="$.run.nodes",
            result_path="$.jobs.sanity", timeout=timeouts.sanity)
        sanity.add_retry(errors=["States.TaskFailed"], max_attempts=1,
                         interval=sanity_retry_interval or cdk.Duration.minutes(1), backoff_rate=1)
        on_failure(sanity, "SanityCheck", "SanityCheckFailed")

        # ---- 3. training; a retry resumes from the run's checkpoints instead of starting over
        train = runner.submit(
            self, "Train", job="train", parameters={k: job_params[k] for k in (
                "run_id", "dataset", "model", "strategy", "max_steps", "checkpoint_every", "seed", "lr", "batch_size")},
            job_name="States.Format('{}-train', $.run.run_id)", nodes="$.run.nodes", attempts="$.run.max_attempts",
            result_path="$.jobs.train", timeout=timeouts.train)
        # A rejected request (bad job definition, bad parameters) will not improve on retry.
        train.add_retry(errors=["Batch.ClientException"], max_attempts=0)
        train.add_retry(errors=["States.TaskFailed"], max_attempts=retry.max_attempts, interval=retry.interval,
                        backoff_rate=retry.backoff_rate, max_delay=retry.max_delay, jitter_strategy=sfn.JitterType.FULL)
        on_failure(train, "Train", "TrainingFailed")

        # ---- 4. validation job, then its verdict
        validate = runner.submit(
            self, "Validate", job="validate",
            parameters={k: job_params[k] for k in ("run_id", "dataset", "model", "baseline", "tolerance")},
            job_name="States.Format('{}-validate', $.run.run_id)", result_path="$.jobs.validate",
            timeout=timeouts.validate)
        on_failure(validate, "Validate", "ValidationJobFailed")

        read_verdict = tasks.CallAwsService(
            self, "ReadVerdict", service="s3", action="getObject",
            parameters={"Bucket": bucket_name, "Key": sfn.JsonPath.string_at("$.paths.verdict_key")},
            iam_resources=[bucket.arn_for_objects(f"{RUNS_PREFIX}*/verdict.json")], iam_action="s3:GetObject",
            result_selector={"report": sfn.JsonPath.string_to_json(sfn.JsonPath.string_at("$.Body"))},
            result_path="$.verdict", task_timeout=sfn.Timeout.duration(timeouts.aws_call))
        on_failure(read_verdict, "ReadVerdict", "VerdictUnreadable")

        # ---- 5a. accepted: record the approved model, notify, succeed
        copy_verdict = tasks.CallAwsService(
            self, "CopyVerdictToModels", service="s3", action="copyObject",
            parameters={"Bucket": bucket_name, "CopySource": sfn.JsonPath.string_at("$.paths.verdict_source"),
                        "Key": sfn.JsonPath.string_at("$.paths.model_verdict_key")},
            iam_resources=[bucket.arn_for_objects(f"{MODELS_PREFIX}*")], iam_action="s3:PutObject",
            additional_iam_statements=[iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{RUNS_PREFIX}*/verdict.json")])],
            result_path=sfn.JsonPath.DISCARD, task_timeout=sfn.Timeout.duration(timeouts.aws_call))
        on_failure(copy_verdict, "CopyVerdictToModels", "ApprovalNotRecorded")
        describe_model = sfn.Pass(self, "DescribeApprovedModel", result_path="$.approval", parameters={
            "run_id.$": "$.run.run_id", "model.$": "$.paths.model_uri", "checkpoints.$": "$.paths.checkpoints_uri",
            "verdict.$": "$.verdict.report", "execution.$": "$$.Execution.Id", "approved_at.$": "$$.State.EnteredTime",
        })
        publish_model = tasks.CallAwsService(
            self, "PublishApprovedModel", service="ssm", action="putParameter",
            parameters={"Name": self.approved_model_parameter, "Type": "String", "Overwrite": True,
                        "Value": sfn.JsonPath.json_to_string(sfn.JsonPath.object_at("$.approval")),
                        "Description": "The model the training pipeline approved last (JSON)"},
            iam_resources=[parameter_arn], iam_action="ssm:PutParameter", result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(timeouts.aws_call))
        on_failure(publish_model, "PublishApprovedModel", "ApprovalNotRecorded")
        notify_approved = tasks.SnsPublish(
            self, "NotifyApproved", topic=topic, result_path=sfn.JsonPath.DISCARD,
            subject=f"EFA training {environment}: model approved",
            message=sfn.TaskInput.from_object({
                "environment": environment, "outcome": "APPROVED", "run_id": sfn.JsonPath.string_at("$.run.run_id"),
                "model": sfn.JsonPath.string_at("$.paths.model_uri"),
                "verdict": sfn.JsonPath.object_at("$.verdict.report"),
                "parameter": self.approved_model_parameter, "execution": sfn.JsonPath.execution_id,
            }),
            task_timeout=sfn.Timeout.duration(timeouts.aws_call))
        notify_approved.add_catch(sfn.Fail(self, "ApprovedButNotNotified", error="NotificationFailed",
                                           cause="The model was approved and recorded, but the alerts topic "
                                                 "could not be notified"),
                                  result_path="$.notification_error")
        succeeded = sfn.Succeed(self, "RunSucceeded")

        # ---- 5b. rejected: notify, fail with ValidationFailed
        rejected = sfn.Fail(self, "ValidationFailed", error="ValidationFailed", cause_path=sfn.JsonPath.format(
            "{} = {} against baseline {}: relative delta {} is beyond the tolerance {}",
            *(sfn.JsonPath.string_at(f"$.verdict.report.{k}") for k in
              ("metric", "value", "baseline", "relative_delta", "tolerance"))))
        notify_rejected = tasks.SnsPublish(
            self, "NotifyRejected", topic=topic, result_path=sfn.JsonPath.DISCARD,
            subject=f"EFA training {environment}: validation failed",
            message=sfn.TaskInput.from_object({
                "environment": environment, "outcome": "REJECTED", "run_id": sfn.JsonPath.string_at("$.run.run_id"),
                "verdict": sfn.JsonPath.object_at("$.verdict.report"), "execution": sfn.JsonPath.execution_id,
            }),
            task_timeout=sfn.Timeout.duration(timeouts.aws_call))
        notify_rejected.add_catch(rejected, result_path="$.notification_error")

        malformed = sfn.Pass(self, "OnMalformedVerdict", parameters={
            "run.$": "$.run",
            "failure": {"state": "ReadVerdict", "error": "VerdictMalformed", "detail": "VerdictMalformed",
                        "cause.$": "States.JsonToString($.verdict.report)"},
        })
        passed = "$.verdict.report.passed"
        verdict_choice = (
            sfn.Choice(self, "IsModelAccepted")
            .when(sfn.Condition.and_(sfn.Condition.is_present(passed), sfn.Condition.is_boolean(passed),
                                     sfn.Condition.boolean_equals(passed, True)),
                  copy_verdict.next(describe_model).next(publish_model).next(notify_approved).next(succeeded))
            .when(sfn.Condition.and_(sfn.Condition.is_present(passed), sfn.Condition.is_boolean(passed)),
                  notify_rejected.next(rejected))
            .otherwise(malformed.next(notify_failure))
        )

        validated.next(prepare)
        definition = sfn.Chain.start(validation_start)
        prepare.next(sanity).next(train).next(validate).next(read_verdict).next(verdict_choice)

        self.log_group = logs.LogGroup(self, "ExecutionLogs", retention=log_retention, removal_policy=removal_policy)
        self.state_machine = sfn.StateMachine(
            self, "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            comment=f"EFA training pipeline ({environment}): validate input, sanity check, train, validate, approve",
            timeout=cdk.Duration.days(7),
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        )
        runner.grant(self.state_machine)
        if getattr(topic, "master_key", None) is not None:  # an encrypted topic: publishing needs its key
            topic.master_key.grant(self.state_machine, "kms:Decrypt", "kms:GenerateDataKey")
        self._acknowledge()

    def _acknowledge(self) -> None:
        """cdk-nag: the one wildcard finding that belongs to the state machine itself (bucket and job
        wildcards are acknowledged where their resources are named: PipelineStack, the job runner)."""
        acknowledge(self.state_machine.role, "AwsSolutions-IAM5[Resource::*]",
                    "X-Ray (PutTraceSegments, PutTelemetryRecords, GetSampling*) and CloudWatch Logs delivery "
                    "(logs:CreateLogDelivery ...) allow no resource-level permissions; nor does the job runner's "
                    "status polling (batch:DescribeJobs)")


def acknowledge(scope: Construct, finding: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (`RuleId[Finding]`) on the policy of `scope` (a role) or on `scope`."""
    policy = scope.node.try_find_child("DefaultPolicy")
    cdk.Validations.of(policy or scope).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))
