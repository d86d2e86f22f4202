"""The accelerator node groups: whole EFA nodes for training, and one small node for validation.

Training: the launch template is the shared EfaLaunchTemplate (every EFA interface of the catalogue type, no
SubnetId, as EKS managed node groups require), with the cluster security group on every interface next to the EFA
group: with interfaces in the template, EKS adds no security group of its own. Scales from 0 to `nodes`, in one
subnet and one cluster placement group, tainted for training.

Validation: one node of the catalogue's validation type (one accelerator, no EFA interfaces, no huge pages), the
way Batch and SageMaker validate; scales from 0 to 1. The pipeline sizes both groups (node_scaling.py).

Both groups have EKS node auto repair on: a node the node monitoring agent (cluster.py's add-ons) reports unhealthy
is rebooted or replaced.
"""

from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_eks_v2 as eks

from config import Accelerator, InstanceType
from config.capacity import CapacityReservation
from constructs import Construct, IConstruct
from constructs.compute.shared.efa_launch_template import EfaLaunchTemplate, EfaLayout
from constructs.escape_hatch import cfn
from constructs.nag import acknowledge, managed_policy_finding
from contracts.eks.job_spec import ACCELERATOR_LABEL, ACCELERATOR_TAINT_KEY, HUGEPAGES_2MI_PAGES

CAPACITY_TYPES = {"on_demand": eks.CapacityType.ON_DEMAND, "spot": eks.CapacityType.SPOT}
# catalogue eks_ami_type (aws_eks_v2.NodegroupAmiType member) -> the CloudFormation AmiType value
CFN_AMI_TYPES = {"AL2023_X86_64_NVIDIA": "AL2023_x86_64_NVIDIA", "AL2023_X86_64_NEURON": "AL2023_x86_64_NEURON"}
ROOT_VOLUME_GIB = 500
VALIDATION_NODES = 1  # a validation job runs on one node  # container images of the CUDA / Neuron stacks are tens of GB
# The NVIDIA device plugin chart's default nodeAffinity requires one of feature.node.kubernetes.io/pci-10de.present,
# feature.node.kubernetes.io/cpu-model.vendor_id=NVIDIA or nvidia.com/gpu.present=true. With GPU/node feature
# discovery off nothing sets them, so the node group sets the last one itself (else the plugin runs nowhere and
# nvidia.com/gpu is never allocatable). Helm merges maps, so `affinity: {}` in the values would not clear it.
NVIDIA_GPU_PRESENT_LABEL = {"nvidia.com/gpu.present": "true"}
# nodeadm (AL2023) merges the MIME parts EKS adds; this one reserves the huge pages EFA's libfabric uses
# (2560 x 2 MiB = the 5 GiB each training pod requests as hugepages-2Mi).
_HUGEPAGES_SCRIPT = (
    "#!/bin/bash\nset -euo pipefail\n"
    f"echo 'vm.nr_hugepages = {HUGEPAGES_2MI_PAGES}' > /etc/sysctl.d/90-efa-hugepages.conf\n"
    "sysctl --system\n"
)


