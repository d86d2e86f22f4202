"""An EKS cluster for training: managed node groups (not Auto Mode), control plane logs, pinned add-ons and charts.

Add-ons where EKS offers one (VPC CNI, Pod Identity agent, FSx CSI driver, CloudWatch observability); Helm
charts for the EFA and accelerator device plugins, and Kubeflow Trainer's when asked for
(eks_kubeflow_trainer). A small on-demand system node group
in the private subnets runs them; accelerator nodes are added separately (EksAcceleratorNodegroup).
"""

import json
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_ec2 as ec2
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_iam as iam
from aws_cdk.lambda_layer_kubectl_v36 import KubectlV36Layer

import constructs.compute.eks.versions as versions
from config import Accelerator, InstanceType
from constructs import Construct, IConstruct
from constructs.compute.eks.accelerator_nodegroup import acknowledge_node_role
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
    ) -> None:
        super().__init__(scope, id_)
        self.cluster = eks.Cluster(
            self,
            "Cluster",
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
        # IMDSv2 with hop limit 1 (EKS best practices, "Restrict access to the instance profile assigned to the
        # worker node"): pods cannot borrow the node role; host-network daemons (VPC CNI, CloudWatch agent) still
        # reach IMDS. The node group's own default template would allow 2 hops.
        system_template = ec2.LaunchTemplate(
            self,
            "SystemLaunchTemplate",
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
        self._acknowledge_cdk_internals()
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

    def _acknowledge_cdk_internals(self) -> None:
        """Findings on roles and functions the EKS constructs create and do not let us shape."""
        acknowledge(
            self.cluster.role,
            managed_policy_finding("AmazonEKSClusterPolicy"),
            "AmazonEKSClusterPolicy is the policy EKS requires on the cluster service role",
        )
        acknowledge_node_role(self.system_nodegroup.role)
        provider = self.cluster.kubectl_provider
        assert provider is not None  # the cluster is built with a kubectl layer, so it has a provider
        for policy in (
            "service-role/AWSLambdaBasicExecutionRole",
            "service-role/AWSLambdaVPCAccessExecutionRole",
            "AmazonEC2ContainerRegistryReadOnly",
        ):
            acknowledge(
                provider,
                managed_policy_finding(policy),
                "CDK's kubectl provider functions: Lambda logging/VPC access and ECR read for OCI charts",
            )
        has_ecr_public = _logical(provider.node.find_child("Handler"), "HasEcrPublic", default_child=False)
        ecr_public = (
            f'{{"Fn::If":["{has_ecr_public}",{{"Fn::Join":["",["arn:",{{"Ref":"AWS::Partition"}},":iam::aws:policy/'
            'AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}'
        )
        acknowledge(
            provider,
            f"AwsSolutions-IAM4[Policy::{ecr_public}]",
            "CDK's kubectl handler may pull OCI charts from public ECR (the Neuron chart lives there)",
        )
        acknowledge(
            provider,
            f"AwsSolutions-IAM5[Resource::<{_logical(provider, 'Handler')}.Arn>:*]",
            "CDK's provider framework may invoke only its own kubectl handler function (its versions: ARN:*)",
        )
        acknowledge(
            provider,
            "AwsSolutions-L1",
            "CDK pins the kubectl handler's Python runtime to match the kubectl/helm layer it ships with",
        )

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
                )
            # EKS installs self-managed vpc-cni at cluster creation; the managed add-on takes it over.
            cfn(addon).add_property_override("ResolveConflicts", "OVERWRITE")
            addons[name] = addon
        # The CloudWatch agent gets its permissions through EKS Pod Identity rather than from every node's role.
        agent_role = iam.Role(
            self,
            "CloudWatchAgentRole",
            assumed_by=_pod_identity_principal(),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy")],
        )
        observability = addons["amazon-cloudwatch-observability"]
        cfn(observability).add_property_override(
            "PodIdentityAssociations", [{"ServiceAccount": "cloudwatch-agent", "RoleArn": agent_role.role_arn}]
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


def _logical(parent: IConstruct, child: str, default_child: bool = True) -> str:
    """The logical ID cdk-nag prints for a child of a CDK-made construct."""
    element = parent.node.find_child(child)
    resource = cast(cdk.CfnElement, cfn(element) if default_child else element)
    return cdk.Stack.of(parent).resolve(cdk.Stack.of(parent).get_logical_id(resource))


def as_icluster(cluster: eks.Cluster) -> eks.ICluster:
    """jsii's Python typing of aws_eks_v2.Cluster misses ICluster.kubectl_provider_options, which it implements."""
    return cast(eks.ICluster, cluster)


def _pod_identity_principal() -> iam.IPrincipal:
    """EKS Pod Identity's trust: the pods service principal with AssumeRole and TagSession."""
    return iam.SessionTagsPrincipal(iam.ServicePrincipal("pods.eks.amazonaws.com"))


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))
