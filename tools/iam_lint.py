"""The IAM gate: every policy of a synthesized app checked against the IAM service authorization reference.

An action given a resource of a type it does not take, an action or service that does not exist, a condition key
the action does not take: each grants nothing, silently, and is denied at run time on the first real run. cdk-nag
checks wildcards, not whether a scoped resource can match. parliament (pinned in requirements-dev.txt) checks
exactly this against the reference it bundles (`iam_definition.json`, parliament 1.6.4 of 2025-04: actions AWS
added since are unknown to it, hence acknowledgements).

Policies read: identity policies (AWS::IAM::Policy, ManagedPolicy, a role's inline Policies) and the resource
policies of buckets, topics, keys, repositories and log groups. Intrinsic functions are rendered the way
CloudFormation resolves them, with a stand-in account, so a scoped resource keeps its type: `{"Fn::GetAtt":
["Bucket", "Arn"]}` becomes `arn:aws:s3:::bucket`.

A finding that is right about the reference but wrong about AWS (an action newer than the bundled data) is
acknowledged on the policy's own resource, where it is raised: metadata `efa-training:iam-lint`, a list of
{"issue", "actions", "reason"} (constructs.nag.acknowledge_iam).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase as fnmatch
from typing import Any, cast

ACCOUNT = "123456789012"
METADATA_KEY = "efa-training:iam-lint"  # constructs/nag.py IAM_LINT_METADATA (the tests hold them equal)
# parliament's issue groups that mean "grants something else than it says" (its config.yaml); NOT_IDEAL (a `*`
# where a resource could be named) and OLD are style, which cdk-nag's IAM5 already governs.
FAILING_GROUPS = {"ERROR", "MALFORMED", "INVALID", "LOGICAL_INCONSISTANCY", "BAD_PATTERN"}
# How each referenced resource renders (CloudFormation's return values): type -> (Ref, Arn) patterns.
_RENDER = {
    "AWS::S3::Bucket": ("bucket-{id}", "arn:aws:s3:::bucket-{id}"),
    "AWS::SNS::Topic": ("arn:aws:sns:{region}:{account}:topic-{id}", "arn:aws:sns:{region}:{account}:topic-{id}"),
    "AWS::KMS::Key": ("key-{id}", "arn:aws:kms:{region}:{account}:key/key-{id}"),
    "AWS::Logs::LogGroup": ("group-{id}", "arn:aws:logs:{region}:{account}:log-group:group-{id}:*"),
    "AWS::StepFunctions::StateMachine": (
        "arn:aws:states:{region}:{account}:stateMachine:machine-{id}",
        "arn:aws:states:{region}:{account}:stateMachine:machine-{id}",
    ),
    "AWS::IAM::Role": ("role-{id}", "arn:aws:iam::{account}:role/role-{id}"),
    "AWS::ECR::Repository": ("repository-{id}", "arn:aws:ecr:{region}:{account}:repository/repository-{id}"),
    "AWS::EKS::Cluster": ("cluster-{id}", "arn:aws:eks:{region}:{account}:cluster/cluster-{id}"),
    "AWS::EKS::Nodegroup": (
        "nodegroup-{id}",
        "arn:aws:eks:{region}:{account}:nodegroup/cluster/nodegroup-{id}/0123",
    ),
    "AWS::Lambda::Function": ("function-{id}", "arn:aws:lambda:{region}:{account}:function:function-{id}"),
    "AWS::SSM::Parameter": ("/parameter-{id}", "arn:aws:ssm:{region}:{account}:parameter/parameter-{id}"),
    "AWS::FSx::FileSystem": ("fs-0123456789abcdef0", "arn:aws:fsx:{region}:{account}:file-system/fs-0123456789abcdef0"),
    "AWS::SQS::Queue": ("https://sqs/queue-{id}", "arn:aws:sqs:{region}:{account}:queue-{id}"),
    "AWS::Events::Rule": ("rule-{id}", "arn:aws:events:{region}:{account}:rule/rule-{id}"),
}
_POLICY_PROPERTIES = {
    "AWS::IAM::Policy": ("PolicyDocument",),
    "AWS::IAM::ManagedPolicy": ("PolicyDocument",),
    "AWS::S3::BucketPolicy": ("PolicyDocument",),
    "AWS::SNS::TopicPolicy": ("PolicyDocument",),
    "AWS::KMS::Key": ("KeyPolicy",),
    "AWS::ECR::Repository": ("RepositoryPolicyText",),
    "AWS::Logs::ResourcePolicy": ("PolicyDocument",),
}


@dataclass(frozen=True)
class Finding:
    stack: str
    logical_id: str
    issue: str
    detail: str

    def __str__(self) -> str:
        return f"{self.stack}/{self.logical_id}: {self.issue} {self.detail}"


class _Renderer:
    """CloudFormation's intrinsic functions, resolved to plausible values of the right shape."""

    def __init__(self, templates: dict[str, dict], region: str) -> None:
        self.templates, self.region = templates, region

    def render(self, value: object, stack: str) -> object:
        if isinstance(value, list):
            return [self.render(item, stack) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((function, argument),) = value.items()
            rendered = self._function(function, argument, stack)
            if rendered is not None:
                return rendered
        return {key: self.render(item, stack) for key, item in value.items()}

    def _function(self, function: str, argument: Any, stack: str) -> object:
        if function == "Ref" and isinstance(argument, str):
            return self._ref(argument, stack, "Ref")
        if function == "Fn::GetAtt":
            logical, attribute = argument if isinstance(argument, list) else str(argument).split(".", 1)
            return self._ref(logical, stack, attribute)
        if function == "Fn::Join":
            separator, parts = argument
            return separator.join(str(self.render(part, stack)) for part in parts)
        if function == "Fn::Sub" and isinstance(argument, str):
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(self._ref(m.group(1), stack, "Ref")), argument)
        if function == "Fn::GetStackOutput":
            producer = str(argument["StackName"])
            return self.render(self.templates[producer]["Outputs"][argument["OutputName"]]["Value"], producer)
        if function == "Fn::ImportValue":
            return self._import(str(self.render(argument, stack)))
        if function == "Fn::Select":
            index, items = argument
            return cast(list, self.render(items, stack))[int(index)]
        return None

    def _import(self, name: str) -> object:
        for producer, template in self.templates.items():
            for output in template.get("Outputs", {}).values():
                if output.get("Export", {}).get("Name") == name:
                    return self.render(output["Value"], producer)
        raise KeyError(f"no stack exports {name}")

    def _ref(self, name: str, stack: str, attribute: str) -> str:
        pseudo = {"AWS::AccountId": ACCOUNT, "AWS::Region": self.region, "AWS::Partition": "aws"}
        if name in pseudo:
            return pseudo[name]
        if name == "AWS::URLSuffix":
            return "amazonaws.com"
        resource = self.templates[stack].get("Resources", {}).get(name, {})
        ref, arn = _RENDER.get(resource.get("Type", ""), ("{id}", "arn:aws:unknown:{region}:{account}:{id}"))
        pattern = arn if attribute.endswith("Arn") else ref
        return pattern.format(id=name.lower()[:40], region=self.region, account=ACCOUNT)


