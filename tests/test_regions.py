"""Every region the configuration accepts synthesizes: each resource type the app puts in a region is one that
region's CloudFormation resource provider schemas list ("Resource availability may vary by Region": CloudFormation
template reference, "CloudFormation resource provider schemas"). Two bundled copies of those schemas check every
template, so both are asked: aws-cdk-lib's CloudFormation Validate at synth (F3006) and cfn-lint in the lint gate.
"""

import json
from pathlib import Path

import aws_cdk as cdk
import jsii
import pytest
from cfnlint.schema.manager import PROVIDER_SCHEMA_MANAGER

from config import ConfigError, load_config
from config.regions import NO_BUDGETS, NO_FSX, REGION_ZONES, omitted_types
from tests.synthesis import BACKENDS, CDK_JSON_CONTEXT, ENVIRONMENTS
from tools.gates import open_findings

pytestmark = pytest.mark.slow  # whole-app synthesis of every variant it checks

BUDGET = "AWS::Budgets::Budget"
FSX = "AWS::FSx::FileSystem"
ACCEPTED = [region for region in REGION_ZONES if region not in NO_FSX]


@pytest.fixture(scope="module")
def used_types(synth) -> frozenset[str]:
    """Every resource type of every environment on every backend (the variants the gates synthesize anyway), less
    custom resources: those are Lambda-backed and exist wherever Lambda does."""
    types: set[str] = set()
    for env in ENVIRONMENTS:
        for compute in BACKENDS:
            for template in synth(env=env, compute=compute).outdir.glob("*.template.json"):
                types.update(r["Type"] for r in json.loads(template.read_text()).get("Resources", {}).values())
    return frozenset(t for t in types if not t.startswith("Custom::"))


def cfn_lint_lacks(region: str, types: frozenset[str]) -> set[str]:
    return set(types) - set(PROVIDER_SCHEMA_MANAGER.get_resource_types(region))


@jsii.implements(cdk.IPolicyValidationContext)
class _Templates:
    """What CloudFormation Validate reads at synth (IPolicyValidationContext): one template per region."""

    def __init__(self, stacks: list[cdk.PolicyValidationStack]) -> None:
        self._app, self._stacks = cdk.App(), stacks

    # jsii reads an interface's members through properties, not plain attributes.
    @property
    def app_construct(self) -> cdk.App:
        return self._app

    @property
    def stack_templates(self) -> list[cdk.PolicyValidationStack]:
        return self._stacks

    @property
    def template_paths(self) -> list[str]:
        return [stack.template_path for stack in self._stacks]

    @property
    def account_id(self) -> None:
        return None

    @property
    def region(self) -> None:
        return None


@pytest.fixture(scope="module")
def validate_lacks(used_types, tmp_path_factory) -> dict[str, set[str]]:
    """The types CloudFormation Validate (the plugin synth runs) reports missing (F3006) per region: one template
    holding one resource of each used type, validated for every shipped region in one call."""
    folder = tmp_path_factory.mktemp("probe")
    types = sorted(used_types)
    probe = json.dumps({"Resources": {f"R{i}": {"Type": t, "Properties": {}} for i, t in enumerate(types)}})
    stacks = []
    for region in REGION_ZONES:
        (folder / f"{region}.json").write_text(probe)
        stacks.append(
            cdk.PolicyValidationStack(
                stack_construct_path=region, template_path=str(folder / f"{region}.json"), region=region
            )
        )
    report = cdk.CloudFormationValidatePlugin(include_default_rules=False).validate(_Templates(stacks))
    lacks: dict[str, set[str]] = {region: set() for region in REGION_ZONES}
    for violation in (v for v in report.violations if v.rule_name == "F3006"):
        for resource in violation.violating_resources:
            # The template names the region, the logical id R<i> the type.
            region, logical_id = Path(str(resource.template_path)).stem, str(resource.resource_logical_id)
            lacks[region].add(types[int(logical_id[1:])])
    return lacks


@pytest.mark.parametrize("region", ACCEPTED)
def test_every_type_the_app_puts_in_an_accepted_region_exists_there(used_types, validate_lacks, region):
    # Less what the app leaves out there (the budget, with a warning), both copies of the schemas have every type.
    placed = used_types - omitted_types(region)
    assert cfn_lint_lacks(region, placed) == set()
    assert validate_lacks[region] & placed == set()


def test_each_region_listed_lacks_the_type_in_a_copy_of_its_schemas(used_types, validate_lacks):
    # The lists are not wider than the data: a budget is left out only where a copy lacks it, FSx refused where both
    # do; everywhere else, both have both. Both copies see the example, so neither probe is blind.
    assert validate_lacks["eu-north-1"] == cfn_lint_lacks("eu-north-1", used_types) == {BUDGET}
    for region in REGION_ZONES:
        lacking = cfn_lint_lacks(region, used_types) | validate_lacks[region]
        assert (BUDGET in lacking) == (region in NO_BUDGETS), region
        assert (FSX in lacking) == (region in NO_FSX), region
        assert lacking <= {BUDGET, FSX, "AWS::FSx::DataRepositoryAssociation"}, region


@pytest.mark.parametrize("region", sorted(NO_FSX))
def test_a_region_without_fsx_is_refused_in_one_line(region):
    with pytest.raises(ConfigError) as refused:
        load_config({**CDK_JSON_CONTEXT, "region": region})
    assert f"region='{region}' is not valid; expected a region with Amazon FSx" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_eu_north_1_synthesizes_without_a_budget_and_says_so(synth):
    # The example, synthesized whole (CloudFormation Validate and cdk-nag run inside synth): no budget, one
    # warning naming the region, and the gate's findings stay empty.
    synthesized = synth(region="eu-north-1")
    assert not [t for t in synthesized.templates.values() if BUDGET in json.dumps(t.get("Resources", {}))]
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    warnings = [v for p in report["pluginReports"] for v in p["violations"] if "budget-omitted" in v["ruleName"]]
    assert [w["severity"] for w in warnings] == ["warning"]
    assert "does not exist in eu-north-1" in warnings[0]["description"]
    assert open_findings(synthesized.outdir)[0] == []
