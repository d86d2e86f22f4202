"""What every training container reads from its environment, on either backend (docs/training_image.md).

One builder for Batch job definitions and EKS jobs, from the catalogue, so the two cannot drift apart.
"""

from config import Accelerator, InstanceType
from config.layout import FSX_MOUNT_PATH

ACCELERATOR_KIND = {Accelerator.NVIDIA: "gpu", Accelerator.NEURON: "neuron"}
# Between SIGTERM (Spot notice, job termination, pod eviction) and SIGKILL, the final checkpoint must be written:
# Spot gives two minutes, so ECS (Batch) and Kubernetes wait that long, and torchrun waits a little less
# before it kills its workers (its own default, 30 s, is too short to save a large model).
STOP_GRACE_SECONDS = 120
WORKER_SHUTDOWN_SECONDS = STOP_GRACE_SECONDS - 10


def shared_memory_gib(instance: InstanceType) -> int:
    """/dev/shm for one training container: a quarter of the node's memory (NCCL and data loaders use it)."""
    return instance.memory_gib // 4


def job_environment(instance: InstanceType) -> dict[str, str]:
    """The catalogue's collective (NCCL/libfabric or Neuron) settings plus what launch.py and the checks read."""
    return {
        **dict(instance.collective_env),
        "ACCELERATOR_KIND": ACCELERATOR_KIND[instance.accelerator],
        "ACCELERATORS_PER_NODE": str(instance.workers_per_node),
        "EXPECTED_BUSBW_GBPS": f"{instance.expected_busbw_gbps:g}",
        "EFA_INTERFACES": str(instance.efa_interfaces),
        # MFU's denominator comes from the catalogue, not from the image's own table of device names.
        "PEAK_TFLOPS_PER_ACCELERATOR": f"{instance.peak_bf16_tflops_per_accelerator:g}",
        "FSX_MOUNT": FSX_MOUNT_PATH,
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(WORKER_SHUTDOWN_SECONDS),
    }
