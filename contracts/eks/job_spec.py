"""The training pod on EKS, written once: the job templates, the training runtime and the pipeline's Jobs all use it.

Plain Python dicts (Kubernetes objects as JSON), so `k8s/render.py` can print them without synthesizing the app.
The container is the training image: ENTRYPOINT `python /opt/training/launch.py`, args `[phase, ...flags]`.
Every pod takes a whole accelerator node: all its GPUs or Trainium chips and all its EFA interfaces.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from config import Accelerator, InstanceType
from config.layout import FSX_MOUNT_PATH, FSX_WRITABLE
from contracts.job_environment import STOP_GRACE_SECONDS, job_environment, shared_memory_gib

NAMESPACE = "training"
SERVICE_ACCOUNT = "efa-training"
FSX_CLAIM = "fsx-training"  # the claim's name prefix; a deployed cluster's claim adds the file system's revision


@dataclass(frozen=True)
class Site:
    """What a deployed environment adds to every training pod: its name (the Environment dimension of the
    training metrics, which the alarms and dashboard filter on) and the claim of its file system."""

    environment: str = ""
    fsx_claim: str = FSX_CLAIM
    neuron_cc_flags: str = ""  # the environment's Neuron compiler flags (config neuron_cc_flags)
    tracking_uri: str = ""  # the environment's MLflow tracking server (config tracking_uri)


def fsx_claim_name(revision: str | None) -> str:
    """The claim for one revision of the file system (StorageStack.file_system_revision).

    A PersistentVolume's CSI attributes and a claim's volumeName are immutable (Kubernetes API reference), so a
    replaced file system gets a new volume and claim instead of an update Kubernetes would refuse.
    """
    return f"{FSX_CLAIM}-{revision}" if revision else FSX_CLAIM


# Only training pods tolerate this taint, so nothing else lands on (and holds) an accelerator node.
ACCELERATOR_TAINT_KEY = "efa-training/accelerator"
ACCELERATOR_LABEL = {ACCELERATOR_TAINT_KEY: "true"}
PHASES = ("sanity", "compile", "train", "validate")


def phases(instance: InstanceType) -> tuple[str, ...]:
    """The phases an instance type runs: only Trainium compiles ahead of time
    (training_image/efa_training/runtime/launch/neuron_compile.py)."""
    return tuple(p for p in PHASES if p != "compile" or instance.accelerator is Accelerator.NEURON)


CONTAINER = "node"  # Kubeflow Trainer's torch runtime names the trainer container "node"
MASTER_PORT = 29400
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# libfabric registers memory from 2 MiB huge pages (AWS EFA on EKS guide requests 5 GiB of them per pod);
# the accelerator nodes reserve exactly this many (eks_accelerator_nodegroup).
HUGEPAGES_2MI_PAGES = 2560
HUGEPAGES_2MI = f"{HUGEPAGES_2MI_PAGES * 2}Mi"
# Training metrics on EKS: the observability add-on's Fluent Bit wraps stdout lines, so EMF is not extracted
# from them; train.py also sends each EMF line to the node's CloudWatch agent (its EMF listener, enabled in
# eks_cluster), through the agent's node-local Service (internalTrafficPolicy Local in daemonset mode).
EMF_AGENT_ENDPOINT = "tcp://cloudwatch-agent.amazon-cloudwatch:25888"
EMF_LOG_GROUP = "/efa-training/eks/training-metrics"


def toleration() -> dict:
    return {"key": ACCELERATOR_TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def resources(instance: InstanceType) -> dict:
    """Every accelerator and every EFA interface of one node; limits equal requests (extended resources demand it).
    A type without EFA (the validation node) gets no EFA devices and no huge pages: its node reserves none."""
    whole_node = {instance.kubernetes_resource: str(instance.accelerators)}
    if instance.has_efa:
        whole_node |= {EFA_RESOURCE: str(instance.efa_interfaces), "hugepages-2Mi": HUGEPAGES_2MI}
    whole_node["memory"] = f"{instance.memory_gib // 2}Gi"
    return {"requests": dict(whole_node), "limits": dict(whole_node)}


def environment(instance: InstanceType, *, nodes: int, site: Site = Site()) -> list[dict]:
    """What launch.py reads besides the launcher's own MASTER_ADDR/MASTER_PORT/PET_NNODES/PET_NODE_RANK."""
    env = {
        **job_environment(
            instance,
            backend="eks",
            environment=site.environment,
            neuron_cc_flags=site.neuron_cc_flags,
            tracking_uri=site.tracking_uri,
        ),
        "PET_NNODES": str(nodes),
        "AWS_EMF_AGENT_ENDPOINT": EMF_AGENT_ENDPOINT,
        "AWS_EMF_LOG_GROUP_NAME": EMF_LOG_GROUP,
    }
    return [{"name": name, "value": value} for name, value in env.items()]


def volumes(instance: InstanceType, site: Site = Site()) -> list[dict]:
    return [
        {"name": "fsx", "persistentVolumeClaim": {"claimName": site.fsx_claim}},
        # torch DataLoader workers and NCCL share tensors through /dev/shm (the same size as on Batch).
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shared_memory_gib(instance)}Gi"}},
    ]


def volume_mounts() -> list[dict]:
    """The file system read-only, and read-write only where a job writes (config/layout.py FSX_WRITABLE): the same
    claim again at each of those folders (Kubernetes docs, "Volumes": `subPath`, and a mount's `readOnly`)."""
    writable = [
        {"name": "fsx", "mountPath": f"{FSX_MOUNT_PATH}/{folder.rstrip('/')}", "subPath": folder.rstrip("/")}
        for folder in FSX_WRITABLE
    ]
    return [
        {"name": "fsx", "mountPath": FSX_MOUNT_PATH, "readOnly": True},
        *writable,
        {"name": "shm", "mountPath": "/dev/shm"},
    ]


def container(
    instance: InstanceType,
    *,
    image: str,
    phase: str,
    nodes: int,
    args: Sequence[str] = (),
    extra_env: Sequence[dict] = (),
    site: Site = Site(),
) -> dict:
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not valid; expected one of {', '.join(PHASES)}")
    return {
        "name": CONTAINER,
        "image": image,
        # No command: the image's ENTRYPOINT (python /opt/training/launch.py) runs with these args.
        "args": [phase, *args],
        "env": [*environment(instance, nodes=nodes, site=site), *extra_env],
        "resources": resources(instance),
        "volumeMounts": volume_mounts(),
        # EFA registers (pins) memory: the uverbs devices come from the device plugin, memlock must be unlimited,
        # which the EKS AL2023 accelerated AMIs' containerd already sets for containers.
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    }


def pod_spec(
    instance: InstanceType,
    *,
    image: str,
    phase: str,
    nodes: int,
    args: Sequence[str] = (),
    extra_env: Sequence[dict] = (),
    restart_policy: str = "Never",
    site: Site = Site(),
) -> dict:
    return {
        "serviceAccountName": SERVICE_ACCOUNT,
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": STOP_GRACE_SECONDS,
        "nodeSelector": {**ACCELERATOR_LABEL, "node.kubernetes.io/instance-type": instance.name},
        "tolerations": [toleration()],
        "containers": [
            container(instance, image=image, phase=phase, nodes=nodes, args=args, extra_env=extra_env, site=site)
        ],
        "volumes": volumes(instance, site),
    }