class EksAcceleratorNodegroup(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        instance: InstanceType,
        subnet: ec2.ISubnet,
        efa_security_group: ec2.ISecurityGroup,
        nodes: int,
        capacity_type: str,
        reservation: CapacityReservation | None = None,
    ) -> None:
        """`capacity_type`: on_demand or spot; `reservation`: the EC2 reservation the nodes launch into (a Capacity
        Block makes the group's capacity type CAPACITY_BLOCK)."""
        super().__init__(scope, id_)
        if reservation is not None and capacity_type != "on_demand":
            raise ValueError(f"capacity_type={capacity_type!r} with a reservation; expected on_demand")
        # A reservation's instances are placed where the reservation is: a launch into a reservation must match its
        # instance type, platform, zone and tenancy (EC2 user guide, "Launch instances into an existing Capacity
        # Reservation"), and a new cluster placement group is no part of it. Otherwise: one cluster group.
        self.placement_group = (
            None
            if reservation is not None
            else ec2.PlacementGroup(self, "PlacementGroup", strategy=ec2.PlacementGroupStrategy.CLUSTER)
        )
        user_data = ec2.MultipartUserData()
        user_data.add_part(
            ec2.MultipartBody.from_raw_body(
                content_type='text/x-shellscript; charset="us-ascii"', body=_HUGEPAGES_SCRIPT
            )
        )
        self.launch_template = EfaLaunchTemplate(
            self,
            "LaunchTemplate",
            instance=instance,
            security_groups=[efa_security_group, cluster.cluster_security_group],
            user_data=user_data,
            # The EKS user guide's EFA launch template: the primary ENA interface, one efa-only per card.
            layout=EfaLayout.EKS,
            root_volume_gib=ROOT_VOLUME_GIB,
            # EKS managed node groups reject a template with shutdown behaviour "terminate" (EKS API reference,
            # LaunchTemplateSpecification: no TerminateInstances); the node group replaces failed nodes itself.
            terminate_on_shutdown=False,
            placement_group=self.placement_group,
            # Capacity Blocks (EKS user guide, "Create a managed node group with Capacity Blocks for ML"): the launch
            # template must carry the market type, the targeted reservation and the InstanceType, or EKS rejects
            # the node group; an On-Demand reservation is targeted the same way ("Use Capacity Reservations").
            reservation=reservation,
        ).launch_template
        template = cfn(self.launch_template)
        # The one type in the launch template, never on the node group: InstanceTypes is create-only on
        # AWS::EKS::Nodegroup (its resource schema), so a new type named there would replace the node group, while
        # a new launch-template version updates it in place, recycling its nodes (EKS user guide, "Customize
        # managed nodes with launch templates"; between runs the group has none). Set on the L1: the L2 cannot parse
        # p6-b200.48xlarge ("Malformed instance type identifier", aws-cdk-lib 2.275).
        template.add_property_override("LaunchTemplateData.InstanceType", instance.name)
        self.nodegroup = cluster.add_nodegroup_capacity(
            "Accelerator",
            instance_types=None,  # set on the L1 below
            capacity_type=(
                eks.CapacityType.CAPACITY_BLOCK
                if reservation is not None and reservation.capacity_block
                else CAPACITY_TYPES[capacity_type]
            ),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=cast(str, self.launch_template.launch_template_id),
                version=self.launch_template.latest_version_number,
            ),
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            min_size=0,
            desired_size=0,
            max_size=nodes,
            # No forced update: with force, a launch-template change replaces the nodes of a running training
            # job, ignoring pod disruption budgets (EKS user guide, "Update a managed node group"). Without it, an
            # update waits for pods to drain (and fails after EKS's drain timeout rather than kill a run). The
            # group's desired size stays 0 in the template (the pipeline sizes it at run time), which is also
            # what Capacity Blocks ask for before an update ("Create a managed node group with Capacity Blocks").
            force_update=False,
            # Node auto repair: EKS reboots or replaces a node whose accelerators fail (AcceleratedHardwareReady,
            # after 10 minutes) or whose kernel, network, storage or runtime fails (after 30 minutes), as the node
            # monitoring agent add-on reports them (EKS user guide, "Automatically repair nodes in EKS clusters",
            # node-repair.html); the next attempt then starts on a sound host. NodeRepairConfig updates the group in
            # place (AWS::EKS::Nodegroup NodeRepairConfig, "Update requires: No interruption").
            enable_node_auto_repair=True,
            labels={
                **ACCELERATOR_LABEL,
                "efa-training/instance-type": instance.name,
                **(NVIDIA_GPU_PRESENT_LABEL if instance.accelerator is Accelerator.NVIDIA else {}),
            },
            taints=[eks.TaintSpec(key=ACCELERATOR_TAINT_KEY, value="true", effect=eks.TaintEffect.NO_SCHEDULE)],
        )
        # The AMI type is set explicitly, through the L1: CDK checks ami_type against its built-in GPU list, which
        # knows neither p5 nor trn1, and refuses AL2023_x86_64_NVIDIA / _NEURON for them.
        self.ami_type = CFN_AMI_TYPES[instance.eks_ami_type]
        cfn(self.nodegroup).add_property_override("AmiType", self.ami_type)
        cdk.Annotations.of(self.nodegroup).acknowledge_warning(
            "@aws-cdk/aws-eks:gpuInstancesUseAL2", f"AmiType is set to {self.ami_type} on the CfnNodegroup"
        )
        acknowledge_node_role(self.nodegroup.role)


