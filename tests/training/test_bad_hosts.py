"""Bad-host records (runtime/bad_hosts.py): a host that failed a health check or hung first names itself under
runs/<run_id>/bad-hosts/pending/<host_id>, where the pipeline finds it, terminates or cordons it, and retries."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from config.layout import BAD_HOSTS_PENDING, HOST_SETUP_FAILED
from efa_training.runtime import bad_hosts
from efa_training.runtime.errors import EXIT_HOST_UNPREPARED
from efa_training.runtime.launch import process, watchdog
from efa_training.runtime.launch.watchdog import Watchdog
from efa_training.runtime.sanity import health

FAILURES = ["health: h: xid on PCI 0000:2b:00: Xid 79, GPU has fallen off the bus."]


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {"REPORT_PREFIX": f"{tmp_path}/runs/", **more}


def _pending(tmp_path: Path, run_id: str = "run-7") -> list[Path]:
    folder = tmp_path / "runs" / run_id / BAD_HOSTS_PENDING
    return sorted(path for path in folder.iterdir() if not path.name.startswith(".")) if folder.is_dir() else []


def test_the_pending_folder_is_the_one_the_pipeline_lists():
    assert bad_hosts.PENDING == BAD_HOSTS_PENDING


def test_the_host_id_is_the_instance_id_else_the_node_name_else_the_host_name(tmp_path):
    instance = tmp_path / "instance-id"
    instance.write_text("i-0123456789abcdef0\n")
    both = {"INSTANCE_ID_FILE": str(instance), "NODE_NAME": "ip-10-0-0-7.ec2.internal"}
    assert bad_hosts.host_identity(both) == {"host_id": "i-0123456789abcdef0", "hostname": socket.gethostname(),
                                             "instance_id": "i-0123456789abcdef0",
                                             "node_name": "ip-10-0-0-7.ec2.internal"}  # fmt: skip
    missing = {"INSTANCE_ID_FILE": str(tmp_path / "absent"), "NODE_NAME": "ip-10-0-0-7.ec2.internal"}
    assert bad_hosts.host_identity(missing)["host_id"] == "ip-10-0-0-7.ec2.internal"
    assert bad_hosts.host_identity({"NODE_NAME": ""})["host_id"] == socket.gethostname()


@pytest.mark.parametrize("text", ["", "i-123", "i-0123456789ABCDEF0", "i-0123456789abcdef0 extra", "../i-01234567"])
def test_an_instance_id_file_that_holds_anything_else_is_ignored(tmp_path, text):
    # A half-written or foreign file must not name an object the pipeline would then terminate.
    instance = tmp_path / "instance-id"
    instance.write_text(text)
    identity = bad_hosts.host_identity({"INSTANCE_ID_FILE": str(instance), "NODE_NAME": "node-a"})
    assert identity["host_id"] == "node-a" and identity["instance_id"] is None


def test_the_record_lands_under_the_runs_pending_bad_hosts_with_its_evidence(tmp_path):
    env = _env(tmp_path, NODE_NAME="node-a")
    location = bad_hosts.record(env, "run-7", "failed the health check\nbefore training", ["line 1", "line\n2"])
    assert location == f"{tmp_path}/runs/run-7/bad-hosts/pending/node-a"  # no extension: the key's end is the id
    doc = json.loads(Path(location).read_text())
    recorded_at = doc.pop("recorded_at")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", recorded_at)
    assert doc == {"host_id": "node-a", "hostname": socket.gethostname(), "instance_id": None, "node_name": "node-a",
                   "why": "failed the health check before training", "evidence": ["line 1", "line 2"],
                   "run_id": "run-7"}  # fmt: skip


@pytest.mark.parametrize("prefix, run_id", [("", "run-7"), (None, "run-7"), ("PREFIX", ""), ("PREFIX", None)])
def test_a_hand_run_without_prefix_or_run_id_records_nothing(tmp_path, prefix, run_id):
    env = {} if prefix is None else {"REPORT_PREFIX": f"{tmp_path}/runs/" if prefix == "PREFIX" else prefix}
    assert bad_hosts.record(env, run_id, "why", ["evidence"]) is None
    assert not (tmp_path / "runs").exists()


def test_a_record_that_cannot_be_written_is_one_line_never_an_error(tmp_path, capsys):
    (tmp_path / "runs").write_text("a file where the folder should be")
    assert bad_hosts.record(_env(tmp_path), "run-7", "why", ["evidence"]) is None
    err = capsys.readouterr().err
    assert err.startswith("launch.py: bad host not recorded: ") and err.count("\n") == 1, err


def _health(monkeypatch: pytest.MonkeyPatch, failures: list[str]) -> None:
    def report(host: str) -> dict:
        return {"host": host, "failures": failures, "warnings": [], "not_run": []}

    monkeypatch.setattr(health, "check_node", lambda kind: SimpleNamespace(report=report))


def test_a_node_that_fails_its_health_after_a_failed_attempt_is_recorded(tmp_path, monkeypatch):
    _health(monkeypatch, FAILURES)
    env = _env(tmp_path, NODE_NAME="node-a", ACCELERATOR_KIND="gpu")
    assert process.health_after_failure("train", 1, env, run_id="run-7") == 1  # the attempt's code stands
    (record,) = _pending(tmp_path)
    doc = json.loads(record.read_text())
    assert doc["why"] == "failed the health check after a failed attempt (exit 1)" and doc["evidence"] == FAILURES
    # Without the script's --run-id, the job's RUN_ID names the run.
    assert process.health_after_failure("train", 6, {**env, "RUN_ID": "run-8"}) == 6
    assert [path.name for path in _pending(tmp_path, "run-8")] == ["node-a"]


def test_a_healthy_node_after_a_failed_attempt_is_not_recorded(tmp_path, monkeypatch):
    _health(monkeypatch, [])
    assert process.health_after_failure("train", 1, _env(tmp_path, NODE_NAME="node-a"), run_id="run-7") == 1
    assert _pending(tmp_path) == []


def test_sanitys_node_health_records_a_failing_node(tmp_path, monkeypatch):
    from efa_training.runtime.sanity import checks  # torch: only this test

    _health(monkeypatch, FAILURES)
    for name, value in _env(tmp_path, NODE_NAME="node-a", LOCAL_RANK="0").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(checks.dist, "all_gather_object", lambda out, own: out.__setitem__(0, own))
    nodes, failures = checks.node_health(SimpleNamespace(rank=0, world_size=1), "gpu", "run-7")  # type: ignore[arg-type]
    assert failures == FAILURES and len(nodes) == 1
    doc = json.loads((tmp_path / "runs/run-7/bad-hosts/pending/node-a").read_text())
    assert (doc["why"], doc["evidence"]) == ("failed the health check before training", FAILURES)


HUNG = {"seconds_without_progress": 99.0, "limit_seconds": 60.0, "progress_lines": 3}


def _end_with(monkeypatch: pytest.MonkeyPatch, watch: Watchdog, workers: list[dict]) -> dict:
    """The watchdog's end of a hung attempt, with the workers it found given (no processes: stop_tree replaced)."""
    monkeypatch.setattr(watchdog, "stop_tree", lambda proc, watch, before_end=None: workers)
    hang = dict(HUNG)
    watch._end(None, hang)  # type: ignore[arg-type]
    return hang


