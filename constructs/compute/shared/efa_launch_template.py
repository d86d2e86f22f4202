"""An EC2 launch template for EFA training nodes, shared by the Batch and EKS backends.

One EFA per network card on both, laid out per backend (EfaLayout): a card takes only so many interfaces (the
catalogue's `max_interfaces_per_network_card`: 2 on p5, p5e and trn2), and Batch attaches one more at run time.
- EKS: the EKS user guide's launch template ("Manage EFA devices on Amazon EKS": its P6-B200 example, and the same
  layout in its P5 NodeClass example), the EC2 user guide's recommendation ("Maximize network bandwidth on Amazon
  EC2 instances with multiple network cards",
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): the primary ENA `interface` at
  card 0 / device 0 (the node's IP; "You can't use an EFA-only network interface as the primary network
  interface"), card 0's EFA `efa-only` at device 1, one `efa-only` at device 0 of every other card.
  Pods take secondary addresses of the primary interface from the VPC CNI.
- Batch: one interface per card, as AWS's own Batch p5 and p6 templates (aws-samples/awsome-distributed-training,
  1.architectures/3.aws-batch/0.aws-batch-distributed-training-p5.yaml and aws-batch-distributed-training-p6.yaml)
  and eksctl (pkg/cfn/builder/network_interfaces.go) have it: the primary at card 0 / device 0 is `efa` (EFA with
  ENA: the host's IP and card 0's EFA), every other card one `efa-only` at device 0. A multi-node job's container
  runs in awsvpc mode and "gets its own elastic network interface" on the host (Batch user guide, "Compute
  environment considerations for MNP"), attached to card 0 (EC2 API reference, AttachNetworkInterface: "The default
  is network card index 0"), so card 0 keeps a place for it.
The EFA security group goes on every interface (`Groups`): a launch template with network interfaces cannot use
SecurityGroupIds. No SubnetId and no public IP: Batch places the instance in its compute environment's subnet, and EKS
managed node groups reject a SubnetId in the template.
"""

from collections import Counter
from enum import Enum

import aws_cdk.aws_ec2 as ec2

from config import InstanceType
from config.capacity import CapacityReservation
from constructs import Construct
from constructs.escape_hatch import cfn

# Amazon Linux 2023 AMIs (ECS- and EKS-optimized) boot from /dev/xvda.
ROOT_DEVICE = "/dev/xvda"


class EfaLayout(Enum):
    """The interface layout of one backend (module docstring) and what that backend attaches to card 0 later."""

    BATCH = "batch"
    EKS = "eks"

    @property
    def interfaces_attached_to_card0(self) -> int:
        """Batch: the awsvpc task interface of a multi-node job (one job, so one container, per host). EKS: none
        fixed; the VPC CNI attaches further interfaces only within its generated per-type limits."""
        return 1 if self is EfaLayout.BATCH else 0


def efa_network_interfaces(efa_interfaces: int, security_group_ids: list[str], layout: EfaLayout) -> list[dict]:
    """The LaunchTemplateData.NetworkInterfaces list (CloudFormation casing) of `layout`, one EFA per network card."""
    if efa_interfaces < 1:
        raise ValueError(f"efa_interfaces={efa_interfaces} is not valid; expected at least 1 (an EFA instance type)")
    common = {"Groups": security_group_ids, "DeleteOnTermination": True}
    batch = layout is EfaLayout.BATCH
    primary = {
        "NetworkCardIndex": 0,
        "DeviceIndex": 0,
        "InterfaceType": "efa" if batch else "interface",
        **common,
        # Several interfaces rule out a public IP anyway; the primary one states it explicitly.
        "AssociatePublicIpAddress": False,
        "Description": "Primary interface, EFA with ENA on network card 0"
        if batch
        else "Primary ENA interface (the node's IP)",
    }
    # Batch's card 0 EFA is the primary interface itself; EKS's is an efa-only at device 1.
    first_efa_only_card = 1 if batch else 0
    return [primary] + [
        {
            "NetworkCardIndex": card,
            "DeviceIndex": 1 if card == 0 else 0,
            "InterfaceType": "efa-only",
            **common,
            "Description": f"EFA on network card {card}",
        }
        for card in range(first_efa_only_card, efa_interfaces)
    ]


def check_card_limits(instance: InstanceType, interfaces: list[dict], layout: EfaLayout) -> None:
    """Refuse a layout that would put more interfaces on a card than `instance` takes, counting what `layout`'s
    backend attaches to card 0 at run time (EC2 refuses the launch or the attachment otherwise)."""
    per_card = Counter(i["NetworkCardIndex"] for i in interfaces)
    per_card[0] += layout.interfaces_attached_to_card0
    limit = instance.max_interfaces_per_network_card
    for card, count in sorted(per_card.items()):
        if count > limit:
            raise ValueError(
                f"{instance.name}: network card {card} would hold {count} interfaces on {layout.value} "
                f"({layout.interfaces_attached_to_card0 if card == 0 else 0} attached at run time); "
                f"expected at most max_interfaces_per_network_card={limit}"
            )


