"""SageMakerStack alone (with the network, storage and registry it takes): the jobs' execution role, limited to the
project's prefixes, image, logs and VPC, and the runner wired to the environment's config. Its constructs alone:
tests/compute/test_sagemaker_job_runner.py; the pipeline on this backend: tests/pipeline/test_sagemaker_pipeline.py."""

import functools
import json

import pytest

from config import CATALOGUE
from constructs.compute.sagemaker.execution_role import VPC_ACTIONS
from tests.alone import StacksAlone

pytestmark = pytest.mark.xdist_group("sagemaker-stack")


@functools.cache
def _environment(**overrides: object) -> StacksAlone:
    return StacksAlone(compute="sagemaker", **overrides)


@functools.cache
def _template(**overrides: object) -> dict:
    environment = _environment(**overrides)
    return environment.raw(environment.compute())


def _statements(template: dict) -> list[dict]:
    return [
        s
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
    ]


def _actions(statement: dict) -> list[str]:
    return [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]


def test_the_jobs_role_is_assumed_by_sagemaker_only():
    (role,) = [r["Properties"] for r in _template()["Resources"].values() if r["Type"] == "AWS::IAM::Role"]
    (statement,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    assert "ManagedPolicyArns" not in role  # no AmazonSageMakerFullAccess: only what the jobs need


def test_the_jobs_reach_the_data_bucket_by_prefix_only():
    objects = {
        json.dumps(resource)
        for s in _statements(_template())
        if "s3:GetObject" in _actions(s)
        for resource in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
    }
    assert objects and all(any(p in o for p in ("datasets/", "checkpoints/", "models/", "runs/")) for o in objects)


def test_the_jobs_may_create_their_network_interfaces_in_the_vpc():
    # VPC mode: SageMaker creates the jobs' interfaces with the job's role (CreateTrainingJob: Execution Role).
    assert any(set(VPC_ACTIONS) <= set(_actions(s)) for s in _statements(_template()))


def test_the_jobs_pull_the_training_image():
    assert any("ecr:BatchGetImage" in _actions(s) for s in _statements(_template()))


def test_metrics_go_only_to_sagemakers_and_the_images_namespaces():
    (statement,) = [s for s in _statements(_template()) if "cloudwatch:PutMetricData" in _actions(s)]
    assert statement["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": ["/aws/sagemaker/TrainingJobs", "EfaTraining"]}
    }


@pytest.mark.parametrize("name", ["p4d.24xlarge", "trn1.32xlarge"])
def test_the_runner_trains_on_the_catalogue_type_as_ml_instances(name):
    runner = _environment(instance_type=name).compute().job_runner
    assert runner.instance is CATALOGUE[name] and runner.instance.sagemaker_instance_type == f"ml.{name}"


def test_datasets_come_from_fsx_by_default_and_from_s3_when_configured():
    assert _environment().compute().job_runner.file_system is not None
    assert _environment(sagemaker_data_source="s3").compute().job_runner.file_system is None


def test_spot_follows_the_configuration():
    assert _environment().compute().job_runner.spot is False
    assert _environment(sagemaker_spot="true").compute().job_runner.spot is True


def test_there_is_no_queue_and_no_cluster_to_keep():
    stack = _environment().compute()
    kinds = {r["Type"] for r in _template()["Resources"].values()}
    assert stack.job_queue_names == []
    assert not {k for k in kinds if k.startswith(("AWS::Batch::", "AWS::EKS::", "AWS::EC2::"))}


def test_the_idle_alarm_reads_the_jobs_own_per_host_utilisation_of_this_environment():
    # SageMaker's instance metrics carry no environment: the jobs publish their own (tests/observability/).
    metrics = _environment(instance_type="p4d.24xlarge").compute().accelerator_metrics
    assert (metrics.namespace, metrics.utilization, metrics.scope) == (
        "EfaTraining",
        "AcceleratorUtilization",
        ("Environment", "dev"),
    )


def test_the_jobs_may_describe_the_file_system_they_read_only_with_the_fsx_data_source():
    # SageMaker asks that the role "has access to Amazon FSx" for a file-system data source (model-access-training-data)
    def describes(template: dict) -> bool:
        return any("fsx:DescribeFileSystems" in _actions(s) for s in _statements(template))

    assert describes(_template()) and not describes(_template(sagemaker_data_source="s3"))
