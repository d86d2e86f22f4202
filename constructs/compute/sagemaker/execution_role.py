"""The role SageMaker training jobs run as: the project's bucket prefixes, its image, its logs, its VPC, nothing else.

SageMaker documents what a VPC-mode training job's role needs (SageMaker developer guide, "How to use SageMaker AI
execution roles", CreateTrainingJob API: Execution Role Permissions): the network interfaces it creates in the
training subnet, the image pull, the log group /aws/sagemaker/TrainingJobs and CloudWatch metrics.
"""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam

from config.layout import TRAINING_METRICS_NAMESPACE
from constructs import Construct
from constructs.nag import acknowledge, shown_arn
from constructs.observability.accelerator_metrics import SAGEMAKER_TRAINING
from constructs.storage.data_bucket_access import DataBucketAccess

# SageMaker writes every training job's logs to this one log group of the account and region (SageMaker developer
# guide, "Log Amazon SageMaker AI events with Amazon CloudWatch"): shared with other SageMaker users, so it is
# named here, never created or deleted by this app.
TRAINING_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
# The namespaces the jobs publish to: SageMaker's instance metrics and the image's EMF metrics (metrics.py).
METRIC_NAMESPACES = (SAGEMAKER_TRAINING, TRAINING_METRICS_NAMESPACE)
# VPC mode: SageMaker creates the jobs' network interfaces in the training subnet with the job's role
# (CreateTrainingJob API: Execution Role Permissions); EC2 grants these on `*` only (Describe*) or on interfaces
# that do not exist yet.
VPC_ACTIONS = (
    "ec2:CreateNetworkInterface",
    "ec2:CreateNetworkInterfacePermission",
    "ec2:DeleteNetworkInterface",
    "ec2:DeleteNetworkInterfacePermission",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
)


class SageMakerExecutionRole(Construct):
    """`role`: assumed by sagemaker.amazonaws.com; `grant_pull` the image into it from the registry stack."""

    def __init__(self, scope: Construct, id_: str, *, data_access: DataBucketAccess, file_system: bool = False) -> None:
        """`file_system`: the jobs read FSx for Lustre as a data source, for which SageMaker asks that the role "has
        access to Amazon FSx" ("Access training data", model-access-training-data.html) without naming actions."""
        super().__init__(scope, id_)
        stack = cdk.Stack.of(self)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=training_jobs_principal(stack),
            description="SageMaker training jobs: read datasets, write checkpoints, models and reports",
        )
        data_access.grant_training(self.role, "SageMaker training jobs")
        log_streams = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=f"{TRAINING_LOG_GROUP}:*",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[log_streams],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": list(METRIC_NAMESPACES)}},
            )
        )
        self.role.add_to_policy(iam.PolicyStatement(actions=list(VPC_ACTIONS), resources=["*"]))
        if file_system:
            # Resource `*`: DescribeFileSystems takes no resource type (Service Authorization Reference, "Actions,
            # resources, and condition keys for Amazon FSx"), so a scoped ARN would grant nothing (the IAM gate,
            # tools/iam_lint.py, refuses one). The only FSx action a job's role can need: SageMaker mounts the file
            # system itself over the VPC interfaces the role creates (VPC_ACTIONS), and no SageMaker document names
            # another ("Access training data").
            self.role.add_to_policy(iam.PolicyStatement(actions=["fsx:DescribeFileSystems"], resources=["*"]))
        self._acknowledge_findings(stack)

    def _acknowledge_findings(self, stack: cdk.Stack) -> None:
        """The gates' findings on the role's policy that SageMaker's documented needs raise (constructs/nag.py)."""
        acknowledge(
            self.role,
            "AwsSolutions-IAM5[Resource::*]",
            "EC2 network interfaces of VPC-mode jobs (created by SageMaker, ids unknown until then; Describe* has "
            "no resource-level permissions), ECR's GetAuthorizationToken, fsx:DescribeFileSystems (no resource "
            "type), and PutMetricData (limited by the cloudwatch:namespace condition to SageMaker's and the "
            "image's namespaces)",
        )
        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(
            policy,
            "CKV_AWS_111",
            "Write actions without a resource constraint are the VPC-mode network interfaces SageMaker creates for "
            "each job (ids unknown before; CreateTrainingJob: Execution Role Permissions); S3 writes are per prefix",
        )
        acknowledge(
            policy,
            "CKV_AWS_109",
            "ec2:Create/DeleteNetworkInterfacePermission, which checkov counts as permissions management, are what "
            "SageMaker documents for VPC-mode jobs' interfaces; they grant no IAM permission",
        )
        acknowledge(
            self.role,
            f"AwsSolutions-IAM5[Resource::{shown_arn(stack, 'logs', f'log-group:{TRAINING_LOG_GROUP}:*')}]",
            "SageMaker names each job's log stream <job name>/algo-N when the job starts; the group is "
            "SageMaker's own, per account and region",
        )


def training_jobs_principal(stack: cdk.Stack) -> iam.IPrincipal:
    """SageMaker, assuming the role for this account's training jobs in this region only: the confused-deputy guard
    SageMaker documents for a training job's role (SageMaker developer guide, "Cross-service confused deputy
    prevention", SageMaker Training Jobs: aws:SourceArn on training-job/*, the account being in the ARN)."""
    training_jobs = stack.format_arn(service="sagemaker", resource="training-job", resource_name="*")
    return iam.ServicePrincipal("sagemaker.amazonaws.com", conditions={"ArnLike": {"aws:SourceArn": training_jobs}})