class EfaLaunchTemplate(Construct):
    """Launch template: EFA interfaces (catalogue count), IMDSv2, encrypted gp3 root, MIME multipart user data.

    `layout`: the backend's interface layout (EfaLayout), required with the interfaces.
    `include_network_interfaces=False` leaves the interfaces (and so EFA) out and puts the security
    groups on the template instead: for single-node hosts that need the same host preparation only.
    `terminate_on_shutdown=False` and `placement_group` for EKS managed node groups: they refuse the shutdown
    behaviour, and nothing else places their nodes (Batch sets the group on its compute environment).
    `reservation`: the EC2 reservation the hosts launch into (config/capacity.py): its target, and for a Capacity
    Block the market type `capacity-block` (EC2 user guide, "Use Capacity Blocks": a launch into a block names both).
    `.launch_template` is the ec2.LaunchTemplate; `.network_interfaces` what was rendered (for tests).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        instance: InstanceType,
        security_groups: list[ec2.ISecurityGroup],
        user_data: ec2.UserData,
        layout: EfaLayout | None = None,
        root_volume_gib: int = 200,
        include_network_interfaces: bool = True,
        terminate_on_shutdown: bool = True,
        placement_group: ec2.IPlacementGroup | None = None,
        reservation: CapacityReservation | None = None,
    ) -> None:
        super().__init__(scope, id_)
        if not security_groups:
            raise ValueError(
                "security_groups is empty; expected the EFA security group (all traffic to and from itself)"
            )
        if include_network_interfaces and layout is None:
            raise ValueError(
                "layout=None is not valid with network interfaces; expected EfaLayout.BATCH or EfaLayout.EKS"
            )
        if root_volume_gib < 30:
            raise ValueError(
                f"root_volume_gib={root_volume_gib} is not valid; expected at least 30 GiB "
                "(accelerated images are tens of GiB)"
            )
        if not isinstance(user_data, ec2.MultipartUserData):
            # Batch and ECS accept only MIME multipart user data in a launch template.
            multipart = ec2.MultipartUserData()
            multipart.add_user_data_part(user_data, ec2.MultipartBody.SHELL_SCRIPT, True)
            user_data = multipart
        self.instance = instance
        self.launch_template = ec2.LaunchTemplate(
            self,
            "Resource",
            user_data=user_data,
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
            # IMDSv2 only, one hop: a container on its own network (bridge, an EKS pod) cannot reach the metadata
            # service and borrow the node's role (EC2 user guide, "Instance metadata access considerations": the
            # container is one more hop; EKS best practices, "Restrict access to the instance profile assigned to
            # the worker node"). Batch's multi-node containers (awsvpc) are kept out by ECS_AWSVPC_BLOCK_IMDS
            # (host_user_data.py). Batch's single-node jobs run in host network mode (Batch user guide, "Networking
            # modes for AWS Batch jobs"), where the hop limit does not apply: the validation container could read
            # the host role (the ECS agent's and CloudWatch agent's managed policies, no data access); it uses its
            # job role, and docs/batch.md says so.
            http_endpoint=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=1,
            instance_metadata_tags=False,
            # A host whose preparation fails shuts itself down; terminating lets the scheduler replace it
            # (EKS managed node groups reject the setting: pass terminate_on_shutdown=False there).
            instance_initiated_shutdown_behavior=(
                ec2.InstanceInitiatedShutdownBehavior.TERMINATE if terminate_on_shutdown else None
            ),
            # Batch sets the placement group on the compute environment; EKS node groups need it here.
            placement_group=placement_group,
            security_group=None if include_network_interfaces else security_groups[0],
        )
        if not include_network_interfaces:
            for extra in security_groups[1:]:
                self.launch_template.add_security_group(extra)
        self.network_interfaces: list[dict] = []
        if include_network_interfaces and layout is not None:  # a missing layout was refused above
            self.network_interfaces = efa_network_interfaces(
                instance.efa_interfaces, [sg.security_group_id for sg in security_groups], layout
            )
            check_card_limits(instance, self.network_interfaces, layout)
            # Escape hatch: the L2 LaunchTemplate has no network-interface (card index, EFA type) properties.
            cfn(self.launch_template).add_property_override(
                "LaunchTemplateData.NetworkInterfaces", self.network_interfaces
            )
        if reservation is not None:
            self._reserve(reservation)

    def _reserve(self, reservation: CapacityReservation) -> None:
        """Escape hatch: the L2's capacityReservationSpecification takes a reservation id only, not a group's ARN,
        and it has no market type; a targeted launch fails rather than run outside the reservation (EC2 user
        guide, "Launch instances into an existing Capacity Reservation")."""
        template = cfn(self.launch_template)
        template.add_property_override(
            "LaunchTemplateData.CapacityReservationSpecification", {"CapacityReservationTarget": reservation.target}
        )
        if reservation.capacity_block:
            template.add_property_override("LaunchTemplateData.InstanceMarketOptions.MarketType", "capacity-block")
