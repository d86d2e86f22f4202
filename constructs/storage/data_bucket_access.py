"""Access to the data bucket from the other stacks: one named export, one set of grants, one acknowledgement form.

The bucket's ARN travels through a named export (`<storage stack>-DataBucketArn`) rather than a generated one, so
the statements that name object prefixes have stable cdk-nag finding names (`AwsSolutions-IAM5[Resource::<export>/
runs/*]`) to acknowledge. Training code (Batch job role, EKS pod role, SageMaker's job role) reads datasets/ and
models/, and reads and writes checkpoints/ and runs/; nothing else in the bucket (config/layout.py names the prefixes).
"""

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_s3 as s3

from config.layout import CHECKPOINTS_PREFIX, DATASETS_PREFIX, MODELS_PREFIX, RUNS_PREFIX
from constructs import Construct
from constructs.nag import acknowledge

# models/ is the pipeline's (an approved run's verdict and the approval's copy, constructs/pipeline/verdict.py): jobs
# name a model's place there (MODELS_PREFIX, MLflow's source), never write it.
READ_PREFIXES = (DATASETS_PREFIX, MODELS_PREFIX)
READ_WRITE_PREFIXES = (CHECKPOINTS_PREFIX, RUNS_PREFIX)


class DataBucketAccess:
    """Created once by the storage stack (which owns the export); consumers call its methods from their stacks."""

    def __init__(self, stack: cdk.Stack, bucket: s3.IBucket) -> None:
        self.bucket_name = bucket.bucket_name
        self.export_name = f"{stack.stack_name}-DataBucketArn"
        stack.export_value(bucket.bucket_arn, name=self.export_name)

    @property
    def bucket_arn(self) -> str:
        """The bucket's ARN in a consuming stack (a token for Fn::ImportValue)."""
        return cdk.Fn.import_value(self.export_name)

    def bucket(self, scope: Construct, id_: str = "DataBucket") -> s3.IBucket:
        """The bucket as seen from `scope`'s stack, its ARN imported through the named export."""
        return s3.Bucket.from_bucket_attributes(scope, id_, bucket_arn=self.bucket_arn, bucket_name=self.bucket_name)

    def grant_training(self, role: iam.IRole, who: str) -> None:
        """datasets/ and models/ read-only; checkpoints/ and runs/ read-write; each prefix acknowledged once."""
        bucket_arn = self.bucket_arn
        prefixes = (*READ_PREFIXES, *READ_WRITE_PREFIXES)

        def objects(names: tuple[str, ...]) -> list[str]:
            return [cdk.Fn.join("", [bucket_arn, f"/{prefix}*"]) for prefix in names]

        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in prefixes]}},
            )
        )
        role.add_to_principal_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=objects(prefixes)))
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=objects(READ_WRITE_PREFIXES),
            )
        )
        for prefix in prefixes:
            access = "read" if prefix in READ_PREFIXES else "read-write"
            self.acknowledge_objects(
                role,
                f"{prefix}*",
                f"{who} get {access} access to objects under {prefix} "
                "only; object names (run ids) are chosen at run time",
            )

    def acknowledge_objects(self, role: iam.IRole, objects: str, reason: str) -> None:
        """The wildcard finding of one object pattern (`runs/*/verdict.json`) on `role`'s policy."""
        acknowledge(role, f"AwsSolutions-IAM5[Resource::{self.export_name}/{objects}]", reason)
