"""launch.py on SageMaker: the plan from resourceconfig.json, hyperparameters as flags, the failure file (no processes).

SageMaker's container contract: https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html
(hyperparameters.json, resourceconfig.json, TRAINING_JOB_NAME); the failure file:
https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-output.html
"""

import json

import pytest

from efa_training.runtime import errors
from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import cli, command, rendezvous, sagemaker

TWO_HOSTS = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}
ENV = {"ACCELERATORS_PER_NODE": "8", "TRAINING_JOB_NAME": "run-7-train-1", "RUN_ID": "run-7"}


def test_one_host_rendezvous_is_local():
    config = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}
    plan = rendezvous.plan_launch("train", ENV, "10.0.1.7", config)
    assert (plan.scheduler, plan.nnodes, plan.rdzv_endpoint, plan.node_rank, plan.is_main_node) == (
        "sagemaker",
        "1",
        "localhost:29500",
        0,
        True,
    )


@pytest.mark.parametrize(("current", "rank"), [("algo-1", 0), ("algo-2", 1)])
def test_each_of_two_hosts_joins_the_first_hosts_rendezvous(current, rank):
    plan = rendezvous.plan_launch("train", ENV, "10.0.1.9", {**TWO_HOSTS, "current_host": current})
    assert plan.torchrun_args() == [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "algo-1:29500",
        "--rdzv-id",
        "run-7-train-1",  # TRAINING_JOB_NAME: one rendezvous per job, so a retried job never meets the last one's
        "--max-restarts",
        "3",
        # algo-1 hosts the store because it is hosts[0], not because c10d takes the name for itself.
        "--rdzv-conf",
        f"is_host={'true' if rank == 0 else 'false'},join_timeout=1800,read_timeout=1800",
        "--local-addr",
        "10.0.1.9",
    ]
    assert (plan.node_rank, plan.is_main_node) == (rank, rank == 0)


def test_rendezvous_id_falls_back_to_the_run_id():
    env = {k: v for k, v in ENV.items() if k != "TRAINING_JOB_NAME"}
    assert rendezvous.plan_launch("train", env, None, TWO_HOSTS).rdzv_id == "run-7"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"current_host": "algo-1", "network_interface_name": "eth0"}, "hosts"),
        ({**TWO_HOSTS, "hosts": []}, "hosts"),
        ({**TWO_HOSTS, "hosts": ["algo-1", "algo-1"]}, "hosts"),
        ({**TWO_HOSTS, "current_host": "algo-3"}, "current_host"),
        ({k: v for k, v in TWO_HOSTS.items() if k != "network_interface_name"}, "network_interface_name"),
    ],
)
def test_a_malformed_resource_config_is_one_usage_error(config, field):
    with pytest.raises(UsageError, match=f"resourceconfig.json {field}"):
        rendezvous.plan_launch("train", ENV, None, config)


def test_node_local_checkpoints_on_several_hosts_turn_in_place_restarts_off():
    # An in-place restart would resume from one node's own folder, not the union SageMaker restores.
    env = {**ENV, "CHECKPOINT_NODE_LOCAL": "1"}
    assert rendezvous.plan_launch("train", env, None, TWO_HOSTS).max_restarts == 0
    one_host = {**TWO_HOSTS, "hosts": ["algo-1"]}
    assert rendezvous.plan_launch("train", env, None, one_host).max_restarts == 3  # its own folder is the whole union
    with pytest.raises(UsageError, match="MAX_RESTARTS"):
        rendezvous.plan_launch("train", {**env, "MAX_RESTARTS": "2"}, None, TWO_HOSTS)


def test_hyperparameters_become_flags_after_the_static_ones_and_dataset_is_dropped():
    hyper = {"run_id": "run-7", "dataset": "datasets/wikitext/", "hyperparameters": '{"max_steps":30}'}
    assert sagemaker.hyperparameter_flags("train", hyper) == [
        "--run-id",
        "run-7",
        "--hyperparameters",
        '{"max_steps":30}',
    ]


@pytest.mark.parametrize(
    ("mode", "hyper", "problem"),
    [
        ("train", {"hyperparameters": {"max_steps": 30}}, "not a string"),
        ("train", {"baseline": "3.1"}, "unknown to train"),
        ("train", {"max_steps": "30"}, "unknown to train"),  # a run's hyperparameters come as one JSON text
        ("validate", {"stop_by": "none"}, "unknown to validate"),
        ("train", ["max_steps", "30"], "not a JSON object"),
    ],
)
def test_a_wrong_hyperparameter_is_one_usage_error(mode, hyper, problem):
    with pytest.raises(UsageError, match=problem):
        sagemaker.hyperparameter_flags(mode, hyper)


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (2, "usage"),
        (3, "sanity report not written"),
        (4, "diverged"),
        (5, "checkpoint folder locked"),
        (143, "stopped (143)"),
        (1, "crash"),
    ],
)
def test_the_failure_reason_starts_with_the_marker_and_the_code(code, meaning):
    # The pipeline matches `*efa-training exit code 4:*` in DescribeTrainingJob's FailureReason.
    text = errors.failure_reason(code, "train")
    assert text.startswith(f"{errors.FAILURE_REASON_MARKER}{code}: ") and meaning in text and "\n" not in text


