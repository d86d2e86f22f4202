"""The environment's MLflow tracking server (config tracking_uri, or the managed one of config tracking_server) reaches
every training and validation container as MLFLOW_TRACKING_URI, on every backend, and nothing does without it
(training_image/efa_training/runtime/tracking.py); with a managed server, the jobs' role may call it."""

import json

import pytest

from config import CATALOGUE
from constructs.storage.tracking import CLIENT_ACTIONS
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


SERVER = "mlflow-tracking-server/efa-training-dev"  # the managed server's ARN ends so (constructs/storage/tracking.py)


@pytest.mark.parametrize("compute", ["batch", "eks", "sagemaker"])
def test_with_a_managed_server_every_job_tracks_to_its_arn(synth, compute):
    # config tracking_server: the jobs' MLFLOW_TRACKING_URI is the server's ARN, which the sagemaker-mlflow plugin in
    # the images resolves and signs for. Each place that names the variable gives it the ARN, in the job definitions
    # (Batch) or the state machine's job requests (EKS, SageMaker).
    app = synth(env="dev", compute=compute, tracking_server="small")
    text = json.dumps([app.templates[app.stack_names[unit]] for unit in ("compute", "pipeline")])
    named = [i for i in range(len(text)) if text.startswith("MLFLOW_TRACKING_URI", i)]
    assert len(named) >= 2  # training and validation at least
    assert all(SERVER in text[i : i + 400] for i in named)


@pytest.mark.parametrize("compute", ["batch", "eks", "sagemaker"])
def test_with_a_managed_server_the_jobs_role_may_call_it_and_nothing_else(synth, compute):
    app = synth(env="dev", compute=compute, tracking_server="small")
    policies = app.template("compute").find_resources("AWS::IAM::Policy")
    statements = [
        s
        for p in policies.values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if any(
            str(a).startswith("sagemaker-mlflow:")
            for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        )
    ]
    (statement,) = statements  # one role: the jobs'
    assert sorted(statement["Action"]) == sorted(CLIENT_ACTIONS)
    assert SERVER in json.dumps(statement["Resource"])


@pytest.mark.parametrize("compute", ["batch", "eks", "sagemaker"])
def test_every_job_knows_where_an_approved_model_is_recorded(synth, compute):
    # MODELS_PREFIX: s3://<bucket>/models/, the place the pipeline records an approval (config/layout.py), which the
    # validation gives MLflow's registry as the model's source (runtime/registered_model.py).
    app = synth(env="dev", compute=compute)
    text = json.dumps([app.templates[app.stack_names[unit]] for unit in ("compute", "pipeline")])
    named = [i for i in range(len(text)) if text.startswith("MODELS_PREFIX", i)]
    assert named and all("/models/" in text[i : i + 300] for i in named)
