"""The environment's MLflow tracking server (config tracking_uri) reaches every training and validation container as
MLFLOW_TRACKING_URI, on every backend, and nothing does without it (training_image/efa_training/runtime/tracking.py)."""

import pytest

from config import CATALOGUE
from contracts.eks import job_spec
from tests.compute.test_batch_job_definitions import _container, _definitions
from tests.compute.test_sagemaker_job_runner import _request

URI = "https://mlflow.example.internal:5000"


@pytest.mark.parametrize("job", ["train", "validate"])
def test_batch_jobs_get_the_tracking_server(job):
    environment = {
        e["Name"]: e["Value"] for e in _container(_definitions("p5.48xlarge", tracking_uri=URI)[job])["Environment"]
    }
    assert environment["MLFLOW_TRACKING_URI"] == URI


def test_batch_jobs_track_nothing_without_one():
    for props in _definitions("p5.48xlarge").values():
        assert "MLFLOW_TRACKING_URI" not in {e["Name"] for e in _container(props)["Environment"]}


@pytest.mark.parametrize("job", ["train", "validate"])
def test_sagemaker_jobs_get_the_tracking_server(job):
    assert _request(job, tracking_uri=URI)["Environment"]["MLFLOW_TRACKING_URI"] == URI
    assert "MLFLOW_TRACKING_URI" not in _request(job)["Environment"]


def test_eks_pods_get_the_tracking_server():
    site = job_spec.Site(tracking_uri=URI)
    variables = {v["name"]: v.get("value") for v in job_spec.environment(CATALOGUE["p5.48xlarge"], nodes=2, site=site)}
    assert variables["MLFLOW_TRACKING_URI"] == URI
    without = job_spec.environment(CATALOGUE["p5.48xlarge"], nodes=2)
    assert "MLFLOW_TRACKING_URI" not in {v["name"] for v in without}
