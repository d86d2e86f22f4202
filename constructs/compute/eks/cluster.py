"""An EKS cluster for training: managed node groups (not Auto Mode), control plane logs, pinned add-ons and charts,
Kubernetes secrets envelope-encrypted with a key of its own.

Add-ons where EKS offers one (VPC CNI, Pod Identity agent, FSx CSI driver, CloudWatch observability, node
monitoring agent); Helm charts for the EFA and accelerator device plugins, and Kubeflow Trainer's when asked for
(eks_kubeflow_trainer). A small on-demand system node group in the private subnets runs them; accelerator nodes are
added separately (EksAcceleratorNodegroup).
"""

import json
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_iam as iam
import aws_cdk.aws_kms as kms
import aws_cdk.aws_logs as logs
from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer

import constructs.compute.eks.versions as versions
from config import Accelerator, InstanceType
from constructs import Construct
from constructs.compute.eks.cluster_internals import acknowledge_cdk_internals
from constructs.compute.eks.cluster_logs import ClusterLogGroups
from constructs.compute.shared.efa_launch_template import ROOT_DEVICE
from constructs.escape_hatch import cfn
from constructs.nag import acknowledge, managed_policy_finding
from contracts.eks.job_spec import ACCELERATOR_LABEL, toleration

SYSTEM_INSTANCE_TYPE = "m6i.xlarge"
# The add-on's agent configuration (replaces its default): Container Insights with enhanced observability and
# accelerator metrics as before, plus the agent's EMF listener (logs.metrics_collected.emf, TCP/UDP 25888;
# CloudWatch user guide, CloudWatch_Embedded_Metric_Format_Generation_CloudWatch_Agent.html and
# install-CloudWatch-Observability-EKS-addon.html) for the training pods' metrics.
OBSERVABILITY_CONFIGURATION = {
    "agent": {
        "config": {
            "logs": {
                "metrics_collected": {
                    "kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": True},
                    "emf": {},
                }
            }
        }
    }
}
# The node monitoring agent's configuration (its chart values; the add-on accepts the subset in its configuration
# schema: EKS user guide, "Detect node health issues with the EKS node monitoring agent", Configure the node
# monitoring agent). Its agent DaemonSet tolerates every taint by default (chart values.yaml, nodeAgent.tolerations
# `operator: Exists`), but its DCGM host engine (dcgm-server, which it reads NVIDIA GPU health from) tolerates none
# and would not run on the tainted accelerator nodes, where the agent would then report the condition DCGMError
# ("Connection to the DCGM host process was lost or could not be established", same page): it gets the training
# taint's toleration. The engine runs on NVIDIA instance types only (the chart's dcgmAgent.affinity).
NODE_MONITORING_CONFIGURATION = {"dcgmAgent": {"tolerations": [toleration()]}}
ADDON_CONFIGURATION: dict[str, dict] = {"eks-node-monitoring-agent": NODE_MONITORING_CONFIGURATION}
# Where the observability add-on runs its CloudWatch agent (the add-on's namespace and service account).
AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT = "amazon-cloudwatch", "cloudwatch-agent"
_CONTROL_PLANE_LOGS = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


