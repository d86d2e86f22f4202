"""sanity_check.py across 2 gloo processes: passes, and fails on a wrong result or a too-high threshold."""

import json
from pathlib import Path

import pytest

from config import CATALOGUE, Accelerator
from contracts.job_environment import job_environment
from efa_training.runtime.sanity import checks
from tests.training import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

ARGS = ["--sizes", "4K,64K", "--warmup", "1", "--iters", "3"]
NODE: dict = {"ACCELERATOR_KIND": "cpu", "ACCELERATORS_PER_NODE": "2"}  # environment of the workers


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    # The Batch job definition's flags: the report goes to <report-prefix><run-id>/sanity.json.
    def build(runs):
        run = th.torchrun(
            "sanity_check.py", [*ARGS, "--run-id", "r1", "--expected-nodes", "1", "--report-prefix", f"{runs}/"], **NODE
        )
        return run, json.loads((runs / "r1" / "sanity.json").read_text())

    return th.shared(tmp_path_factory, "sanity", build)


def test_sanity_passes_on_a_healthy_group(passing):
    run, report = passing
    assert run.returncode == 0 and report["passed"], run.stderr[-2000:]


def test_every_ranks_matmul_rate_is_reported_and_on_cpu_not_gated(passing):
    # CPU ranks share cores with the rest of the host: the compute check reports there unless asked to gate.
    _, report = passing
    compute = report["compute"]
    assert len(compute["tflops_by_rank"]) == 2 and all(v > 0 for v in compute["tflops_by_rank"])
    assert compute["min_of_median"] == 0.0 and compute["peak_tflops"] is None


# A slow accelerator: rank 1's timed matmul rounds each take 100 ms longer (the test's stand-in for a throttled GPU);
# the group names the rank and its host, and the check fails before any training.
def test_a_slow_accelerator_is_named_before_training(tmp_path):
    report_path = tmp_path / "sanity.json"
    run = th.torchrun("sanity_check.py", [*ARGS, "--min-compute-of-median", "0.5", "--report", str(report_path)],
                      SANITY_TEST_SLOW_COMPUTE="1:100", **NODE)  # fmt: skip
    report = json.loads(report_path.read_text())
    assert run.returncode == 1 and not report["passed"], run.stderr[-2000:]
    (line,) = report["failures"]
    assert line.startswith("compute: rank 1 on ") and "under 0.5 of the group's median" in line, line


def test_sanity_report_uses_nccl_tests_bus_bandwidth(passing):
    _, report = passing
    factors = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": 1 / 2, "reduce_scatter": 1 / 2}
    assert {r["op"] for r in report["results"]} == set(factors)
    assert all(r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factors[r["op"]]) for r in report["results"])


def test_sanity_report_sizes_and_algbw_match_the_buffers(passing):
    # Each op is measured on the full --sizes buffer, and algbw = size_bytes / time (GB/s = 1e9 bytes/s).
    _, report = passing
    sizes = {
        op: sorted(r["size_bytes"] for r in report["results"] if r["op"] == op)
        for op in ("all_reduce", "all_gather", "reduce_scatter")
    }
    assert sizes == {op: [4096, 65536] for op in sizes}, sizes
    for r in report["results"]:
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9, rel=1e-9), r


