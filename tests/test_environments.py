"""The environment matrix: every environment in cdk.json, on every backend, synthesizes a whole app with its name
in every stack, its tags on every taggable resource, its region, its data kept or not, and its observability."""

import pytest
from aws_cdk.assertions import Match

from config import load_config
from constructs.observability.alarms import GIB
from tests.observability.metrics import alarms
from tests.synthesis import BACKENDS, CDK_JSON_CONTEXT, ENVIRONMENTS

MATRIX = [(env, compute) for env in ENVIRONMENTS for compute in BACKENDS]
PROJECT_TAGS = {"Project": "efa-training"}
# What holds data or costs money after `cdk destroy` if kept: deleted with dev, kept with prod (retain_data).
DATA_RESOURCES = [
    ("storage", "AWS::S3::Bucket"),
    ("storage", "AWS::FSx::FileSystem"),
    ("registry", "AWS::ECR::Repository"),
    ("network", "AWS::Logs::LogGroup"),
    ("alerts", "AWS::KMS::Key"),
]


@pytest.mark.parametrize(("env", "compute"), MATRIX)
def test_environment_synthesizes_with_its_name_in_every_stack(synth, env, compute):
    # dev and prod can live in one account: stack names carry the environment.
    names = list(synth(env=env, compute=compute).templates)
    assert len(names) == 7 and all(name.startswith(f"EfaTraining-{env}-") for name in names)


def _tags(properties: dict) -> dict[str, str] | None:
    """A resource's tags as a map, whichever of CloudFormation's two forms (list of Key/Value, or map) it uses."""
    tags = properties.get("Tags")
    if isinstance(tags, list):
        return {tag["Key"]: tag["Value"] for tag in tags if isinstance(tag, dict) and "Key" in tag}
    return tags if isinstance(tags, dict) else None


@pytest.mark.parametrize(("env", "compute"), MATRIX)
def test_taggable_resources_carry_project_and_environment_tags(synth, env, compute):
    # Cost allocation: budgets filter on these tags, so no tagged resource may miss them.
    synthesized = synth(env=env, compute=compute)
    expected = {**PROJECT_TAGS, "Environment": env}
    tagged = {
        (unit, logical_id): tags
        for unit in synthesized.stack_names
        for logical_id, resource in synthesized.raw(unit)["Resources"].items()
        if (tags := _tags(resource.get("Properties", {}))) is not None
    }
    kinds = {synthesized.raw(unit)["Resources"][logical_id]["Type"] for unit, logical_id in tagged}
    assert {"AWS::EC2::VPC", "AWS::S3::Bucket", "AWS::FSx::FileSystem", "AWS::ECR::Repository"} <= kinds
    untagged = [key for key, tags in tagged.items() if not expected.items() <= tags.items()]
    assert untagged == []


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_environment_region_reaches_every_stack(synth, env):
    # Each environment deploys to its own region (prod: us-west-2).
    synthesized = synth(env=env)
    region = CDK_JSON_CONTEXT["environments"][env]["region"]
    assert {synthesized.region(unit) for unit in synthesized.stack_names} == {region}


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_data_is_kept_on_destroy_only_where_the_environment_retains_it(synth, env):
    # dev: `cdk destroy` leaves nothing billable; prod (retain_data): data, models, images, logs and keys survive.
    synthesized = synth(env=env)
    expected = "Retain" if load_config({**CDK_JSON_CONTEXT, "env": env}).retain_data else "Delete"
    for unit, kind in DATA_RESOURCES:
        resources = synthesized.template(unit).find_resources(kind)
        assert resources, (unit, kind)
        policies = {(r.get("DeletionPolicy"), r.get("UpdateReplacePolicy")) for r in resources.values()}
        assert policies == {(expected, expected)}, (unit, kind)


@pytest.mark.parametrize(("env", "compute"), MATRIX)
def test_every_environment_and_backend_has_dashboard_alarms_and_budget(synth, env, compute):
    # Each shipped environment on each backend synthesizes the dashboard, its alarms and its budget.
    template = synth(env=env, compute=compute).template("observability")
    template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    template.resource_count_is("AWS::Budgets::Budget", 1)
    assert len(template.find_resources("AWS::CloudWatch::Alarm")) >= 3


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_observability_follows_the_environments_config(synth, env):
    # The file system alarm at fsx_free_capacity_alarm_percent free on the fullest storage target, a share of
    # fsx_storage_gib (in bytes); the budget at budget_monthly_usd, counting only costs tagged with the environment.
    config = load_config({**CDK_JSON_CONTEXT, "env": env})
    template = synth(env=env).template("observability")
    alarm = alarms(template)[f"EfaTraining-{env}-fsx-free-capacity-low"]
    assert alarm["Threshold"] == pytest.approx(config.fsx_free_capacity_alarm_percent)
    (expression,) = [m["Expression"] for m in alarm["Metrics"] if "Expression" in m]
    assert expression == f"100 * fullest * targets / {config.fsx_storage_gib * GIB}"
    template.has_resource_properties(
        "AWS::Budgets::Budget",
        {
            "Budget": Match.object_like(
                {
                    "BudgetLimit": {"Amount": config.budget_monthly_usd, "Unit": "USD"},
                    "CostFilters": {"TagKeyValue": [f"user:Environment${env}"]},
                }
            )
        },
    )