class EksValidationNodegroup(Construct):
    """One on-demand node of `instance` (a single-accelerator type without EFA) for validation jobs, from 0 to 1.

    Same subnet (FSx's zone) and security groups as training, so it mounts FSx; the template's security groups
    replace EKS's own, so the cluster group is named too (EKS user guide, "Customize managed nodes with launch
    templates": security groups in the template). Tainted and labelled like the training nodes; the validation Job
    selects it by its instance type."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        instance: InstanceType,
        subnet: ec2.ISubnet,
        efa_security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, id_)
        if instance.has_efa or instance.accelerators != 1:
            raise ValueError(
                f"validation instance {instance.name} is not valid; expected a single-accelerator type without EFA"
            )
        self.launch_template = EfaLaunchTemplate(
            self,
            "LaunchTemplate",
            instance=instance,
            security_groups=[efa_security_group, cluster.cluster_security_group],
            user_data=ec2.MultipartUserData(),  # no EFA, so no huge pages to reserve
            root_volume_gib=ROOT_VOLUME_GIB,
            include_network_interfaces=False,
            terminate_on_shutdown=False,
        ).launch_template
        cfn(self.launch_template).add_property_override("LaunchTemplateData.InstanceType", instance.name)
        self.nodegroup = cluster.add_nodegroup_capacity(
            "Validation",
            instance_types=None,  # in the launch template, as for training (InstanceTypes is create-only)
            capacity_type=eks.CapacityType.ON_DEMAND,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=cast(str, self.launch_template.launch_template_id),
                version=self.launch_template.latest_version_number,
            ),
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            min_size=0,
            desired_size=0,
            max_size=VALIDATION_NODES,
            force_update=False,
            # Repaired like the training nodes (EKS user guide, "Automatically repair nodes in EKS clusters"): the
            # group holds one node at most, so a failing one would otherwise serve every retry of validation.
            enable_node_auto_repair=True,
            labels={
                **ACCELERATOR_LABEL,
                "efa-training/instance-type": instance.name,
                **(NVIDIA_GPU_PRESENT_LABEL if instance.accelerator is Accelerator.NVIDIA else {}),
            },
            taints=[eks.TaintSpec(key=ACCELERATOR_TAINT_KEY, value="true", effect=eks.TaintEffect.NO_SCHEDULE)],
        )
        cfn(self.nodegroup).add_property_override("AmiType", CFN_AMI_TYPES[instance.eks_ami_type])
        cdk.Annotations.of(self.nodegroup).acknowledge_warning(
            "@aws-cdk/aws-eks:gpuInstancesUseAL2", "AmiType is set on the CfnNodegroup"
        )
        acknowledge_node_role(self.nodegroup.role)


NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryReadOnly")


def acknowledge_node_role(role: IConstruct) -> None:
    """The managed policies EKS documents for a managed node group's role (EKS user guide, create-node-role)."""
    for policy in NODE_ROLE_POLICIES:
        acknowledge(
            role,
            managed_policy_finding(policy),
            f"{policy} is one of the policies EKS documents for managed node group roles",
        )
