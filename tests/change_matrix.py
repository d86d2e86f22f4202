"""What a redeploy does, computed from the templates before and after a change, as CloudFormation and the CDK CLI
decide it:

- the CLI deploys a stack when its template changed (`cdk deploy` skips an unchanged stack), and always when it has
  a Systems Manager parameter type (aws-cdk, ParameterValues.hasChanges: "we can't predict what the values will
  be"; one whose description holds `[cdk:skip]`, the bootstrap version's, opts out);
- CloudFormation replaces a resource when its logical id goes away (deleted; a rename creates a new one), its type
  changes, or one of its create-only properties changes (the resource type's schema, `createOnlyProperties`:
  cfn-lint bundles the schemas), or when such a property reads a value that itself changes;
- a Batch compute environment's ComputeResources properties are create-only unless `ReplaceComputeEnvironment` is
  false (CloudFormation template reference, AWS::Batch::ComputeEnvironment, ReplaceComputeEnvironment); then Batch
  makes an infrastructure update instead: it launches new instances with the new settings and ends the old ones as
  their jobs finish; running jobs are terminated if `TerminateJobsOnUpdate`, else allowed to run until
  `JobExecutionTimeoutMinutes` (default 30) has elapsed (AWS Batch user guide, "Updating compute environments");
- a value read from Parameter Store is fetched again on every stack update (CloudFormation user guide, "Systems
  Manager parameter types": "CloudFormation always fetches the latest values from Parameter Store when it updates
  stacks"; an `ssm` dynamic reference without a version: "Get a plaintext value from Systems Manager Parameter
  Store"), so whatever reads one may change on every deploy of its stack;
- a weak reference (`Fn::GetStackOutput`) is resolved only when its consumer is created or updated (CloudFormation
  template reference, "Fn::GetStackOutput"), so a consumer the CLI skips keeps the old value of an output that
  changed: it is stale. A strong reference (`Fn::ImportValue`) whose value changes blocks the producer's update
  instead ("Exporting stack output values": an export in use cannot be modified).

An output's value changes when its expression changes, or reads a resource that is replaced, or reads an attribute
that every update renews: a job definition's `Ref` (the ARN with its revision: AWS::Batch::JobDefinition, "Return
values") and a launch template's `LatestVersionNumber`.
"""

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from cfnlint.schema.manager import PROVIDER_SCHEMA_MANAGER

# (type, attribute) pairs whose value changes on every update of the resource, not only on replacement. A version
# written "$Latest" or "$Default" is re-evaluated only during an infrastructure update (Batch API reference,
# LaunchTemplateSpecification): a launch-template update alone leaves such a compute environment as it is.
RENEWED_ON_UPDATE = {("AWS::Batch::JobDefinition", "Ref"), ("AWS::EC2::LaunchTemplate", "LatestVersionNumber")}
COMPUTE_ENVIRONMENT = "AWS::Batch::ComputeEnvironment"
# The ComputeResources properties "that can't be changed without replacing the compute environment" unless
# ReplaceComputeEnvironment is false (CloudFormation template reference, AWS::Batch::ComputeEnvironment).
REPLACED_UNLESS_UPDATABLE = (
    *("AllocationStrategy", "BidPercentage", "Ec2Configuration", "Ec2KeyPair", "ImageId", "InstanceRole"),
    *("InstanceTypes", "LaunchTemplate", "MaxvCpus", "MinvCpus", "PlacementGroup", "SecurityGroupIds", "Subnets"),
    *("Tags", "Type", "UpdateToLatestImageVersion"),
)
SCALING = ("MaxvCpus", "MinvCpus")  # a scaling update: no instance replaced (Batch user guide, as above)
SSM_PARAMETER_TYPE, NO_INVALIDATE = "AWS::SSM::Parameter::", "[cdk:skip]"
_SSM_REFERENCE = re.compile(r"\{\{resolve:ssm:([^}]+)\}\}")


@functools.cache
def create_only(region: str, resource_type: str) -> tuple[tuple[str, ...], ...]:
    """The create-only property paths of a resource type, e.g. (("Tags",), ("ComputeResources", "SpotIamFleetRole"))."""
    if resource_type.startswith("Custom::") or resource_type == "AWS::CloudFormation::CustomResource":
        return ()
    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type).schema
    return tuple(tuple(path.split("/")[2:]) for path in schema.get("createOnlyProperties", ()))


