"""What every training container reads from its environment, on either backend (docs/training_image.md).

One builder for Batch job definitions and EKS jobs, from the catalogue, so the two cannot drift apart.
"""

from config import BUSBW_MESSAGE_BYTES, Accelerator, InstanceType
from config.layout import FSX_MOUNT_PATH

ACCELERATOR_KIND = {Accelerator.NVIDIA: "gpu", Accelerator.NEURON: "neuron"}
# Between SIGTERM (Spot notice, job termination, pod eviction) and SIGKILL, the final checkpoint must be written:
# Spot gives two minutes, so ECS (Batch) and Kubernetes wait that long, and torchrun waits a little less
# before it kills its workers (its own default, 30 s, is too short to save a large model).
STOP_GRACE_SECONDS = 120
WORKER_SHUTDOWN_SECONDS = STOP_GRACE_SECONDS - 10

# Which interface NCCL's and Gloo's bootstrap (and torchrun's --local-addr, see launch.py) use, per backend.
# Batch multi-node containers run in awsvpc mode (Batch user guide, "Multi-node parallel jobs": "awsvpc network
# mode"): besides lo they see eth0, the task's interface, and ecs-eth0, a link-local (169.254.172.0/22) link to
# the ECS agent (ECS developer guide, "Amazon ECS task networking options for EC2": task IAM credentials and
# metadata arrive over it). An exclusion list leaves ecs-eth0 eligible, so the bootstrap could advertise an
# address no other host can reach: pin eth0 by exact match ("=" prefix, NCCL environment variables,
# NCCL_SOCKET_IFNAME). GLOO_SOCKET_IFNAME takes plain interface names. EKS pods see only eth0 and lo (VPC CNI),
# so the exclusion list that works there stays.
SOCKET_INTERFACE_ENV = {
    "batch": {"NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "eth0"},
    "eks": {"NCCL_SOCKET_IFNAME": "^docker,lo,veth"},
    # SageMaker names the instance's interface in /opt/ml/input/config/resourceconfig.json (network_interface_name,
    # SageMaker developer guide, "Distributed training configuration"): launch.py sets both variables from it.
    "sagemaker": {},
}


def shared_memory_gib(instance: InstanceType) -> int:
    """/dev/shm for one training container: a quarter of the node's memory (NCCL and data loaders use it)."""
    return instance.memory_gib // 4


def _efa_count(instance: InstanceType, backend: str) -> dict[str, str]:
    """How many EFA devices the sanity check wants: EC2's count (DescribeInstanceTypes) on Batch and EKS; on SageMaker
    the catalogue's measured count, else EC2's as a hint that is not enforced (EFA_COUNT_CONFIRMED=0)."""
    if backend != "sagemaker":
        return {"EFA_INTERFACES": str(instance.efa_interfaces)}
    measured = instance.sagemaker_efa_interfaces
    return {
        "EFA_INTERFACES": str(measured or instance.efa_interfaces),
        "EFA_COUNT_CONFIRMED": "1" if measured else "0",
    }


def job_environment(
    instance: InstanceType, *, backend: str, environment: str = "", neuron_cc_flags: str = "", tracking_uri: str = ""
) -> dict[str, str]:
    """The catalogue's collective (NCCL/libfabric or Neuron) settings plus what launch.py and the checks read.
    `neuron_cc_flags`: the environment's Neuron compiler flags, the same for every job (a compile job fills the cache
    only for the flags training then uses). `tracking_uri`: the environment's MLflow server, where rank 0's launcher
    and the validation track the run (MLflow reads MLFLOW_TRACKING_URI)."""
    return {
        **({"MLFLOW_TRACKING_URI": tracking_uri} if tracking_uri else {}),
        # The Environment dimension of the training metrics (training_image/efa_training/runtime/metrics.py): alarms and
        # the
        # dashboard of one environment see its runs only.
        **({"TRAINING_ENVIRONMENT": environment} if environment else {}),
        **dict(instance.collective_env),
        **SOCKET_INTERFACE_ENV[backend],
        "ACCELERATOR_KIND": ACCELERATOR_KIND[instance.accelerator],
        "ACCELERATORS_PER_NODE": str(instance.workers_per_node),
        # The sanity check counts Neuron cores as /dev/neuronN devices x this (trn1: 2; trn2: 4 logical at LNC=2);
        # the Neuron image's default (2) would make every trn2 node look half-present.
        **(
            {
                "NEURON_CORES_PER_DEVICE": str(instance.cores_per_accelerator),
                # Neuron docs, "PyTorch NeuronX environment variables": NEURON_CC_FLAGS reach the compiler.
                **({"NEURON_CC_FLAGS": neuron_cc_flags} if neuron_cc_flags else {}),
            }
            if instance.accelerator is Accelerator.NEURON
            else {}
        ),
        # The sanity check's bandwidth gate: the threshold, the one message size it applies at, and its source.
        "EXPECTED_BUSBW_GBPS": f"{instance.expected_busbw_gbps:g}",
        "BUSBW_MESSAGE_BYTES": str(BUSBW_MESSAGE_BYTES),
        "BUSBW_SOURCE": instance.busbw_source,
        **_efa_count(instance, backend),
        # MFU's denominator comes from the catalogue, not from the image's own table of device names.
        "PEAK_TFLOPS_PER_ACCELERATOR": f"{instance.peak_bf16_tflops_per_accelerator:g}",
        # What the built-in trainer's memory estimate is held to before it starts (workloads/gpt/preflight.py).
        "ACCELERATOR_MEMORY_GB": f"{instance.memory_gb_per_worker:g}",
        "FSX_MOUNT": FSX_MOUNT_PATH,
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(WORKER_SHUTDOWN_SECONDS),
    }
