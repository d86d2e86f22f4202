"""The rendezvous survives a cold start (launch.py's plan for torchrun): the store's host is chosen by node rank, not
by whether the endpoint's name resolves to the machine yet, and nodes may start far apart. Two "nodes" of one
process each run torchrun with the plans launch.py makes for them, with real processes and a real gloo all_reduce.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from efa_training.runtime.launch import rendezvous
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(value)
print("all_reduce", int(value.item()), flush=True)
dist.destroy_process_group()
"""


def _plan(rank: int, master: str, port: int, timeout: int = 60) -> rendezvous.LaunchPlan:
    env = {
        "ACCELERATORS_PER_NODE": "1",
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(rank),
        "RUN_ID": "cold-start",
        "MAX_RESTARTS": "0",
        "RDZV_TIMEOUT": str(timeout),
    }
    return rendezvous.plan_launch("train", env, own_address="127.0.0.1")


def _start(plan: rendezvous.LaunchPlan, script: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", *plan.torchrun_args(), str(script)]
    return subprocess.Popen(
        command,
        env=th.env(GLOO_SOCKET_IFNAME="lo"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_rank_zero_hosts_the_store_though_its_endpoint_does_not_look_like_itself(tmp_path):
    # The endpoint is an address that reaches this machine but that c10d's name heuristic does not take for it
    # (0.0.0.0: `_matches_machine_hostname` is False), as a headless-service name that resolves late, or SageMaker's
    # algo-1, is not taken for the machine: with the heuristic nobody would host the store, and both nodes would wait
    # for it until the rendezvous timed out. Node 1 starts first and waits for the store; node 0 starts seconds later.
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    port = th.free_port()
    second = _start(_plan(1, "0.0.0.0", port), script)
    time.sleep(5)
    first = _start(_plan(0, "0.0.0.0", port), script)
    outputs = [node.communicate(timeout=120)[0] for node in (first, second)]
    assert [node.returncode for node in (first, second)] == [0, 0], outputs
    assert all("all_reduce 3" in output for output in outputs), outputs


def test_a_node_whose_store_never_comes_gives_up_after_rdzv_timeout(tmp_path):
    # The timeout reaches torchrun: alone, node 1 waits for a store nobody hosts and gives up after RDZV_TIMEOUT (10 s
    # here), not after torchrun's own 60 s read timeout, which would outlast the 45 s this test allows.
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    alone = _start(_plan(1, "127.0.0.1", th.free_port(), timeout=10), script)
    output = alone.communicate(timeout=45)[0]
    assert alone.returncode != 0 and "all_reduce" not in output


def test_every_plan_names_its_host_by_rank_and_waits_for_a_cold_start():
    # The rendezvous options of both nodes: only rank 0 hosts; join and store-read timeouts cover a scale-up from zero
    # and an image pull (torchrun's defaults are 600 s and 60 s).
    confs = [
        _conf(
            rendezvous.plan_launch(
                "train",
                {"ACCELERATORS_PER_NODE": "8", "MASTER_ADDR": "m", "PET_NNODES": "2", "PET_NODE_RANK": str(rank)},
            )
        )
        for rank in (0, 1)
    ]
    assert confs == [
        {"is_host": "true", "join_timeout": "1800", "read_timeout": "1800"},
        {"is_host": "false", "join_timeout": "1800", "read_timeout": "1800"},
    ]


def _conf(plan: rendezvous.LaunchPlan) -> dict[str, str]:
    args = plan.torchrun_args()
    return dict(item.split("=") for item in args[args.index("--rdzv-conf") + 1].split(","))
