"""What a job may write on the shared file system, per backend: its mounts leave datasets/ and models/ read-only.

On Batch and EKS /fsx is the file system whose data repository association exports what is written to the bucket, so a
job that could write models/<run_id>/ could replace an approved model (or, before 0.13.0, its approval record).
"""

import json

import pytest

from config import CATALOGUE
from config.layout import FSX_MOUNT_PATH
from contracts.eks.job_templates import indexed_job
from tests.compute.test_batch_job_definitions import _container, _definitions

PROTECTED = ("datasets/wikitext/", "models/run-7/", "models/run-7/approval.json", "mlflow/0/", "")


def _writable(mounts: list[tuple[str, bool]], relative: str) -> bool:
    """Whether `relative` under /fsx is writable: the deepest mount holding it decides (Docker and the kubelet both
    mount a folder inside its parent's mount)."""
    path = f"{FSX_MOUNT_PATH}/{relative}".rstrip("/")
    holding = [(target, read_only) for target, read_only in mounts if path == target or path.startswith(target + "/")]
    return not max(holding, key=lambda m: len(m[0]))[1]


def _eks_mounts(job: str) -> list[tuple[str, bool]]:
    manifest = indexed_job(CATALOGUE["p5.48xlarge"], image="i", phase=job, nodes=2, name="n")
    mounts = manifest["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    return [(m["mountPath"], m.get("readOnly", False)) for m in mounts if m["name"] == "fsx"]


def _batch_mounts(job: str) -> list[tuple[str, bool]]:
    container = _container(_definitions("p5.48xlarge")[job])
    return [
        (m["ContainerPath"], m.get("ReadOnly", False))
        for m in container["MountPoints"]
        if m["SourceVolume"].startswith("fsx")
    ]


def _mounts(backend: str, job: str) -> list[tuple[str, bool]]:
    return _batch_mounts(job) if backend == "batch" else _eks_mounts(job)


@pytest.mark.parametrize("job", ["sanity", "train", "validate"])
@pytest.mark.parametrize("backend", ["batch", "eks"])
def test_a_job_cannot_write_datasets_models_or_the_roots(backend, job):
    mounts = _mounts(backend, job)
    assert [r for r in PROTECTED if _writable(mounts, r)] == [], json.dumps(mounts)


@pytest.mark.parametrize("job", ["sanity", "train", "validate"])
@pytest.mark.parametrize("backend", ["batch", "eks"])
def test_a_job_writes_its_checkpoints_run_folder_and_compile_cache(backend, job):
    mounts = _mounts(backend, job)
    assert all(_writable(mounts, r) for r in ("checkpoints/run-7/", "runs/run-7/model/", "neuron-cache/x"))