def _worker(rank: int, pid: int, state: str) -> dict:
    return {"rank": rank, "local_rank": str(rank), "state": state, "pid": pid, "host": "h", "stacks": ""}


def test_the_host_that_hung_first_is_told_with_its_rank_and_evidence(tmp_path, monkeypatch):
    # A worker of this node's (no identity of another node's): this host is recorded (bad_hosts.record's default).
    told: list[tuple[str, list[str], object]] = []
    watch = Watchdog(
        60.0, run=tmp_path / "run", bad_host=lambda why, evidence, identity: told.append((why, evidence, identity))
    )
    hang = _end_with(monkeypatch, watch, [_worker(0, 41, "S"), _worker(1, 42, "T")])
    expected = (f"hung first: {hang['stopped_first']['why']}", ["rank 1 pid 42", f"evidence: {hang['evidence']}"], None)
    assert told == [expected]
    assert "process state T" in told[0][0] and Path(hang["evidence"]).is_dir()


def test_a_worker_of_another_node_that_hung_first_is_recorded_by_that_nodes_identity(tmp_path, monkeypatch):
    # The stopped rank was on the node that answered the ask (its node-<N>.json carries its host's identity).
    told: list[object] = []
    watch = Watchdog(60.0, run=tmp_path / "run", bad_host=lambda why, evidence, identity: told.append(identity))
    theirs = {**_worker(1, 42, "T"), "node": "1", "identity": {"host_id": "i-0123456789abcdef0"}}
    _end_with(monkeypatch, watch, [_worker(0, 41, "S"), theirs])
    assert told == [{"host_id": "i-0123456789abcdef0"}]


def test_a_hang_that_singles_out_no_rank_tells_of_no_host(tmp_path, monkeypatch):
    told: list[tuple] = []
    watch = Watchdog(60.0, run=tmp_path / "run", bad_host=lambda *args: told.append(args))
    assert _end_with(monkeypatch, watch, [_worker(0, 41, "S"), _worker(1, 42, "S")])["stopped_first"] is None
    assert told == []


def test_the_launchers_watchdog_records_the_host_under_the_scripts_run_id(tmp_path, monkeypatch):
    # command.py's wiring: the built-in trainer's --run-id reaches the watchdog, and its record the pending folder.
    from efa_training.runtime.launch import command
    from tests.training import training_helpers as th

    env = th.env(ACCELERATORS_PER_NODE="2", MASTER_PORT="29555", MAX_RESTARTS="0", **_env(tmp_path, NODE_NAME="n-1"))
    launch = command.prepare("train", ["--data", "d", "--run-id", "run-9"], env)
    assert launch.watchdog is not None
    _end_with(monkeypatch, launch.watchdog, [_worker(0, 41, "T")])
    doc = json.loads((tmp_path / "runs/run-9/bad-hosts/pending/n-1").read_text())
    assert doc["why"].startswith("hung first: held stopped by the kernel") and doc["evidence"][0] == "rank 0 pid 41"


