"""The one catalogue of instance facts. Every stack, test and report reads it.

EFA counts are `NetworkInfo.EfaInfo.MaximumEfaInterfaces` from EC2 DescribeInstanceTypes
(see shared AWS_FACTS.md); each EFA interface sits on its own network card.
Prices are Linux on-demand in us-east-1; `make cost-report` prefers the live Price List API.
"""

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

# NVIDIA A10G datasheet for AWS (d1.awsstatic.com/.../NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf): 70 dense bf16
# TFLOPS (140 with sparsity). 125 is the plain A10's figure, which the catalogue carried before.
A10G_BF16_TFLOPS = 70.0


class Accelerator(StrEnum):
    NVIDIA = "nvidia"
    NEURON = "neuron"


# List prices as last recorded, before the June 2025 P4/P5 reductions, and not re-checked from this machine
# (no network to AWS); `make cost-report` with AWS credentials uses the live Price List API instead.
PRICE_SOURCE = "AWS EC2 On-Demand list prices, us-east-1, Linux (recorded, not re-checked)"
PRICE_DATE = "2025-05-31"
# SageMaker training (ml.<type>), on-demand, us-east-1: `sagemaker_usd_per_hour` of each type. The SageMaker AI pricing
# page (aws.amazon.com/sagemaker/pricing, Training) could not be read from this machine: the recorded figures are the
# last known list prices from before the June 2025 P4/P5 reductions (ml.p4d and ml.g5.12xlarge agree with third-party
# cost tables); the others are estimates, EC2's price x SAGEMAKER_ESTIMATE_RATIO, the ratio of the recorded P-family
# prices to EC2's (37.688 / 32.7726 = 113.068 / 98.32 = 1.15), marked ESTIMATED.
SAGEMAKER_PRICE_SOURCE = "SageMaker AI training on-demand list prices, us-east-1 (recorded, not re-checked)"
SAGEMAKER_PRICE_DATE = "2025-05-31"
SAGEMAKER_ESTIMATE_RATIO = 1.15
ESTIMATED = "estimated"
# Managed Spot training: AWS states savings of up to 90% over on-demand; the real discount varies with capacity.
SAGEMAKER_SPOT_MAX_SAVING = 0.9
SAGEMAKER_SPOT_SOURCE = "SageMaker developer guide, 'Managed Spot Training in Amazon SageMaker AI'"

# libfabric >= 1.18 with aws-ofi-nccl >= 1.7 needs few variables; FI_PROVIDER=efa keeps libfabric from choosing
# another provider (it does not stop NCCL from falling back to its own sockets: the sanity check proves the
# transport from NCCL's log instead). NCCL_DEBUG=INFO prints "NET/OFI Selected Provider is efa".
# The bootstrap interface (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) is a fact of the backend, not of the
# instance: contracts/job_environment.py sets it per backend.
_NCCL_OVER_EFA = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "NCCL_DEBUG": "INFO",
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
    network_gbps: int  # the instance's network bandwidth (EFA line rate where it has EFA), Gbit/s
    # Two-node nccl-tests all_reduce bus bandwidth at BUSBW_MESSAGE_BYTES, GB/s, where one is published.
    published_busbw_gbps: float | None
    busbw_source: str
    peak_bf16_tflops_per_accelerator: float  # for MFU
    collective_env: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    cores_per_accelerator: int = 1  # Trainium: 2 NeuronCores per chip, one worker process each
    # Single-node types (one accelerator, no EFA) serve validation and other one-node jobs, never training.
    single_node_only: bool = False
    # The small single-accelerator type that validates this type's models by default (Batch single-node jobs).
    validation_instance_type: str | None = None
    price_note: str = ""  # where this type's price differs from PRICE_SOURCE
    # SageMaker training's on-demand price for ml.<name>: a recorded list price (SAGEMAKER_PRICE_SOURCE), ESTIMATED
    # (EC2's price x SAGEMAKER_ESTIMATE_RATIO), or None: SageMaker training does not offer the type (refused).
    sagemaker_list_usd_per_hour: float | str | None = None

    @property
    def workers_per_node(self) -> int:
        """torchrun's --nproc-per-node: one process per GPU or per NeuronCore."""
        return self.accelerators * self.cores_per_accelerator

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def expected_busbw_gbps(self) -> float:
        """The bus bandwidth the sanity check demands at BUSBW_MESSAGE_BYTES across two or more nodes.

        80% of the published two-node figure where one exists; otherwise half the line rate (GB/s), which a
        healthy EFA fabric exceeds and a fallback to TCP sockets over the ENA interface cannot reach.
        """
        if not self.has_efa:
            return 0.0
        if self.published_busbw_gbps is not None:
            return round(PUBLISHED_BUSBW_SHARE * self.published_busbw_gbps, 1)
        return round(LINE_RATE_SHARE * self.network_gbps / 8, 1)

    @property
    def sagemaker_price_estimated(self) -> bool:
        return self.sagemaker_list_usd_per_hour == ESTIMATED

    @property
    def sagemaker_usd_per_hour(self) -> float | None:
        if self.sagemaker_price_estimated:
            return round(self.on_demand_usd_per_hour * SAGEMAKER_ESTIMATE_RATIO, 4)
        price = self.sagemaker_list_usd_per_hour
        return price if isinstance(price, float) else None

    @property
    def sagemaker_instance_type(self) -> str:
        """The SageMaker training instance type: ml.<EC2 name> (CreateTrainingJob ResourceConfig.InstanceType)."""
        return f"ml.{self.name}"

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


