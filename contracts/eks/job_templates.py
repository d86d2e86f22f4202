"""Job objects for the three phases (sanity, train, validate), built from the one pod spec in eks_job_spec.

- `training_runtime`: a Kubeflow Trainer ClusterTrainingRuntime carrying the whole-node pod (tolerations, FSx,
  /dev/shm, the pod identity service account). Kubeflow Trainer's torch plugin sets PET_NNODES, PET_NODE_RANK,
  PET_MASTER_ADDR and PET_MASTER_PORT in every pod.
- `job_templates`: one TrainJob per phase for people with kubectl (also stored in the cluster as a ConfigMap).
- `indexed_job`: a batch/v1 Indexed Job for the pipeline, because Step Functions' eks:runJob.sync waits on
  batch/v1 Jobs only. Its pods find rank 0 through the headless service WORKERS_SERVICE and learn their node's
  name in NODE_NAME.

The launcher reads MASTER_ADDR/MASTER_PORT/PET_NNODES/PET_NODE_RANK: both job kinds set them explicitly.
"""

import copy
from collections.abc import Sequence

import contracts.eks.job_spec as spec
from config import InstanceType
from contracts.run import REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE

RUNTIME_NAME = "efa-torch-distributed"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
WORKERS_SERVICE = "training-workers"
NODE_NAME = "NODE_NAME"  # the pipeline's pods' node name (indexed_job)
# Step Functions starts one Job per phase; a failed pod fails the Job (the pipeline decides about retries).
_BACKOFF_LIMIT = 0
# The exit codes that end a run, not an attempt (contracts.run): a pod that exits with one fails its Job through the
# pod failure policy's FailJob rule, whose Failed condition names the code: "Container <name> for pod <ns>/<pod>
# failed with exit code <code> matching FailJob rule at index 0" (Kubernetes docs, "Handling retriable and
# non-retriable pod failures with Pod failure policy"; GA in 1.31; the message is the Job controller's,
# pkg/controller/job/pod_failure_policy.go). The pipeline reads the code from it (train_attempt.EKS_EXIT_CODE).
RUN_ENDING_EXIT_CODES = sorted({*REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE})
POD_FAILURE_POLICY = {
    "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": RUN_ENDING_EXIT_CODES}}]
}


def training_runtime(instance: InstanceType, *, image: str, nodes: int, site: spec.Site = spec.Site()) -> dict:
    pod = spec.pod_spec(instance, image=image, phase="train", nodes=nodes, site=site)
    container = pod["containers"][0]
    container.pop("args")  # each TrainJob gives its phase
    container["env"] = _without_trainer_env(container["env"])
    return {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": RUNTIME_NAME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": nodes, "torch": {"numProcPerNode": instance.workers_per_node}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {"template": {"spec": pod}},
                            },
                        }
                    ]
                }
            },
        },
    }


def train_job(
    instance: InstanceType,
    *,
    image: str,
    phase: str,
    nodes: int,
    name: str | None = None,
    args: Sequence[str] = (),
    site: spec.Site = spec.Site(),
) -> dict:
    """A TrainJob on the runtime; rank 0 is JobSet pod `<name>-node-0-0` under the JobSet's service `<name>`."""
    name = name or f"efa-{phase}"
    pod = spec.pod_spec(instance, image=image, phase=phase, nodes=nodes, args=list(args), site=site)
    container = pod["containers"][0]
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": spec.NAMESPACE, "labels": {"efa-training/phase": phase}},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": RUNTIME_NAME},
            "trainer": {
                "image": image,
                "args": container["args"],
                "numNodes": nodes,
                "resourcesPerNode": container["resources"],
                "env": [
                    *_without_trainer_env(container["env"]),
                    {"name": "MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
                    {"name": "MASTER_PORT", "value": str(spec.MASTER_PORT)},
                ],
            },
        },
    }


def _without_trainer_env(env: list[dict]) -> list[dict]:
    """Kubeflow Trainer sets the PET_* variables itself."""
    return [var for var in env if not var["name"].startswith("PET_")]


def job_templates(instance: InstanceType, *, image: str, nodes: int, site: spec.Site = spec.Site()) -> dict[str, dict]:
    return {
        phase: train_job(instance, image=image, phase=phase, nodes=nodes, site=site) for phase in spec.phases(instance)
    }


def indexed_job(
    instance: InstanceType,
    *,
    image: str,
    phase: str,
    nodes: int,
    name: str,
    args: Sequence[str] = (),
    site: spec.Site = spec.Site(),
) -> dict:
    """batch/v1 Indexed Job: one pod per node, all started together, rank from the completion index."""
    rank_from_index = {
        "name": "PET_NODE_RANK",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}},
    }
    launcher_env: list[dict] = [
        # From the pod's own label, so the name can be chosen at submission (Step Functions) without a second copy.
        {
            "name": "JOB_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}},
        },
        {"name": "MASTER_ADDR", "value": f"$(JOB_NAME)-0.{WORKERS_SERVICE}"},
        {"name": "MASTER_PORT", "value": str(spec.MASTER_PORT)},
        rank_from_index,
        # The node the pod runs on, from the downward API (Kubernetes docs, "Expose Pod Information to Containers
        # Through Environment Variables": fieldRef spec.nodeName): a host the training names bad is recorded by
        # this name (training_image/efa_training/runtime/bad_hosts.py), and the pipeline cordons that node.
        {"name": NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    pod = spec.pod_spec(
        instance, image=image, phase=phase, nodes=nodes, args=list(args), extra_env=launcher_env, site=site
    )
    pod["subdomain"] = WORKERS_SERVICE
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": spec.NAMESPACE, "labels": {"efa-training/phase": phase}},
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "backoffLimit": _BACKOFF_LIMIT,
            "podFailurePolicy": copy.deepcopy(POD_FAILURE_POLICY),  # needs the pods' restartPolicy Never
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": {"efa-training/workers": WORKERS_SERVICE, "efa-training/phase": phase}},
                "spec": copy.deepcopy(pod),
            },
        },
    }
