"""Every version the EKS backend installs, pinned in one place (docs/eks.md says where each was checked).

Bump them together with the Kubernetes version: `aws eks describe-addon-versions --kubernetes-version 1.33
--addon-name NAME` lists what EKS accepts; charts are pulled at deploy time from their repositories.
"""

from dataclasses import dataclass

# 1.33 matches the kubectl/helm in the pinned Lambda layer (aws-cdk.lambda-layer-kubectl-v33).
KUBERNETES_VERSION = "1.33"

ADDONS = {
    # >= 1.18.5 attaches `efa-only` interfaces correctly; v1.20.1-eksbuild.3 is the EKS user guide's
    # latest for 1.33 ("Amazon VPC CNI versions" table).
    "vpc-cni": "v1.20.1-eksbuild.3",
    "eks-pod-identity-agent": "v1.3.7-eksbuild.2",
    "aws-fsx-csi-driver": "v1.8.0-eksbuild.1",
    # Container Insights with enhanced observability: DCGM (GPU), neuron-monitor (Neuron) and EFA metrics.
    "amazon-cloudwatch-observability": "v4.10.2-eksbuild.1",
}


@dataclass(frozen=True)
class Chart:
    chart: str
    repository: str
    version: str
    namespace: str


EFA_DEVICE_PLUGIN = Chart("aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts", "v0.5.29", "kube-system")
NVIDIA_DEVICE_PLUGIN = Chart("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "0.17.2",
                             "kube-system")
# OCI charts: the CDK kubectl handler pulls `repository` itself (public ECR login, or anonymous for ghcr.io).
NEURON = Chart("neuron-helm-chart", "oci://public.ecr.aws/neuron/neuron-helm-chart", "1.1.2", "kube-system")
KUBEFLOW_TRAINER = Chart("kubeflow-trainer", "oci://ghcr.io/kubeflow/charts/kubeflow-trainer", "2.1.0",
                         "kubeflow-system")