def _ml_root(tmp_path, config, hyperparameters=None):
    (tmp_path / "input/config").mkdir(parents=True)
    (tmp_path / "input/config/resourceconfig.json").write_text(json.dumps(config))
    if hyperparameters is not None:
        (tmp_path / "input/config/hyperparameters.json").write_text(json.dumps(hyperparameters))
    return {"SAGEMAKER_ML_ROOT": str(tmp_path), "ACCELERATORS_PER_NODE": "1", "RUN_ID": "run-7"}


def test_a_sagemaker_container_gets_its_flags_interfaces_and_a_sanity_check_first(tmp_path):
    config = {"current_host": "localhost", "hosts": ["localhost"], "network_interface_name": "lo"}
    given = {"hyperparameters": '{"max_steps": 30}', "run_id": "run-7"}
    env = {**_ml_root(tmp_path, config, given), "SANITY_BEFORE_TRAINING": "1"}
    prepared = command.prepare("train", ["--data", "/opt/ml/input/data/training"], env)
    assert prepared.command[-6:] == ["--data", "/opt/ml/input/data/training", "--run-id", "run-7", "--max-steps", "30"]
    assert prepared.env["NCCL_SOCKET_IFNAME"] == "=lo" and prepared.env["GLOO_SOCKET_IFNAME"] == "lo"
    assert prepared.plan is not None and prepared.plan.local_addr == "127.0.0.1"
    sanity = prepared.sanity_first or []
    assert sanity[sanity.index("--rdzv-endpoint") + 1] == "localhost:29501"  # its own rendezvous
    assert sanity[-5:] == ["efa_training.runtime.sanity", "--run-id", "run-7", "--expected-nodes", "1"]


def test_interfaces_the_job_sets_are_kept(tmp_path):
    config = {"current_host": "localhost", "hosts": ["localhost"], "network_interface_name": "lo"}
    env = {**_ml_root(tmp_path, config), "NCCL_SOCKET_IFNAME": "^docker,lo"}
    assert command.prepare("train", [], env).env["NCCL_SOCKET_IFNAME"] == "^docker,lo"


def test_a_usage_error_on_sagemaker_is_written_to_the_failure_file(tmp_path, monkeypatch, capsys):
    env = _ml_root(tmp_path, {**TWO_HOSTS, "current_host": "algo-9"})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_BATCH_JOB_NUM_NODES", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--data", "d"])
    failure = (tmp_path / "output/failure").read_text()
    assert exit_info.value.code == 2 and failure.startswith("efa-training exit code 2: usage"), failure
    assert "current_host" in failure and "Traceback" not in capsys.readouterr().err


# A declared workload on SageMaker (docs/workloads.md): its flags from the job's hyperparameters (its own arrive whole,
# as JSON), the hosts from resourceconfig.json, the platform's sanity check first, then the declared command under
# torchrun with the contract's folders: the model where SageMaker uploads it.
WORKLOAD_DECLARATION = {
    "name": "my-llm",
    "launch": "torchrun",
    "train": ["python", "train.py"],
    "validate": ["python", "evaluate.py"],
    "metric": {"name": "eval_loss", "direction": "lower"},
    "metrics": {},
}


def _workload_job(tmp_path, hyperparameters: dict) -> dict:
    config = {"current_host": "localhost", "hosts": ["localhost"], "network_interface_name": "lo"}
    env = _ml_root(tmp_path / "ml", config, hyperparameters)
    return {**env, "WORKLOAD": json.dumps(WORKLOAD_DECLARATION), "SANITY_BEFORE_TRAINING": "1"}


def test_a_declared_workload_trains_on_sagemaker_with_the_contract(tmp_path):
    hyper = {"run_id": "run-7", "dataset": "datasets/x/", "hyperparameters": '{"lr": 0.1}', "expected_nodes": "1"}
    folders = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--run-dir", str(tmp_path / "run")]
    prepared = command.prepare(
        "train", ["--data", "/d", *folders, "--model-dir", str(tmp_path / "model")], _workload_job(tmp_path, hyper)
    )
    assert prepared.command[-2:] == ["python", "train.py"] and prepared.ml_root == tmp_path / "ml"
    assert prepared.env["MODEL_DIR"] == str(tmp_path / "model") and prepared.env["DATA_DIR"] == "/d"
    assert json.loads((tmp_path / "run/hyperparameters.json").read_text()) == {"lr": 0.1}
    assert prepared.env["NCCL_SOCKET_IFNAME"] == "=lo" and prepared.plan is not None
    assert "efa_training.runtime.sanity" in (prepared.sanity_first or [])


def test_a_declared_workload_validates_on_sagemaker_through_the_gate(tmp_path):
    hyper = {"run_id": "run-7", "dataset": "d", "hyperparameters": "{}", "baseline": "3.2", "tolerance": "0.001"}
    prepared = command.prepare("validate", ["--data", "/d"], _workload_job(tmp_path, hyper))
    assert prepared.command[1:3] == ["-m", "efa_training.runtime.user_validate"] and prepared.plan is None
    assert prepared.command[-4:] == ["--baseline", "3.2", "--tolerance", "0.001"]


def test_a_built_in_hyperparameter_is_refused_for_a_declared_workload(tmp_path):
    with pytest.raises(UsageError, match="hyperparameter model"):
        command.prepare("train", [], _workload_job(tmp_path, {"run_id": "r", "model": "tiny"}))
