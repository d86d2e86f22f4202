"""Registry: ECR repositories for the GPU and Neuron training images, and the image built from training_image/.

Every image the app runs is scanned for vulnerabilities: a tag CI pushed (image_tag) to our repositories, which scan on
push; an image `cdk deploy` builds from training_image/ lands in the CDK bootstrap's asset repository, which does not,
so this stack asks ECR for a basic scan of that image when it deploys it (StartImageScan). Not the registry's scanning
configuration (AWS::ECR::RegistryScanningConfiguration): one per account and region, it would replace what the account
has (Amazon Inspector's enhanced scanning included), and two environments in one account would own it both.
"""

import hashlib
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ecr as ecr
import aws_cdk.aws_ecr_assets as ecr_assets
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_logs as logs
import aws_cdk.custom_resources as cr

from config import Accelerator, EnvironmentConfig
from config.layout import workload_repository_name
from constructs import Construct
from constructs.nag import (
    acknowledge,
    acknowledge_cdk_handler,
    acknowledge_log_group_encryption,
    managed_policy_finding,
)
from stacks.policies import data_removal_policy, log_retention

TRAINING_IMAGE_DIR = Path(__file__).resolve().parent.parent / "training_image"
DOCKERFILES = {Accelerator.NVIDIA: "Dockerfile.gpu", Accelerator.NEURON: "Dockerfile.neuron"}
IMAGE_EXCLUDE = ["**/__pycache__", "benchmarks/results", "*.md"]  # what platform_image_tag leaves out too
RESULTS = ("benchmarks", "results")
PLATFORM_LOCAL_IMAGE = "efa-training-platform"


def platform_image_tag(accelerator: Accelerator) -> str:
    """The local tag of the platform image built from this tree: what a workload's Dockerfile builds FROM
    (`make push-workload` builds it first where it is missing: tools/push_workload.py). Named by its content, so a
    changed platform is a new tag, and a workload pushed on it a new image."""
    digest = hashlib.sha256(DOCKERFILES[accelerator].encode())
    for path in sorted(TRAINING_IMAGE_DIR.rglob("*")):
        relative = path.relative_to(TRAINING_IMAGE_DIR)
        left_out = "__pycache__" in relative.parts or path.suffix == ".md" or relative.parts[:2] == RESULTS
        if path.is_file() and not left_out:
            digest.update(str(relative).encode() + b"\0" + path.read_bytes())
    return f"{PLATFORM_LOCAL_IMAGE}:{accelerator.value}-{digest.hexdigest()[:16]}"


