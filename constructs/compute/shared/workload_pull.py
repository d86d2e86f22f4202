"""Pulling registered workloads' images: the environment's workload repository, by its fixed name.

A registered workload's image is pushed to `efa-training-<env>-workloads` (`make push-workload`; the Registry stack
owns the repository), so the roles that run its jobs may pull from it without a deploy per workload and without a
cross-stack reference: Batch's execution role (the ECS agent pulls with it) and SageMaker's job role. EKS nodes read
every repository of the account (AmazonEC2ContainerRegistryReadOnly).
"""

import aws_cdk.aws_ecr as ecr
import aws_cdk.aws_iam as iam

from config.layout import workload_repository_name
from constructs import Construct


def grant_workload_pull(scope: Construct, role: iam.IGrantable, environment: str) -> None:
    repository = ecr.Repository.from_repository_name(
        scope, "WorkloadRepository", workload_repository_name(environment or "manual")
    )
    repository.grant_pull(role)