class EksTrainingCluster(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        vpc: ec2.IVpc,
        instance: InstanceType,
        admin_role_arns: tuple[str, ...] = (),
        kubeflow_trainer: bool = False,
        public_access_cidrs: tuple[str, ...] = (),
        log_retention: logs.RetentionDays | None = None,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.DESTROY,
    ) -> None:
        """`log_retention`: the control plane's and Container Insights' log groups are created with it (before EKS
        and the add-on would create them without); None leaves them to the services."""
        super().__init__(scope, id_)
        self.secrets_key = _secrets_key(self)
        self.cluster_name = _fixed_name(self, id_)
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=self.cluster_name,
            secrets_encryption_key=self.secrets_key,
            version=eks.KubernetesVersion.of(versions.KUBERNETES_VERSION),
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
            # Public as well as private: Step Functions' eks:runJob reaches the API server over its public endpoint
            # (Step Functions developer guide, "Call Amazon EKS": "supports only Kubernetes APIs with public
            # endpoint access"), from AWS's addresses: a CIDR list that leaves those out stops every run.
            endpoint_access=(
                eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*public_access_cidrs)
                if public_access_cidrs
                else eks.EndpointAccess.PUBLIC_AND_PRIVATE
            ),
            cluster_logging=_CONTROL_PLANE_LOGS,
            kubectl_provider_options=eks.KubectlProviderOptions(kubectl_layer=KubectlV36Layer(self, "KubectlLayer")),
        )
        _guard_cluster_role(self.cluster, self.cluster_name)
        _standard_support_only(self.cluster)
        # IMDSv2 with hop limit 1 (EKS best practices, "Restrict access to the instance profile assigned to the
        # worker node"): pods cannot borrow the node role; host-network daemons (VPC CNI, CloudWatch agent) still
        # reach IMDS. The node group's own default template would allow 2 hops.
        # Its root volume encrypted whatever the account's EBS default (the node group's own default template
        # leaves that to the account; AL2023 EKS AMIs boot from /dev/xvda, 20 GiB as EKS's default disk_size).
        system_template = ec2.LaunchTemplate(
            self,
            "SystemLaunchTemplate",
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        20, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True, delete_on_termination=True
                    ),
                )
            ],
            http_endpoint=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            http_put_response_hop_limit=1,
        )
        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "System",
            launch_template_spec=eks.LaunchTemplateSpec(
                id=cast(str, system_template.launch_template_id), version=system_template.latest_version_number
            ),
            instance_types=[ec2.InstanceType(SYSTEM_INSTANCE_TYPE)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            capacity_type=eks.CapacityType.ON_DEMAND,
            min_size=2,
            desired_size=2,
            max_size=3,
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            labels={"efa-training/role": "system"},
        )
        acknowledge_cdk_internals(self.cluster, self.system_nodegroup)
        for index, arn in enumerate(admin_role_arns):
            self.cluster.grant_access(
                f"Admin{index}",
                arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )
        self.addons = self._add_addons()
        self.charts = self._add_charts(instance.accelerator, kubeflow_trainer)
        self.log_groups = None if log_retention is None else self._log_groups(log_retention, removal_policy)

    def _log_groups(self, retention: logs.RetentionDays, removal_policy: cdk.RemovalPolicy) -> ClusterLogGroups:
        """The groups EKS and the observability add-on write to, created first: the cluster and the add-on wait."""
        groups = ClusterLogGroups(
            self, "Logs", cluster_name=self.cluster_name, retention=retention, removal_policy=removal_policy
        )
        cfn(self.cluster).node.add_dependency(groups.control_plane)
        for group in groups.container_insights.values():
            self.addons["amazon-cloudwatch-observability"].node.add_dependency(group)
        return groups

    def _add_addons(self) -> dict[str, eks.IAddon]:
        addons: dict[str, eks.IAddon] = {}
        for name, version in versions.ADDONS.items():
            if name == "eks-pod-identity-agent":
                # The cluster creates this add-on itself for pod identity service accounts; pin that one.
                agent = self.cluster.eks_pod_identity_agent
                assert agent is not None  # the cluster has pod identity service accounts
                addon = agent
                if version:
                    cfn(addon).add_property_override("AddonVersion", version)
            else:
                addon = eks.Addon(
                    self,
                    _pascal(name),
                    cluster=as_icluster(self.cluster),
                    addon_name=name,
                    addon_version=version,
                    preserve_on_delete=False,
                    configuration_values=ADDON_CONFIGURATION.get(name),
                )
            # EKS installs self-managed vpc-cni at cluster creation; the managed add-on takes it over.
            cfn(addon).add_property_override("ResolveConflicts", "OVERWRITE")
            addons[name] = addon
        # The CloudWatch agent gets its permissions through EKS Pod Identity rather than from every node's role.
        agent_role = iam.Role(
            self,
            "CloudWatchAgentRole",
            assumed_by=_pod_identity_principal(self.cluster_name, AGENT_NAMESPACE, AGENT_SERVICE_ACCOUNT),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy")],
        )
        observability = addons["amazon-cloudwatch-observability"]
        cfn(observability).add_property_override(
            "PodIdentityAssociations", [{"ServiceAccount": AGENT_SERVICE_ACCOUNT, "RoleArn": agent_role.role_arn}]
        )
        cfn(observability).add_property_override("ConfigurationValues", json.dumps(OBSERVABILITY_CONFIGURATION))
        observability.node.add_dependency(addons["eks-pod-identity-agent"])
        acknowledge(
            agent_role,
            managed_policy_finding("CloudWatchAgentServerPolicy"),
            "CloudWatchAgentServerPolicy is the policy AWS documents for the Container Insights agent",
        )
        return addons

    def _add_charts(self, accelerator: Accelerator, kubeflow_trainer: bool) -> dict[str, eks.HelmChart]:
        on_accelerators = {"tolerations": [toleration()], "nodeSelector": dict(ACCELERATOR_LABEL)}
        charts = {"efa": self._chart("EfaDevicePlugin", versions.EFA_DEVICE_PLUGIN, on_accelerators)}
        if accelerator is Accelerator.NVIDIA:
            # The device plugin alone: no GPU Operator, so no MOFED driver to fight the EFA stack; the EKS
            # accelerated AMI already ships the NVIDIA driver and container toolkit. GPU feature discovery off.
            charts["accelerator"] = self._chart(
                "NvidiaDevicePlugin",
                versions.NVIDIA_DEVICE_PLUGIN,
                {**on_accelerators, "gfd": {"enabled": False}, "nfd": {"enabled": False}},
            )
        else:
            # The device plugin (the chart's own tolerations plus ours); the node problem detector needs IAM of its
            # own and is left off (Neuron docs: --set npd.enabled=false).
            charts["accelerator"] = self._chart(
                "Neuron",
                versions.NEURON,
                {
                    "npd": {"enabled": False},
                    "devicePlugin": {
                        "tolerations": [
                            {"key": "CriticalAddonsOnly", "operator": "Exists"},
                            {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"},
                            toleration(),
                        ]
                    },
                },
            )
        if kubeflow_trainer:
            # Optional, and never waited for: a chart that fails to become ready must not roll the cluster back
            # (Helm `--wait` makes the custom resource fail, and CloudFormation the stack, until it is ready).
            charts["trainer"] = self._chart("KubeflowTrainer", versions.KUBEFLOW_TRAINER, {})
        for chart in charts.values():
            chart.node.add_dependency(self.system_nodegroup)
        return charts

    def _chart(self, id_: str, chart: versions.Chart, values: dict) -> eks.HelmChart:
        return self.cluster.add_helm_chart(
            id_,
            chart=chart.chart,
            repository=chart.repository,
            version=chart.version,
            namespace=chart.namespace,
            create_namespace=True,
            release=chart.chart[:53],
            values=values or None,
            wait=False,
        )


def as_icluster(cluster: eks.Cluster) -> eks.ICluster:
    """jsii's Python typing of aws_eks_v2.Cluster misses ICluster.kubectl_provider_options, which it implements."""
    return cast(eks.ICluster, cluster)


def _secrets_key(scope: Construct) -> kms.Key:
    """Secrets envelope encryption with a key of ours (EKS user guide, "Encrypt Kubernetes secrets with KMS on
    existing clusters": symmetric, same region; irreversible once enabled). CloudFormation calls CreateCluster with the
    deploying role, which creates EKS's grant on the key (the key policy lets IAM decide). EncryptionConfig is
    create-only (AWS::EKS::Cluster EncryptionConfig, "Update requires: Replacement"), and so is Name: a cluster created
    without them is replaced on the next deploy (docs/eks.md, Security)."""
    return kms.Key(
        scope,
        "SecretsKey",
        enable_key_rotation=True,
        description="Envelope-encrypts the training cluster's Kubernetes secrets",
        # The key serves this cluster only, which is deleted before it (the cluster depends on the key).
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )


def _fixed_name(scope: Construct, id_: str) -> str:
    """A fixed name: the log groups' names are known before EKS creates them, and a later create-only change fails
    (the name is taken) instead of quietly replacing the cluster under running jobs. It ends with the stack's own id
    (the first group of its UUID): groups a destroyed prod stack kept (retain_data) never collide with the next
    deploy's, which EKS and the add-on would write to by name."""
    stack = cdk.Stack.of(scope)
    stack_uuid = cdk.Fn.select(2, cdk.Fn.split("/", stack.stack_id))
    return cdk.Fn.join("-", [stack.stack_name, id_, cdk.Fn.select(0, cdk.Fn.split("-", stack_uuid))])


def _guard_cluster_role(cluster: eks.Cluster, name: str) -> None:
    """The cluster role serves this cluster of this account only (EKS user guide, "Cross-service confused deputy
    prevention in Amazon EKS": aws:SourceArn, the cluster's ARN, and aws:SourceAccount in the cluster role's trust).
    The name is fixed, so the ARN is known before the cluster exists; set in place on the role CDK makes."""
    stack = cdk.Stack.of(cluster)
    arn = stack.format_arn(service="eks", resource="cluster", resource_name=name)
    cfn(cluster.role).add_property_override(
        "AssumeRolePolicyDocument.Statement.0.Condition",
        {"StringEquals": {"aws:SourceAccount": stack.account}, "ArnLike": {"aws:SourceArn": arn}},
    )


def _standard_support_only(cluster: eks.Cluster) -> None:
    """No extended support: at the end of standard support (14 months from the version's EKS release) EKS upgrades
    the cluster's control plane rather than keep the version "at an additional cost per cluster hour" (EKS user
    guide, "View current cluster upgrade policy"; AWS::EKS::Cluster UpgradePolicy: the default is EXTENDED). Fixed
    here: config/ pins no Kubernetes version to put a choice beside (versions.KUBERNETES_VERSION, whose standard
    support ends 2027-08-02: move it before then, or the next version arrives by EKS's upgrade, not this template's).
    The aws_eks_v2 L2 has no upgrade policy, so it is set on its CfnCluster. Not create-only (the resource schema's
    createOnlyProperties lack it; "Update requires: No interruption"): a deployed cluster is updated in place."""
    cast(eks.CfnCluster, cfn(cluster)).upgrade_policy = eks.CfnCluster.UpgradePolicyProperty(support_type="STANDARD")


def _pod_identity_principal(cluster_name: str, namespace: str, service_account: str) -> iam.IPrincipal:
    """EKS Pod Identity's trust: the pods service principal with AssumeRole and TagSession, for one service account
    of one cluster only. EKS documents the session tags it sets, not aws:SourceArn, as the trust policy's conditions
    (EKS user guide, "Create IAM role with trust policy required by EKS Pod Identity", Setting Conditions; the tags:
    "Enable or disable session tags", pod-id-abac.html)."""
    tags = {
        "eks-cluster-name": cluster_name,
        "kubernetes-namespace": namespace,
        "kubernetes-service-account": service_account,
    }
    return iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com")).with_conditions(
        {"StringEquals": {f"aws:RequestTag/{tag}": value for tag, value in tags.items()}}
    )


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))