class RegistryStack(cdk.Stack):
    def __init__(self, scope: Construct, id_: str, *, config: EnvironmentConfig, **kwargs) -> None:
        super().__init__(scope, id_, **kwargs)
        removal_policy = data_removal_policy(config)
        self.repositories = {
            accelerator: ecr.Repository(
                self,
                f"{accelerator.value.capitalize()}Repository",
                image_scan_on_push=True,
                image_tag_mutability=ecr.TagMutability.IMMUTABLE,
                encryption=ecr.RepositoryEncryption.AES_256,
                lifecycle_rules=[
                    ecr.LifecycleRule(
                        description=f"keep the last {config.ecr_keep_images} images",
                        max_image_count=config.ecr_keep_images,
                    )
                ],
                removal_policy=removal_policy,
                empty_on_delete=removal_policy == cdk.RemovalPolicy.DESTROY,
            )
            for accelerator in Accelerator
        }
        for repository in self.repositories.values():
            acknowledge(
                repository,
                "CKV_AWS_136",
                "AES-256 at rest (ECR's own keys, set explicitly); a KMS key would need a grant for every role that "
                "pulls, and EncryptionConfiguration is create-only (the repository's schema): a change replaces it",
            )
        accelerator = config.instance.accelerator
        if config.image_tag:
            # A tag that CI pushed to our repository (immutable, scanned).
            repository = self.repositories[accelerator]
            self.container_image: ecs.ContainerImage = ecs.ContainerImage.from_ecr_repository(
                repository, config.image_tag
            )
            self.image_uri = repository.repository_uri_for_tag(config.image_tag)
            self.image_repository: ecr.IRepository = repository
        else:
            # Built by `cdk deploy` from training_image/ (synth only stages the build context).
            asset = ecr_assets.DockerImageAsset(
                self,
                "TrainingImage",
                directory=str(TRAINING_IMAGE_DIR),
                file=DOCKERFILES[accelerator],
                platform=ecr_assets.Platform.LINUX_AMD64,
                exclude=IMAGE_EXCLUDE,
            )
            self.container_image = ecs.ContainerImage.from_docker_image_asset(asset)
            self.image_uri = asset.image_uri
            self.image_repository = asset.repository
            self._scan_on_deploy(asset, config)
        for accel, repository in self.repositories.items():
            cdk.CfnOutput(self, f"{accel.value.capitalize()}RepositoryUri", value=repository.repository_uri)
        self._workload_repository(config, removal_policy)

    def _workload_repository(self, config: EnvironmentConfig, removal_policy: cdk.RemovalPolicy) -> None:
        """Registered workloads' images (`make push-workload`), which the runs name by digest: kept while a record may
        name them (no count rule, unlike the platform's; an untagged layer is removed after a day), tags immutable,
        scanned on push. `RepositoryName` is create-only (AWS::ECR::Repository): it stays fixed."""
        repository = ecr.Repository(
            self,
            "WorkloadRepository",
            repository_name=workload_repository_name(config.name),
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.AES_256,
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description="untagged layers of a retagged push",
                    tag_status=ecr.TagStatus.UNTAGGED,
                    max_image_age=cdk.Duration.days(1),
                )
            ],
            removal_policy=removal_policy,
            empty_on_delete=removal_policy == cdk.RemovalPolicy.DESTROY,
        )
        acknowledge(
            repository,
            "CKV_AWS_136",
            "AES-256 at rest (ECR's own keys), as the platform's repositories: a KMS key would need a grant for every "
            "role that pulls",
        )
        cdk.CfnOutput(self, "WorkloadRepositoryUri", value=repository.repository_uri)

    def _scan_on_deploy(self, asset: ecr_assets.DockerImageAsset, config: EnvironmentConfig) -> None:
        """A basic scan of the built image, once per image (a new image is a new tag, so an update scans it).
        ECR allows one basic scan per image per 24 hours (ECR API reference, StartImageScan): LimitExceededException
        means it is scanned already (another environment of the account deployed the same image). A registry on
        enhanced scanning answers ValidationException ("This feature is disabled"): Amazon Inspector scans it there."""
        call = cr.AwsSdkCall(
            service="ECR",
            action="startImageScan",
            parameters={"repositoryName": asset.repository.repository_name, "imageId": {"imageTag": asset.image_tag}},
            physical_resource_id=cr.PhysicalResourceId.of(asset.image_tag),
            ignore_error_codes_matching="LimitExceededException|ValidationException",
        )
        logs_group = logs.LogGroup(
            self, "ImageScanLogs", retention=log_retention(config), removal_policy=data_removal_policy(config)
        )
        cr.AwsCustomResource(
            self,
            "ImageScan",
            on_create=call,
            on_update=call,
            policy=cr.AwsCustomResourcePolicy.from_sdk_calls(resources=[asset.repository.repository_arn]),
            install_latest_aws_sdk=False,
            log_group=logs_group,
        )
        acknowledge_log_group_encryption(logs_group)
        self._acknowledge_scan_handler()
        cdk.CfnOutput(
            self,
            "ImageScanFindingsCommand",
            value=cdk.Fn.join(
                "",
                [
                    "aws ecr describe-image-scan-findings --region ",
                    self.region,
                    " --repository-name ",
                    asset.repository.repository_name,
                    f" --image-id imageTag={asset.image_tag}",
                ],
            ),
        )

    def _acknowledge_scan_handler(self) -> None:
        """CDK's one AwsCustomResource function per stack (a singleton), which runs the scan request."""
        # SingletonFunction's id: "AWS" and the uuid without dashes (aws-lambda, SingletonFunction).
        handler = self.node.find_child("AWS" + cr.AwsCustomResource.PROVIDER_FUNCTION_UUID.replace("-", ""))
        acknowledge(
            handler,
            managed_policy_finding("service-role/AWSLambdaBasicExecutionRole"),
            "CDK's AwsCustomResource function writes its own logs with the policy Lambda documents for that; its one "
            "call (ecr:StartImageScan) is granted on the asset repository alone",
        )
        acknowledge_cdk_handler(handler, "CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117")
