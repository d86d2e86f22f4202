"""The Batch definitions every registered workload's jobs copy at run start (compute/batch/workload_jobs.py,
BatchJobRunner.workload_jobs), built alone in a bare stack: they carry the launcher's workload flags and a WORKLOAD
the run's registration replaces, on the platform's image until then."""

import aws_cdk as cdk
import aws_cdk.aws_ecs as ecs
import aws_cdk.aws_iam as iam
import aws_cdk.aws_logs as logs

from config import CATALOGUE
from constructs.compute.batch.job_definitions import BatchJobDefinitions
from tests.alone import template_of

PLATFORM_URI = "111122223333.dkr.ecr.eu-west-1.amazonaws.com/efa-training-dev:nvidia-1"


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
    names = jobs.add_workload_templates(ecs.ContainerImage.from_registry(PLATFORM_URI))
    resources = template_of(stack)["Resources"].values()
    by_name = {
        r["Properties"]["JobDefinitionName"]: r["Properties"]
        for r in resources
        if "JobDefinitionName" in r.get("Properties", {})
    }
    assert names == {"train": "efa-training-dev-workload-train", "validate": "efa-training-dev-workload-validate"}
    return {job: by_name[name] for job, name in names.items()}


def _container(props: dict) -> dict:
    node = props.get("NodeProperties")
    return node["NodeRangeProperties"][0]["Container"] if node else props["ContainerProperties"]


# The launcher's workload path reads the declaration from WORKLOAD and the run's values from these flags
# (user_workload.prepare_run, user_validate); `nodes` has a default because every multi-node submission sends it.
def test_the_workload_templates_take_the_launchers_workload_flags_and_a_workload_to_replace():
    train, validate = (_workload_definitions()[job] for job in ("train", "validate"))
    assert train["Type"] == "multinode" and validate["Type"] == "container"
    for props in (train, validate):
        container = _container(props)
        environment = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert environment["WORKLOAD"] == "{}" and container["Image"] == PLATFORM_URI
        assert container["Command"][container["Command"].index("--hyperparameters") + 1] == "Ref::hyperparameters"
    assert set(train["Parameters"]) == {"run_id", "dataset", "hyperparameters", "stop_by", "nodes"}
    assert {"baseline", "tolerance"} <= set(validate["Parameters"])
    assert "--verdict-prefix" in _container(validate)["Command"]
