"""The launcher (runtime/launch/) maps scheduler environments to torchrun arguments (pure function); exit_relay.py keeps
the workers' own exit codes."""

import gc

import pytest

from efa_training.runtime import exit_relay
from efa_training.runtime.errors import UsageError
from efa_training.runtime.launch import command, rendezvous

BATCH = {
    "ACCELERATORS_PER_NODE": "8",
    "AWS_BATCH_JOB_NUM_NODES": "4",
    "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
    "AWS_BATCH_JOB_ID": "0f1e2d#0",
    "AWS_BATCH_JOB_ATTEMPT": "2",
}


def test_batch_main_node_hosts_the_rendezvous_on_its_own_address():
    plan = rendezvous.plan_launch("train", {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "0"}, own_address="10.0.1.7")
    assert plan.torchrun_args() == [
        "--nnodes",
        "4",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "10.0.1.7:29500",
        "--rdzv-id",
        "0f1e2d-2",
        "--max-restarts",
        "3",
        "--rdzv-conf",
        "is_host=true,join_timeout=1800,read_timeout=1800",
        "--local-addr",
        "10.0.1.7",
    ]


def test_batch_main_node_without_known_address_uses_localhost():
    plan = rendezvous.plan_launch("train", {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "0"})
    assert plan.rdzv_endpoint == "localhost:29500" and plan.is_main_node


def test_batch_child_node_joins_the_main_node_address():
    env = {
        **BATCH,
        "AWS_BATCH_JOB_NODE_INDEX": "3",
        "AWS_BATCH_JOB_ID": "0f1e2d#3",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.7",
    }
    plan = rendezvous.plan_launch("train", env, own_address="10.0.1.9")
    assert (plan.rdzv_endpoint, plan.rdzv_id, plan.nnodes, plan.is_main_node) == (
        "10.0.1.7:29500",
        "0f1e2d-2",
        "4",
        False,
    )


def test_batch_child_node_without_main_address_is_a_usage_error():
    with pytest.raises(UsageError, match="AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"):
        rendezvous.plan_launch("train", {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "1"})


def test_pytorchjob_uses_master_addr_and_pet_nnodes():
    env = {
        "ACCELERATORS_PER_NODE": "8",
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "2",
        "RANK": "1",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "8",
        "RUN_ID": "exp-42",
    }
    plan = rendezvous.plan_launch("train", env)
    assert (
        plan.torchrun_args()
        == [
            "--nnodes",
            "2",
            "--nproc-per-node",
            "8",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "job-master-0:23456",
            "--rdzv-id",
            "exp-42",
            "--max-restarts",
            "3",
            "--rdzv-conf",
            "is_host=false,join_timeout=1800,read_timeout=1800",
        ]
        and plan.node_rank == 1
    )


def test_pytorchjob_world_size_counts_nodes_when_pet_nnodes_is_absent():
    env = {"ACCELERATORS_PER_NODE": "4", "MASTER_ADDR": "m", "MASTER_PORT": "1234", "WORLD_SIZE": "3", "RANK": "0"}
    assert rendezvous.plan_launch("train", env).nnodes == "3"


def test_elastic_min_nodes_gives_a_node_range():
    assert (
        rendezvous.plan_launch("train", {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "0", "ELASTIC_MIN_NODES": "2"}).nnodes
        == "2:4"
    )


def test_sanity_is_not_restarted_by_default():
    assert rendezvous.plan_launch("sanity", {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "0"}).max_restarts == 0


def test_missing_accelerators_per_node_is_a_usage_error():
    with pytest.raises(UsageError, match="ACCELERATORS_PER_NODE"):
        rendezvous.plan_launch("train", {"AWS_BATCH_JOB_NUM_NODES": "2"})


def test_validate_runs_as_a_single_process():
    cmd, plan = command.build_command("validate", ["--checkpoint", "c"], {})
    assert plan is None and cmd[1:3] == ["-m", "efa_training.validate"] and "torch.distributed.run" not in cmd


