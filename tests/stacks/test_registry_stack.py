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


def test_one_repository_per_accelerator_family_and_one_for_registered_workloads(dev):
    # GPU and Neuron images live in their own repositories; registered workloads' images in the environment's one.
    dev.resource_count_is("AWS::ECR::Repository", 3)
    dev.has_resource_properties("AWS::ECR::Repository", {"RepositoryName": "efa-training-dev-workloads"})


def test_registered_workloads_images_are_never_expired_by_count(dev):
    # A workload's record names its image by digest for as long as it is registered: only untagged layers expire.
    (workloads,) = [
        r for r in dev.find_resources("AWS::ECR::Repository").values()
        if r["Properties"].get("RepositoryName") == "efa-training-dev-workloads"
    ]  # fmt: skip
    (rule,) = json.loads(workloads["Properties"]["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert rule["selection"]["tagStatus"] == "untagged" and rule["selection"]["countType"] == "sinceImagePushed"


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
    repositories = [
        r for r in registry.find_resources("AWS::ECR::Repository").values() if "RepositoryName" not in r["Properties"]
    ]
    assert len(repositories) == 2  # the platform's (the workloads' keeps every tagged image)
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


def _scans(template: Template) -> list[dict]:
    return [json.loads(_joined(r["Properties"]["Create"])) for r in template.find_resources("Custom::AWS").values()]


def _joined(value: object) -> str:
    """A Fn::Join of literals and tokens, tokens as "<token>" (the call's JSON keeps its shape)."""
    if isinstance(value, dict) and "Fn::Join" in value:
        return "".join(part if isinstance(part, str) else "<token>" for part in value["Fn::Join"][1])
    return str(value)


def test_a_built_image_is_scanned_when_it_is_deployed(dev):
    # The bootstrap's asset repository does not scan on push: the stack starts ECR's basic scan of the image it
    # deploys (ECR API reference, StartImageScan), on create and on every update (a new image is a new tag).
    (scan,) = _scans(dev)
    assert (scan["service"], scan["action"]) == ("ECR", "startImageScan")
    assert scan["parameters"]["imageId"]["imageTag"] == scan["physicalResourceId"]["id"]
    (resource,) = dev.find_resources("Custom::AWS").values()
    assert resource["Properties"]["Update"] == resource["Properties"]["Create"]


def test_an_image_scanned_already_or_by_inspector_does_not_fail_the_deploy(dev):
    # One basic scan per image per 24 hours (LimitExceededException: another environment deployed the same image);
    # a registry on enhanced scanning refuses basic scans (ValidationException): Amazon Inspector scans it there.
    (scan,) = _scans(dev)
    assert scan["ignoreErrorCodesMatching"] == "LimitExceededException|ValidationException"


def test_the_scan_may_only_start_scans_in_the_asset_repository(dev):
    # The custom resource's function may call ecr:StartImageScan on the bootstrap's asset repository, nothing else.
    (policy,) = dev.find_resources("AWS::IAM::Policy").values()
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "ecr:StartImageScan"
    assert "container-assets" in json.dumps(statement["Resource"])


def test_the_registry_scanning_configuration_is_left_to_the_account(dev):
    # AWS::ECR::RegistryScanningConfiguration is one per account and region: two environments would both own it, and
    # it would replace the account's own (enhanced) scanning.
    dev.resource_count_is("AWS::ECR::RegistryScanningConfiguration", 0)


def test_a_pinned_image_tag_is_not_scanned_again():
    # image_tag=v1: CI pushed it to our repository, which scanned it on push; no scan request is added.
    registry = StacksAlone(image_tag="v1")
    registry.template(registry.registry()).resource_count_is("Custom::AWS", 0)
