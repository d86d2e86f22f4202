"""The environment's SageMaker managed MLflow tracking server (constructs/storage/tracking.py), alone in a bare stack:
named by the environment (its one create-only property, so a redeploy never replaces it), artifacts under the data
bucket's mlflow/ prefix, a role SageMaker assumes with that prefix only, no automatic registration; and the jobs' side:
the ARN as their tracking URI and the MLflow actions on that server only."""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3
from aws_cdk.assertions import Match, Template

from config import load_config
from constructs.storage.tracking import CLIENT_ACTIONS, TrackingServer, grant_tracking, tracking_uri
from tests.synthesis import CDK_JSON_CONTEXT


def _server(removal: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY) -> Template:
    stack = cdk.Stack()
    bucket = s3.Bucket(stack, "Data")
    TrackingServer(stack, "Tracking", environment="dev", bucket=bucket, size="medium", removal_policy=removal)
    return Template.from_stack(stack)


def test_the_server_is_named_by_the_environment_and_keeps_artifacts_in_the_data_bucket():
    # AWS::SageMaker::MlflowTrackingServer: TrackingServerName "Update requires: Replacement", the size "No
    # interruption" (CloudFormation template reference): the name is fixed by the environment.
    _server().has_resource_properties(
        "AWS::SageMaker::MlflowTrackingServer",
        {
            "TrackingServerName": "efa-training-dev",
            "TrackingServerSize": "Medium",
            "AutomaticModelRegistration": False,  # the pipeline registers approved models itself
            "ArtifactStoreUri": {"Fn::Join": ["", ["s3://", {"Ref": Match.any_value()}, "/mlflow/"]]},
        },
    )


def test_the_servers_role_is_sagemakers_with_the_mlflow_prefix_only():
    # SageMaker developer guide, "Set up IAM permissions for MLflow": trusted by sagemaker.amazonaws.com.
    template = _server()
    (role,) = template.find_resources("AWS::IAM::Role").values()
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "sagemaker.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    (policy,) = template.find_resources("AWS::IAM::Policy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    objects = next(s for s in statements if "s3:PutObject" in s["Action"])
    assert objects["Resource"]["Fn::Join"][1][-1] == "/mlflow/*"
    listing = next(s for s in statements if s["Action"] == "s3:ListBucket")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["mlflow/*"]}}


def test_the_servers_trust_has_no_condition_sagemaker_is_not_documented_to_meet():
    # SageMaker's "Cross-service confused deputy prevention" has examples for Edge Manager, Images, Inference, Batch
    # Transform, Marketplace, Neo, Pipelines, Processing, Studio and Training Jobs, none for MLflow: a condition key
    # SageMaker does not send would deny its AssumeRole and roll the Storage stack back at CreateMlflowTrackingServer.
    (role,) = _server().find_resources("AWS::IAM::Role").values()
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert "Condition" not in trust


def test_the_server_goes_with_the_data_unless_the_data_is_kept():
    template = _server(cdk.RemovalPolicy.RETAIN)
    template.has_resource("AWS::SageMaker::MlflowTrackingServer", {"DeletionPolicy": "Retain"})


def test_jobs_track_to_the_servers_arn_and_may_call_it_only():
    config = load_config({**CDK_JSON_CONTEXT, "env": "dev", "tracking_server": "small"})
    stack = cdk.Stack(env=cdk.Environment(account="123456789012", region="us-east-1"))
    role = iam.Role(stack, "Jobs", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    grant_tracking(role, config)
    # The resource type's ARN format (Service Authorization Reference, "Amazon SageMaker with MLflow").
    arn = [
        "arn:",
        {"Ref": "AWS::Partition"},
        ":sagemaker:us-east-1:123456789012:mlflow-tracking-server/efa-training-dev",
    ]
    assert stack.resolve(tracking_uri(stack, config)) == {"Fn::Join": ["", arn]}
    (policy,) = Template.from_stack(stack).find_resources("AWS::IAM::Policy").values()
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert sorted(statement["Action"]) == sorted(CLIENT_ACTIONS)
    assert stack.resolve(statement["Resource"]) == stack.resolve(tracking_uri(stack, config))


def test_a_url_needs_no_grant_and_is_the_jobs_uri():
    config = load_config({**CDK_JSON_CONTEXT, "env": "dev", "tracking_uri": "https://mlflow.example.internal"})
    stack = cdk.Stack()
    role = iam.Role(stack, "Jobs", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
    grant_tracking(role, config)
    assert tracking_uri(stack, config) == "https://mlflow.example.internal"
    assert Template.from_stack(stack).find_resources("AWS::IAM::Policy") == {}