def test_expected_nodes_must_match_the_scheduler():
    env = {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "0"}
    with pytest.raises(UsageError, match="--expected-nodes"):
        command.build_command("train", ["--expected-nodes", "2"], env)
    plan = command.build_command("train", ["--expected-nodes", "4"], env)[1]
    assert plan is not None and plan.nnodes == "4"


def test_kubeflow_trainer_pet_master_addr_is_accepted():
    env = {
        "ACCELERATORS_PER_NODE": "8",
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29400",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "8",
        "RUN_ID": "r",
    }
    assert rendezvous.plan_launch("train", env).rdzv_endpoint == "tj-node-0-0.tj:29400"


def test_non_numeric_pet_nnodes_is_a_usage_error():
    # PET_NNODES is validated like the other counts (with ELASTIC_MIN_NODES it used to raise ValueError).
    env = {"ACCELERATORS_PER_NODE": "8", "MASTER_ADDR": "m", "PET_NNODES": "two", "ELASTIC_MIN_NODES": "1"}
    with pytest.raises(UsageError, match="PET_NNODES"):
        rendezvous.plan_launch("train", env)


def test_elastic_pet_nnodes_range_is_passed_through():
    # A PyTorchJob elastic policy sets PET_NNODES=MIN:MAX; that stays a valid --nnodes.
    env = {"ACCELERATORS_PER_NODE": "8", "MASTER_ADDR": "m", "PET_NNODES": "1:4"}
    assert rendezvous.plan_launch("train", env).nnodes == "1:4"


def test_rank_is_not_read_when_pet_node_rank_is_set():
    # RANK is only a fallback for PET_NODE_RANK; a RANK that is not a node index must not fail the launch.
    env = {
        "ACCELERATORS_PER_NODE": "8",
        "MASTER_ADDR": "m",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "RANK": "not-a-node-index",
    }
    assert rendezvous.plan_launch("train", env).node_rank == 1


