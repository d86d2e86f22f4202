"""A declared workload's image and Batch jobs, built alone in a bare stack (compute/shared/workload_images.py,
compute/batch/workload_jobs.py): a folder is built on the platform image's local tag, an ECR URI is pulled
with a grant on its own repository, a public URI without one; the workload's train and validate definitions carry
its declaration and the launcher's workload flags."""

import json
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs

from config import CATALOGUE
from constructs.compute.batch.job_definitions import BatchJobDefinitions
from constructs.compute.shared.workload_images import WorkloadImages
from contracts.workload import parse_workload
from tests.alone import bare_stack, template_of
from tests.synthesis import ROOT

DDP = json.loads((ROOT / "examples/torch_ddp/workload.json").read_text())
ECR_URI = "111122223333.dkr.ecr.eu-west-1.amazonaws.com/team/llm:v7"
PLATFORM = "efa-training-platform:nvidia-0123456789abcdef"


def _workload(name: str, image: dict):
    return parse_workload(name, {**DDP, "image": image}, ROOT)


def _policy_statements(stack: cdk.Stack) -> list[dict]:
    resources = template_of(stack)["Resources"].values()
    policies = [r for r in resources if r["Type"] == "AWS::IAM::Policy"]
    return [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]]


def test_a_folder_is_built_on_the_platform_images_local_tag():
    stack = bare_stack()
    images = WorkloadImages(
        stack, "Images", workloads=(_workload("ddp", {"directory": "examples/torch_ddp"}),), platform_image=PLATFORM
    )
    assert images.uri("ddp")  # the asset's URI, a deploy-time value
    assembly = cdk.App.of(stack).synth()  # type: ignore[union-attr]
    manifest = next(Path(assembly.directory).glob("*.assets.json"))
    docker = json.loads(manifest.read_text())["dockerImages"]
    (source,) = [image["source"] for image in docker.values()]
    assert source["dockerBuildArgs"] == {"PLATFORM_IMAGE": PLATFORM}


# An ECR image of another account or region: the role that runs it may pull from that repository and no other.
def test_an_ecr_uri_is_pulled_with_a_grant_on_its_own_repository():
    stack = bare_stack()
    images = WorkloadImages(stack, "Images", workloads=(_workload("llm", {"uri": ECR_URI}),), platform_image=PLATFORM)
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    images.grant_pull(role)
    assert images.uri("llm") == ECR_URI
    pulls = [s for s in _policy_statements(stack) if "ecr:BatchGetImage" in s["Action"]]
    assert len(pulls) == 1 and "repository/team/llm" in json.dumps(pulls[0]["Resource"])


def test_a_public_uri_gets_no_grant():
    stack = bare_stack()
    uri = "public.ecr.aws/acme/trainer:1.0"
    images = WorkloadImages(stack, "Images", workloads=(_workload("pub", {"uri": uri}),), platform_image=PLATFORM)
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    images.grant_pull(role)
    assert images.for_runner()["pub"][0] == uri and _policy_statements(stack) == []


def _workload_definitions() -> dict[str, dict]:
    stack = cdk.Stack()
    jobs = BatchJobDefinitions(
        stack,
        "Jobs",
        instance=CATALOGUE["p4d.24xlarge"],
        single_node_instance=CATALOGUE["g5.xlarge"],
        nodes=2,
        image=ecs.ContainerImage.from_registry("training:v1"),
        job_role=iam.Role(stack, "JobRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com")),
        log_group=logs.LogGroup(stack, "JobLogs"),
        bucket_name="data-bucket",
        train_timeout=cdk.Duration.hours(72),
        environment="dev",
    )
    names = jobs.add_workload(_workload("ddp", {"uri": ECR_URI}), ecs.ContainerImage.from_registry(ECR_URI))
    resources = template_of(stack)["Resources"].values()
    by_name = {
        r["Properties"]["JobDefinitionName"]: r["Properties"]
        for r in resources
        if "JobDefinitionName" in r.get("Properties", {})
    }
    assert names == {"train": "efa-training-dev-ddp-train", "validate": "efa-training-dev-ddp-validate"}
    return {job: by_name[name] for job, name in names.items()}


def _container(props: dict) -> dict:
    node = props.get("NodeProperties")
    return node["NodeRangeProperties"][0]["Container"] if node else props["ContainerProperties"]


# The launcher's workload path reads the declaration from WORKLOAD and the run's values from these flags
# (user_workload.prepare_run, user_validate); `nodes` has a default because every multi-node submission sends it.
def test_a_workloads_batch_jobs_run_its_image_with_its_declaration_and_flags():
    train, validate = (_workload_definitions()[job] for job in ("train", "validate"))
    assert train["Type"] == "multinode" and validate["Type"] == "container"
    for props in (train, validate):
        container = _container(props)
        environment = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert json.loads(environment["WORKLOAD"])["name"] == "ddp" and container["Image"] == ECR_URI
        assert container["Command"][container["Command"].index("--hyperparameters") + 1] == "Ref::hyperparameters"
    assert set(train["Parameters"]) == {"run_id", "dataset", "hyperparameters", "stop_by", "nodes"}
    assert {"baseline", "tolerance"} <= set(validate["Parameters"])
    assert "--verdict-prefix" in _container(validate)["Command"]
