"""Quality gates on every app variant: cdk-nag AwsSolutions at synth, cfn-lint over every template, checkov over the
templates of every environment on every backend."""

import contextlib
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import aws_cdk as cdk
import aws_cdk.aws_s3 as s3
import pytest

from app import build_app
from config import efa_instance_types
from constructs.nag import CHECKOV_METADATA
from tests.synthesis import CDK_JSON_CONTEXT, app_variants, locked, shared_directory, variant_id
from tools.gates import cfn_lint, checkov, open_findings

pytestmark = pytest.mark.slow  # whole-app synthesis of every variant it checks

VARIANTS = app_variants()
# Every environment on every backend. The instance-type variants add no resource type to these (their templates
# differ in values: types, counts, charts), and checkov's start-up (about 4 s) is paid once for all of them.
# The managed tracking server adds a resource type: its variants are scanned too.
SCANNED = [
    variant for variant in VARIANTS if set(variant) in ({"env", "compute"}, {"env", "compute", "tracking_server"})
]


def lint_errors(templates: list[Path], region: str) -> list[str]:
    """cfn-lint's errors in these templates. Variants share many templates (every dev variant's network, storage
    and alerts, each accelerator's registry): each distinct content is linted once per test run and region, by
    whichever worker meets it first, and its errors are recorded for the others. The templates not linted yet go
    to tools.gates together, in one folder (it lints a cloud assembly's folder)."""
    folder = shared_directory() / "cfn-lint" / region
    records = {template: folder / f"{hashlib.sha256(template.read_bytes()).hexdigest()}.json" for template in templates}
    with contextlib.ExitStack() as held:
        for record in sorted(set(records.values())):  # in one order, so two workers never wait on each other
            held.enter_context(locked(record))
        fresh = {template: record for template, record in records.items() if not record.exists()}
        if fresh:
            together = Path(tempfile.mkdtemp(dir=folder))
            for template in fresh:
                shutil.copyfile(template, together / template.name)
            errors, _ = cfn_lint(together, region)
            for template, record in fresh.items():
                record.write_text(
                    json.dumps(
                        [f"{template.name}: {error}" for error in errors if Path(error.filename).name == template.name]
                    )
                )
    return [error for record in records.values() for error in json.loads(record.read_text())]


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cfn_lint_finds_no_errors(synth, variant):
    # Every synthesized template (nested ones too) is free of cfn-lint errors; warnings are allowed.
    synthesized = synth(**variant)
    templates = sorted(synthesized.outdir.glob("*.template.json"))
    assert len(templates) >= len(synthesized.stack_names)
    assert lint_errors(templates, synthesized.config.region) == []


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


def test_the_lint_gate_can_fail(tmp_path):
    # cfn-lint's errors reach the gate: a resource type that does not exist is one.
    template = tmp_path / "Broken.template.json"
    template.write_text(json.dumps({"Resources": {"Thing": {"Type": "AWS::EC2::NoSuchThing", "Properties": {}}}}))
    assert lint_errors([template], "us-east-1") != []


def _acknowledgements(synthesized):
    # The synthesized app's construct tree (built again, not synthesized, where another worker synthesized it).
    app = synthesized.stacks["network"].node.root
    for construct in app.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for rule, reason in entry.data.items():
                    if "AwsSolutions-" in rule:  # CDK acknowledges some of its own template checks itself
                        yield construct, rule, reason


@pytest.mark.parametrize(
    "variant",
    [{"env": "dev"}, {"env": "prod"}, {"compute": "eks", "instance_type": efa_instance_types()[-1]}],
    ids=variant_id,
)
def test_every_acknowledgement_is_narrow_and_explained(synth, variant):
    # No blanket suppressions: never on an app or stack, and every reason says something specific.
    acknowledgements = list(_acknowledgements(synth(**variant)))
    assert acknowledgements
    for construct, rule, reason in acknowledgements:
        assert not isinstance(construct, (cdk.App, cdk.Stack)), f"{rule} acknowledged on {construct.node.path}"
        assert len(reason) >= 40, f"{rule} on {construct.node.path}: reason too thin: {reason!r}"


def test_the_synth_summary_counts_the_acknowledged_findings_the_report_lists(synth):
    # cdk-nag's report keeps acknowledged findings apart (suppressedViolations): the summary counts those.
    outdir = synth().outdir
    report = json.loads((outdir / "validation-report.json").read_text())
    listed = sum(len(plugin.get("suppressedViolations", [])) for plugin in report["pluginReports"])
    assert listed > 0 and open_findings(outdir) == ([], listed)


def test_the_synth_summary_lints_only_this_synthesis_templates(synth, tmp_path):
    # A template another environment's synthesis left in cdk.out/ is not this synthesis's: the manifest says which.
    from tools.gates import stack_templates

    outdir = tmp_path / "cdk.out"
    shutil.copytree(synth().outdir, outdir)
    ours = stack_templates(outdir)
    shutil.copyfile(ours[0], outdir / "EfaTraining-old-Leftover.template.json")
    assert stack_templates(outdir) == ours and len(ours) == len(list(outdir.glob("*.template.json"))) - 1