def test_batch_node_publishes_the_bootstrap_interface_address():
    # The job names the interface (GLOO_SOCKET_IFNAME=eth0 on Batch); the launcher publishes that interface's
    # address to torchrun (--local-addr), never the hostname's, which could resolve elsewhere.
    assert rendezvous.interface_ipv4("lo") == "127.0.0.1"
    assert rendezvous.own_ipv4({"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"


def test_a_missing_bootstrap_interface_is_one_usage_error():
    with pytest.raises(UsageError, match="GLOO_SOCKET_IFNAME"):
        rendezvous.own_ipv4({"GLOO_SOCKET_IFNAME": "no-such-if0"})


def test_relayed_exit_code_is_the_first_failure_of_the_last_restart(tmp_path):
    for name, text in {"restart0-rank0": "4 10.0", "restart1-rank0": "143 30.0", "restart1-rank1": "5 20.0"}.items():
        (tmp_path / name).write_text(text)
    assert exit_relay.relayed_exit_code(tmp_path, 1) == 5  # restart 1: rank 1 failed first, rank 0 was stopped
    assert exit_relay.relayed_exit_code(tmp_path, 0) == 0
    (tmp_path / "restart1-rank0").write_text("1 15.0")
    assert exit_relay.relayed_exit_code(tmp_path, 1) == 1  # a crash first: torchrun's own code
    assert exit_relay.relayed_exit_code(tmp_path / "empty", 1) == 1


# A stop signal every worker answered by saving and ending (0 from a user's script, 143 from the platform's trainer)
# ends the job as stopped (143: an attempt failure, resumed), not as torchrun's own 1 for its SIGTERM.
def test_workers_that_all_stopped_cleanly_on_a_signal_end_the_job_as_stopped(tmp_path):
    for name, text in {"restart0-rank0": "0 10.0", "restart0-rank1": "143 11.0"}.items():
        (tmp_path / name).write_text(text)
    assert exit_relay.relayed_exit_code(tmp_path, 1, stop_requested=True) == 143
    assert exit_relay.relayed_exit_code(tmp_path, 1, stop_requested=False) == 143  # the first failure: rank 1's
    (tmp_path / "restart0-rank1").write_text("0 11.0")
    assert exit_relay.relayed_exit_code(tmp_path, 1, stop_requested=False) == 1  # no signal: torchrun's own
    (tmp_path / "restart0-rank1").write_text("7 11.0")
    assert exit_relay.relayed_exit_code(tmp_path, 1, stop_requested=True) == 7  # one failed on the way out


def test_a_restart_after_a_final_code_ends_the_same_way_without_running_again(tmp_path, monkeypatch):
    # torchrun restarts the group after a refusal too; the relay ends it at once with the same code.
    (tmp_path / "restart0-rank1").write_text("5 10.0")
    monkeypatch.setenv(exit_relay.EXIT_CODE_DIR, str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(exit_relay.sys, "argv", ["exit_relay.py", str(tmp_path / "never-run.py")])
    with pytest.raises(SystemExit) as exit_info:
        exit_relay.main()
    assert exit_info.value.code == 5 and (tmp_path / "restart1-rank1").read_text().startswith("5 ")
    (tmp_path / "restart0-rank1").write_text("1 10.0")  # a crash: the restart runs the script again
    assert exit_relay.previous_final_code() is None


HOLDS_A_MODEL = """
class Model:  # stands for a DDP model: freeing it after destroy_process_group can deadlock gloo's teardown
    def __del__(self):
        __import__("pathlib").Path({freed!r}).write_text("freed")
def train(model):
    {end}
train(Model())
"""


@pytest.mark.parametrize(("end", "code"), [("raise SystemExit(4)", 4), ("raise RuntimeError('crash')", 1)])
def test_the_relay_never_frees_what_the_failed_script_held(tmp_path, monkeypatch, capsys, end, code):
    # The exception's traceback holds the script's frames; the relay keeps it until os._exit (exit_relay._run_script).
    script, freed = tmp_path / "script.py", tmp_path / "freed"
    script.write_text(HOLDS_A_MODEL.format(end=end, freed=str(freed)))
    monkeypatch.delenv(exit_relay.RELAYED, raising=False)
    monkeypatch.setattr(exit_relay, "_KEPT", [])
    assert exit_relay._run_script(str(script)) == code
    gc.collect()
    assert not freed.exists()
    assert ("RuntimeError: crash" in capsys.readouterr().err) == (code == 1)


def test_a_parameter_server_run_gets_the_supervisor_with_the_batch_nodes_layout():
    # --strategy ps: no torchrun (it would restart every worker of a node for one failure); the supervisor takes
    # the same plan: node count and rank, one worker per accelerator, the rendezvous endpoint for its registry.
    env = {
        **BATCH,
        "AWS_BATCH_JOB_NODE_INDEX": "2",
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.1.7",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    prepared = command.prepare("train", ["--strategy", "ps", "--model", "ctr-small"], env)
    assert "torch.distributed.run" not in prepared.command and prepared.command[1:3] == ["-m", "efa_training.train"]
    layout = {k: v for k, v in prepared.env.items() if k.startswith("PS_") or k == "MAX_RESTARTS"}
    assert layout == {
        "PS_NNODES": "4",
        "PS_NODE_RANK": "2",
        "PS_WORKERS_PER_NODE": "8",
        "PS_REGISTRY": "10.0.1.7:29500",
        "PS_HOST": "127.0.0.1",
        "MAX_RESTARTS": "3",
    }


def test_a_parameter_server_run_refuses_an_elastic_node_range():
    env = {**BATCH, "AWS_BATCH_JOB_NODE_INDEX": "0", "ELASTIC_MIN_NODES": "2"}
    with pytest.raises(UsageError, match="fixed node count"):
        command.prepare("train", ["--strategy", "ps"], env)
