"""Registry stack: scanned, immutable repositories for both images, and the image staged from training_image/."""

import json

import pytest


@pytest.fixture(scope="module")
def registry(synth):
    return synth().template("registry")


def test_one_repository_per_accelerator_family(registry):
    # GPU and Neuron images live in their own repositories.
    registry.resource_count_is("AWS::ECR::Repository", 2)


def test_repositories_scan_on_push_with_immutable_tags(registry):
    # A pushed tag can never be overwritten; every push is scanned.
    for repository in registry.find_resources("AWS::ECR::Repository").values():
        props = repository["Properties"]
        assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
        assert props["ImageTagMutability"] == "IMMUTABLE"


def test_lifecycle_keeps_the_configured_number_of_images(synth):
    # ecr_keep_images=7 becomes a countMoreThan 7 expiry rule.
    registry = synth(ecr_keep_images="7").template("registry")
    for repository in registry.find_resources("AWS::ECR::Repository").values():
        rules = json.loads(repository["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
        assert rules[0]["selection"]["countNumber"] == 7


@pytest.mark.parametrize("instance_type,dockerfile", [("g5.12xlarge", "Dockerfile.gpu"),
                                                      ("trn1.32xlarge", "Dockerfile.neuron")])
def test_training_image_is_staged_from_the_matching_dockerfile(synth, instance_type, dockerfile):
    # synth stages the Docker build context; `cdk deploy` builds and pushes it.
    synthesized = synth(instance_type=instance_type)
    manifest = json.loads((synthesized.outdir / f"{synthesized.stacks['registry'].stack_name}.assets.json").read_text())
    images = list(manifest["dockerImages"].values())
    assert [image["source"]["dockerFile"] for image in images] == [dockerfile]
    context = synthesized.outdir / images[0]["source"]["directory"]
    # The staged context holds the Dockerfile and the entry point it copies into the image.
    assert (context / dockerfile).exists() and (context / "launch.py").exists()


def test_a_pinned_image_tag_uses_the_repository_instead_of_a_build(synth):
    # image_tag=v1: no Docker asset, the job definitions pull repository:v1.
    synthesized = synth(image_tag="v1")
    manifest = json.loads((synthesized.outdir / f"{synthesized.stacks['registry'].stack_name}.assets.json").read_text())
    assert manifest.get("dockerImages", {}) == {}
