"""EksTrainingWorkspace alone, on a cluster in a bare stack, per catalogue family (p4d, p5: NVIDIA; trn1: Neuron): the
training namespace, the pods' AWS identity, FSx as a static volume, the Kubeflow Trainer runtime, the job templates."""

import functools
import json

import aws_cdk.aws_eks_v2 as eks
import aws_cdk.aws_fsx as fsx
import aws_cdk.aws_s3 as s3
import pytest

from config import CATALOGUE
from constructs.compute.eks.cluster import as_icluster
from constructs.compute.eks.training_workspace import EksTrainingWorkspace
from constructs.storage.data_bucket_access import DataBucketAccess
from contracts.eks.job_spec import ACCELERATOR_TAINT_KEY, EFA_RESOURCE, HUGEPAGES_2MI_PAGES
from contracts.job_environment import STOP_GRACE_SECONDS, shared_memory_gib
from tests.alone import bare_stack, template_of
from tests.compute.eks_parts import cluster, manifests, vpc

INSTANCE_TYPES = ("p4d.24xlarge", "p5.48xlarge", "trn1.32xlarge")


@functools.cache
def _workspace(instance_type: str, fsx_revision: str = "abc123") -> dict:
    stack = bare_stack()
    network = vpc(stack)
    training = cluster(stack, network)
    file_system = fsx.LustreFileSystem(
        stack,
        "Lustre",
        vpc=network,
        vpc_subnet=network.private_subnets[0],
        storage_capacity_gib=1200,
        lustre_configuration=fsx.LustreConfiguration(deployment_type=fsx.LustreDeploymentType.SCRATCH_2),
    )
    EksTrainingWorkspace(
        stack,
        "Workspace",
        cluster=training,
        data_access=DataBucketAccess(stack, s3.Bucket(stack, "Data")),
        file_system=file_system,
        storage_gib=1200,
        instance=CATALOGUE[instance_type],
        image="training:v1",
        nodes=2,
        trainer_chart=training.add_helm_chart("Trainer", chart="kubeflow-trainer", repository="oci://example"),
        fsx_csi_driver=eks.Addon(stack, "FsxCsi", cluster=as_icluster(training), addon_name="aws-fsx-csi-driver"),
        fsx_revision=fsx_revision,
        environment="dev",
    )
    return template_of(stack)


def _resources(raw: dict, kind: str) -> list[dict]:
    return [r["Properties"] for r in raw["Resources"].values() if r["Type"] == kind]


def _job_templates(raw: dict) -> dict[str, dict]:
    config_map = next(
        o for o in manifests(raw) if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "job-templates"
    )
    return {phase: json.loads(config_map["data"][f"{phase}.json"]) for phase in ("sanity", "train", "validate")}


def _runtime_pod(raw: dict) -> dict:
    runtime = next(o for o in manifests(raw) if o["kind"] == "ClusterTrainingRuntime")
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_job_templates_take_whole_nodes(instance_type):
    # Each phase's job template requests every EFA interface and every accelerator of a node.
    instance = CATALOGUE[instance_type]
    for phase, job in _job_templates(_workspace(instance_type)).items():
        limits = job["spec"]["trainer"]["resourcesPerNode"]["limits"]
        assert limits[EFA_RESOURCE] == str(instance.efa_interfaces), phase
        assert limits[instance.kubernetes_resource] == str(instance.accelerators), phase
        assert job["spec"]["trainer"]["args"][0] == phase


def test_training_pods_request_the_huge_pages_nodes_reserve():
    # 2 MiB pages, as many as the accelerator nodes reserve (tests/compute/test_eks_accelerator_nodegroup.py).
    limits = _job_templates(_workspace("p4d.24xlarge"))["train"]["spec"]["trainer"]["resourcesPerNode"]["limits"]
    assert limits["hugepages-2Mi"] == f"{HUGEPAGES_2MI_PAGES * 2}Mi"


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_runtime_pod_has_fsx_shm_and_toleration(instance_type):
    # The training runtime mounts FSx at /fsx and a memory-backed /dev/shm, and tolerates the accelerator taint.
    raw = _workspace(instance_type)
    pod = _runtime_pod(raw)
    (claim,) = [o["metadata"]["name"] for o in manifests(raw) if o["kind"] == "PersistentVolumeClaim"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": claim}} in pod["volumes"]
    memory = {"medium": "Memory", "sizeLimit": f"{shared_memory_gib(CATALOGUE[instance_type])}Gi"}
    assert {"name": "shm", "emptyDir": memory} in pod["volumes"]
    assert {"name": "fsx", "mountPath": "/fsx", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert pod["tolerations"][0]["key"] == ACCELERATOR_TAINT_KEY


@pytest.mark.parametrize("instance_type", INSTANCE_TYPES)
def test_runtime_pod_keeps_the_stop_grace_for_a_final_checkpoint(instance_type):
    # Evicted or stopped training pods keep the stop grace for their final checkpoint (Kubernetes' default is 30 s).
    assert _runtime_pod(_workspace(instance_type))["terminationGracePeriodSeconds"] == STOP_GRACE_SECONDS


def test_fsx_static_volume_and_claim():
    # The file system is a static PersistentVolume (FSx CSI driver) bound to the training namespace's claim.
    objects = {o["kind"]: o for o in manifests(_workspace("p4d.24xlarge"))}
    assert objects["PersistentVolume"]["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert objects["PersistentVolumeClaim"]["spec"]["volumeName"] == objects["PersistentVolume"]["metadata"]["name"]


def test_volume_and_claim_are_named_by_the_file_systems_revision():
    # A PersistentVolume's CSI attributes and a claim's volumeName are immutable: a replaced file system gets new
    # names, and the runtime's pods use the new claim.
    def claim(raw: dict) -> str:
        (name,) = [o["metadata"]["name"] for o in manifests(raw) if o["kind"] == "PersistentVolumeClaim"]
        return name

    before, after = _workspace("p4d.24xlarge"), _workspace("p4d.24xlarge", fsx_revision="def456")
    assert claim(before) == "fsx-training-abc123" and claim(after) == "fsx-training-def456"
    assert json.dumps(_runtime_pod(after)).count('"claimName": "fsx-training-def456"') == 1


def test_pod_identity_role_is_limited_to_project_prefixes():
    # Training pods may read datasets/ and models/ and write checkpoints/ and runs/ only (EKS Pod Identity).
    raw = _workspace("p4d.24xlarge")
    statements = [
        s
        for p in _resources(raw, "AWS::IAM::Policy")
        for s in p["PolicyDocument"]["Statement"]
        if "s3:PutObject" in s["Action"]
    ]
    assert len(statements) == 1
    written = {r["Fn::Join"][1][-1] for r in statements[0]["Resource"]}
    assert written == {"/checkpoints/*", "/runs/*"}
    assert _resources(raw, "AWS::EKS::PodIdentityAssociation")


def test_training_pods_may_not_be_evicted():
    # A node-group update drains through the eviction API, which honours a PodDisruptionBudget: with none, a rolling
    # update would evict a running job's pods (EKS user guide, "Update a managed node group").
    (budget,) = [o for o in manifests(_workspace("p5.48xlarge")) if o["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 0
    (service,) = [o for o in manifests(_workspace("p5.48xlarge")) if o["kind"] == "Service"]
    assert budget["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]  # the pipeline's Job pods
