"""The training pipeline: validate the run, sanity-check the nodes, train, validate, approve or reject.

One Step Functions state machine (JSONPath, one JSONata state for patterns). Its input is documented in
docs/pipeline.md and defined by the run contract (contracts/run.py), which also gives every stage's timeout.
Every job runs through a `JobRunner` (the seam to Batch or EKS); every Task has a timeout and a Catch that
notifies the alerts topic before failing; every AWS call of the pipeline's own retries throttling and 5xx.
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
from contracts.run import execution_seconds, stages, train_state_seconds
from constructs.pipeline_aws_calls import CALL_TIMEOUT, NOTIFICATION_ERRORS, retry_transient
from constructs.pipeline_input import input_validation
from constructs.pipeline_jobs import JobRunner
from constructs.pipeline_run_claim import PRECONDITION_FAILED, RunClaim
from constructs.pipeline_train_attempt import ATTEMPT_FAILED, classified_training


@dataclass(frozen=True)
class TrainingRetry:
    """Step Functions Retry of a failed training job; each attempt resumes from the last checkpoint."""
    max_attempts: int = 3  # retries after the first attempt
    interval: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(2))
    backoff_rate: float = 2.0
    max_delay: cdk.Duration = field(default_factory=lambda: cdk.Duration.minutes(30))


SANITY_RETRIES = 1  # one more submission (fresh placement) after a failed sanity check


class TrainingPipeline(Construct):
    def __init__(self, scope: Construct, id_: str, *, environment: str, max_nodes: int, bucket: s3.IBucket,
                 topic: sns.ITopic, runner: JobRunner, log_retention: logs.RetentionDays,
                 removal_policy: cdk.RemovalPolicy, training_retry: TrainingRetry | None = None,
                 sanity_retry_interval: cdk.Duration | None = None, train_attempt_hours: int = 72) -> None:
        super().__init__(scope, id_)
        self.training_retry = retry = training_retry or TrainingRetry()
        # Each stage's timeouts come from the run contract; the Batch job definitions read the same table.
        stage = stages(train_attempt_hours)
        stack = cdk.Stack.of(self)
        # A fixed name, so that the role may describe this state machine's executions (the holder of a run
        # being resumed) without naming the state machine itself, which would be a circular reference.
        self.state_machine_name = f"{stack.stack_name}-{id_}"[:80]
        execution_arns = stack.format_arn(service="states", resource="execution",
                                          resource_name=f"{self.state_machine_name}:*",
                                          arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME)
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
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(notify_failure, NOTIFICATION_ERRORS)
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

        # ---- 1b. a run id names one run (S3 conditional writes), unless the input asks to resume it
        claim = RunClaim(self, bucket=bucket, execution_arns=execution_arns, on_failure=on_failure,
                         notify_failure=notify_failure)

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
                "approval_key.$": f"States.Format('{MODELS_PREFIX}{{}}/approval.json', $.run.run_id)",
            },
            # Batch may make `max_attempts` attempts inside one training submission: the Train state waits
            # for all of them, each with its queue wait (Task state `TimeoutSecondsPath`:
            # https://docs.aws.amazon.com/step-functions/latest/dg/state-task.html).
            "timeouts": {"train.$": "States.ArrayGetItem(States.Array("
                                    f"{', '.join(map(str, train_state_seconds(train_attempt_hours)))}), "
                                    "$.run.max_attempts)"},
        })

        job_params = {name: f"$.job.{name}" for name in
                      ("run_id", "dataset", "model", "strategy", "max_steps", "checkpoint_every", "seed", "lr",
                       "batch_size", "baseline", "tolerance")}

        # ---- 2. sanity check on the run's nodes; once more (fresh placement) if it fails
        sanity = runner.submit(
            self, "SanityCheck", job="sanity", parameters={"run_id": "$.job.run_id"},
            job_name="States.Format('{}-sanity', $.run.run_id)", nodes="$.run.nodes",
            result_path="$.jobs.sanity", timeout=cdk.Duration.seconds(stage["sanity"].state_seconds()))
        sanity.add_retry(errors=["States.TaskFailed"], max_attempts=SANITY_RETRIES,
                         interval=sanity_retry_interval or cdk.Duration.minutes(1), backoff_rate=1)
        on_failure(sanity, "SanityCheck", "SanityCheckFailed")

        # ---- 3. training; a retry resumes from the run's checkpoints instead of starting over
        train_job = runner.submit(
            self, "TrainJob", job="train", parameters={k: job_params[k] for k in (
                "run_id", "dataset", "model", "strategy", "max_steps", "checkpoint_every", "seed", "lr", "batch_size")},
            job_name="States.Format('{}-train', $.run.run_id)", nodes="$.run.nodes", attempts="$.run.max_attempts",
            result_path="$", timeout="$.timeouts.train")
        # Retried only when the job failed for a reason other than the run itself (its exit code says which).
        train = classified_training(self, "Train", train_job, result_path="$.jobs.train")
        # A rejected request (bad job definition, bad parameters) will not improve on retry.
        train.add_retry(errors=["Batch.ClientException"], max_attempts=0)
        train.add_retry(errors=[ATTEMPT_FAILED], max_attempts=retry.max_attempts, interval=retry.interval,
                        backoff_rate=retry.backoff_rate, max_delay=retry.max_delay, jitter_strategy=sfn.JitterType.FULL)
        on_failure(train, "Train", "TrainingFailed")

        # ---- 4. validation job, then its verdict
        validate = runner.submit(
            self, "Validate", job="validate",
            parameters={k: job_params[k] for k in ("run_id", "dataset", "model", "baseline", "tolerance")},
            job_name="States.Format('{}-validate', $.run.run_id)", result_path="$.jobs.validate",
            timeout=cdk.Duration.seconds(stage["validate"].state_seconds()))
        on_failure(validate, "Validate", "ValidationJobFailed")

        read_verdict = tasks.CallAwsService(
            self, "ReadVerdict", service="s3", action="getObject",
            parameters={"Bucket": bucket_name, "Key": sfn.JsonPath.string_at("$.paths.verdict_key")},
            iam_resources=[bucket.arn_for_objects(f"{RUNS_PREFIX}*/verdict.json")], iam_action="s3:GetObject",
            result_selector={"report": sfn.JsonPath.string_to_json(sfn.JsonPath.string_at("$.Body"))},
            result_path="$.verdict", task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(read_verdict)
        on_failure(read_verdict, "ReadVerdict", "VerdictUnreadable")

        # ---- 5a. accepted: record the approved model, notify, succeed
        copy_verdict = tasks.CallAwsService(
            self, "CopyVerdictToModels", service="s3", action="copyObject",
            parameters={"Bucket": bucket_name, "CopySource": sfn.JsonPath.string_at("$.paths.verdict_source"),
                        "Key": sfn.JsonPath.string_at("$.paths.model_verdict_key")},
            iam_resources=[bucket.arn_for_objects(f"{MODELS_PREFIX}*")], iam_action="s3:PutObject",
            additional_iam_statements=[iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{RUNS_PREFIX}*/verdict.json")])],
            result_path=sfn.JsonPath.DISCARD, task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(copy_verdict)
        on_failure(copy_verdict, "CopyVerdictToModels", "ApprovalNotRecorded")
        describe_model = sfn.Pass(self, "DescribeApprovedModel", result_path="$.approval", parameters={
            "run_id.$": "$.run.run_id", "model.$": "$.paths.model_uri", "checkpoints.$": "$.paths.checkpoints_uri",
            "verdict.$": "$.verdict.report", "execution.$": "$$.Execution.Id", "approved_at.$": "$$.State.EnteredTime",
        })
        # The approval is recorded once per run (If-None-Match: *); a retried step or a resumed run that finds
        # it recorded publishes the recorded one, so the parameter never names a different approval.
        record_approval = tasks.CallAwsService(
            self, "RecordApproval", service="s3", action="putObject",
            parameters={"Bucket": bucket_name, "Key": sfn.JsonPath.string_at("$.paths.approval_key"),
                        "Body": sfn.JsonPath.json_to_string(sfn.JsonPath.object_at("$.approval")),
                        "ContentType": "application/json", "IfNoneMatch": "*"},
            iam_resources=[bucket.arn_for_objects(f"{MODELS_PREFIX}*")], iam_action="s3:PutObject",
            result_path=sfn.JsonPath.DISCARD, task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(record_approval)
        read_approval = tasks.CallAwsService(
            self, "ReadRecordedApproval", service="s3", action="getObject",
            parameters={"Bucket": bucket_name, "Key": sfn.JsonPath.string_at("$.paths.approval_key")},
            iam_resources=[bucket.arn_for_objects(f"{MODELS_PREFIX}*/approval.json")], iam_action="s3:GetObject",
            result_selector={"recorded.$": "States.StringToJson($.Body)"}, result_path="$.recorded",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(read_approval)
        on_failure(read_approval, "ReadRecordedApproval", "ApprovalNotRecorded")
        use_recorded = sfn.Pass(self, "UseRecordedApproval", parameters={
            "run.$": "$.run", "paths.$": "$.paths", "verdict.$": "$.verdict", "approval.$": "$.recorded.recorded"})
        record_approval.add_catch(
            sfn.Choice(self, "IsApprovalRecorded")
            .when(sfn.Condition.string_matches("$.caught.Cause", PRECONDITION_FAILED), read_approval.next(use_recorded))
            .otherwise(sfn.Pass(self, "RecordApprovalFailed", parameters={
                "run.$": "$.run", "failure": {"state": "RecordApproval", "error": "ApprovalNotRecorded",
                                              "detail.$": "$.caught.Error", "cause.$": "$.caught.Cause"}})
                       .next(notify_failure)),
            errors=["S3.S3Exception"], result_path="$.caught")
        on_failure(record_approval, "RecordApproval", "ApprovalNotRecorded")
        publish_model = tasks.CallAwsService(
            self, "PublishApprovedModel", service="ssm", action="putParameter",
            parameters={"Name": self.approved_model_parameter, "Type": "String", "Overwrite": True,
                        "Value": sfn.JsonPath.json_to_string(sfn.JsonPath.object_at("$.approval")),
                        "Description": "The model the training pipeline approved last (JSON)"},
            iam_resources=[parameter_arn], iam_action="ssm:PutParameter", result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(publish_model)
        on_failure(publish_model, "PublishApprovedModel", "ApprovalNotRecorded")
        use_recorded.next(publish_model)
        notify_approved = tasks.SnsPublish(
            self, "NotifyApproved", topic=topic, result_path=sfn.JsonPath.DISCARD,
            subject=f"EFA training {environment}: model approved",
            message=sfn.TaskInput.from_object({
                "environment": environment, "outcome": "APPROVED", "run_id": sfn.JsonPath.string_at("$.run.run_id"),
                "model": sfn.JsonPath.string_at("$.paths.model_uri"),
                "verdict": sfn.JsonPath.object_at("$.verdict.report"),
                "parameter": self.approved_model_parameter, "execution": sfn.JsonPath.execution_id,
            }),
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(notify_approved, NOTIFICATION_ERRORS)
        succeeded = sfn.Succeed(self, "RunSucceeded")
        # The model is approved and recorded: a notification that still fails does not turn the run into a
        # failure (the caught error stays in the execution history).
        notify_approved.add_catch(sfn.Pass(self, "ApprovedButNotNotified").next(succeeded),
                                  result_path="$.notification_error")

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
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT))
        retry_transient(notify_rejected, NOTIFICATION_ERRORS)
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
                  copy_verdict.next(describe_model).next(record_approval).next(publish_model).next(notify_approved)
                  .next(succeeded))
            .when(sfn.Condition.and_(sfn.Condition.is_present(passed), sfn.Condition.is_boolean(passed)),
                  notify_rejected.next(rejected))
            .otherwise(malformed.next(notify_failure))
        )

        validated.next(claim.start)
        claim.claimed.next(prepare)
        definition = sfn.Chain.start(validation_start)
        prepare.next(sanity).next(train).next(validate).next(read_verdict).next(verdict_choice)

        self.log_group = logs.LogGroup(self, "ExecutionLogs", retention=log_retention, removal_policy=removal_policy)
        self.state_machine = sfn.StateMachine(
            self, "StateMachine",
            definition_body=sfn.DefinitionBody.from_chainable(definition),
            comment=f"EFA training pipeline ({environment}): validate input, sanity check, train, validate, approve",
            state_machine_name=self.state_machine_name,
            # Every stage at its longest (the Train state's at the most attempts a run may ask for).
            timeout=cdk.Duration.seconds(execution_seconds(
                train_attempt_hours, sanity_submissions=1 + SANITY_RETRIES, train_submissions=1 + retry.max_attempts,
                train_backoff_seconds=retry.max_attempts * int(retry.max_delay.to_seconds()),
                calls_seconds=3600)),
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
        stack = cdk.Stack.of(self)

        def shown(value: str, pseudo: str) -> str:
            return f"<AWS::{pseudo}>" if cdk.Token.is_unresolved(value) else value
        executions = (f"arn:{shown(stack.partition, 'Partition')}:states:{shown(stack.region, 'Region')}:"
                      f"{shown(stack.account, 'AccountId')}:execution:{self.state_machine_name}:*")
        acknowledge(self.state_machine.role, f"AwsSolutions-IAM5[Resource::{executions}]",
                    "A resumed run describes the execution that holds it (is it still running?); execution "
                    "names are chosen at start, so only this state machine's prefix is fixed")


def acknowledge(scope: Construct, finding: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding (`RuleId[Finding]`) on the policy of `scope` (a role) or on `scope`."""
    policy = scope.node.try_find_child("DefaultPolicy")
    cdk.Validations.of(policy or scope).acknowledge(cdk.Acknowledgment(id=finding, reason=reason))
