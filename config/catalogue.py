"""The one catalogue of instance facts. Every stack, test and report reads it.

EFA counts are `NetworkInfo.EfaInfo.MaximumEfaInterfaces` from EC2 DescribeInstanceTypes
(see shared AWS_FACTS.md); each EFA interface sits on its own network card.
Prices are Linux on-demand in us-east-1; `make cost-report` prefers the live Price List API.
"""

from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType


class Accelerator(str, Enum):
    NVIDIA = "nvidia"
    NEURON = "neuron"


# List prices as last recorded, before the June 2025 P4/P5 reductions, and not re-checked from this machine
# (no network to AWS); `make cost-report` with AWS credentials uses the live Price List API instead.
PRICE_SOURCE = "AWS EC2 On-Demand list prices, us-east-1, Linux (recorded, not re-checked)"
PRICE_DATE = "2025-05-31"

# libfabric >= 1.18 with aws-ofi-nccl >= 1.7 needs few variables; FI_PROVIDER=efa makes
# libfabric refuse to run without EFA instead of quietly falling back to TCP sockets.
# NCCL_DEBUG=INFO prints "Selected provider is efa", the line operators look for.
_NCCL_OVER_EFA = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_SOCKET_IFNAME": "^docker,lo,veth",
}
# g5 has EFA but no GPUDirect RDMA, so device RDMA must stay off there.
_NCCL_OVER_EFA_NO_RDMA = {**_NCCL_OVER_EFA, "FI_EFA_USE_DEVICE_RDMA": "0"}
_NEURON_OVER_EFA = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "NCCL_DEBUG": "INFO",
}


@dataclass(frozen=True)
class InstanceType:
    name: str
    accelerator: Accelerator
    accelerators: int  # GPUs, or Trainium chips (one /dev/neuronN device each)
    accelerator_model: str
    vcpus: int
    memory_gib: int
    efa_interfaces: int  # 0: no EFA, refused for training
    on_demand_usd_per_hour: float
    expected_busbw_gbps: float  # two-node all_reduce bus bandwidth the sanity check demands
    busbw_source: str
    peak_bf16_tflops_per_accelerator: float  # for MFU
    collective_env: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    cores_per_accelerator: int = 1  # Trainium: 2 NeuronCores per chip, one worker process each

    @property
    def workers_per_node(self) -> int:
        """torchrun's --nproc-per-node: one process per GPU or per NeuronCore."""
        return self.accelerators * self.cores_per_accelerator

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def batch_image_type(self) -> str:
        """aws_batch.EcsMachineImageType member name (Neuron hosts get their AMI via the launch template)."""
        return "ECS_AL2023_NVIDIA" if self.accelerator is Accelerator.NVIDIA else "ECS_AL2023"

    @property
    def eks_ami_type(self) -> str:
        """aws_eks_v2.NodegroupAmiType member name."""
        return "AL2023_X86_64_NVIDIA" if self.accelerator is Accelerator.NVIDIA else "AL2023_X86_64_NEURON"

    @property
    def kubernetes_resource(self) -> str:
        return "nvidia.com/gpu" if self.accelerator is Accelerator.NVIDIA else "aws.amazon.com/neuron"


def _env(values: dict) -> MappingProxyType:
    return MappingProxyType(dict(values))


CATALOGUE: MappingProxyType = MappingProxyType({
    it.name: it
    for it in (
        InstanceType(
            name="p4d.24xlarge", accelerator=Accelerator.NVIDIA, accelerators=8,
            accelerator_model="A100 40 GB", vcpus=96, memory_gib=1152, efa_interfaces=4,
            on_demand_usd_per_hour=32.7726, expected_busbw_gbps=26.0,
            busbw_source="AWS ParallelCluster nccl-tests pass threshold at 1 GiB",
            peak_bf16_tflops_per_accelerator=312.0, collective_env=_env(_NCCL_OVER_EFA),
        ),
        InstanceType(
            name="p4de.24xlarge", accelerator=Accelerator.NVIDIA, accelerators=8,
            accelerator_model="A100 80 GB", vcpus=96, memory_gib=1152, efa_interfaces=4,
            on_demand_usd_per_hour=40.9657, expected_busbw_gbps=26.0,
            busbw_source="AWS ParallelCluster nccl-tests pass threshold at 1 GiB (p4d/p4de)",
            peak_bf16_tflops_per_accelerator=312.0, collective_env=_env(_NCCL_OVER_EFA),
        ),
        InstanceType(
            name="p5.48xlarge", accelerator=Accelerator.NVIDIA, accelerators=8,
            accelerator_model="H100 80 GB", vcpus=192, memory_gib=2048, efa_interfaces=32,
            on_demand_usd_per_hour=98.32, expected_busbw_gbps=250.0,
            busbw_source="AWS ParallelCluster nccl-tests pass threshold (p5)",
            peak_bf16_tflops_per_accelerator=989.0, collective_env=_env(_NCCL_OVER_EFA),
        ),
        InstanceType(
            name="trn1.32xlarge", accelerator=Accelerator.NEURON, accelerators=16,
            accelerator_model="Trainium (2 NeuronCores each)", vcpus=128, memory_gib=512,
            efa_interfaces=8, on_demand_usd_per_hour=21.50, expected_busbw_gbps=40.0,
            busbw_source="40% of the 800 Gbps EFA line rate; no published nccl-tests figure",
            peak_bf16_tflops_per_accelerator=190.0, collective_env=_env(_NEURON_OVER_EFA),
            cores_per_accelerator=2,
        ),
        InstanceType(
            name="trn1n.32xlarge", accelerator=Accelerator.NEURON, accelerators=16,
            accelerator_model="Trainium (2 NeuronCores each)", vcpus=128, memory_gib=512,
            efa_interfaces=16, on_demand_usd_per_hour=24.78, expected_busbw_gbps=80.0,
            busbw_source="40% of the 1600 Gbps EFA line rate; no published nccl-tests figure",
            peak_bf16_tflops_per_accelerator=190.0, collective_env=_env(_NEURON_OVER_EFA),
            cores_per_accelerator=2,
        ),
        InstanceType(
            name="g5.12xlarge", accelerator=Accelerator.NVIDIA, accelerators=4,
            accelerator_model="A10G 24 GB", vcpus=48, memory_gib=192, efa_interfaces=1,
            on_demand_usd_per_hour=5.672, expected_busbw_gbps=4.0,
            busbw_source="about a third of the 100 Gbps EFA line rate; low-cost trials only",
            peak_bf16_tflops_per_accelerator=125.0, collective_env=_env(_NCCL_OVER_EFA_NO_RDMA),
        ),
        # Listed so that choosing it fails with a reason: one GPU, no EFA.
        InstanceType(
            name="g5.xlarge", accelerator=Accelerator.NVIDIA, accelerators=1,
            accelerator_model="A10G 24 GB", vcpus=4, memory_gib=16, efa_interfaces=0,
            on_demand_usd_per_hour=1.006, expected_busbw_gbps=0.0,
            busbw_source="no EFA", peak_bf16_tflops_per_accelerator=125.0,
        ),
    )
})


def efa_instance_types() -> tuple[str, ...]:
    return tuple(name for name, it in CATALOGUE.items() if it.has_efa)
