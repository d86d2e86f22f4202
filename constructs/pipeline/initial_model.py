"""Incremental training: which model a run starts from, resolved before the run is claimed or any job submitted.

`init_from` (contracts/run.py): empty, from scratch; "approved", the newest version of the run's workload in the
SageMaker Model Registry (status Approved, group efa-training-<env>-<workload>: model_registry.py registers each
approved run there), whose run id then names the record read; or a run id, that run's approval record
(its item's approval in the runs table, written once when it was approved, where no job can write:
approval_record.py). The block adds to `$.run`:
  init_run: the initial model's run id, or contracts.run.NO_INITIAL_MODEL (the train job's --init-from),
  baseline: where the run gave none, the initial model's own verdict value; from scratch, "none" where no model was
  ever approved (the environment's first run: its own metric becomes the baseline), else the run is refused.
A missing model fails the run (`NoApprovedModel`, `ModelNotApproved`) through the failure path, before any
instance starts; the reads retry throttling and 5xx like the pipeline's other calls.
"""

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from config.layout import RUN_APPROVAL, RUNS_TABLE_KEY
from constructs import Construct
from constructs.pipeline.aws_calls import CALL_TIMEOUT, DYNAMODB_TRANSIENT, retry_transient
from constructs.pipeline.failure_path import FailurePath
from constructs.pipeline.input_checks import INVALID, MISSING
from constructs.pipeline.model_registry import GROUP_PREFIX, SAGEMAKER_TRANSIENT, group_name
from contracts.run import INIT_FROM_APPROVED, NO_INITIAL_MODEL

C, J = sfn.Condition, sfn.JsonPath
NO_APPROVED_MODEL = "NoApprovedModel"
MODEL_NOT_APPROVED = "ModelNotApproved"


