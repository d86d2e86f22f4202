"""Registry: ECR repositories for the GPU and Neuron training images, and the image built from training_image/."""

from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ecr as ecr
import aws_cdk.aws_ecr_assets as ecr_assets
import aws_cdk.aws_ecs as ecs

from config import Accelerator, EnvironmentConfig
from constructs import Construct
from stacks.policies import data_removal_policy

TRAINING_IMAGE_DIR = Path(__file__).resolve().parent.parent / "training_image"
DOCKERFILES = {Accelerator.NVIDIA: "Dockerfile.gpu", Accelerator.NEURON: "Dockerfile.neuron"}


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
                exclude=["**/__pycache__", "benchmarks/results", "*.md"],
            )
            self.container_image = ecs.ContainerImage.from_docker_image_asset(asset)
            self.image_uri = asset.image_uri
            self.image_repository = asset.repository
        for accel, repository in self.repositories.items():
            cdk.CfnOutput(self, f"{accel.value.capitalize()}RepositoryUri", value=repository.repository_uri)
