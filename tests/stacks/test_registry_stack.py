"""RegistryStack alone: scanned, immutable repositories for both images, and the image staged from training_image/."""

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from tests.alone import StacksAlone


def _registry(**overrides: object) -> tuple[Template, dict]:
    """The registry's template and its asset manifest (what `cdk deploy` builds and pushes)."""
    environment = StacksAlone(**overrides)
    stack = environment.registry()
    template = environment.template(stack)
    manifest = json.loads((Path(environment.app.outdir) / f"{stack.stack_name}.assets.json").read_text())
    return template, manifest


@pytest.fixture(scope="module")
def dev() -> Template:
    return _registry()[0]


def test_one_repository_per_accelerator_family(dev):
    # GPU and Neuron images live in their own repositories.
    dev.resource_count_is("AWS::ECR::Repository", 2)


def test_repositories_scan_on_push_with_immutable_tags(dev):
    # A pushed tag can never be overwritten; every push is scanned.
    for repository in dev.find_resources("AWS::ECR::Repository").values():
        props = repository["Properties"]
        assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
        assert props["ImageTagMutability"] == "IMMUTABLE"


def test_dev_repositories_are_emptied_before_deletion(dev):
    # ECR refuses to delete a repository with images unless EmptyOnDelete is set.
    for repository in dev.find_resources("AWS::ECR::Repository").values():
        assert repository["Properties"]["EmptyOnDelete"] is True


def test_lifecycle_keeps_the_configured_number_of_images():
    # ecr_keep_images=7 becomes a countMoreThan 7 expiry rule.
    registry, _ = _registry(ecr_keep_images="7")
    repositories = registry.find_resources("AWS::ECR::Repository").values()
    assert len(repositories) == 2
    for repository in repositories:
        rules = json.loads(repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
        assert rules[0]["selection"]["countNumber"] == 7


@pytest.mark.parametrize(
    "instance_type,dockerfile", [("g5.12xlarge", "Dockerfile.gpu"), ("trn1.32xlarge", "Dockerfile.neuron")]
)
def test_training_image_is_staged_from_the_matching_dockerfile(instance_type, dockerfile):
    # synth stages the Docker build context; `cdk deploy` builds and pushes it.
    environment = StacksAlone(instance_type=instance_type)
    stack = environment.registry()
    environment.template(stack)
    outdir = Path(environment.app.outdir)
    images = list(json.loads((outdir / f"{stack.stack_name}.assets.json").read_text())["dockerImages"].values())
    assert [image["source"]["dockerFile"] for image in images] == [dockerfile]
    context = outdir / images[0]["source"]["directory"]
    # The staged context holds the Dockerfile and the entry point it copies into the image.
    assert (context / dockerfile).exists() and (context / "launch.py").exists()


def test_a_pinned_image_tag_uses_the_repository_instead_of_a_build():
    # image_tag=v1: no Docker asset; the stack's image is repository:v1.
    _, manifest = _registry(image_tag="v1")
    assert manifest.get("dockerImages", {}) == {}
    registry = StacksAlone(image_tag="v1").registry()
    uri = registry.resolve(registry.image_uri)
    assert uri["Fn::Join"][1][-1].endswith(":v1"), uri
