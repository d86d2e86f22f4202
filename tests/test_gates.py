"""Quality gates on every app variant: cdk-nag AwsSolutions at synth, cfn-lint over every template."""

import aws_cdk as cdk
import aws_cdk.aws_s3 as s3
import pytest

from app import build_app
from tests.conftest import CDK_JSON_CONTEXT, app_variants, variant_id
from tools.gates import cfn_lint, open_findings

VARIANTS = app_variants()


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cfn_lint_finds_no_errors(synth, variant):
    # Every synthesized template (nested ones too) is free of cfn-lint errors; warnings are allowed.
    synthesized = synth(**variant)
    assert sorted(synthesized.outdir.glob("*.template.json"))
    errors, _ = cfn_lint(synthesized.outdir, synthesized.stacks["network"].region)
    assert [str(m) for m in errors] == []


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_validation_report_has_no_unacknowledged_finding(synth, variant):
    # cdk-nag AwsSolutions (and CDK's own template checks) run inside synth; nothing may be left open.
    unacknowledged, _ = open_findings(synth(**variant).outdir)
    assert unacknowledged == []


def test_cdk_nag_is_wired_into_the_app(tmp_path):
    # The gate can fail: an unlogged, plain-HTTP bucket added to the real app stops synth.
    app, stacks = build_app(context=dict(CDK_JSON_CONTEXT), outdir=str(tmp_path))
    s3.Bucket(stacks["storage"], "CarelessBucket")
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()


def _acknowledgements(variant):
    app, _ = build_app(context={**CDK_JSON_CONTEXT, **variant}, outdir=None)
    for construct in app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for rule, reason in entry.data.items():
                    if "AwsSolutions-" in rule:  # CDK acknowledges some of its own template checks itself
                        yield construct, rule, reason


@pytest.mark.parametrize("variant", VARIANTS[:2] + VARIANTS[-1:], ids=variant_id)
def test_every_acknowledgement_is_narrow_and_explained(variant):
    # No blanket suppressions: never on an app or stack, and every reason says something specific.
    for construct, rule, reason in _acknowledgements(variant):
        assert not isinstance(construct, (cdk.App, cdk.Stack)), f"{rule} acknowledged on {construct.node.path}"
        assert len(reason) >= 40, f"{rule} on {construct.node.path}: reason too thin: {reason!r}"
