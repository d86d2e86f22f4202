"""Each declared workload's image (docs/workloads.md), for the backend stack that runs it.

A folder is a CDK asset whose Dockerfile starts `FROM ${PLATFORM_IMAGE}` (contracts/workload.py checks it): the build
argument is the platform image's local tag (stacks/registry_stack.platform_image_tag), which `make deploy` builds
before `cdk deploy`, because a build argument cannot be a deploy-time value and CDK does not order one asset's build
after another's (aws/aws-cdk#6471). A URI is pulled as it is: from a private ECR repository with a grant on that
repository (parsed from the URI), from any other registry only if it is public.
"""

import re
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ecr as ecr
import aws_cdk.aws_ecr_assets as ecr_assets
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_iam as iam

from constructs import Construct
from contracts.workload import PLATFORM_IMAGE_ARG, Workload

PROJECT_ROOT = Path(__file__).resolve().parents[3]
# A private ECR image as a declaration's URI gives it: account, region, repository, then a tag or a digest.
_ECR_URI = (
    r"(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([a-z0-9._/-]+)"
    r"(?::([\w.-]+)|@(sha256:[0-9a-f]{64}))"
)


class WorkloadImages(Construct):
    """`.uri(name)` for a pod or a SageMaker job, `.container_image(name)` for a Batch job, `.grant_pull(role)`."""

    def __init__(self, scope: Construct, id_: str, *, workloads: tuple[Workload, ...], platform_image: str) -> None:
        super().__init__(scope, id_)
        self._uris: dict[str, str] = {}
        self._images: dict[str, ecs.ContainerImage] = {}
        self._repositories: list[ecr.IRepository] = []
        self._workloads = workloads
        for workload in workloads:
            self._add(workload, platform_image)

    def _add(self, workload: Workload, platform_image: str) -> None:
        name = workload.name
        if workload.image_directory is not None:
            asset = ecr_assets.DockerImageAsset(
                self,
                name,
                directory=str(PROJECT_ROOT / workload.image_directory),
                build_args={PLATFORM_IMAGE_ARG: platform_image},
                platform=ecr_assets.Platform.LINUX_AMD64,
            )
            self._uris[name], self._images[name] = asset.image_uri, ecs.ContainerImage.from_docker_image_asset(asset)
            self._repositories.append(asset.repository)
            return
        uri = workload.image_uri
        assert uri is not None  # parse_workload gives exactly one of the two
        self._uris[name] = uri
        in_ecr = re.fullmatch(_ECR_URI, uri)
        if in_ecr is None:
            self._images[name] = ecs.ContainerImage.from_registry(uri)
            return
        account, region, repository_name, tag, digest = in_ecr.groups()
        repository = ecr.Repository.from_repository_attributes(
            self,
            f"{name}-repository",
            repository_arn=f"arn:{cdk.Aws.PARTITION}:ecr:{region}:{account}:repository/{repository_name}",
            repository_name=repository_name,
        )
        self._images[name] = ecs.ContainerImage.from_ecr_repository(repository, digest or tag)
        self._repositories.append(repository)

    def uri(self, name: str) -> str:
        return self._uris[name]

    def for_runner(self) -> dict[str, tuple[str, str]]:
        """Each workload's (image URI, WORKLOAD variable): what the EKS and SageMaker job runners take."""
        return {w.name: (self._uris[w.name], w.variable) for w in self._workloads}

    def container_image(self, name: str) -> ecs.ContainerImage:
        """For Batch: the ECS image binds its own pull grant to the job's execution role."""
        return self._images[name]

    def grant_pull(self, grantee: iam.IGrantable) -> None:
        """Pull every workload image kept in ECR (a role that runs them: SageMaker's execution role)."""
        for repository in self._repositories:
            repository.grant_pull(grantee)
