"""sanity_check.py across 2 gloo processes: passes, and fails on a wrong result or a too-high threshold."""
import json

import pytest

import training_helpers as th

pytestmark = pytest.mark.slow  # real torchrun processes

ARGS = ["--sizes", "4K,64K", "--warmup", "1", "--iters", "3"]
NODE = {"ACCELERATOR_KIND": "cpu", "ACCELERATORS_PER_NODE": "2"}


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    # The Batch job definition's flags: the report goes to <report-prefix><run-id>/sanity.json.
    runs = tmp_path_factory.mktemp("sanity") / "runs"
    run = th.torchrun("sanity_check.py", [*ARGS, "--run-id", "r1", "--expected-nodes", "1",
                                          "--report-prefix", f"{runs}/"], **NODE)
    return run, json.loads((runs / "r1" / "sanity.json").read_text())


def test_sanity_passes_on_a_healthy_group(passing):
    run, report = passing
    assert run.returncode == 0 and report["passed"], run.stderr[-2000:]


def test_sanity_report_uses_nccl_tests_bus_bandwidth(passing):
    _, report = passing
    factors = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": 1 / 2, "reduce_scatter": 1 / 2}
    assert {r["op"] for r in report["results"]} == set(factors)
    assert all(r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factors[r["op"]]) for r in report["results"])


def test_sanity_report_sizes_and_algbw_match_the_buffers(passing):
    # Each op is measured on the full --sizes buffer, and algbw = size_bytes / time (GB/s = 1e9 bytes/s).
    _, report = passing
    sizes = {op: sorted(r["size_bytes"] for r in report["results"] if r["op"] == op)
             for op in ("all_reduce", "all_gather", "reduce_scatter")}
    assert sizes == {op: [4096, 65536] for op in sizes}, sizes
    for r in report["results"]:
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9, rel=1e-9), r


def test_unwritable_report_is_one_line_with_its_own_exit_code(tmp_path, monkeypatch, capsys):
    # The checks pass but the report cannot be written: exit 3 and one error line, not a traceback with exit 1.
    import sanity_check
    monkeypatch.setenv("ACCELERATOR_KIND", "cpu")
    for name in ("MASTER_ADDR", "ACCELERATORS_PER_NODE", "SANITY_TEST_CORRUPT_RANK"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "f").write_text("x")
    code = sanity_check.main(["--sizes", "4K", "--warmup", "0", "--iters", "1", "--device", "cpu",
                              "--report", str(tmp_path / "f" / "sanity.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == sanity_check.EXIT_REPORT_NOT_WRITTEN == 3 and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith("sanity_check.py: error: could not write the report to "), err


def test_sanity_fails_when_one_rank_contributes_a_wrong_value():
    run = th.torchrun("sanity_check.py", ARGS, SANITY_TEST_CORRUPT_RANK="1", **NODE)
    assert run.returncode != 0 and "FAIL: collectives" in run.stderr, run.stderr[-2000:]
    assert "wrong data came from rank(s) 1)" in run.stderr, run.stderr[-2000:]  # rank 0 prints, rank 1 is at fault


def test_sanity_fails_below_the_bandwidth_threshold():
    run = th.torchrun("sanity_check.py", [*ARGS, "--min-busbw-gbps", "100000"], **NODE)
    assert run.returncode != 0 and "FAIL: bandwidth" in run.stderr, run.stderr[-2000:]


def test_bus_bandwidth_formulas_match_nccl_tests():
    import sanity_check
    assert sanity_check.bus_bandwidth("all_reduce", 10.0, 8) == pytest.approx(17.5)
    assert sanity_check.bus_bandwidth("all_gather", 10.0, 8) == pytest.approx(8.75)
    assert sanity_check.bus_bandwidth("reduce_scatter", 10.0, 8) == pytest.approx(8.75)