def test_a_straggler_is_told_once_when_it_stayed_the_slowest_for_the_alarms_time():
    from efa_training.runtime.stragglers import Persistent

    now = [0.0]
    persistent = Persistent(900, clock=lambda: now[0])
    seen = []
    for t, rank, ratio in [(0, 1, 1.6), (300, 1, 1.7), (899, 1, 1.6), (900, 1, 1.6), (1200, 1, 1.9)]:
        now[0] = t
        seen.append(persistent.observe(rank, ratio))
    assert seen == [False, False, False, True, False]


def test_the_straggler_metric_counts_what_the_bad_host_rule_counts():
    # StragglerPersistSeconds, the alarm's metric: the seconds the same rank has stayed the slowest at the ratio.
    from efa_training.runtime.stragglers import Persistent

    now = [0.0]
    persistent = Persistent(900, clock=lambda: now[0])
    held = []
    for t, rank, ratio in [(0, 1, 1.6), (300, 1, 1.7), (600, 0, 1.6), (700, 0, 1.2), (800, 1, 1.9)]:
        now[0] = t
        persistent.observe(rank, ratio)
        held.append(persistent.held_seconds())
    assert held == [0.0, 300.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "interruption",
    [(1, 1.2), (0, 1.8)],  # back under the ratio; another rank the slowest
    ids=["back-under-the-ratio", "another-rank-slowest"],
)
def test_a_straggler_that_recovers_or_changes_starts_its_time_again(interruption):
    from efa_training.runtime.stragglers import Persistent

    now = [0.0]
    persistent = Persistent(900, clock=lambda: now[0])
    persistent.observe(1, 1.6)
    now[0] = 600
    persistent.observe(*interruption)
    now[0] = 1000
    assert persistent.observe(1, 1.6) is False  # its 900 s start again at 1000


def test_the_straggler_persistence_is_the_alarms():
    from constructs.observability.alarms import PROGRESS_PERIOD, STRAGGLER_PERIODS, STRAGGLER_RATIO
    from efa_training.runtime import stragglers

    assert stragglers.PERSIST_RATIO == STRAGGLER_RATIO
    assert STRAGGLER_PERIODS * PROGRESS_PERIOD.to_seconds() == stragglers.PERSIST_SECONDS


def test_the_setup_failure_file_is_the_one_the_host_writes():
    assert bad_hosts.SETUP_FAILED == HOST_SETUP_FAILED


def test_a_job_on_a_host_whose_preparation_failed_names_it_bad_and_runs_nothing(tmp_path, monkeypatch):
    # A Batch host that failed a step says which beside its instance id (constructs/compute/batch/host_user_data.py):
    # the launcher refuses the host before anything starts, and records it for the pipeline to replace.
    from efa_training.runtime.launch import cli

    host = tmp_path / "host"
    host.mkdir()
    (host / "instance-id").write_text("i-0123456789abcdef0\n")
    (host / HOST_SETUP_FAILED).write_text("line 31: mount -t lustre fs@tcp:/abc /fsx\n")
    monkeypatch.setenv("INSTANCE_ID_FILE", str(host / "instance-id"))
    monkeypatch.setenv("REPORT_PREFIX", str(tmp_path / "runs"))
    ran = tmp_path / "ran"
    monkeypatch.setattr(cli, "_run", lambda *args: ran.write_text("ran") or 0)
    assert cli.main(["validate", "--run-id", "run-7", "--checkpoint", str(tmp_path / "ckpt")]) == EXIT_HOST_UNPREPARED
    assert not ran.exists()
    (record,) = _pending(tmp_path)
    doc = json.loads(record.read_text())
    assert record.name == "i-0123456789abcdef0" and "mount -t lustre" in doc["why"]


def test_a_prepared_host_runs_its_job(tmp_path, monkeypatch):
    from efa_training.runtime.launch import cli

    (tmp_path / "instance-id").write_text("i-0123456789abcdef0\n")
    monkeypatch.setenv("INSTANCE_ID_FILE", str(tmp_path / "instance-id"))
    monkeypatch.setattr(cli, "_run", lambda *args: 0)
    assert cli.main(["validate", "--run-id", "run-7", "--checkpoint", str(tmp_path / "ckpt")]) == 0


def test_an_unprepared_host_is_an_attempt_failure_not_a_refusal_of_the_run():
    # The pipeline retries an attempt on fresh hosts unless its code ends the run (contracts/run.py): a broken host is
    # the host's fault, not the run's.
    from contracts.run import REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE

    assert EXIT_HOST_UNPREPARED not in {*REFUSED_EXIT_CODES, WINDOW_ENDED_EXIT_CODE, 0}