def policies(templates: dict[str, dict], region: str) -> Iterator[tuple[str, str, dict, list[dict]]]:
    """(stack, logical id, rendered policy document, acknowledgements) for every policy of the app."""
    renderer = _Renderer(templates, region)
    for stack, template in templates.items():
        for logical, resource in template.get("Resources", {}).items():
            properties = resource.get("Properties", {})
            acknowledged = resource.get("Metadata", {}).get(METADATA_KEY, [])
            documents = [properties[p] for p in _POLICY_PROPERTIES.get(resource["Type"], ()) if p in properties]
            if resource["Type"] == "AWS::IAM::Role":
                documents += [policy["PolicyDocument"] for policy in properties.get("Policies", [])]
            for document in documents:
                rendered = renderer.render(document, stack)
                parsed = json.loads(rendered) if isinstance(rendered, str) else cast(dict, rendered)
                yield stack, logical, _allowing(parsed), acknowledged


def _allowing(document: dict) -> dict:
    """The statements that grant: a Deny on a resource its actions do not take denies nothing it meant to allow
    (a bucket policy's `Deny s3:*` without TLS names the bucket for actions that take none), so it is no finding."""
    statements = document.get("Statement", [])
    statements = [statements] if isinstance(statements, dict) else statements
    return {**document, "Statement": [s for s in statements if s.get("Effect") == "Allow"]}


def findings(templates: dict[str, dict], region: str) -> tuple[list[Finding], int]:
    """(the findings nobody acknowledged, how many were acknowledged) over every policy of the app."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports pkg_resources, which warns that it is deprecated
        from parliament import analyze_policy_string, config

    open_findings: list[Finding] = []
    acknowledged = 0
    for stack, logical, document, acknowledgements in policies(templates, region):
        for found in analyze_policy_string(json.dumps(document), ignore_private_auditors=True).findings:
            if config.get(found.issue, {}).get("group") not in FAILING_GROUPS:
                continue
            if any(_covers(ack, found) for ack in acknowledgements):
                acknowledged += 1
                continue
            open_findings.append(Finding(stack, logical, found.issue, json.dumps(found.detail, default=str)))
    return open_findings, acknowledged


def _covers(acknowledgement: dict, found) -> bool:
    """The acknowledgement names this issue, every action the finding names matches its pattern, and, where it names
    the resource types it is about (`formats`), every type the finding wants is one of them: an acknowledged
    mismatch on one type never hides a missing grant of another."""
    detail = found.detail
    formats = set(acknowledgement.get("formats") or [])
    if isinstance(detail, list) and all(isinstance(item, dict) and "action" in item for item in detail):
        named = {item["action"] for item in detail}
        wanted = {item.get("required_format", "") for item in detail}
    else:  # a sentence naming actions: service:ActionName
        named = set(re.findall(r"\b[a-z0-9-]+:[A-Z][A-Za-z0-9]*", json.dumps(detail, default=str)))
        wanted = set()
    pattern = acknowledgement.get("actions", "")
    return (
        acknowledgement.get("issue") == found.issue
        and bool(named)
        and all(fnmatch(a, pattern) for a in named)
        and (not formats or wanted <= formats)
    )
