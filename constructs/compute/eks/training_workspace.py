"""What training pods need inside the cluster: their namespace, an AWS identity limited to the project's S3
prefixes (EKS Pod Identity), the FSx for Lustre file system as a static PersistentVolume, the Kubeflow Trainer
runtime they run under, and the rendered job templates (a ConfigMap, so `kubectl` users start from them).
"""

import json

import aws_cdk as cdk
import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_fsx as fsx

import contracts.eks.job_spec as spec
from config import InstanceType
from constructs import Construct
from constructs.storage.data_bucket_access import DataBucketAccess
from contracts.eks.job_templates import RUNTIME_NAME, WORKERS_SERVICE, job_templates, training_runtime

FSX_VOLUME = "fsx-training"


class EksTrainingWorkspace(Construct):
    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        cluster: eks.Cluster,
        data_access: DataBucketAccess,
        file_system: fsx.LustreFileSystem,
        storage_gib: int,
        instance: InstanceType,
        image: str,
        nodes: int,
        trainer_chart: eks.HelmChart | None,
        fsx_csi_driver: eks.IAddon,
        fsx_revision: str = "",
        environment: str = "",
        neuron_cc_flags: str = "",
        tracking_uri: str = "",
    ) -> None:
        super().__init__(scope, id_)
        namespace = cluster.add_manifest(
            "Namespace", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.NAMESPACE}}
        )

        self.service_account = cluster.add_service_account(
            "TrainingServiceAccount",
            name=spec.SERVICE_ACCOUNT,
            namespace=spec.NAMESPACE,
            identity_type=eks.IdentityType.POD_IDENTITY,
        )
        self.service_account.node.add_dependency(namespace)
        self.role = self.service_account.role
        data_access.grant_training(self.role, "Training pods")

        # Static provisioning: the file system already exists (storage stack); no CSI controller AWS calls needed.
        # Volume and claim are named by the file system's revision: a replaced file system gets new ones (their
        # CSI attributes and volumeName are immutable), and every job below names the new claim.
        self.fsx_claim = spec.fsx_claim_name(fsx_revision)
        self.site = spec.Site(
            environment=environment,
            fsx_claim=self.fsx_claim,
            neuron_cc_flags=neuron_cc_flags,
            tracking_uri=tracking_uri,
        )
        fsx_volume = f"{FSX_VOLUME}-{fsx_revision}" if fsx_revision else FSX_VOLUME
        capacity = f"{storage_gib}Gi"
        volume = cluster.add_manifest(
            "FsxVolume",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": fsx_volume},
                "spec": {
                    "capacity": {"storage": capacity},
                    "volumeMode": "Filesystem",
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",  # the file system's life is the storage stack's business
                    "storageClassName": "",
                    "mountOptions": ["relatime", "flock"],
                    "csi": {
                        "driver": "fsx.csi.aws.com",
                        "volumeHandle": file_system.file_system_id,
                        "volumeAttributes": {"dnsname": file_system.dns_name, "mountname": file_system.mount_name},
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": self.fsx_claim, "namespace": spec.NAMESPACE},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": fsx_volume,
                    "resources": {"requests": {"storage": capacity}},
                },
            },
        )
        volume.node.add_dependency(namespace)
        volume.node.add_dependency(fsx_csi_driver)

        # The pipeline's Jobs find their rank-0 pod by DNS through this headless service (see eks_job_runner).
        workers = cluster.add_manifest(
            "WorkersService",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": WORKERS_SERVICE, "namespace": spec.NAMESPACE},
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": {"efa-training/workers": WORKERS_SERVICE},
                    "ports": [{"name": "rendezvous", "port": spec.MASTER_PORT}],
                },
            },
            # No voluntary eviction of a training pod: a node-group update (never forced, EksAcceleratorNodegroup)
            # drains nodes through the eviction API, which honours this budget, so it waits for the run and then
            # fails instead of ending it (EKS user guide, "Update a managed node group"; Kubernetes docs,
            # "Specifying a Disruption Budget for your Application").
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": WORKERS_SERVICE, "namespace": spec.NAMESPACE},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"efa-training/workers": WORKERS_SERVICE}}},
            },
        )
        workers.node.add_dependency(namespace)

        self.templates = job_templates(instance, image=image, nodes=nodes, site=self.site)
        templates = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "job-templates", "namespace": spec.NAMESPACE},
            "data": {f"{phase}.json": json.dumps(job, indent=2) for phase, job in self.templates.items()},
        }
        # The ClusterTrainingRuntime only with Kubeflow Trainer, whose chart brings its CRD (eks_kubeflow_trainer):
        # the pipeline runs plain Indexed Jobs and needs neither. The TrainJob templates are data and always stay.
        manifests = (
            [templates]
            if trainer_chart is None
            else [training_runtime(instance, image=image, nodes=nodes, site=self.site), templates]
        )
        # The pipeline cordons and taints a node the training named bad (EksJobRunner.quarantine_host): nodes are
        # cluster-scoped, beyond its namespace's edit rights, so this group may read and update nodes, nothing else.
        cluster.add_manifest("NodeQuarantineAccess", *node_quarantine_rbac())
        runtime = cluster.add_manifest("TrainingRuntime", *manifests)
        if trainer_chart is not None:
            runtime.node.add_dependency(trainer_chart)
        runtime.node.add_dependency(namespace)
        cdk.CfnOutput(self, "RuntimeName", value=RUNTIME_NAME)
        cdk.CfnOutput(self, "FsxClaimName", value=self.fsx_claim)


# The Kubernetes group of the pipeline's access entry (EksJobRunner.grant) that may cordon and taint nodes.
QUARANTINE_GROUP = "efa-training:node-quarantine"
QUARANTINE_ROLE = "efa-training-node-quarantine"


def node_quarantine_rbac() -> list[dict]:
    """A ClusterRole to get and update nodes, bound to QUARANTINE_GROUP (Kubernetes docs, "Using RBAC
    Authorization"; an EKS access entry's kubernetesGroups name the groups its principal joins: EKS user guide,
    "Create access entries")."""
    meta = {"name": QUARANTINE_ROLE, "labels": {"app.kubernetes.io/part-of": "efa-training"}}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": QUARANTINE_ROLE},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": QUARANTINE_GROUP}]},
    ]  # fmt: skip
