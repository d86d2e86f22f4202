"""The architecture of one environment at component level: each stack a cluster, its main resources, the main edges.

Derived from the synthesized app (tools/diagram/synthesized.py), so the picture cannot drift from the code: a
resource type listed in KINDS becomes one node per stack (its resources counted and named), and an edge is drawn
where the templates reference one main resource from another (directly, or through resources that are no node,
such as a launch template) and the pair is listed in RELATIONS, which says what the edge means.
"""

from collections import defaultdict
from dataclasses import dataclass

from tools.diagram.synthesized import DOCKER_IMAGE_ASSET, Assembly, Key, Resource


@dataclass(frozen=True)
class Kind:
    label: str  # what a reader calls it
    icon: str  # the `diagrams` node class that draws it, as "module.Class" under diagrams.aws
    suffix: str = ""  # the word its construct ids end with, dropped from the names shown
    shared_only: bool = False  # drawn only where a main resource of another stack references it


KINDS: dict[str, Kind] = {
    "AWS::EC2::VPC": Kind("VPC", "network.VPC"),
    # The groups that other stacks put their resources in (EFA, Lustre), not each stack's internal ones.
    "AWS::EC2::SecurityGroup": Kind("security group", "general.GenericFirewall", "SecurityGroup", shared_only=True),
    "AWS::S3::Bucket": Kind("S3 bucket", "storage.SimpleStorageServiceS3Bucket"),
    "AWS::FSx::FileSystem": Kind("FSx for Lustre", "storage.FsxForLustre"),
    "AWS::ECR::Repository": Kind("ECR repository", "compute.EC2ContainerRegistry", "Repository"),
    DOCKER_IMAGE_ASSET: Kind("training image (asset)", "compute.EC2ContainerRegistryImage"),
    "AWS::SNS::Topic": Kind("SNS topic", "integration.SimpleNotificationServiceSnsTopic", "Topic"),
    "AWS::Batch::ComputeEnvironment": Kind("compute environment", "compute.Batch", "Environment"),
    "AWS::Batch::JobQueue": Kind("job queue", "integration.SimpleQueueServiceSqsQueue", "Queue"),
    "AWS::Batch::JobDefinition": Kind("job definition", "compute.ElasticContainerServiceTask", "JobDefinition"),
    "AWS::EKS::Cluster": Kind("EKS cluster", "compute.ElasticKubernetesService", "Cluster"),
    "AWS::EKS::Nodegroup": Kind("node group", "compute.EC2AutoScaling", "Nodegroup"),
    # SageMaker training jobs are created at run time; what the app deploys for them is the role they run as.
    "AWS::IAM::Role": Kind("training jobs' role", "ml.SagemakerTrainingJob", "Role", shared_only=True),
    "AWS::StepFunctions::StateMachine": Kind("state machine", "integration.StepFunctions", "StateMachine"),
    "AWS::CloudWatch::Dashboard": Kind("dashboard", "management.Cloudwatch", "Dashboard"),
    "AWS::CloudWatch::Alarm": Kind("alarm", "management.CloudwatchAlarm"),
    "AWS::CloudWatch::CompositeAlarm": Kind("composite alarm", "management.CloudwatchAlarm"),
    "AWS::Budgets::Budget": Kind("budget", "cost.Budgets", "Budget"),
}

# Resources that are an edge rather than a node: they link the main resources they reference, both ways.
# A data repository association keeps a Lustre path and an S3 prefix in step (import and export):
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/create-dra-linked-data-repo.html
CONNECTORS: dict[str, str] = {"AWS::FSx::DataRepositoryAssociation": "data repository\nassociation"}

