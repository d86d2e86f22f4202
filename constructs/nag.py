"""cdk-nag acknowledgements: one helper, one id form (`AwsSolutions::<finding>`), one finding per call.

Every acknowledgement names one rule or one finding on one construct, with a reason a reviewer can check
(cdklabs/cdk-nag: "the narrowest scope"). A role's findings sit on its DefaultPolicy when it has one, so the
acknowledgement goes there; other constructs (a role's managed policies, a function) are acknowledged themselves.
"""

import aws_cdk as cdk

from constructs import IConstruct


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """`finding` as cdk-nag names it: a rule (AwsSolutions-L1) or one finding (AwsSolutions-IAM5[Resource::*])."""
    policy = scope.node.try_find_child("DefaultPolicy") if finding.startswith("AwsSolutions-IAM5") else None
    cdk.Validations.of(policy or scope).acknowledge(cdk.Acknowledgment(id=f"AwsSolutions::{finding}", reason=reason))


def managed_policy_finding(name: str) -> str:
    """The finding of one AWS managed policy attached to a role (AwsSolutions-IAM4)."""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


def shown_arn(stack: cdk.Stack, service: str, resource: str) -> str:
    """An ARN of `stack` as cdk-nag prints it in a finding: known values literal, tokens as <AWS::Pseudo>."""

    def shown(value: str, pseudo: str) -> str:
        return f"<AWS::{pseudo}>" if cdk.Token.is_unresolved(value) else value

    return (
        f"arn:{shown(stack.partition, 'Partition')}:{service}:{shown(stack.region, 'Region')}:"
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