def test_unwritable_report_is_one_line_with_its_own_exit_code(tmp_path, monkeypatch, capsys):
    # The checks pass but the report cannot be written: exit 3 and one error line, not a traceback with exit 1.
    from efa_training.runtime.sanity import cli as sanity_check

    monkeypatch.setenv("ACCELERATOR_KIND", "cpu")
    for name in ("MASTER_ADDR", "ACCELERATORS_PER_NODE", "SANITY_TEST_CORRUPT_RANK"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "f").write_text("x")
    code = sanity_check.main(
        [
            "--sizes",
            "4K",
            "--warmup",
            "0",
            "--iters",
            "1",
            "--device",
            "cpu",
            "--report",
            str(tmp_path / "f" / "sanity.json"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == sanity_check.EXIT_REPORT_NOT_WRITTEN == 3 and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith("sanity_check.py: error: could not write the report to "), err


def test_sanity_fails_when_one_rank_contributes_a_wrong_value():
    run = th.torchrun("sanity_check.py", ARGS, SANITY_TEST_CORRUPT_RANK="1", **NODE)
    assert run.returncode != 0 and "FAIL: collectives" in run.stderr, run.stderr[-2000:]
    assert "wrong data came from rank(s) 1)" in run.stderr, run.stderr[-2000:]  # rank 0 prints, rank 1 is at fault


def test_bus_bandwidth_formulas_match_nccl_tests():
    from efa_training.runtime.sanity import collectives

    assert collectives.bus_bandwidth("all_reduce", 10.0, 8) == pytest.approx(17.5)
    assert collectives.bus_bandwidth("all_gather", 10.0, 8) == pytest.approx(8.75)
    assert collectives.bus_bandwidth("reduce_scatter", 10.0, 8) == pytest.approx(8.75)


# ---- EFA proof: the devices the container sees and the transport NCCL chose
# (training_image/efa_training/runtime/sanity/efa_proof.py).
# The inputs are composed from the printing programs' own format strings (see efa_fixtures/README.md) and go
# through the same code path as on a host: the sanity check reads NCCL_DEBUG_FILE, lists --uverbs-dir, runs --fi-info.
FIXTURES = Path(__file__).resolve().parent / "efa_fixtures"
EFA_NODE = {**NODE, "EFA_INTERFACES": "4"}


def _efa_inputs(tmp_path, *, log: str, fi_info: str, uverbs: int) -> tuple[list[str], dict]:
    devices = tmp_path / "infiniband"
    devices.mkdir()
    for i in range(uverbs):
        (devices / f"uverbs{i}").touch()
    fake_fi_info = tmp_path / "fi_info"
    fake_fi_info.write_text(f"#!/bin/sh\ncat {FIXTURES / fi_info}\n")
    fake_fi_info.chmod(0o755)
    return (
        ["--uverbs-dir", str(devices), "--fi-info", str(fake_fi_info)],
        {**EFA_NODE, "NCCL_DEBUG_FILE": str(FIXTURES / log)},
    )


def _sanity_with_efa(tmp_path, *, log="nccl-efa-1.16.3.log", fi_info="fi_info-efa-4.txt", uverbs=4, extra=(), **more):
    flags, env = _efa_inputs(tmp_path, log=log, fi_info=fi_info, uverbs=uverbs)
    env.update(more)
    report = tmp_path / "sanity.json"
    run = th.torchrun("sanity_check.py", [*ARGS, *flags, "--report", str(report), *extra], **env)
    return run, (json.loads(report.read_text()) if report.exists() else None)


def test_efa_proof_passes_with_every_device_and_the_efa_provider(tmp_path):
    run, report = _sanity_with_efa(tmp_path)
    assert run.returncode == 0 and report["passed"], run.stderr[-2000:]
    efa = report["efa"]
    assert efa["transport"]["kind"] == "efa" and efa["transport"]["network"] == "Libfabric"
    assert len(efa["uverbs"]) == 4 and len(efa["fi_info_domains"]) == 4
    # The report records the gate: one size, its threshold and the threshold's source, and busbw per size.
    assert report["measured_at_bytes"] == 65536 and set(report["busbw_gbps_by_size"]) == {"4096", "65536"}


def test_efa_proof_fails_on_a_socket_fallback_naming_the_transport(tmp_path):
    run, report = _sanity_with_efa(tmp_path, log="nccl-socket-fallback-1.16.3.log")
    assert run.returncode == 1 and not report["passed"]
    (line,) = [f for f in report["failures"] if f.startswith("transport")]
    assert line == "transport: NCCL used socket (NET/OFI aws-ofi-nccl initialization failed), not EFA", line


def test_efa_proof_fails_on_a_missing_uverbs_device(tmp_path):
    run, report = _sanity_with_efa(tmp_path, uverbs=3)
    assert run.returncode == 1
    (line,) = [f for f in report["failures"] if f.startswith("EFA devices")]
    assert line.startswith("EFA devices: 3 of 4 /dev/infiniband/uverbs* visible in the container"), line


def test_efa_proof_fails_when_libfabric_offers_fewer_devices(tmp_path):
    run, report = _sanity_with_efa(tmp_path, fi_info="fi_info-efa-3.txt")
    assert run.returncode == 1
    (line,) = [f for f in report["failures"] if f.startswith("EFA devices")]
    assert line.startswith("EFA devices: libfabric's efa provider offers 3 of 4 devices"), line


STRAGGLER_MS = 200  # 4 KiB per 200 ms is 0.00002 GB/s; gloo on loopback moves 4 KiB in well under a millisecond
GATE_GBPS = 0.0001  # between the two: 5 x the straggler bound, and 4 KiB in 41 ms for a healthy pair (CI under load
# measured 0.00047, 4 KiB in 8.7 ms, for a healthy pair: a 20 ms straggler left too little room, 18 calls cost 3.6 s)


@pytest.fixture(scope="module")
def below_threshold(tmp_path_factory):
    # --busbw-bytes 4K and a straggler that slows every call below the threshold, on a node whose EFA proof passes:
    # bandwidth is the one failure.
    # One run for the two tests below (a torchrun launch costs ~10 s of CPU).
    return th.shared(
        tmp_path_factory,
        "below_threshold",
        lambda folder: _sanity_with_efa(
            folder,
            extra=["--busbw-bytes", "4K", "--min-busbw-gbps", str(GATE_GBPS)],
            SANITY_TEST_SLOW_RANK=f"1:{STRAGGLER_MS}",
        ),
    )


def test_sanity_fails_below_the_bandwidth_threshold(below_threshold):
    run, _ = below_threshold
    assert run.returncode != 0 and "FAIL: bandwidth" in run.stderr, run.stderr[-2000:]


def test_every_rank_times_the_straggler_it_waited_for(below_threshold, passing):
    # Rank 1 waits STRAGGLER_MS before each timed call: every call takes at least that on every rank, so the report
    # (the slowest rank's time) can show no more than 4 KiB per STRAGGLER_MS, a bound the test knows, not the report.
    _, report = below_threshold
    assert all(r["time_us"] >= STRAGGLER_MS * 1000 for r in report["results"]), report["results"]
    assert report["measured_busbw_gbps"] <= 4096 / (STRAGGLER_MS / 1000) / 1e9
    healthy = [r["busbw_gbps"] for r in passing[1]["results"] if (r["op"], r["size_bytes"]) == ("all_reduce", 4096)]
    assert healthy[0] > GATE_GBPS  # without the straggler the same group passes this gate


def test_bandwidth_gate_uses_the_fixed_size_not_the_largest(below_threshold):
    # --busbw-bytes 4K: the gate reads the 4 KiB figure even though 64 KiB was measured too.
    run, report = below_threshold
    assert run.returncode == 1 and report["measured_at_bytes"] == 4096
    assert report["measured_busbw_gbps"] == report["busbw_gbps_by_size"]["4096"]
    (line,) = [f for f in report["failures"] if f.startswith("bandwidth")]
    assert f"at 4096 bytes < --min-busbw-gbps {GATE_GBPS}" in line


# Each fixture names the aws-ofi-nccl release and source line it follows (efa_fixtures/README.md).
TRANSPORT_FIXTURES = {
    "nccl-efa-1.16.3.log": ("efa", "Libfabric", "NET/OFI Selected provider is efa, fabric is efa"),
    "nccl-efa-direct-1.21.1.log": ("efa", "Libfabric", "NET/OFI Selected provider is efa, fabric is efa-direct"),
    "nccl-efa-1.13.2.log": ("efa", "Libfabric", "NET/OFI Selected Provider is efa"),
    "nccl-efa-aws-libfabric-1.16.3.log": ("efa", "AWS Libfabric", "NET/OFI Selected provider is efa, fabric is efa"),
    "nccl-socket-fallback-1.16.3.log": ("socket", "Socket", "NET/OFI aws-ofi-nccl initialization failed"),
}


@pytest.mark.parametrize("fixture", sorted(TRANSPORT_FIXTURES))
def test_nccl_transport_reads_each_release_format(fixture):
    from efa_training.runtime.sanity import efa_proof

    found = efa_proof.nccl_transport((FIXTURES / fixture).read_text())
    assert (found.kind, found.network, found.evidence) == TRANSPORT_FIXTURES[fixture]


def test_nccl_transport_refuses_what_is_not_efa():
    from efa_training.runtime.sanity import efa_proof

    assert efa_proof.nccl_transport("x NCCL INFO Using network IB\n").kind == "ib"
    # Libfabric with another provider (tcp) is not EFA either.
    tcp = efa_proof.nccl_transport(
        "h:1:1 [0] NCCL INFO NET/OFI Selected provider is tcp, fabric is 10.0.0.0/16 (found 1 nics)\n"
        "h:1:1 [0] NCCL INFO Using network Libfabric\n"
    )
    assert tcp.kind == "unknown" and "provider tcp" in tcp.evidence
    assert efa_proof.nccl_transport("").kind == "unknown"


def test_nccl_debug_file_names_the_file_nccl_writes_on_a_dotted_hostname(monkeypatch):
    # Batch awsvpc containers are named by their private DNS name; NCCL's %h is the hostname cut at the first '.'.
    from efa_training.runtime.sanity import efa_proof

    monkeypatch.setattr(efa_proof.socket, "gethostname", lambda: "ip-10-0-1-5.ec2.internal")
    assert efa_proof.debug_file("/tmp/nccl.%h.%p.log") == f"/tmp/nccl.ip-10-0-1-5.{efa_proof.os.getpid()}.log"
    env: dict[str, str] = {}
    path = efa_proof.prepare_nccl_logging(env, rank=3)
    assert path == env["NCCL_DEBUG_FILE"] == "/tmp/nccl-sanity.rank3.log"
    assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")


def test_neuron_without_an_nccl_log_is_a_warning_but_a_socket_fallback_still_fails(tmp_path):
    # The Neuron runtime is not known here to write NCCL_DEBUG_FILE: no log is "not proven", not a failure.
    from efa_training.runtime.sanity import efa_proof

    empty = tmp_path / "empty.log"
    empty.write_text("")
    quiet = efa_proof.collect(
        0, str(empty), uverbs_dir=str(tmp_path), fi_info="/bin/true", transport_proof_required=False
    )
    assert quiet.warnings() and not [f for f in quiet.failures() if f.startswith("transport")]
    socket_log = str(FIXTURES / "nccl-socket-fallback-1.16.3.log")
    loud = efa_proof.collect(
        0, socket_log, uverbs_dir=str(tmp_path), fi_info="/bin/true", transport_proof_required=False
    )
    assert [f for f in loud.failures() if f.startswith("transport: NCCL used socket")]


def test_a_gate_size_that_is_not_whole_float32_elements_is_one_usage_error(monkeypatch, capsys):
    # Checked before any process group exists: exit 2 and one line, not a KeyError after the measurements.
    from efa_training.runtime.sanity import cli as sanity_check

    monkeypatch.setenv("ACCELERATOR_KIND", "cpu")
    with pytest.raises(SystemExit) as exited:
        sanity_check.main(["--sizes", "4K", "--busbw-bytes", "4099", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and "--busbw-bytes" in err[0], err


@pytest.mark.parametrize("name", [n for n, it in CATALOGUE.items() if it.accelerator is Accelerator.NEURON])
def test_the_jobs_neuron_core_count_is_what_the_sanity_check_finds(name, monkeypatch):
    # Every Neuron type's job environment makes a full node count as full: /dev/neuron0..N-1 x the cores per device
    # it sets equals the workers it expects (trn2: 16 x 4 logical cores at LNC=2, not the image's default 2).
    instance = CATALOGUE[name]
    env = job_environment(instance, backend="batch")
    monkeypatch.setenv("NEURON_CORES_PER_DEVICE", env["NEURON_CORES_PER_DEVICE"])
    devices = [f"/dev/neuron{i}" for i in range(instance.accelerators)]
    monkeypatch.setattr(checks.glob, "glob", lambda pattern: devices)
    assert checks.check_accelerators("neuron", int(env["ACCELERATORS_PER_NODE"]))["ok"]
    monkeypatch.setattr(checks.glob, "glob", lambda pattern: devices[:-1])  # one device missing
    assert not checks.check_accelerators("neuron", int(env["ACCELERATORS_PER_NODE"]))["ok"]
