"""The one catalogue of instance facts. Every stack, test and report reads it.

Where each fact comes from (the README's catalogue table repeats this per type):
- vCPUs, memory, accelerators, accelerator memory, network bandwidth and `NetworkInfo.EfaInfo.MaximumEfaInterfaces`
  are EC2 DescribeInstanceTypes fields, read from AWS's own generated copy of them: Karpenter's instance-type
  reference (aws/karpenter-provider-aws website/content/en/preview/reference/instance-types.md, v1.14.0,
  2026-07-11: `vpc.amazonaws.com/efa` is MaximumEfaInterfaces). Network cards (`MaximumNetworkCards`) and the
  interfaces one card takes (`NetworkCards[].MaximumNetworkInterfaces`, the same on every card of each type here)
  from the VPC CNI's generated limits (aws/amazon-vpc-cni-k8s pkg/vpc/vpc_ip_resource_limit.go, 2026-08-11). On
  every type here each EFA interface sits on its own network card, card 0 included (EC2 user guide, "Maximize
  network bandwidth on Amazon EC2 instances with multiple network cards").
- Peak dense bf16 throughput from the accelerator's vendor (cited per constant below).
- Prices: Linux on-demand in us-east-1 (PRICE_SOURCE); `make cost-report` prefers the live Price List API.
- Machine images: the EKS guide's accelerated-AMI table ("Use EKS-optimized accelerated AMIs", ml-eks-optimized-ami)
  and Batch's `Ec2Configuration.imageType` (ECS_AL2023_NVIDIA "doesn't support p3 and g3"; there is no Neuron
  image type, so Neuron hosts take the ECS AL2023 Neuron AMI from SSM: stacks/batch_stack.py).
"""

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

# NVIDIA A10G datasheet for AWS (d1.awsstatic.com/.../NVIDIA_AWS_A10G_DataSheet_FINAL_02_17_2022.pdf): 70 dense bf16
# TFLOPS (140 with sparsity). 125 is the plain A10's figure, which the catalogue carried before.
A10G_BF16_TFLOPS = 70.0
# NVIDIA A100 datasheet: 312 bf16 Tensor Core TFLOPS (624 with sparsity).
A100_BF16_TFLOPS = 312.0
# NVIDIA H100 SXM datasheet: 1,979 bf16 TFLOPS "with sparsity", so 989 dense. The H200 is the same GH100 die with
# more memory and the same figure (NVIDIA's H200 datasheet was not readable from here; secondary sources agree).
HOPPER_BF16_TFLOPS = 989.0
# NVIDIA HGX B200 at 1,000 W: 4.5 PFLOPS bf16 with sparsity, 2,250 dense. NOT confirmed from an NVIDIA page here
# (only secondary copies of NVIDIA's table were readable): treat MFU and token costs on p6-b200 as approximate.
B200_BF16_TFLOPS = 2250.0
# Neuron docs, "Trainium architecture": 190 bf16 TFLOPS per Trainium chip.
TRAINIUM_BF16_TFLOPS = 190.0
# Neuron docs, "Trainium2 architecture" (trainium2.rst): "667 BF16/FP16/TF32 TFLOPS" per chip (8 NeuronCore-v3).
TRAINIUM2_BF16_TFLOPS = 667.0


class Accelerator(StrEnum):
    NVIDIA = "nvidia"
    NEURON = "neuron"


