"""What the pictures read: every resource of a synthesized app, where it sits and what it references.

Read from the cloud assembly (templates and asset manifests) and from each stack's construct tree (construct
paths), never from the construct classes, so the pictures follow the code whatever its modules are called.
"""

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # importing aws_cdk starts Node.js: only the caller that synthesized the app has paid for it
    import aws_cdk as cdk

# A Docker image asset is no CloudFormation resource, but what a job runs: it stands in the model as this type.
DOCKER_IMAGE_ASSET = "cdk:DockerImageAsset"
# The L1 child ids under which an L2 construct keeps its CloudFormation resource.
_GENERIC_IDS = {"Resource", "Default"}

Key = tuple[str, str]  # (stack name, logical id)


@dataclass
class Resource:
    key: Key
    type: str
    path: str  # construct path inside its stack, without the stack and the L1's generic ids: "Network/Vpc"
    refs: set[Key] = field(default_factory=set)  # the resources its properties reference, in any stack

    @property
    def stack(self) -> str:
        return self.key[0]


@dataclass
class Assembly:
    stacks: tuple[str, ...]  # stack names, in the app's order
    templates: dict[str, dict]  # stack name -> CloudFormation template
    resources: dict[Key, Resource]


def read_assembly(stacks: Sequence["cdk.Stack"], assembly_dir: Path) -> Assembly:
    """Every resource of `stacks`, synthesized into `assembly_dir`, with its references resolved across stacks."""
    templates = {stack.stack_name: json.loads((assembly_dir / stack.template_file).read_text()) for stack in stacks}
    paths = {stack.stack_name: construct_paths(stack) for stack in stacks}
    assets = {
        stack.stack_name: docker_image_assets(assembly_dir / f"{stack.artifact_id}.assets.json") for stack in stacks
    }
    return assemble(templates, paths, assets)


def assemble(
    templates: dict[str, dict], paths: dict[str, dict[str, str]], assets: dict[str, dict[str, str]]
) -> Assembly:
    """The model of synthesized stacks (in the order of `templates`): their templates, the construct path of each
    logical id, and the Docker image assets each publishes (image tag -> origin)."""
    resources: dict[Key, Resource] = {}
    for stack, template in templates.items():
        for logical_id, body in template.get("Resources", {}).items():
            key = (stack, logical_id)
            resources[key] = Resource(key, body["Type"], paths.get(stack, {}).get(logical_id, logical_id))
        for tag, origin in assets.get(stack, {}).items():
            resources[(stack, f"asset:{tag}")] = Resource((stack, f"asset:{tag}"), DOCKER_IMAGE_ASSET, origin)
    resolver = _References(templates, resources)
    for key, resource in resources.items():
        if resource.type != DOCKER_IMAGE_ASSET:
            body = templates[key[0]]["Resources"][key[1]]
            resource.refs = set(resolver.of(body.get("Properties", {}), key[0])) - {key}
    return Assembly(tuple(templates), templates, resources)


def construct_paths(stack: "cdk.Stack") -> dict[str, str]:
    """Logical id -> the construct path of the L2 that owns it ("Storage/Lustre" for the FSx file system)."""
    import aws_cdk as cdk

    paths = {}
    for construct in stack.node.find_all():
        if cdk.CfnResource.is_cfn_resource(construct):
            parts = construct.node.path.split("/")[1:]
            while len(parts) > 1 and parts[-1] in _GENERIC_IDS:
                parts.pop()
            paths[stack.resolve(cast(cdk.CfnResource, construct).logical_id)] = "/".join(parts)
    return paths


def docker_image_assets(manifest: Path) -> dict[str, str]:
    """Image tag -> a readable origin ("Dockerfile.gpu") of each Docker image asset a stack publishes."""
    if not manifest.exists():
        return {}
    images = json.loads(manifest.read_text()).get("dockerImages", {})
    return {
        destination["imageTag"]: image["source"].get("dockerFile", "Dockerfile")
        for image in images.values()
        for destination in image["destinations"].values()
    }


class _References:
    """Resolves the intrinsic functions that name another resource, following outputs into the stack they are in."""

    def __init__(self, templates: dict[str, dict], resources: dict[Key, Resource]) -> None:
        self.templates = templates
        self.resources = resources
        # Fn::ImportValue names an export; CloudFormation resolves it to that output's value:
        # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-importvalue.html
        self.exports = {
            output["Export"]["Name"]: (stack, output["Value"])
            for stack, template in templates.items()
            for output in template.get("Outputs", {}).values()
            if isinstance(output.get("Export", {}).get("Name"), str)
        }
        self.assets = {
            key[1].removeprefix("asset:"): key for key, r in resources.items() if r.type == DOCKER_IMAGE_ASSET
        }
        # Batch queues are named, not referenced, by their consumers (config.layout.batch_name): an ARN formatted
        # from the name, `...:job-queue/<name>`, names the queue.
        self.queues = {
            resource["Properties"]["JobQueueName"]: (stack, logical)
            for stack, template in templates.items()
            for logical, resource in template.get("Resources", {}).items()
            if resource.get("Type") == "AWS::Batch::JobQueue"
            and isinstance(resource.get("Properties", {}).get("JobQueueName"), str)
        }

    def of(self, value: object, stack: str) -> Iterator[Key]:
        if isinstance(value, list):
            for item in value:
                yield from self.of(item, stack)
        elif isinstance(value, str):
            # A Docker image asset is referenced by its image URI, which ends with the asset's tag.
            yield from (key for tag, key in self.assets.items() if tag in value)
            yield from (self.queues[name] for name in re.findall(r"job-queue/([\w-]+)", value) if name in self.queues)
        elif isinstance(value, dict):
            if len(value) == 1:
                yield from self._function(*next(iter(value.items())), stack)
            for item in value.values():
                yield from self.of(item, stack)

    def _function(self, name: str, argument: object, stack: str) -> Iterator[Key]:
        if name == "Ref" and isinstance(argument, str):
            yield from self._resource(stack, argument)
        elif name == "Fn::GetAtt":
            target = argument[0] if isinstance(argument, list) else str(argument).split(".")[0]
            yield from self._resource(stack, target)
        elif name == "Fn::Sub":
            # ${LogicalId} and ${LogicalId.Attribute} name resources:
            # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-sub.html
            text = argument[0] if isinstance(argument, list) else argument
            for target in re.findall(r"\$\{([^!}.]+)", str(text)):
                yield from self._resource(stack, target)
        elif name == "Fn::ImportValue" and argument in self.exports:
            producer, output = self.exports[str(argument)]
            yield from self.of(output, producer)
        elif name == "Fn::GetStackOutput" and isinstance(argument, dict):
            # Returns the named output of another stack, exported or not:
            # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-getstackoutput.html
            stack_name = str(argument.get("StackName"))
            output = self.templates.get(stack_name, {}).get("Outputs", {}).get(argument.get("OutputName"))
            if output:
                yield from self.of(output["Value"], stack_name)

    def _resource(self, stack: str, logical_id: str) -> Iterator[Key]:
        if (stack, logical_id) in self.resources:
            yield stack, logical_id