class InitialModel:
    """`start` takes the validated input ({"run"}); every path that goes on ends at `chosen`."""

    def __init__(
        self,
        scope: Construct,
        *,
        table: dynamodb.ITable,
        failures: FailurePath,
        environment: str,
        supported: bool = True,
    ) -> None:
        """`supported`: whether this backend's jobs can read another run's checkpoints (SageMaker with its dataset
        in S3 cannot: the checkpoints of other runs are on the file system only)."""
        self._scope, self._failures, self._environment = scope, failures, environment
        self.chosen = sfn.Pass(scope, "InitialModelChosen")
        scratch = sfn.Pass.jsonata(
            scope,
            "FromScratch",
            outputs={"run": f"{{% $merge([$states.input.run, {{'init_run': '{NO_INITIAL_MODEL}'}}]) %}}"},
        )
        use = self._use_initial_model()
        # From scratch with no baseline: only the environment's first run (no model approved yet).
        no_baseline = C.and_(C.is_string("$.run.baseline"), C.string_equals("$.run.baseline", MISSING))
        from_scratch = (
            sfn.Choice(scope, "IsBaselineGiven").when(no_baseline, self._baseline_of_approved()).otherwise(scratch)
        )
        choose = sfn.Choice(scope, "ChooseInitialModel").when(C.string_equals("$.run.init_from", ""), from_scratch)
        if not supported:
            choose.when(
                C.is_present("$.run.init_from"),
                sfn.Fail(
                    scope,
                    "InitialModelUnsupported",
                    error=INVALID,
                    cause="init_from is not valid here; expected empty: this environment's SageMaker jobs read their "
                    "data from S3 and cannot reach other runs' checkpoints (set sagemaker_data_source=fsx)",
                ),
            )
        named = self._named(table, use)
        choose.when(C.string_equals("$.run.init_from", INIT_FROM_APPROVED), self._approved(named))
        choose.otherwise(named)
        scratch.next(self.chosen)
        self.start = choose

    def _approved(self, named: sfn.IChainable) -> tasks.CallAwsService:
        """The newest approved version of the run's workload in the registry (ListModelPackages, newest first), whose
        run id (its CustomerMetadataProperties, DescribeModelPackage) names the approval record `named` reads. None
        there: NoApprovedModel, before anything starts; a registry that cannot be read after its retries alike."""
        scope, stack = self._scope, cdk.Stack.of(self._scope)
        listed = self._list_approved("FindApprovedVersion")
        packages = stack.format_arn(
            service="sagemaker", resource="model-package", resource_name=f"{GROUP_PREFIX}{self._environment}-*"
        )
        described = tasks.CallAwsService(
            scope,
            "DescribeApprovedVersion",
            service="sagemaker",
            action="describeModelPackage",
            parameters={"ModelPackageName.$": "$.registry_lookup.arn"},
            iam_action="sagemaker:DescribeModelPackage",
            iam_resources=[packages],
            # The whole answer, not a selector: a version without the run id (registered by hand) would make a
            # ResultSelector path fail with States.Runtime, which no Catch takes (Step Functions, "Error names").
            result_path="$.registry_lookup.described",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        for call in (listed, described):
            retry_transient(call, SAGEMAKER_TRANSIENT)
            self._failures.catch(call, call.node.id, NO_APPROVED_MODEL)
        none = self._no_approved_version()
        newest = sfn.Pass.jsonata(  # one value: a JSONPath index would be a list in some evaluators
            scope,
            "TakeNewestVersion",
            outputs={
                "run": "{% $states.input.run %}",
                "registry_lookup": {"arn": "{% $states.input.registry_lookup.versions[0].ModelPackageArn %}"},
            },
        )
        newest.next(described)
        listed.next(
            sfn.Choice(scope, "IsAnyVersionApproved")
            .when(C.is_present("$.registry_lookup.versions[0]"), newest)
            .otherwise(none)
        )
        take = sfn.Pass.jsonata(
            scope,
            "NameApprovedRun",
            outputs={
                "run": "{% $merge([$states.input.run, "
                "{'init_from': $states.input.registry_lookup.described.CustomerMetadataProperties.run_id}]) %}"
            },
        )
        run_id = "$.registry_lookup.described.CustomerMetadataProperties.run_id"
        described.next(
            sfn.Choice(scope, "IsVersionOfARun")
            .when(C.and_(C.is_present(run_id), C.is_string(run_id)), take)
            .otherwise(self._unnamed_version())
        )
        take.next(named)
        return listed

    def _unnamed_version(self) -> sfn.Pass:
        """An approved version that names no run (registered by other means): the run fails as ModelNotApproved."""
        unnamed = sfn.Pass(
            self._scope,
            "OnApprovedVersionUnnamed",
            parameters={
                "run.$": "$.run",
                "failure": {
                    "state": "DescribeApprovedVersion",
                    "error": MODEL_NOT_APPROVED,
                    "detail": "ApprovedVersionUnnamed",
                    "cause.$": "States.Format('the newest approved version {} names no run_id in its metadata', "
                    "$.registry_lookup.arn)",
                },
            },
        )
        unnamed.next(self._failures.notify)
        return unnamed

    def _list_approved(self, id_: str) -> tasks.CallAwsService:
        """ListModelPackages: the newest approved version of the run's workload, in `$.registry_lookup.versions`
        (an empty list where none is, or no group: the name is a filter, API_ListModelPackages)."""
        return tasks.CallAwsService(
            self._scope,
            id_,
            service="sagemaker",
            action="listModelPackages",
            iam_action="sagemaker:ListModelPackages",
            parameters={
                "ModelPackageGroupName.$": group_name(self._environment),
                "ModelApprovalStatus": "Approved",
                # the default lists unversioned packages only (API_ListModelPackages, ModelPackageType)
                "ModelPackageType": "Versioned",
                "SortBy": "CreationTime",
                "SortOrder": "Descending",
                "MaxResults": 1,
            },
            iam_resources=["*"],  # Service Authorization Reference, SageMaker: List* have no resource types
            result_selector={"versions.$": "$.ModelPackageSummaryList"},
            result_path="$.registry_lookup",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )

    def _no_approved_version(self) -> sfn.Pass:
        """No approved version of the run's workload in the registry: the run fails as NoApprovedModel."""
        none = sfn.Pass(
            self._scope,
            "OnNoApprovedVersion",
            parameters={
                "run.$": "$.run",
                "failure": {
                    "state": "FindApprovedVersion",
                    "error": NO_APPROVED_MODEL,
                    "detail": "NoApprovedVersion",
                    "cause.$": f"States.Format('no approved version in the model package group {{}}', "
                    f"{group_name(self._environment)})",
                },
            },
        )
        none.next(self._failures.notify)
        return none

    def _baseline_of_approved(self) -> tasks.CallAwsService:
        """A run from scratch that gave no baseline is its workload's first model or nothing: where none was ever
        approved (no approved version in the registry), validation with `--baseline none` makes the run's own metric
        the baseline (approved only when finite: validate.py); where one was, the run is refused, since an approved
        model's metric on its own data is no bar for this run's data."""
        scope = self._scope
        first = sfn.Pass.jsonata(
            scope,
            "FirstBaseline",
            outputs={
                "run": f"{{% $merge([$states.input.run, {{'init_run': '{NO_INITIAL_MODEL}', 'baseline': 'none'}}]) %}}"
            },
        )
        first.next(self.chosen)
        listed = self._list_approved("FindApprovedModel")
        retry_transient(listed, SAGEMAKER_TRANSIENT)
        self._failures.catch(listed, "FindApprovedModel", NO_APPROVED_MODEL)
        required = sfn.Fail(
            scope,
            "BaselineRequired",
            error=INVALID,
            cause="baseline is missing; expected a number: this workload has an approved model in this environment, "
            "so only its first run may leave the baseline out (or give init_from to start from, and be held to, "
            "that model)",
        )
        listed.next(
            sfn.Choice(scope, "IsFirstModel")
            .when(C.is_present("$.registry_lookup.versions[0]"), required)
            .otherwise(first)
        )
        return listed

    def _named(self, table: dynamodb.ITable, then: sfn.IChainable) -> tasks.DynamoGetItem:
        """A named run's approval: the attribute RUN_APPROVAL of its item in the runs table, where only the pipeline
        writes (approval_record.py; a job could write models/<run_id>/approval.json itself), read strongly consistent
        into `$.initial.approval`. None there: ModelNotApproved; a table that cannot be read after its retries alike."""
        scope = self._scope
        read = tasks.DynamoGetItem(
            scope,
            "GetNamedApproval",
            table=table,
            key={RUNS_TABLE_KEY: tasks.DynamoAttributeValue.from_string(J.string_at("$.run.init_from"))},
            consistent_read=True,
            result_path="$.initial_item",
            task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
        )
        retry_transient(read, DYNAMODB_TRANSIENT)
        self._failures.catch(read, "GetNamedApproval", MODEL_NOT_APPROVED)
        recorded = f"$.initial_item.Item.{RUN_APPROVAL}.S"
        take = sfn.Pass(
            scope,
            "ReadNamedApproval",
            parameters={"run.$": "$.run", "initial": {"approval.$": f"States.StringToJson({recorded})"}},
        )
        never = sfn.Pass(
            scope,
            "OnNamedRunNotApproved",
            parameters={
                "run.$": "$.run",
                "failure": {
                    "state": "GetNamedApproval",
                    "error": MODEL_NOT_APPROVED,
                    "detail": "NoApprovalRecorded",
                    "cause": J.format(
                        "init_from {} names no approved run: the runs table records no approval for it; give an "
                        "approved run id, approved, or leave init_from out",
                        J.string_at("$.run.init_from"),
                    ),
                },
            },
        )
        never.next(self._failures.notify)
        read.next(
            sfn.Choice(scope, "IsNamedRunApproved").when(C.is_present(recorded), take.next(then)).otherwise(never)
        )
        return read

    def _use_initial_model(self) -> sfn.Choice:
        """The record must name a run and carry a numeric verdict value; the run takes its id, and its value as the
        baseline unless the run gave one."""
        use = sfn.Pass.jsonata(
            self._scope,
            "UseInitialModel",
            outputs={
                "run": "{% $merge([$states.input.run, {'init_run': $states.input.initial.approval.run_id, "
                f"'baseline': $states.input.run.baseline = '{MISSING}' ? $states.input.initial.approval.verdict.value "
                ": $states.input.run.baseline}]) %}"
            },
        )
        use.next(self.chosen)
        unreadable = self._unreadable("ChooseInitialModel", "InitialModelUnreadable")
        return (
            sfn.Choice(self._scope, "IsInitialModelUsable")
            .when(
                C.and_(
                    C.is_present("$.initial.approval.run_id"),
                    C.is_string("$.initial.approval.run_id"),
                    C.is_present("$.initial.approval.verdict.value"),
                    C.is_numeric("$.initial.approval.verdict.value"),
                ),
                use,
            )
            .otherwise(unreadable)
        )

    def _unreadable(self, state: str, detail: str) -> sfn.Pass:
        """An approval record without a run id or a numeric verdict: the run fails as ModelNotApproved."""
        unreadable = sfn.Pass(
            self._scope,
            f"On{detail}",
            parameters={
                "run.$": "$.run",
                "failure": {
                    "state": state,
                    "error": MODEL_NOT_APPROVED,
                    "detail": detail,
                    "cause.$": "States.JsonToString($.initial)",
                },
            },
        )
        unreadable.next(self._failures.notify)
        return unreadable
