"""An approved model registered where deployment tools look: the SageMaker Model Registry.

After the approval is recorded and published (verdict.py), the model becomes a version in the model package group
`efa-training-<env>-<workload>` (SageMaker developer guide, "Model Registration Deployment with Model Registry":
a group per model, a version per training run), with approval status Approved and the model's S3 folder and the
verdict's figures as its metadata (CreateModelPackage: ModelApprovalStatus, CustomerMetadataProperties; no
InferenceSpecification, which names a serving image the platform does not choose). No SourceUri: the API reference
takes an ARN there ("If you want to clone a model package, set it to the model package Amazon Resource Name (ARN).
If you want to register a model, set it to the model ARN."), and the platform creates no SageMaker model.
The group is created on the first approval (ListModelPackageGroups, then CreateModelPackageGroup), not by the
stack: a group that holds versions outlives `cdk destroy` without failing it, and a redeploy never replaces it.
A rejected model is not registered: it is never copied to models/, so the group holds only what a deployment may take;
its verdict stays in runs/<run_id>/verdict.json. The call is idempotent per run (ClientToken: the run id's MD5), so a
retried or resumed run does not add a second version. A registry that cannot be reached after its retries never
undoes the approval: the run succeeds, and `$.registry` (in the notification and `describe`) says why it is missing.
"""

import aws_cdk as cdk
import aws_cdk.aws_stepfunctions as sfn
import aws_cdk.aws_stepfunctions_tasks as tasks

from constructs import Construct, IConstruct
from constructs.nag import acknowledge, shown_arn
from constructs.pipeline.aws_calls import CALL_TIMEOUT, retry_transient

J = sfn.JsonPath
GROUP_PREFIX = "efa-training-"  # + <env>-<workload>: at most 13 + 20 + 1 + 24 characters, within SageMaker's 63
# Throttling and 5xx of SageMaker's API have no modeled exception: the service's base one (aws_calls.py).
SAGEMAKER_TRANSIENT = ("SageMaker.SageMakerException", "States.Timeout")
VERDICT_METADATA = ("metric", "value", "baseline", "relative_delta", "tolerance")


def group_name(environment: str) -> str:
    """States.Format: the run's model package group."""
    return f"States.Format('{GROUP_PREFIX}{environment}-{{}}', $.run.workload)"


def register_approved(scope: Construct, environment: str) -> tuple[sfn.State, sfn.INextable]:
    """(first, last): `$.registry` set to {group, model_package, status} or, where it failed, {group, error, cause}."""
    stack = cdk.Stack.of(scope)
    names = f"{GROUP_PREFIX}{environment}-*"
    groups = stack.format_arn(service="sagemaker", resource="model-package-group", resource_name=names)
    packages = stack.format_arn(service="sagemaker", resource="model-package", resource_name=names)
    group = {"ModelPackageGroupName.$": group_name(environment)}
    name = f"'{GROUP_PREFIX}{environment}-' & $states.input.run.workload"
    found = tasks.CallAwsService.jsonata(  # a list, not a describe: no expected failure in the history or `watch`
        scope,
        "FindModelGroup",
        service="sagemaker",
        action="listModelPackageGroups",
        parameters={"NameContains": f"{{% {name} %}}", "MaxResults": 100},
        iam_resources=["*"],  # Service Authorization Reference, SageMaker: List* have no resource types
        outputs=(
            "{% $merge([$states.input, {'registry_group_found': "
            f"({name}) in $states.result.ModelPackageGroupSummaryList.ModelPackageGroupName}}]) %}}"
        ),
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(found, SAGEMAKER_TRANSIENT)
    created = _call(
        scope,
        "CreateModelGroup",
        "createModelPackageGroup",
        {**group, "ModelPackageGroupDescription": f"Models the {environment} training pipeline approved"},
        [groups],
    )
    retry_transient(created, SAGEMAKER_TRANSIENT)
    metadata = {f"{name}.$": f"States.Format('{{}}', $.verdict.report.{name})" for name in VERDICT_METADATA}
    registered = tasks.CallAwsService(
        scope,
        "RegisterApprovedModel",
        service="sagemaker",
        action="createModelPackage",
        parameters={
            **group,
            "ModelApprovalStatus": "Approved",
            "ModelPackageDescription.$": "States.Format('Run {} approved by the training pipeline', $.run.run_id)",
            "CustomerMetadataProperties": {  # SourceUri takes a model's or a model package's ARN, not a folder
                "run_id.$": "$.run.run_id",
                "model.$": "$.paths.model_uri",
                "execution.$": "$$.Execution.Id",
                "checkpoints.$": "$.paths.checkpoints_uri",
                **metadata,
            },
            "ClientToken.$": "States.Hash($.run.run_id, 'MD5')",
        },
        iam_resources=[packages, groups],
        iam_action="sagemaker:CreateModelPackage",
        result_selector={"model_package.$": "$.ModelPackageArn"},
        result_path="$.registry",
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
    retry_transient(registered, SAGEMAKER_TRANSIENT)
    recorded = sfn.Pass(
        scope,
        "ModelRegistered",
        parameters={
            "group.$": group_name(environment),
            "model_package.$": "$.registry.model_package",
            "status": "Approved",
        },  # fmt: skip
        result_path="$.registry",
    )
    done = sfn.Pass(scope, "RegistryChecked")
    missed = sfn.Pass(
        scope,
        "ApprovedButNotRegistered",
        parameters={
            "group.$": group_name(environment),
            "error.$": "$.registry_error.Error",
            "cause.$": "$.registry_error.Cause",
        },
        result_path="$.registry",
    )
    found.add_catch(created, errors=["States.ALL"], outputs="{% $states.input %}")  # unlisted: create it
    there = sfn.Choice(scope, "IsModelGroupThere").when(
        sfn.Condition.boolean_equals("$.registry_group_found", True), registered
    )
    created.add_catch(registered, errors=["States.ALL"], result_path=J.DISCARD)  # made meanwhile: register anyway
    registered.add_catch(missed, errors=["States.ALL"], result_path="$.registry_error")
    found.next(there.otherwise(created))
    created.next(registered)
    registered.next(recorded).next(done)
    missed.next(done)
    return found, done


def acknowledge_registry(role: IConstruct, environment: str) -> None:
    """cdk-nag: the environment's groups and their versions, whose names are chosen by the runs' workloads."""
    for resource in ("model-package-group", "model-package"):
        arn = shown_arn(cdk.Stack.of(role), "sagemaker", f"{resource}/{GROUP_PREFIX}{environment}-*")
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::{arn}]",
            "The pipeline registers approved models in a model package group per workload of this environment, "
            "created at the first approval, and each version's name is SageMaker's (<group>/<version>)",
        )


def _call(scope: Construct, id_: str, action: str, parameters: dict, resources: list[str]) -> tasks.CallAwsService:
    return tasks.CallAwsService(
        scope,
        id_,
        service="sagemaker",
        action=action,
        parameters=parameters,
        iam_resources=resources,
        result_path=J.DISCARD,
        task_timeout=sfn.Timeout.duration(CALL_TIMEOUT),
    )