def _at(properties: dict, path: tuple[str, ...]) -> object:
    value: object = properties
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _reads(value: object) -> Iterator[tuple[str, str, str]]:
    """What an expression reads: ("resource", logical id or parameter, attribute), ("output", stack name, output
    name) and ("ssm", parameter, "") for an `ssm` dynamic reference without a version (it reads the latest)."""
    if isinstance(value, str):
        for reference in _SSM_REFERENCE.findall(value):
            if not re.fullmatch(r".*:\d+", reference):
                yield ("ssm", reference, "")
    elif isinstance(value, list):
        for item in value:
            yield from _reads(item)
    elif isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str) and not value["Ref"].startswith("AWS::"):
            yield ("resource", value["Ref"], "Ref")
        elif "Fn::GetAtt" in value:
            logical, attribute = value["Fn::GetAtt"]
            yield ("resource", logical, attribute)
        elif "Fn::GetStackOutput" in value:
            ref = value["Fn::GetStackOutput"]
            yield ("output", ref["StackName"], ref["OutputName"])
        else:
            for item in value.values():
                yield from _reads(item)


def _always_deployed(template: dict) -> bool:
    return any(
        p.get("Type", "").startswith(SSM_PARAMETER_TYPE) and NO_INVALIDATE not in p.get("Description", "")
        for p in template.get("Parameters", {}).values()
    )


@dataclass
class Redeploy:
    """One change: which stacks the CLI deploys, which resources CloudFormation replaces or deletes, which compute
    environments go through an infrastructure update, what may change on every deploy, who keeps a stale value."""

    deployed: set[str] = field(default_factory=set)
    replaced: set[tuple[str, str]] = field(default_factory=set)  # (stack, logical id), the deleted ones too
    deleted: set[tuple[str, str]] = field(default_factory=set)  # logical ids that went away
    infrastructure_updated: set[tuple[str, str]] = field(default_factory=set)  # instances replaced, not the CE
    every_deploy: set[tuple[str, str]] = field(default_factory=set)  # changed by a value resolved at deploy time
    stale: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    kinds: dict[tuple[str, str], str] = field(default_factory=dict, compare=False, repr=False)  # types before
    notes: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    def replaced_of_type(self, types: tuple[str, ...]) -> list[str]:
        """The replaced or deleted resources of these types (the type they had before the change)."""
        return sorted(self._describe(key) for key in self.replaced if self.kinds.get(key) in types)

    def infrastructure_updates(self) -> list[str]:
        return sorted(self._describe(key) for key in self.infrastructure_updated)

    def _describe(self, key: tuple[str, str]) -> str:
        notes = [self.kinds[key], *self.notes.get(key, ())] + ["deleted"] * (key in self.deleted)
        return f"{key[0]}/{key[1]} ({', '.join(notes + ['may change on every deploy'] * (key in self.every_deploy))})"