# (from type, to type) -> what the reference means; other references between main resources are not drawn.
RELATIONS: dict[tuple[str, str], str] = {
    ("AWS::Batch::ComputeEnvironment", "AWS::FSx::FileSystem"): "mounts /fsx",
    ("AWS::FSx::FileSystem", "AWS::EC2::SecurityGroup"): "Lustre",
    ("AWS::Batch::ComputeEnvironment", "AWS::EC2::SecurityGroup"): "EFA",
    ("AWS::Batch::JobQueue", "AWS::Batch::ComputeEnvironment"): "places jobs",
    ("AWS::Batch::JobDefinition", DOCKER_IMAGE_ASSET): "image",
    ("AWS::Batch::JobDefinition", "AWS::ECR::Repository"): "image",
    ("AWS::EKS::Nodegroup", "AWS::EKS::Cluster"): "joins",
    ("AWS::EKS::Nodegroup", "AWS::EC2::SecurityGroup"): "EFA",
    ("AWS::EKS::Cluster", "AWS::FSx::FileSystem"): "mounts /fsx",
    ("AWS::EKS::Cluster", DOCKER_IMAGE_ASSET): "image",
    ("AWS::EKS::Cluster", "AWS::ECR::Repository"): "image",
    ("AWS::StepFunctions::StateMachine", "AWS::Batch::JobQueue"): "submits jobs",
    ("AWS::StepFunctions::StateMachine", "AWS::EKS::Cluster"): "runs jobs",
    ("AWS::StepFunctions::StateMachine", "AWS::EKS::Nodegroup"): "scales",
    ("AWS::StepFunctions::StateMachine", "AWS::IAM::Role"): "creates SageMaker\ntraining jobs as",
    # The SageMaker job requests live in the state machine's definition: the jobs' data, network and image.
    ("AWS::StepFunctions::StateMachine", "AWS::FSx::FileSystem"): "jobs read /fsx",
    ("AWS::StepFunctions::StateMachine", "AWS::EC2::SecurityGroup"): "jobs' EFA group",
    ("AWS::StepFunctions::StateMachine", DOCKER_IMAGE_ASSET): "jobs' image",
    ("AWS::StepFunctions::StateMachine", "AWS::ECR::Repository"): "jobs' image",
    ("AWS::StepFunctions::StateMachine", "AWS::S3::Bucket"): "run records",
    ("AWS::StepFunctions::StateMachine", "AWS::SNS::Topic"): "notifies",
    ("AWS::CloudWatch::Alarm", "AWS::SNS::Topic"): "alarms",
    ("AWS::CloudWatch::CompositeAlarm", "AWS::SNS::Topic"): "alarms",
    ("AWS::Budgets::Budget", "AWS::SNS::Topic"): "budget alerts",
}


@dataclass(frozen=True)
class Node:
    id: str  # "<cluster>/<type>"
    cluster: str
    type: str
    names: tuple[str, ...]  # one per resource it stands for

    @property
    def kind(self) -> Kind:
        return KINDS[self.type]

    @property
    def label(self) -> str:
        if len(self.names) == 1:
            return self.kind.label
        plural = _plural(self.kind.label)
        return f"{len(self.names)} {plural}\n" + "\n".join(_wrap(self.names))


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    label: str
    both_ways: bool = False


@dataclass(frozen=True)
class Architecture:
    title: str
    clusters: tuple[str, ...]  # stack labels, in the app's order
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]


def architecture(assembly: Assembly, title: str) -> Architecture:
    clusters = {name: cluster_label(name) for name in assembly.stacks}
    candidates = {key: r for key, r in assembly.resources.items() if r.type in KINDS}
    pairs = _references(assembly, candidates)
    shared = {b for a, b in pairs if a[0] != b[0]}
    main = {key: r for key, r in candidates.items() if key in shared or not KINDS[r.type].shared_only}
    node_of = {key: f"{clusters[r.stack]}/{r.type}" for key, r in main.items()}
    names: dict[str, list[str]] = defaultdict(list)
    for key, resource in main.items():
        names[node_of[key]].append(short_name(resource))
    order = list(KINDS)  # within a cluster, nodes in the order KINDS lists their types
    nodes = tuple(
        sorted(
            (
                Node(node_id, node_id.split("/")[0], node_id.split("/", 1)[1], tuple(sorted(members)))
                for node_id, members in names.items()
            ),
            key=lambda n: order.index(n.type),
        )
    )
    edges = [
        Edge(node_of[a], node_of[b], RELATIONS[(main[a].type, main[b].type)])
        for a, b in sorted(pairs)
        if a in main and b in main and (main[a].type, main[b].type) in RELATIONS
    ]
    edges += _connector_edges(assembly, main, node_of)
    unique = tuple(dict.fromkeys(edge for edge in edges if edge.source != edge.target))
    return Architecture(title, tuple(clusters.values()), nodes, unique)