# EC2 list prices after the June 2025 P4/P5 reductions (p5.48xlarge 98.32 -> 55.04, p4d 32.7726 -> 21.957642, p4de
# 40.96575 -> 27.44705, p5en 84.80 -> 63.296), read from the AWS Price List API as Karpenter records it
# (aws/karpenter-provider-aws pkg/providers/pricing/zz_generated.pricing_aws.go, "generated at 2026-07-20T13:44:30Z for
# us-east-1"); the AWS pricing page itself cannot be read from this machine. `make cost-report` with AWS credentials
# asks the live Price List API instead.
PRICE_SOURCE = "AWS Price List API, EC2 On-Demand, us-east-1, Linux (via Karpenter's generated table)"
PRICE_DATE = "2026-07-20"
# p5e.48xlarge and trn2.48xlarge have no on-demand price in that table for any region: AWS sells them through EC2
# Capacity Blocks for ML ("Capacity Blocks for ML", EC2 user guide: p5e and trn2 in US East (Ohio)), whose prices
# change with supply and demand, and through SageMaker training.
CAPACITY_BLOCKS_ONLY = "no on-demand list price: sold through EC2 Capacity Blocks for ML, priced at reservation"
# SageMaker training (ml.<type>), on-demand, us-east-1: `sagemaker_usd_per_hour` of each type. The SageMaker AI pricing
# page (aws.amazon.com/sagemaker/pricing, Training) could not be read from this machine. The g5 figures are recorded
# list prices. The P4/P5 ml.* list prices recorded before June 2025 (ml.p4d 37.688, ml.p5 113.068) were 1.15 x the EC2
# prices of the time (37.688 / 32.7726 = 113.068 / 98.32 = 1.15); whether SageMaker passed the June 2025 cut on is not
# confirmed here, so every P and trn type is an estimate: EC2's current price x SAGEMAKER_ESTIMATE_RATIO (ESTIMATED).
SAGEMAKER_PRICE_SOURCE = "SageMaker AI training on-demand list prices, us-east-1 (recorded, not re-checked)"
SAGEMAKER_PRICE_DATE = "2025-05-31"
SAGEMAKER_ESTIMATE_RATIO = 1.15
ESTIMATED = "estimated"
# SageMaker trains on the type but no price is known (no EC2 on-demand price to estimate from).
UNPRICED = "unpriced"
# Managed Spot training: AWS states savings of up to 90% over on-demand; the real discount varies with capacity.
SAGEMAKER_SPOT_MAX_SAVING = 0.9
SAGEMAKER_SPOT_SOURCE = "SageMaker developer guide, 'Managed Spot Training in Amazon SageMaker AI'"

