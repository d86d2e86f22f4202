"""Environments: every one in cdk.json synthesizes, with its name in every stack and tag."""

import pytest

from tests.conftest import ENVIRONMENTS


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_environment_synthesizes_with_its_name_in_every_stack(synth, env):
    # dev and prod can live in one account: stack names carry the environment.
    names = list(synth(env=env).templates)
    assert names and all(name.startswith(f"EfaTraining-{env}-") for name in names)


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_taggable_resources_carry_project_and_environment_tags(synth, env):
    # Cost allocation: budgets filter on these tags, so no taggable resource may miss them.
    synthesized = synth(env=env)
    expected = [{"Key": "Environment", "Value": env}, {"Key": "Project", "Value": "efa-training"}]
    for unit in ("network", "storage", "registry"):
        for kind in ("AWS::EC2::VPC", "AWS::S3::Bucket", "AWS::FSx::FileSystem", "AWS::ECR::Repository"):
            for resource in synthesized.template(unit).find_resources(kind).values():
                tags = resource["Properties"]["Tags"]
                for tag in expected:
                    assert tag in tags, (unit, kind)


def test_environment_region_reaches_the_stacks(synth):
    # prod deploys to its own region.
    assert {stack.region for stack in synth(env="prod").stacks.values()} == {"us-west-2"}
