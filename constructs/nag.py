"""Acknowledgements of the gates' findings: one helper, one finding per call, each with a reason.

cdk-nag (`AwsSolutions-...`, stored as `AwsSolutions::<finding>`) and checkov (`CKV_...`, tools/gates.py). Every
acknowledgement names one rule or one finding on one construct, with a reason a reviewer can check
(cdklabs/cdk-nag: "the narrowest scope"). A role's cdk-nag IAM5 findings sit on its DefaultPolicy when it has one, so
the acknowledgement goes there; other constructs (a role's managed policies, a function) are acknowledged themselves.
A checkov finding is acknowledged on the CloudFormation resource it is raised on: the construct itself or its default
child (a role's statements: pass its DefaultPolicy).
"""

from typing import cast

import aws_cdk as cdk

from constructs import IConstruct

# checkov skips a check on a resource whose template Metadata has checkov.skip: [{id, comment}] (checkov docs,
# "Suppressing and Skipping Policies"; checkov/cloudformation/context_parser.py, collect_skip_comments).
CHECKOV_METADATA = "checkov"


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """`finding` as cdk-nag names it: a rule (AwsSolutions-L1) or one finding (AwsSolutions-IAM5[Resource::*]); or
    a checkov check id (CKV_AWS_158), skipped on `scope`'s resource."""
    if finding.startswith("CKV"):
        _skip_checkov(scope, finding, reason)
        return
    policy = scope.node.try_find_child("DefaultPolicy") if finding.startswith("AwsSolutions-IAM5") else None
    cdk.Validations.of(policy or scope).acknowledge(cdk.Acknowledgment(id=f"AwsSolutions::{finding}", reason=reason))


# The reasons shared by every acknowledgement of one kind of resource.
LOGS_ENCRYPTED_AT_REST = (
    "CloudWatch Logs encrypts every log group at rest (CloudWatch Logs user guide, Encrypt log data in CloudWatch Logs "
    "using AWS KMS, encrypt-log-data-kms.html); a customer key would add a key policy for the logs service and keep no "
    "reader out that IAM does not"
)
CDK_HANDLER_REASONS = {
    "CKV_AWS_115": "A CDK-made custom resource handler runs only while CloudFormation deploys; reserved concurrency "
    "would take capacity from the account for nothing",
    "CKV_AWS_116": "A CDK-made custom resource handler reports its outcome to CloudFormation itself (the custom "
    "resource response); a dead-letter queue would hold events nobody replays",
    "CKV_AWS_117": "A CDK-made custom resource handler calls only AWS APIs; in the VPC it would need NAT or "
    "endpoints and isolate nothing",
    "CKV_AWS_173": "A CDK-made handler's environment holds CDK settings, no secret; Lambda encrypts environment "
    "variables at rest with an AWS managed key (Lambda developer guide, configuration-envvars-encryption.html)",
}


def acknowledge_log_group_encryption(log_group: IConstruct) -> None:
    """checkov's CKV_AWS_158 (no customer key) on a log group: CloudWatch Logs encrypts it at rest itself."""
    _skip_checkov(log_group, "CKV_AWS_158", LOGS_ENCRYPTED_AT_REST)


def acknowledge_cdk_handler(function: IConstruct, *checks: str) -> None:
    """checkov's Lambda checks on a handler CDK creates for its own custom resources (these `checks` of
    CDK_HANDLER_REASONS, the ones raised on it): its code and settings are CDK's, not ours to change."""
    for check in checks:
        _skip_checkov(function, check, CDK_HANDLER_REASONS[check])


def acknowledge_cdk_provider(scope: IConstruct, provider: str, *checks: str) -> None:
    """acknowledge_cdk_handler on the handler of CDK's one-per-stack custom resource provider `provider` (e.g.
    "S3AutoDeleteObjects": construct Custom::<provider>CustomResourceProvider at the top of `scope`'s stack), where the
    stack has it."""
    singleton = cdk.Stack.of(scope).node.try_find_child(f"Custom::{provider}CustomResourceProvider")
    if singleton is not None:
        acknowledge_cdk_handler(singleton.node.find_child("Handler"), *checks)


def _skip_checkov(scope: IConstruct, check: str, reason: str) -> None:
    resource = scope if cdk.CfnResource.is_cfn_resource(scope) else scope.node.default_child
    if resource is None or not cdk.CfnResource.is_cfn_resource(resource):
        raise ValueError(f"{scope.node.path} has no CloudFormation resource to acknowledge {check} on")
    resource = cast(cdk.CfnResource, resource)
    skips = (resource.get_metadata(CHECKOV_METADATA) or {}).get("skip", [])
    resource.add_metadata(CHECKOV_METADATA, {"skip": [*skips, {"id": check, "comment": reason}]})


def managed_policy_finding(name: str) -> str:
    """The finding of one AWS managed policy attached to a role (AwsSolutions-IAM4)."""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


def shown_arn(stack: cdk.Stack, service: str, resource: str, region: str | None = None) -> str:
    """An ARN of `stack` as cdk-nag prints it in a finding: known values literal, tokens as <AWS::Pseudo>; `region`
    "" for a global service's (IAM)."""

    def shown(value: str, pseudo: str) -> str:
        return f"<AWS::{pseudo}>" if cdk.Token.is_unresolved(value) else value

    return (
        f"arn:{shown(stack.partition, 'Partition')}:{service}:"
        f"{shown(stack.region, 'Region') if region is None else region}:"
        f"{shown(stack.account, 'AccountId')}:{resource}"
    )


# The IAM gate's acknowledgements (tools/iam_lint.py), read from the policy resource's metadata.
IAM_LINT_METADATA = "efa-training:iam-lint"


def acknowledge_iam(scope: IConstruct, issue: str, actions: str, reason: str, formats: tuple[str, ...] = ()) -> None:
    """Acknowledge the IAM gate's `issue` (parliament's name) on the policy where the grant is: a role's DefaultPolicy,
    or a policy construct itself (a bucket policy). `actions` is a pattern (`s3:List*`) every action the finding
    names must match; `formats`, where given, the only resource types (parliament's required_format) it is about.
    For a finding that is right about the bundled reference and wrong about AWS, with why."""
    policy = scope.node.try_find_child("DefaultPolicy") or scope
    resource = policy.node.default_child
    if not isinstance(resource, cdk.CfnResource):
        raise ValueError(f"{scope.node.path} has no policy resource to acknowledge {issue} on")
    existing = resource.get_metadata(IAM_LINT_METADATA) or []
    entry = {"issue": issue, "actions": actions, "reason": reason, **({"formats": list(formats)} if formats else {})}
    resource.add_metadata(IAM_LINT_METADATA, [*existing, entry])