# libfabric >= 1.18 with aws-ofi-nccl >= 1.7 needs few variables; FI_PROVIDER=efa keeps libfabric from choosing
# another provider (it does not stop NCCL from falling back to its own sockets: the sanity check proves the
# transport from NCCL's log instead). NCCL_DEBUG=INFO prints "NET/OFI Selected provider is efa, fabric is efa".
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
    efa_interfaces: int  # 0: no EFA, refused for training. One per network card, from card 0 on.
    # EC2 on-demand price; None where AWS lists none (CAPACITY_BLOCKS_ONLY, said in price_note).
    on_demand_usd_per_hour: float | None
    network_gbps: int  # the instance's network bandwidth (EFA line rate where it has EFA), Gbit/s
    # Two-node nccl-tests all_reduce bus bandwidth at BUSBW_MESSAGE_BYTES, GB/s, where one is published.
    published_busbw_gbps: float | None
    busbw_source: str
    peak_bf16_tflops_per_accelerator: float  # for MFU
    # Memory of one GPU or Trainium chip, GB, as EC2's accelerated computing specifications list it (the instance's
    # accelerator memory over its accelerators): what the training image's memory estimate is held to.
    accelerator_memory_gb: float
    collective_env: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    # Workers per accelerator, one process each: Trainium 2 NeuronCores per chip; Trainium2 4 logical NeuronCores
    # per chip at the default LNC=2 (Neuron docs, "Best practices for training": "64 ranks per instance").
    cores_per_accelerator: int = 1
    # Single-node types (one accelerator, no EFA) serve validation and other one-node jobs, never training.
    single_node_only: bool = False
    # The small single-accelerator type that validates this type's models by default (Batch single-node jobs).
    validation_instance_type: str | None = None
    price_note: str = ""  # where this type's price differs from PRICE_SOURCE
    # MaximumNetworkCards; 0 means one card. Every EFA interface has its own card (efa_interfaces <= network_cards).
    network_cards: int = 0
    # NetworkCardInfo.MaximumNetworkInterfaces (EC2 API reference: "The maximum number of network interfaces for the
    # network card"), every card alike: what a launch template and the interfaces attached later may put on one card
    # (EC2 refuses more: "The maximum devices for this network card is 2", p5, eksctl-io/eksctl#7520).
    max_interfaces_per_network_card: int = 0
    # SageMaker training's on-demand price for ml.<name>: a recorded list price (SAGEMAKER_PRICE_SOURCE), ESTIMATED
    # (EC2's price x SAGEMAKER_ESTIMATE_RATIO), UNPRICED (offered, no price known), or None: SageMaker training does
    # not offer the type (refused). Offered types are in CreateTrainingJob's TrainingInstanceType enum.
    sagemaker_list_usd_per_hour: float | str | None = None
    # EFA devices a SageMaker training job's container sees on ml.<name>: no SageMaker document gives the count, so
    # None (for every type until measured: the first job's sanity report, `efa.uverbs`, says) means "not confirmed":
    # the sanity check there wants EFA devices and EFA transport, not EC2's exact count.
    sagemaker_efa_interfaces: int | None = None

    def __post_init__(self) -> None:
        # One EFA interface per network card (module docstring): a type cannot have more EFAs than cards.
        if self.efa_interfaces > max(self.network_cards, 1):
            raise ValueError(f"{self.name}: {self.efa_interfaces} EFA interfaces on {self.network_cards} network cards")
        if self.max_interfaces_per_network_card < 1:
            raise ValueError(
                f"{self.name}: max_interfaces_per_network_card={self.max_interfaces_per_network_card} is not valid; "
                "expected DescribeInstanceTypes' NetworkCards[].MaximumNetworkInterfaces (at least 1)"
            )

    @property
    def workers_per_node(self) -> int:
        """torchrun's --nproc-per-node: one process per GPU or per NeuronCore."""
        return self.accelerators * self.cores_per_accelerator

    @property
    def memory_gb_per_worker(self) -> float:
        """One worker's share of its accelerator's memory: a GPU's, or a Trainium chip's over its NeuronCores."""
        return self.accelerator_memory_gb / self.cores_per_accelerator

    @property
    def has_efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def capacity_blocks_only(self) -> bool:
        """EC2 sells this type through Capacity Blocks for ML only (CAPACITY_BLOCKS_ONLY): no on-demand or Spot."""
        return self.price_note == CAPACITY_BLOCKS_ONLY

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
    def sagemaker_offered(self) -> bool:
        """Whether SageMaker training runs on ml.<name> (priced or not)."""
        return self.sagemaker_list_usd_per_hour is not None

    @property
    def sagemaker_usd_per_hour(self) -> float | None:
        if self.sagemaker_price_estimated:
            ec2 = self.on_demand_usd_per_hour
            return None if ec2 is None else round(ec2 * SAGEMAKER_ESTIMATE_RATIO, 4)
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
                network_cards=4,
                max_interfaces_per_network_card=15,
                on_demand_usd_per_hour=21.957642,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=400,
                published_busbw_gbps=78.3,
                busbw_source=f"p4de's figure (same 4 x 100 Gbps EFA and NVSwitch): {_NCCL_TESTS_README} (2 x p4de)",
                peak_bf16_tflops_per_accelerator=A100_BF16_TFLOPS,
                accelerator_memory_gb=40,
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
                network_cards=4,
                max_interfaces_per_network_card=15,
                on_demand_usd_per_hour=27.44705,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=400,
                published_busbw_gbps=78.3,
                busbw_source=f"{_NCCL_TESTS_README} (2 x p4de.24xlarge: 78.33 GB/s at 2147483648 bytes)",
                peak_bf16_tflops_per_accelerator=A100_BF16_TFLOPS,
                accelerator_memory_gb=80,
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
                network_cards=32,
                max_interfaces_per_network_card=2,
                on_demand_usd_per_hour=55.04,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=3200,
                published_busbw_gbps=443.7,
                busbw_source=f"{_NCCL_TESTS_README} (2 x p5.48xlarge: 443.72 GB/s at 2147483648 bytes)",
                peak_bf16_tflops_per_accelerator=HOPPER_BF16_TFLOPS,
                accelerator_memory_gb=80,
                collective_env=_env(_NCCL_OVER_EFA),
                validation_instance_type="p5.4xlarge",
            ),
            # p5e: p5's network (32 cards, one EFA each, 3200 Gbps) with H200s; aws-ofi-nccl treats both alike
            # (src/platform-aws.cpp: "p5/p5e", GPUDirect RDMA required).
            InstanceType(
                name="p5e.48xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=8,
                accelerator_model="H200 141 GB",
                vcpus=192,
                memory_gib=2048,
                efa_interfaces=32,
                network_cards=32,
                max_interfaces_per_network_card=2,
                on_demand_usd_per_hour=None,
                price_note=CAPACITY_BLOCKS_ONLY,
                sagemaker_list_usd_per_hour=UNPRICED,
                network_gbps=3200,
                published_busbw_gbps=443.7,
                busbw_source=f"p5's figure (same 32 x 100 Gbps EFA and NVLink 4): {_NCCL_TESTS_README} (2 x p5)",
                peak_bf16_tflops_per_accelerator=HOPPER_BF16_TFLOPS,
                accelerator_memory_gb=141,
                collective_env=_env(_NCCL_OVER_EFA),
                validation_instance_type="p5.4xlarge",
            ),
            # p5en and p6-b200: fewer, faster EFA interfaces (16 and 8 network cards for the same 3200 Gbps);
            # aws-ofi-nccl: "p5en/p6-b200", GPUDirect RDMA required.
            InstanceType(
                name="p5en.48xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=8,
                accelerator_model="H200 141 GB",
                vcpus=192,
                memory_gib=2048,
                efa_interfaces=16,
                network_cards=16,
                max_interfaces_per_network_card=4,
                on_demand_usd_per_hour=63.296,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=3200,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 3200 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=HOPPER_BF16_TFLOPS,
                accelerator_memory_gb=141,
                collective_env=_env(_NCCL_OVER_EFA),
                validation_instance_type="p5.4xlarge",
            ),
            # No single-GPU Blackwell or H200 type exists: their models validate on one H100 (bf16 weights load
            # on any of them).
            InstanceType(
                name="p6-b200.48xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=8,
                accelerator_model="B200 179 GB",
                vcpus=192,
                memory_gib=2048,
                efa_interfaces=8,
                network_cards=8,
                max_interfaces_per_network_card=4,
                on_demand_usd_per_hour=113.9328,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=3200,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 3200 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=B200_BF16_TFLOPS,
                accelerator_memory_gb=179,
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
                network_cards=8,
                max_interfaces_per_network_card=5,
                on_demand_usd_per_hour=21.50,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=800,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 800 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=TRAINIUM_BF16_TFLOPS,
                accelerator_memory_gb=32,
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
                network_cards=16,
                max_interfaces_per_network_card=5,
                on_demand_usd_per_hour=24.78,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=1600,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 1600 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=TRAINIUM_BF16_TFLOPS,
                accelerator_memory_gb=32,
                collective_env=_env(_NEURON_OVER_EFA),
                cores_per_accelerator=2,
                validation_instance_type="trn1.2xlarge",
            ),
            # Trainium2: 16 chips of 8 physical NeuronCore-v3, shown as 4 logical cores each at the default LNC=2;
            # 96 GiB HBM per chip (Neuron docs, "Amazon EC2 Trn2 architecture"). The compiler's
            # --logical-nc-config must match the runtime's NEURON_LOGICAL_NC_CONFIG (Neuron docs, "Logical
            # NeuronCore configuration"): both stay at their default, 2. Models validate on trn1.2xlarge: trn2.3xlarge's
            # facts could not be confirmed here and SageMaker does not train on it (no ml.trn2.3xlarge).
            InstanceType(
                name="trn2.48xlarge",
                accelerator=Accelerator.NEURON,
                accelerators=16,
                accelerator_model="Trainium2 (4 logical NeuronCores each)",
                vcpus=192,
                memory_gib=2048,
                efa_interfaces=16,
                network_cards=16,
                max_interfaces_per_network_card=2,
                on_demand_usd_per_hour=None,
                price_note=CAPACITY_BLOCKS_ONLY,
                sagemaker_list_usd_per_hour=UNPRICED,
                network_gbps=3200,
                published_busbw_gbps=None,
                busbw_source="no published two-node figure found; half the 3200 Gbps EFA line rate",
                peak_bf16_tflops_per_accelerator=TRAINIUM2_BF16_TFLOPS,
                accelerator_memory_gb=96,
                collective_env=_env(_NEURON_OVER_EFA),
                cores_per_accelerator=4,
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
                network_cards=1,
                max_interfaces_per_network_card=15,
                on_demand_usd_per_hour=5.672,
                sagemaker_list_usd_per_hour=7.09,
                network_gbps=40,
                published_busbw_gbps=None,
                # EFA and ENA share the same 40 Gbps here: bandwidth alone cannot tell EFA from a socket fallback,
                # which is why the sanity check also proves the transport from NCCL's own log.
                busbw_source="no published two-node figure found; half the 40 Gbps network rate (low-cost trials only)",
                peak_bf16_tflops_per_accelerator=A10G_BF16_TFLOPS,
                accelerator_memory_gb=24,
                collective_env=_env(_NCCL_OVER_EFA_NO_RDMA),
                validation_instance_type="g5.xlarge",
            ),
            # Single-node types: one accelerator, no EFA in use. They validate models; choosing one to train fails
            # with a reason.
            InstanceType(
                name="g5.xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=1,
                accelerator_model="A10G 24 GB",
                vcpus=4,
                memory_gib=16,
                efa_interfaces=0,
                max_interfaces_per_network_card=4,
                on_demand_usd_per_hour=1.006,
                sagemaker_list_usd_per_hour=1.408,
                network_gbps=10,
                published_busbw_gbps=None,
                busbw_source="no EFA",
                peak_bf16_tflops_per_accelerator=A10G_BF16_TFLOPS,
                accelerator_memory_gb=24,
                single_node_only=True,
            ),
            # No EC2 type has one A100, H200 or B200, so those models validate on one H100 80 GB (it loads what they
            # wrote). DescribeInstanceTypes gives p5.4xlarge one EFA interface; single-node jobs do not use it.
            InstanceType(
                name="p5.4xlarge",
                accelerator=Accelerator.NVIDIA,
                accelerators=1,
                accelerator_model="H100 80 GB",
                vcpus=16,
                memory_gib=256,
                efa_interfaces=0,
                max_interfaces_per_network_card=4,
                on_demand_usd_per_hour=6.88,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=100,
                published_busbw_gbps=None,
                busbw_source="single-node only",
                peak_bf16_tflops_per_accelerator=HOPPER_BF16_TFLOPS,
                accelerator_memory_gb=80,
                single_node_only=True,
            ),
            InstanceType(
                name="trn1.2xlarge",
                accelerator=Accelerator.NEURON,
                accelerators=1,
                accelerator_model="Trainium (2 NeuronCores each)",
                vcpus=8,
                memory_gib=32,
                efa_interfaces=0,
                max_interfaces_per_network_card=4,
                on_demand_usd_per_hour=1.34375,
                sagemaker_list_usd_per_hour=ESTIMATED,
                network_gbps=12,
                published_busbw_gbps=None,
                busbw_source="single-node only",
                peak_bf16_tflops_per_accelerator=TRAINIUM_BF16_TFLOPS,
                accelerator_memory_gb=32,
                cores_per_accelerator=2,
                single_node_only=True,
            ),
        )
    }
)


def efa_instance_types() -> tuple[str, ...]:
    return tuple(name for name, it in CATALOGUE.items() if it.has_efa)