def _distinct_templates(synth, variants: list[dict]) -> list[Path]:
    """One path per distinct template content among these variants' stacks (many are shared between variants)."""
    by_content: dict[str, Path] = {}
    for variant in variants:
        for template in sorted(synth(**variant).outdir.glob("*.template.json")):
            by_content.setdefault(hashlib.sha256(template.read_bytes()).hexdigest(), template)
    return list(by_content.values())


def test_checkov_finds_nothing_unacknowledged(synth):
    # checkov, a scanner independent of cdk-nag and cfn-lint, over every environment on every backend: each finding
    # is fixed or acknowledged on its resource (Metadata.checkov.skip, constructs/nag.py acknowledge).
    assert checkov(_distinct_templates(synth, SCANNED)) == []


def test_the_checkov_gate_reports_what_nobody_acknowledged(tmp_path):
    # An unencrypted log group (CKV_AWS_158) fails the gate; the same resource with a checkov skip does not.
    group = {"Type": "AWS::Logs::LogGroup", "Properties": {"RetentionInDays": 7}}
    skip = {"checkov": {"skip": [{"id": "CKV_AWS_158", "comment": "a test of the acknowledgement itself"}]}}
    for name, resource in (("Open", group), ("Acknowledged", {**group, "Metadata": skip})):
        (tmp_path / f"{name}.template.json").write_text(json.dumps({"Resources": {f"{name}Logs": resource}}))
    found = checkov(sorted(tmp_path.glob("*.template.json")))
    assert found == ["Open.template.json: CKV_AWS_158 AWS::Logs::LogGroup.OpenLogs"]


def test_every_checkov_acknowledgement_names_one_check_with_a_reason(synth):
    # No blanket skip: each entry names one check id and says why, on one resource.
    skips = [
        (template.name, logical, entry)
        for template in _distinct_templates(synth, SCANNED)
        for logical, resource in json.loads(template.read_text())["Resources"].items()
        for entry in resource.get("Metadata", {}).get(CHECKOV_METADATA, {}).get("skip", [])
    ]
    assert skips
    for template, logical, entry in skips:
        assert entry["id"].startswith("CKV") and "," not in entry["id"], f"{template} {logical}: {entry}"
        assert len(entry["comment"]) >= 40, f"{template} {logical} {entry['id']}: reason too thin"


# (service principal, resource type) of every grant whose service documents a confused-deputy condition for it: the
# grant must carry one (aws:SourceArn / aws:SourceAccount). CloudWatch alarms and AWS Budgets on the alerts topic
# (SNS developer guide, "Example cases for Amazon SNS access control"), CloudWatch on its key too; the SageMaker,
# EKS cluster and VPC flow-log role trusts (each service's "Cross-service confused deputy prevention" or role page).
GUARDED_GRANTS = {
    ("cloudwatch.amazonaws.com", "AWS::SNS::TopicPolicy"),
    ("cloudwatch.amazonaws.com", "AWS::KMS::Key"),
    ("budgets.amazonaws.com", "AWS::SNS::TopicPolicy"),
    ("sagemaker.amazonaws.com", "AWS::IAM::Role"),
    ("eks.amazonaws.com", "AWS::IAM::Role"),
    ("vpc-flow-logs.amazonaws.com", "AWS::IAM::Role"),
}
# Grants of such a service that its documents give no condition for: SageMaker's "Cross-service confused deputy
# prevention" lists its features' examples (Edge Manager ... Training Jobs) and none for MLflow, whose tracking server
# role (constructs/storage/tracking.py) a condition SageMaker may not meet would make fail to create. By logical id.
UNDOCUMENTED_GRANTS = {("sagemaker.amazonaws.com", "TrackingRole")}
_POLICY_DOCUMENTS = {
    "AWS::IAM::Role": "AssumeRolePolicyDocument",
    "AWS::SNS::TopicPolicy": "PolicyDocument",
    "AWS::KMS::Key": "KeyPolicy",
}


def _service_grants(templates: list[Path]):
    """(service, resource type, template, logical id, statement) of every service-principal statement."""
    for template in templates:
        for logical, resource in json.loads(template.read_text())["Resources"].items():
            document = resource.get("Properties", {}).get(_POLICY_DOCUMENTS.get(resource["Type"], ""), {})
            for statement in document.get("Statement", []) if isinstance(document, dict) else []:
                services = (
                    statement.get("Principal", {}).get("Service", []) if statement.get("Principal") != "*" else []
                )
                for service in [services] if isinstance(services, str) else services:
                    yield service, resource["Type"], template.name, logical, statement


@pytest.mark.parametrize("grant", sorted(GUARDED_GRANTS), ids=lambda grant: f"{grant[0]}-{grant[1]}")
def test_service_grants_carry_the_confused_deputy_guard_their_service_documents(synth, grant):
    # Derived from the synthesized templates of every environment on every backend: each such grant is scoped to
    # this account's sources, and there is at least one (the grant exists on some backend).
    found = [g for g in _service_grants(_distinct_templates(synth, SCANNED)) if g[:2] == grant]
    assert found
    for service, _, template, logical, statement in found:
        if any(service == s and logical.startswith(prefix) for s, prefix in UNDOCUMENTED_GRANTS):
            continue
        keys = {key for test in statement.get("Condition", {}).values() for key in test}
        assert keys & {"aws:SourceArn", "aws:SourceAccount"}, f"{template} {logical}: {statement}"
