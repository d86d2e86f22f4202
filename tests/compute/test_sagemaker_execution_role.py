"""SageMakerExecutionRole alone, in a bare stack: the role SageMaker assumes for this account's training jobs."""

import aws_cdk as cdk
import aws_cdk.aws_s3 as s3
from aws_cdk.assertions import Template

from constructs.compute.sagemaker.execution_role import SageMakerExecutionRole
from constructs.storage.data_bucket_access import DataBucketAccess


def test_sagemaker_may_assume_the_role_for_this_accounts_training_jobs_only():
    # Confused-deputy guard (SageMaker developer guide, "Cross-service confused deputy prevention", SageMaker
    # Training Jobs): aws:SourceArn on training-job/* of this region and account.
    stack = cdk.Stack(env=cdk.Environment(region="us-west-2"))
    SageMakerExecutionRole(stack, "Jobs", data_access=DataBucketAccess(stack, s3.Bucket(stack, "Data")))
    (role,) = Template.from_stack(stack).find_resources("AWS::IAM::Role").values()
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert statement["Condition"] == {
        "ArnLike": {
            "aws:SourceArn": {
                "Fn::Join": [
                    "",
                    [
                        "arn:",
                        {"Ref": "AWS::Partition"},
                        ":sagemaker:us-west-2:",
                        {"Ref": "AWS::AccountId"},
                        ":training-job/*",
                    ],
                ]
            }
        }
    }