class _Analysis:
    def __init__(self, before: dict[str, dict], after: dict[str, dict], region: str):
        self.before, self.after, self.region = before, after, region
        deployed = {name for name in after if before.get(name) != after[name] or _always_deployed(after[name])}
        self.result = Redeploy(deployed=deployed)
        self.result.kinds = {(s, k): r["Type"] for s, t in before.items() for k, r in t.get("Resources", {}).items()}
        self.updated = {
            (stack, logical)
            for stack, template in after.items()
            for logical, resource in template.get("Resources", {}).items()
            if before.get(stack, {}).get("Resources", {}).get(logical) != resource
        }

    def changes(self, value: object, stack: str, outputs: bool = True) -> bool:
        return any(self._read_changes(read, stack) for read in _reads(value) if outputs or read[0] != "output")

    def resolved(self, value: object, stack: str) -> bool:
        """Whether the value may change on every deploy: it reads Parameter Store, or what changes by reading it."""
        every_deploy = self.result.every_deploy
        return any(
            self._resolved_here(read, stack) or (self._read_changes(read, stack) and (stack, read[1]) in every_deploy)
            for read in _reads(value)
            if read[0] != "output"
        )

    def _resolved_here(self, read: tuple[str, str, str], stack: str) -> bool:
        kind, name, _ = read
        parameter = self.after[stack].get("Parameters", {}).get(name, {})
        ssm = kind == "ssm" or (kind == "resource" and parameter.get("Type", "").startswith(SSM_PARAMETER_TYPE))
        return ssm and stack in self.result.deployed

    def _read_changes(self, read: tuple[str, str, str], stack: str) -> bool:
        kind, name, attribute = read
        if kind == "output":
            return self.output_changes(name, attribute)
        if self._resolved_here(read, stack):
            return True
        resource_type = self.after[stack]["Resources"].get(name, {}).get("Type", "")
        renewed = (resource_type, attribute) in RENEWED_ON_UPDATE and (stack, name) in self.updated
        return kind == "resource" and ((stack, name) in self.result.replaced or renewed)

    def output_changes(self, stack: str, output: str) -> bool:
        old = self.before.get(stack, {}).get("Outputs", {}).get(output, {}).get("Value")
        new = self.after.get(stack, {}).get("Outputs", {}).get(output, {}).get("Value")
        return old != new or self.changes(new, stack)

    def settle(self) -> None:
        """Replacements and updates propagate through the values properties read: to a fixed point."""
        while self._pass():
            pass
        self.result.infrastructure_updated -= self.result.replaced
        for stack, template in self.before.items():  # a logical id that goes away: its resource is deleted
            for logical in template.get("Resources", {}):
                if logical not in self.after.get(stack, {}).get("Resources", {}):
                    self.result.deleted.add((stack, logical))
        self.result.replaced |= self.result.deleted

    def _pass(self) -> bool:
        result, known = self.result, self._known()
        for stack, template in self.after.items():
            for logical, resource in template.get("Resources", {}).items():
                old = self.before.get(stack, {}).get("Resources", {}).get(logical)
                if old is not None and (stack, logical) not in result.replaced:
                    self._classify((stack, logical), resource, old)
        return self._known() != known

    def _known(self) -> tuple[int, ...]:
        r = self.result
        return len(r.replaced), len(r.infrastructure_updated), len(r.every_deploy), len(self.updated)

    def _classify(self, key: tuple[str, str], resource: dict, old: dict) -> None:
        stack, props, old_props = key[0], resource.get("Properties", {}), old.get("Properties", {})

        def differs(path: tuple[str, ...]) -> bool:
            return _at(props, path) != _at(old_props, path) or self.changes(_at(props, path), stack)

        # What reads a replaced resource is updated to point to the new one (CloudFormation user guide, "Understand
        # update behaviors of stack resources", Replacement), and so is what reads a value fetched at deploy time.
        if self.changes(props, stack, outputs=False):
            self.updated.add(key)
        if old["Type"] != resource["Type"] or any(differs(p) for p in create_only(self.region, resource["Type"])):
            self.result.replaced.add(key)
        elif resource["Type"] == COMPUTE_ENVIRONMENT:
            changed = [name for name in REPLACED_UNLESS_UPDATABLE if differs(("ComputeResources", name))]
            self._compute_environment(key, props, changed)
        if key in self.updated and self.resolved(props, stack):
            self.result.every_deploy.add(key)

    def _compute_environment(self, key: tuple[str, str], props: dict, changed: list[str]) -> None:
        if not changed:
            return
        # An infrastructure update needs the service-linked role (the default) and a strategy other than BEST_FIT,
        # Batch's default (user guide, as above; API reference, ComputeResource); what CloudFormation does without
        # them is not documented: counted as a replacement.
        strategy = str(_at(props, ("ComputeResources", "AllocationStrategy")) or "BEST_FIT").upper()
        own_role = "ServiceRole" in props and "AWSServiceRoleForBatch" not in json.dumps(props["ServiceRole"])
        if props.get("ReplaceComputeEnvironment", True) is not False or strategy == "BEST_FIT" or own_role:
            self.result.replaced.add(key)
        elif set(changed) - set(SCALING):
            self.result.infrastructure_updated.add(key)
            policy = props.get("UpdatePolicy", {})  # what running jobs see (user guide, as above)
            minutes = policy.get("JobExecutionTimeoutMinutes", 30)
            terminated = policy.get("TerminateJobsOnUpdate", False) is not False
            self.result.notes[key] = ("running jobs terminated" if terminated else f"running jobs run {minutes} min",)

    def references(self) -> None:
        result = self.result
        for stack, template in self.after.items():
            for kind, producer, output in set(_reads(template)):
                if kind == "output" and stack not in result.deployed and self.output_changes(producer, output):
                    result.stale.append(f"{stack} keeps the old value of {producer}.{output}")
            for name in _imports(template):
                if _export_changes(self.after, name, self.output_changes):
                    result.blocked.append(f"{stack} imports {name}, whose value changes")


def redeploy(before: dict[str, dict], after: dict[str, dict], region: str) -> Redeploy:
    """Compare two synthesized apps (stack name -> template)."""
    analysis = _Analysis(before, after, region)
    analysis.settle()
    analysis.references()
    return analysis.result


def _imports(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        if isinstance(value.get("Fn::ImportValue"), str):
            yield value["Fn::ImportValue"]
        for item in value.values():
            yield from _imports(item)
    elif isinstance(value, list):
        for item in value:
            yield from _imports(item)


def _export_changes(after: dict, name: str, output_changes) -> bool:
    for stack, template in after.items():
        for output_name, output in template.get("Outputs", {}).items():
            if output.get("Export", {}).get("Name") == name:
                return output_changes(stack, output_name)
    return True  # the export went away


def with_new_image(templates: dict[str, dict]) -> dict[str, dict]:
    """The templates after a change to training_image/: every Docker image asset's hash is a new one (the CDK
    hashes the build context), as in the URIs the job definitions and states hold."""
    text = json.dumps(templates)
    for digest in {part.split(":")[-1][:64] for part in _asset_uris(templates)}:
        text = text.replace(digest, "f" * 64)
    return json.loads(text)


def _asset_uris(value: object) -> Iterator[str]:
    if isinstance(value, str) and "container-assets" in value and ":" in value:
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _asset_uris(item)
    elif isinstance(value, list):
        for item in value:
            yield from _asset_uris(item)