# The sanity check's bandwidth gate: one fixed large message (never nccl-tests' average over sizes, which
# reads 53 GB/s on a healthy 2 x p5), the size the published two-node figures were taken at.
BUSBW_MESSAGE_BYTES = 2 * 2**30
PUBLISHED_BUSBW_SHARE = 0.8
LINE_RATE_SHARE = 0.5
# awslabs/awsome-distributed-training, micro-benchmarks/nccl-tests README: two-node all_reduce_perf results.
_NCCL_TESTS_README = "awslabs/awsome-distributed-training micro-benchmarks/nccl-tests README, 2 nodes, 2 GB"


_P5_48XLARGE_USD_PER_HOUR = 98.32  # p5.4xlarge's estimate is derived from it


def _env(values: dict) -> MappingProxyType:
    return MappingProxyType(dict(values))


CATALOGUE: MappingProxyType = MappingProxyType(
    {
        it.name: it
        for it in (
            InstanceType(
                name="p4d.24xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=8,
                accelerator_model="A100 40 GB",
                vcpus=96,
                memory_gib=1152,
                efa_interfaces=4,
                on_demand_usd_per_hour=32.7726,
                sagemaker_list_usd_per_hour=37.688,
                network_gbps=400,
                published_busbw_gbps=78.3,
                busbw_source=f"p4de's figure (same 4 x 100 Gbps EFA and NVSwitch): {_NCCL_TESTS_README} (2 x p4de)",
                peak_bf16_tflops_per_accelerator=312.0,
                collective_env=_env(_NCCL_OVER_EFA),
                validation_instance_type="p5.4xlarge",
            ),
            InstanceType(
                name="p4de.24xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=8,
                accelerator_model="A100 80 GB",
                vcpus=96,
                memory_gib=1152,
                efa_interfaces=4,
                on_demand_usd_per_hour=40.9657,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=400,
                published_busbw_gbps=78.3,
                busbw_source=f"{_NCCL_TESTS_README} (2 x p4de.24xlarge: 78.33 GB/s at 2147483648 bytes)",
                peak_bf16_tflops_per_accelerator=312.0,
                collective_env=_env(_NCCL_OVER_EFA),
                validation_instance_type="p5.4xlarge",
            ),
            InstanceType(
                name="p5.48xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=8,
                accelerator_model="H100 80 GB",
                vcpus=192,
                memory_gib=2048,
                efa_interfaces=32,
                on_demand_usd_per_hour=_P5_48XLARGE_USD_PER_HOUR,
                sagemaker_list_usd_per_hour=113.068,
                network_gbps=3200,
                published_busbw_gbps=443.7,
                busbw_source=f"{_NCCL_TESTS_README} (2 x p5.48xlarge: 443.72 GB/s at 2147483648 bytes)",
                peak_bf16_tflops_per_accelerator=989.0,
                collective_env=_env(_NCCL_OVER_EFA),
                validation_instance_type="p5.4xlarge",
            ),
            InstanceType(
                name="trn1.32xlarge",
                accelerator=Accelerator.NEURON,
                accelerators=16,
                accelerator_model="Trainium (2 NeuronCores each)",
                vcpus=128,
                memory_gib=512,
                efa_interfaces=8,
                on_demand_usd_per_hour=21.50,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=800,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 800 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=190.0,
                collective_env=_env(_NEURON_OVER_EFA),
                cores_per_accelerator=2,
                validation_instance_type="trn1.2xlarge",
            ),
            InstanceType(
                name="trn1n.32xlarge",
                accelerator=Accelerator.NEURON,
                accelerators=16,
                accelerator_model="Trainium (2 NeuronCores each)",
                vcpus=128,
                memory_gib=512,
                efa_interfaces=16,
                on_demand_usd_per_hour=24.78,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=1600,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 1600 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=190.0,
                collective_env=_env(_NEURON_OVER_EFA),
                cores_per_accelerator=2,
                validation_instance_type="trn1.2xlarge",
            ),
            InstanceType(
                name="g5.12xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=4,
                accelerator_model="A10G 24 GB",
                vcpus=48,
                memory_gib=192,
                efa_interfaces=1,
                on_demand_usd_per_hour=5.672,
                sagemaker_list_usd_per_hour=7.09,
                network_gbps=40,
                published_busbw_gbps=None,
                # EFA and ENA share the same 40 Gbps here: bandwidth alone cannot tell EFA from a socket fallback,
                # which is why the sanity check also proves the transport from NCCL's own log.
                busbw_source="no published two-node figure found; half the 40 Gbps network rate (low-cost trials only)",
                peak_bf16_tflops_per_accelerator=A10G_BF16_TFLOPS,
                collective_env=_env(_NCCL_OVER_EFA_NO_RDMA),
                validation_instance_type="g5.xlarge",
            ),
            # Single-node types: one accelerator, no EFA. They validate models; choosing one to train fails
            # with a reason.
            InstanceType(
                name="g5.xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=1,
                accelerator_model="A10G 24 GB",
                vcpus=4,
                memory_gib=16,
                efa_interfaces=0,
                on_demand_usd_per_hour=1.006,
                sagemaker_list_usd_per_hour=1.408,
                network_gbps=10,
                published_busbw_gbps=None,
                busbw_source="no EFA",
                peak_bf16_tflops_per_accelerator=A10G_BF16_TFLOPS,
                single_node_only=True,
            ),
            # No EC2 type has one A100, so A100 models validate on one H100 80 GB (it loads what an A100 wrote).
            InstanceType(
                name="p5.4xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=1,
                accelerator_model="H100 80 GB",
                vcpus=16,
                memory_gib=256,
                efa_interfaces=0,
                on_demand_usd_per_hour=round(_P5_48XLARGE_USD_PER_HOUR / 8, 4),
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=100,
                published_busbw_gbps=None,
                busbw_source="single-node only",
                peak_bf16_tflops_per_accelerator=989.0,
                single_node_only=True,
                price_note="estimated as one eighth of p5.48xlarge; not confirmed from the EC2 price list here",
            ),
            InstanceType(
                name="trn1.2xlarge",
                accelerator=Accelerator.NEURON,
                accelerators=1,
                accelerator_model="Trainium (2 NeuronCores each)",
                vcpus=8,
                memory_gib=32,
                efa_interfaces=0,
                on_demand_usd_per_hour=1.34375,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=12,
                published_busbw_gbps=None,
                busbw_source="single-node only",
                peak_bf16_tflops_per_accelerator=190.0,
                cores_per_accelerator=2,
                single_node_only=True,
            ),
        )
    }
)


def efa_instance_types() -> tuple[str, ...]:
    return tuple(name for name, it in CATALOGUE.items() if it.has_efa)
