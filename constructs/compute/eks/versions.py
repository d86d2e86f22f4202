"""Every version the EKS backend installs, pinned in one place (docs/eks.md says where each was checked).

Kubernetes 1.36, chosen on 2026-11-26: the newest version the EKS user guide lists ("Review release notes for
Kubernetes versions on standard support"; no EKS page lists 1.37), and the newest aws-cdk-lib 2.275 knows
(`KubernetesVersion.V1_36`). Standard support lasts 14 months from EKS's release ("Understand the Kubernetes
version lifecycle on EKS"): 1.36 (EKS release 2026-06-02) keeps it until 2027-08-02. `make deploy` checks,
before deploying, that the region offers it in standard support (tools/deploy.py, `DescribeClusterVersions`).
The kubectl/helm layer is the matching aws-cdk.lambda-layer-kubectl-v36 (requirements.txt).
"""

from dataclasses import dataclass

KUBERNETES_VERSION = "1.36"
# Add-ons need at least these versions (checked by `make deploy` against DescribeAddonVersions' default for the
# cluster's version, since no 1.36 build is documented where we could read it): vpc-cni 1.18.5 is the first to
# attach `efa-only` interfaces (EKS user guide, "Run machine learning training on Amazon EKS with Elastic
# Fabric Adapter").
ADDON_MINIMUMS = {"vpc-cni": "1.18.5"}

# Add-ons: None installs the version EKS marks as the default for the cluster's Kubernetes version when the
# add-on is created (AWS::EKS::Addon, AddonVersion unset), and later deploys leave it alone. No 1.36 build was
# documented where we could read it; pin one with `aws eks describe-addon-versions --kubernetes-version 1.36
# --addon-name NAME` (a wrong build string fails CreateAddon, so none is guessed here).
ADDONS: dict[str, str | None] = {
    # At least ADDON_MINIMUMS["vpc-cni"]: `make deploy` refuses a region whose default is older.
    "vpc-cni": None,
    "eks-pod-identity-agent": None,
    "aws-fsx-csi-driver": None,
    # Container Insights with enhanced observability: DCGM (GPU), neuron-monitor (Neuron) and EFA metrics. Its
    # agent runs on the host network since aws-observability/helm-charts#82 (2024-08), so it reaches IMDS on
    # nodes whose hop limit is 1.
    "amazon-cloudwatch-observability": None,
    # Reports node health as node conditions (AcceleratedHardwareReady, KernelReady, NetworkingReady, ...), which
    # node auto repair on the accelerator node groups acts on (EKS user guide, "Detect node health issues with the
    # EKS node monitoring agent", node-health-nma.html; "Automatically repair nodes in EKS clusters",
    # node-repair.html). No IAM permissions ("AWS add-ons": eks-node-monitoring-agent).
    "eks-node-monitoring-agent": None,
}


@dataclass(frozen=True)
class Chart:
    chart: str
    repository: str
    version: str
    namespace: str


# None of these charts declares an upper Kubernetes bound (`kubeVersion`); Kubeflow Trainer 2.1.0's end-to-end
# tests cover 1.31-1.34 (its .github/workflows/test-e2e.yaml), so 1.36 is untested upstream: it is optional
# (eks_kubeflow_trainer, off by default) and never waited for.
EFA_DEVICE_PLUGIN = Chart("aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts", "v0.5.29", "kube-system")
NVIDIA_DEVICE_PLUGIN = Chart(
    "nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.17.2", "kube-system"
)
# OCI charts: the CDK kubectl handler pulls `repository` itself (public ECR login, or anonymous for ghcr.io).
NEURON = Chart("neuron-helm-chart", "oci://public.ecr.aws/neuron/neuron-helm-chart", "1.1.2", "kube-system")
KUBEFLOW_TRAINER = Chart(
    "kubeflow-trainer", "oci://ghcr.io/kubeflow/charts/kubeflow-trainer", "2.1.0", "kubeflow-system"
)
