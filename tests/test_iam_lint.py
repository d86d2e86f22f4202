"""The IAM gate (tools/iam_lint.py) over every app variant: each policy checked against the IAM service
authorization reference that parliament bundles, with no finding left unexplained."""

import json

import pytest

from constructs.nag import IAM_LINT_METADATA
from tests.synthesis import app_variants, variant_id
from tools.iam_lint import METADATA_KEY, findings, policies


@pytest.mark.slow  # whole-app synthesis of every variant (a gate, beside tests/test_gates.py)
@pytest.mark.parametrize("variant", app_variants(), ids=variant_id)
def test_every_policy_grants_what_it_says(synth, variant):
    synthesized = synth(**variant)
    assert len(list(policies(synthesized.templates, synthesized.config.region))) >= 5  # the gate read the app
    unexplained, _ = findings(synthesized.templates, synthesized.config.region)
    assert [str(f) for f in unexplained] == []


def _app(statement: dict, *, metadata: list | None = None) -> dict[str, dict]:
    policy = {
        "Type": "AWS::IAM::Policy",
        "Properties": {"PolicyDocument": {"Version": "2012-10-17", "Statement": [statement]}, "Roles": ["r"]},
        **({"Metadata": {METADATA_KEY: metadata}} if metadata else {}),
    }
    return {"App": {"Resources": {"Policy": policy}}}


def _file_systems(resource: object) -> dict:
    return {"Effect": "Allow", "Action": "fsx:DescribeFileSystems", "Resource": resource}


def test_a_scoped_resource_on_an_action_that_takes_none_is_a_finding():
    # DescribeFileSystems supports no resource-level permissions (Service Authorization Reference, Amazon FSx): a
    # file-system ARN, here built as the CDK builds one, grants nothing.
    scoped = {
        "Fn::Join": [
            "",
            ["arn:", {"Ref": "AWS::Partition"}, ":fsx:us-east-1:", {"Ref": "AWS::AccountId"}, ":file-system/*"],
        ]
    }
    (finding,) = findings(_app(_file_systems(scoped)), "us-east-1")[0]
    assert finding.issue == "RESOURCE_MISMATCH" and "fsx:DescribeFileSystems" in finding.detail
    assert findings(_app(_file_systems("*")), "us-east-1") == ([], 0)


def test_an_unknown_action_is_a_finding():
    statement = {"Effect": "Allow", "Action": "batch:SubmitJobs", "Resource": "*"}
    assert [f.issue for f in findings(_app(statement), "us-east-1")[0]] == ["UNKNOWN_ACTION"]


def test_a_finding_acknowledged_on_its_policy_is_counted_not_raised():
    acknowledged = [{"issue": "RESOURCE_MISMATCH", "actions": "fsx:Describe*", "reason": "a test"}]
    scoped = "arn:aws:fsx:us-east-1:123456789012:file-system/*"
    assert findings(_app(_file_systems(scoped), metadata=acknowledged), "us-east-1") == ([], 1)


def test_a_deny_is_not_read_as_a_grant():
    # A bucket policy's `Deny s3:*` without TLS names the bucket for every s3 action, most of which take no bucket.
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::data", "Principal": {"AWS": "*"}}
    assert findings(_app(deny), "us-east-1") == ([], 0)


def test_references_render_as_arns_of_their_type():
    # A role's grant on a bucket it references by Fn::GetAtt keeps the bucket's ARN shape, so the check has teeth.
    templates = _app({"Effect": "Allow", "Action": "s3:GetObject", "Resource": {"Fn::GetAtt": ["Data", "Arn"]}})
    templates["App"]["Resources"]["Data"] = {"Type": "AWS::S3::Bucket"}
    ((_, _, document, _),) = list(policies(templates, "us-east-1"))
    assert json.dumps(document["Statement"][0]["Resource"]) == '"arn:aws:s3:::bucket-data"'


def test_the_metadata_key_is_the_one_constructs_write():
    assert METADATA_KEY == IAM_LINT_METADATA


def test_an_acknowledgement_covers_only_the_actions_its_pattern_names():
    # A finding about fsx:DescribeFileSystems is not covered by an acknowledgement of s3 actions.
    acknowledged = [{"issue": "RESOURCE_MISMATCH", "actions": "s3:*", "reason": "another finding"}]
    scoped = "arn:aws:fsx:us-east-1:123456789012:file-system/*"
    unexplained, counted = findings(_app(_file_systems(scoped), metadata=acknowledged), "us-east-1")
    assert [f.issue for f in unexplained] == ["RESOURCE_MISMATCH"] and counted == 0


def test_an_acknowledged_resource_type_never_hides_a_missing_one():
    # The job-definition acknowledgement (parliament cannot match `name:*`) must not cover a SubmitJob that lost its
    # queue: that finding also wants the job-queue type.
    acknowledged = [
        {
            "issue": "RESOURCE_MISMATCH",
            "actions": "batch:SubmitJob",
            "reason": "a test",
            "formats": ["arn:*:batch:*:*:job-definition/*"],
        }
    ]
    arn = "arn:aws:batch:us-east-1:123456789012"
    grant = {"Effect": "Allow", "Action": "batch:SubmitJob", "Resource": [f"{arn}:job-definition/d:*", f"{arn}:job/*"]}
    unexplained, counted = findings(_app(grant, metadata=acknowledged), "us-east-1")
    assert [f.issue for f in unexplained] == ["RESOURCE_MISMATCH"] and counted == 0
    complete = {**grant, "Resource": [*grant["Resource"], f"{arn}:job-queue/q"]}
    assert findings(_app(complete, metadata=acknowledged), "us-east-1") == ([], 1)
