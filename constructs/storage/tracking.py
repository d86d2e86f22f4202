"""Where every run is tracked in AWS: the environment's MLflow server, its address in the jobs and their permission.

With config `tracking_server` (small, medium or large) the storage stack creates a SageMaker managed MLflow tracking
server (AWS::SageMaker::MlflowTrackingServer; SageMaker developer guide, "MLflow Tracking Servers") named
`efa-training-<env>`, its artifacts under the data bucket's mlflow/ prefix. The jobs reach it by its ARN as
MLFLOW_TRACKING_URI: the `sagemaker-mlflow` plugin in the images resolves the ARN to the server's endpoint and signs
every request with the job's role (SigV4), so no password exists anywhere; the roles get the `sagemaker-mlflow`
actions the platform's tracker and validation call, on this server only (Service Authorization Reference, "Amazon
SageMaker with MLflow"). With config `tracking_uri` instead, the jobs track to that URL (a server you run).

Day two: TrackingServerName is the one create-only property (CloudFormation, AWS::SageMaker::MlflowTrackingServer:
"Update requires: Replacement"), and it is fixed by the environment's name, so a redeploy never replaces the server
and its runs; a size change is "No interruption". The consumers build the ARN from the name (no cross-stack export
to pin). The server is removed with the data on `cdk destroy` unless `retain_data` (config) keeps it.
"""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sagemaker as sagemaker

from config import EnvironmentConfig
from config.environment import TRACKING_SERVER_SIZES
from config.layout import tracking_server_name
from constructs import Construct, IConstruct
from constructs.nag import acknowledge

ARTIFACTS_PREFIX = "mlflow/"
# What the tracker (runtime/tracking.py: run_of, log_batch, set_terminated, job tags) and the validation's model
# registration call, as MLflow REST operations: the actions of the same names (Service Authorization Reference).
CLIENT_ACTIONS = tuple(
    f"sagemaker-mlflow:{action}"
    for action in (
        "GetExperimentByName",
        "CreateExperiment",
        "SearchRuns",
        "CreateRun",
        "GetRun",
        "UpdateRun",
        "LogBatch",
        "SetTag",
        "GetRegisteredModel",
        "CreateRegisteredModel",
        "SearchModelVersions",
        "CreateModelVersion",
    )
)


def server_arn(scope: IConstruct, environment: str) -> str:
    """The server's ARN from `scope`'s stack: arn:<partition>:sagemaker:<region>:<account>:mlflow-tracking-server/
    <name> (the resource type's ARN format, Service Authorization Reference)."""
    return cdk.Stack.of(scope).format_arn(
        service="sagemaker", resource="mlflow-tracking-server", resource_name=tracking_server_name(environment)
    )


def tracking_uri(scope: Construct, config: EnvironmentConfig) -> str:
    """MLFLOW_TRACKING_URI for the environment's jobs: the managed server's ARN, the configured URL, or "" (none)."""
    return server_arn(scope, config.name) if config.tracking_server else config.tracking_uri


def grant_tracking(role: iam.IRole, config: EnvironmentConfig) -> None:
    """The jobs' role may track to the managed server (nothing to grant for a URL: it takes no AWS identity)."""
    if config.tracking_server:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=list(CLIENT_ACTIONS), resources=[server_arn(role, config.name)])
        )


class TrackingServer(Construct):
    """The managed MLflow server, and the role SageMaker assumes to keep its artifacts in the data bucket."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        environment: str,
        bucket: s3.IBucket,
        size: str,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id_)
        # SageMaker developer guide, "Set up IAM permissions for MLflow": trusted by sagemaker.amazonaws.com, with
        # S3 access to the artifact store; here its prefix only. No model registry rights: automatic registration
        # stays off (the pipeline registers approved models itself, constructs/pipeline/model_registry.py).
        self.role = iam.Role(
            self,
            "Role",
            # The documented trust, with no aws:SourceAccount/aws:SourceArn condition: SageMaker's "Cross-service
            # confused deputy prevention" gives examples per feature (Edge Manager ... Training Jobs) and none for
            # MLflow, so nothing says the key is sent when the server assumes this role; a condition it lacks would
            # deny the AssumeRole and fail CreateMlflowTrackingServer (the Storage stack rolls back).
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="SageMaker managed MLflow: the tracking server's artifacts in the data bucket",
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{ARTIFACTS_PREFIX}*"]}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[bucket.arn_for_objects(f"{ARTIFACTS_PREFIX}*")],
            )
        )
        bucket_id = cdk.Stack.of(self).get_logical_id(bucket.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            self.role,
            f"AwsSolutions-IAM5[Resource::<{bucket_id}.Arn>/{ARTIFACTS_PREFIX}*]",
            "The tracking server keeps its artifacts under the bucket's mlflow/ prefix, named by MLflow at run time",
        )
        # L1: aws-cdk-lib has no L2 for the tracking server.
        self.server = sagemaker.CfnMlflowTrackingServer(
            self,
            "Server",
            tracking_server_name=tracking_server_name(environment),
            artifact_store_uri=f"s3://{bucket.bucket_name}/{ARTIFACTS_PREFIX}",
            role_arn=self.role.role_arn,
            tracking_server_size=TRACKING_SERVER_SIZES[size],
            automatic_model_registration=False,
        )
        self.server.apply_removal_policy(removal_policy)
        # The role's policy exists before SageMaker checks the artifact store with it.
        self.server.node.add_dependency(self.role)
