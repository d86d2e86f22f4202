"""The launcher on Amazon SageMaker: the training job's files, read once, and the failure file written at the end.

SageMaker's container contract ("How Amazon SageMaker AI provides training information",
https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html): the
hyperparameters (a JSON object of strings) and the distributed training configuration (resourceconfig.json:
current_host, hosts, network_interface_name) under /opt/ml/input/config; TRAINING_JOB_NAME in the environment.
"""

from __future__ import annotations

import json
import sys
import tarfile
from collections.abc import Mapping
from pathlib import Path

from efa_training.runtime.errors import UsageError, failure_reason

ML_ROOT_ENV = "SAGEMAKER_ML_ROOT"  # tests redirect /opt/ml
DEFAULT_ML_ROOT = "/opt/ml"
# The hyperparameters each mode accepts: contracts/run.py JOB_PARAMETERS, plus train's expected_nodes (the image
# cannot import contracts/: tests/training/test_run_contract.py holds them equal).
SAGEMAKER_HYPERPARAMETERS = {
    "sanity": ("run_id",),
    "train": ("run_id", "dataset", "hyperparameters", "init_from", "stop_by", "expected_nodes"),
    "validate": ("run_id", "dataset", "hyperparameters", "baseline", "tolerance"),
}
SAGEMAKER_HYPERPARAMETERS["compile"] = SAGEMAKER_HYPERPARAMETERS["train"]  # the trial run takes the run's flags
CHANNEL_HYPERPARAMETERS = ("dataset",)  # on SageMaker the `training` input channel: the --data flag wins
# A declared workload's jobs (contracts/run.py WORKLOAD_JOB_PARAMETERS, plus train's expected_nodes): the same, less
# the initial model; the hyperparameters (JSON text) go to user_workload.prepare_run, a built-in trainer's to
# hyperparameters.as_flags.
WORKLOAD_HYPERPARAMETERS = {
    job: tuple(name for name in SAGEMAKER_HYPERPARAMETERS[job] if name != "init_from") for job in ("train", "validate")
}


def ml_root(env: Mapping[str, str]) -> Path:
    return Path(env.get(ML_ROOT_ENV) or DEFAULT_ML_ROOT)


def on_sagemaker(env: Mapping[str, str]) -> bool:
    return "AWS_BATCH_JOB_NUM_NODES" not in env and (ml_root(env) / "input/config/resourceconfig.json").is_file()


def read_json(path: Path, default: object = None) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if default is None:
            raise UsageError(str(path), None, "missing", "the file SageMaker writes") from None
        return default
    except (OSError, ValueError) as exc:
        raise UsageError(str(path), None, f"unreadable ({type(exc).__name__}: {exc})", "a JSON object") from None


def sagemaker_hosts(config: Mapping) -> tuple[list[str], int, str]:
    """(hosts, this host's index, the network interface) from resourceconfig.json, or one UsageError."""
    hosts, current, interface = config.get("hosts"), config.get("current_host"), config.get("network_interface_name")
    if not (isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts)):
        raise UsageError("resourceconfig.json hosts", hosts, "not a list of host names", 'e.g. ["algo-1", "algo-2"]')
    if len(set(hosts)) != len(hosts):
        raise UsageError("resourceconfig.json hosts", hosts, "names a host twice", "distinct host names")
    if current not in hosts:
        raise UsageError("resourceconfig.json current_host", current, "not one of hosts", ", ".join(hosts))
    if not (isinstance(interface, str) and interface):
        raise UsageError("resourceconfig.json network_interface_name", interface, "missing", "an interface, e.g. eth0")
    return hosts, hosts.index(current), interface


def hyperparameter_flags(
    mode: str, hyperparameters: object, accepted: Mapping[str, tuple[str, ...]] = SAGEMAKER_HYPERPARAMETERS
) -> list[str]:
    """SageMaker's hyperparameters as the script's flags: --name-with-dashes VALUE, as the EKS job runner passes them
    (constructs/compute/eks/job_runner.py launcher_flag), minus the ones an input channel already gives. `accepted`:
    the names each mode takes (a declared workload's: WORKLOAD_HYPERPARAMETERS)."""
    if not isinstance(hyperparameters, dict):
        raise UsageError("hyperparameters.json", hyperparameters, "not a JSON object", '{"max_steps": "1000", ...}')
    known = accepted.get(mode, ())
    flags: list[str] = []
    for name, value in hyperparameters.items():
        if name not in known:
            raise UsageError(f"hyperparameter {name}", value, f"unknown to {mode}", ", ".join(known) or "none")
        if not isinstance(value, str):
            raise UsageError(f"hyperparameter {name}", value, "not a string", "strings (SageMaker passes strings)")
        if name not in CHANNEL_HYPERPARAMETERS:
            flags += ["--" + name.replace("_", "-"), value]
    return flags


def unpack_model_archive(channel: Path, model_dir: Path) -> Path:
    """The training job's model artifact (its one .tar.gz in the `model` channel's folder, or `channel` itself) unpacked
    into `model_dir`, so that a validate script reads MODEL_DIR as the train script left it; the archive's path, or
    one UsageError. SageMaker tars training's /opt/ml/model into it ("SageMaker AI copies this data as a single
    object in compressed tar format", "How Amazon SageMaker AI Processes Training Output") and copies a channel's
    objects as they are, unpacked (API_Channel: CompressionType "is used only in Pipe input mode")."""
    archives = [channel] if channel.is_file() else sorted(channel.glob("*.tar.gz")) if channel.is_dir() else []
    if len(archives) != 1:
        found = ", ".join(a.name for a in archives) or "none"
        raise UsageError("--model-archive", str(channel), f"{found} found", "one model.tar.gz (the training's model)")
    model_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archives[0], "r:*") as archive:
            # The data filter refuses absolute names, `..`, links out of model_dir and device files (tarfile docs).
            archive.extractall(model_dir, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise UsageError(
            "--model-archive", str(archives[0]), f"not unpacked ({type(exc).__name__}: {exc})", "a tar file"
        ) from None
    return archives[0]


def write_failure(root: Path, code: int, stage: str, detail: str = "") -> None:
    """SageMaker's failure file: DescribeTrainingJob returns its first 1024 characters as FailureReason
    (https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-output.html)."""
    path = root / "output" / "failure"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(failure_reason(code, stage, detail)[:1024] + "\n")
    except OSError as exc:  # the exit code still tells the job failed
        print(f"launch.py: WARNING could not write {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
