"""A model that passed validation, registered in MLflow's model registry where tracking is on.

The pipeline approves exactly the verdicts that pass (IsModelAccepted reads `passed`, docs/pipeline.md) and registers
that model in the SageMaker Model Registry (constructs/pipeline/model_registry.py). The validation job holds the
verdict and the MLflow client, so it registers the same model in MLflow's registry: a version of the registered model
`<environment>-<workload>` (the run's experiment, and the workload its training logged as a parameter), linked to the
run's MLflow run, tagged with the verdict's figures, its source where the pipeline records the approved model
(MODELS_PREFIX + run id: s3://<bucket>/models/<run_id>/), or in a local run the checkpoint validated. A rejected model
is not registered, as in SageMaker's registry: its verdict stays in the run's metrics. Once per run: a validation run
again (a resumed run) finds its version and adds none. Waited for at most close_seconds(uri); a registry that fails
costs one line, never the verdict.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from efa_training.runtime.tracking import URI_VARIABLE, _say, close_seconds

MODELS_PREFIX_VARIABLE = "MODELS_PREFIX"
VERDICT_TAGS = ("metric", "value", "baseline", "relative_delta", "tolerance", "step")


def register(env: Mapping[str, str], run_id: str, verdict: Mapping[str, object]) -> None:
    """The verdict's model in MLflow's registry, if it passed and tracking is on (see the module's docstring)."""
    uri = env.get(URI_VARIABLE, "").strip()
    if not uri or verdict.get("passed") is not True:
        return
    experiment = env.get("TRAINING_ENVIRONMENT") or "local"
    prefix = env.get(MODELS_PREFIX_VARIABLE, "")
    source = f"{prefix.rstrip('/')}/{run_id}/" if prefix else str(verdict.get("checkpoint", ""))
    outcome: list[str] = []

    def attempt() -> None:
        try:
            from mlflow.tracking import MlflowClient

            outcome.append(registered(MlflowClient(tracking_uri=uri), experiment, run_id, source, verdict))
        except Exception as error:  # any client or network error: the verdict stands without the entry
            outcome.append(f"not registered in MLflow ({type(error).__name__}: {str(error)[:200]})")

    worker = threading.Thread(target=attempt, name="mlflow-registry", daemon=True)
    worker.start()
    wait = close_seconds(uri)
    worker.join(wait)
    _say(outcome[0] if outcome else f"not registered in MLflow within {wait:g} s (server slow or down)")


def registered(client: Any, experiment: str, run_id: str, source: str, verdict: Mapping[str, object]) -> str:
    """The run's model version in `<experiment>-<workload>`, made unless the run has one; what was done, in words."""
    from mlflow.exceptions import MlflowException

    # Found, not resumed: the validation's tracker has just closed the run, which stays FINISHED.
    found = client.get_experiment_by_name(experiment)
    runs = (
        client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{run_id}'", max_results=1)
        if found is not None
        else []
    )
    workload = runs[0].data.params.get("workload") if runs else None
    if not workload:
        return f"not registered in MLflow: run {run_id!r} logged no workload parameter (its training was not tracked)"
    mlflow_run = runs[0].info.run_id
    name = f"{experiment}-{workload}"
    found = client.search_model_versions(f"name = '{name}' and run_id = '{mlflow_run}'")
    if found:
        return f"model {name} version {found[0].version} holds run {run_id} already (MLflow registry)"
    try:
        client.create_registered_model(name, description=f"Models of workload {workload} that passed validation")
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = {f"verdict_{k}": str(verdict[k]) for k in VERDICT_TAGS if k in verdict}
    version = client.create_model_version(
        name,
        source,
        run_id=mlflow_run,
        tags={**tags, "efa_training.run_id": run_id},
        description=f"Run {run_id}: passed validation ({verdict.get('metric')} {verdict.get('value')})",
    )
    return f"registered model {name} version {version.version} (MLflow registry, source {source})"