def cluster_label(stack_name: str) -> str:
    """The deployable unit a stack is: EfaTraining-prod-Network -> Network."""
    return stack_name.rsplit("-", 1)[-1]


def short_name(resource: Resource) -> str:
    """The construct id a reader recognises: EfaSecurityGroup -> Efa; a bare StateMachine -> TrainingPipeline."""
    if resource.type == DOCKER_IMAGE_ASSET:
        return resource.path
    suffix = KINDS[resource.type].suffix
    parts = resource.path.split("/")
    for part in reversed(parts):  # the deepest construct id that says more than the kind does
        name = part.removesuffix(suffix).removeprefix(suffix) if suffix else part
        if name:
            return name
    return parts[-1]


def _references(assembly: Assembly, main: dict[Key, Resource]) -> set[tuple[Key, Key]]:
    """(a, b) where main resource a, or a resource inside its construct, reaches main resource b."""
    owner = _owners(assembly, main)
    pairs = set()
    for key, resource in assembly.resources.items():
        source = owner.get(key)
        if source is None or resource.type in CONNECTORS:
            continue
        for target in _reach(assembly, resource.refs, main, owner):
            if target != source:
                pairs.add((source, target))
    return pairs


def _reach(assembly: Assembly, start: set[Key], main: dict[Key, Resource], owner: dict[Key, Key]) -> set[Key]:
    """The main resources reached from `start`, walking through resources that belong to no main one."""
    found, seen, todo = set(), set(), list(start)
    while todo:
        key = todo.pop()
        if key in seen or key not in assembly.resources:
            continue
        seen.add(key)
        if key in owner:
            found.add(owner[key])
        elif assembly.resources[key].type not in CONNECTORS:
            todo.extend(assembly.resources[key].refs)
    return found


def _owners(assembly: Assembly, main: dict[Key, Resource]) -> dict[Key, Key]:
    """Each resource -> the main resource whose construct contains it (a main resource owns itself)."""
    owner = {key: key for key in main}
    for key, resource in assembly.resources.items():
        if key in owner or resource.type in CONNECTORS:
            continue
        scopes = [m for m in main if m[0] == key[0] and resource.path.startswith(main[m].path + "/")]
        if scopes:
            owner[key] = max(scopes, key=lambda m: len(main[m].path))
    return owner


def _connector_edges(assembly: Assembly, main: dict[Key, Resource], node_of: dict[Key, str]) -> list[Edge]:
    edges = []
    for resource in assembly.resources.values():
        if resource.type in CONNECTORS:
            ends = sorted(node_of[key] for key in resource.refs if key in main)
            edges += [
                Edge(a, b, CONNECTORS[resource.type], both_ways=True) for a, b in zip(ends, ends[1:], strict=False)
            ]
    return edges


def _plural(label: str) -> str:
    if label.endswith(")"):
        return label
    return label[:-1] + "ies" if label.endswith("y") else label + "s"


def _wrap(names: tuple[str, ...], width: int = 22) -> list[str]:
    """Names joined by commas, a line break before the one that would pass `width` characters."""
    lines = [names[0]]
    for name in names[1:]:
        if len(lines[-1]) + len(name) + 2 > width:
            lines[-1] += ","
            lines.append(name)
        else:
            lines[-1] += f", {name}"
    return lines
