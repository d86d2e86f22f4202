"""What a redeploy does, computed from the templates before and after a change, as CloudFormation and the CDK CLI
decide it:

- the CLI deploys a stack only when its template changed (`cdk deploy` skips an unchanged stack);
- CloudFormation replaces a resource when its logical id goes away or one of its create-only properties changes
  (the resource type's schema, `createOnlyProperties`: cfn-lint bundles the schemas), or when such a property
  reads a value that itself changes;
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
from collections.abc import Iterator
from dataclasses import dataclass, field

from cfnlint.schema.manager import PROVIDER_SCHEMA_MANAGER

# (type, attribute) pairs whose value changes on every update of the resource, not only on replacement.
RENEWED_ON_UPDATE = {("AWS::Batch::JobDefinition", "Ref"), ("AWS::EC2::LaunchTemplate", "LatestVersionNumber")}


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
    """What an expression reads: ("resource", logical id, attribute) and ("output", stack name, output name)."""
    if isinstance(value, list):
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


@dataclass
class Redeploy:
    """One change: which stacks the CLI deploys, which resources CloudFormation replaces, who keeps a stale value."""

    deployed: set[str] = field(default_factory=set)
    replaced: set[tuple[str, str]] = field(default_factory=set)  # (stack, logical id)
    stale: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def replaced_of_type(self, after: dict[str, dict], types: tuple[str, ...]) -> list[str]:
        return sorted(
            f"{stack}/{logical} ({kind})"
            for stack, logical in self.replaced
            if (kind := after.get(stack, {}).get("Resources", {}).get(logical, {}).get("Type")) in types
        )


def redeploy(before: dict[str, dict], after: dict[str, dict], region: str) -> Redeploy:
    """Compare two synthesized apps (stack name -> template)."""
    result = Redeploy(deployed={name for name in after if before.get(name) != after[name]})
    updated = {
        (stack, logical)
        for stack, template in after.items()
        for logical, resource in template.get("Resources", {}).items()
        if before.get(stack, {}).get("Resources", {}).get(logical) != resource
    }

    def changes(value: object, stack: str) -> bool:
        for kind, name, attribute in _reads(value):
            if kind == "resource":
                resource_type = after[stack]["Resources"].get(name, {}).get("Type", "")
                if (stack, name) in result.replaced or (
                    (resource_type, attribute) in RENEWED_ON_UPDATE and (stack, name) in updated
                ):
                    return True
            elif output_changes(name, attribute):
                return True
        return False

    def output_changes(stack: str, output: str) -> bool:
        old = before.get(stack, {}).get("Outputs", {}).get(output, {}).get("Value")
        new = after.get(stack, {}).get("Outputs", {}).get(output, {}).get("Value")
        return old != new or changes(new, stack)

    while True:  # replacements propagate through the values create-only properties read: to a fixed point
        found = set()
        for stack, template in after.items():
            for logical, resource in template.get("Resources", {}).items():
                old = before.get(stack, {}).get("Resources", {}).get(logical)
                if (stack, logical) in result.replaced or old is None:
                    continue
                paths = create_only(region, resource["Type"])
                props, old_props = resource.get("Properties", {}), old.get("Properties", {})
                if old["Type"] != resource["Type"] or any(
                    _at(props, path) != _at(old_props, path) or changes(_at(props, path), stack) for path in paths
                ):
                    found.add((stack, logical))
        if not found:
            break
        result.replaced |= found
    for stack, template in before.items():  # a logical id that goes away: its resource is deleted
        for logical in template.get("Resources", {}):
            if logical not in after.get(stack, {}).get("Resources", {}):
                result.replaced.add((stack, logical))
    for stack, template in after.items():
        for kind, producer, output in set(_reads(template)):
            if kind == "output" and stack not in result.deployed and output_changes(producer, output):
                result.stale.append(f"{stack} keeps the old value of {producer}.{output}")
        for name in _imports(template):
            if _export_changes(before, after, name, output_changes):
                result.blocked.append(f"{stack} imports {name}, whose value changes")
    return result


def _imports(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        if isinstance(value.get("Fn::ImportValue"), str):
            yield value["Fn::ImportValue"]
        for item in value.values():
            yield from _imports(item)
    elif isinstance(value, list):
        for item in value:
            yield from _imports(item)


def _export_changes(before: dict, after: dict, name: str, output_changes) -> bool:
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
