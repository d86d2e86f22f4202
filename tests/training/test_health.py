"""The sanity check's deep health checks (runtime/sanity/health.py) on the documented output of each tool
(health_fixtures/README.md says where each shape comes from), and a sick GPU failing a real sanity run on CPU."""

import json
import os
from pathlib import Path

import pytest

from efa_training.runtime.launch import process
from efa_training.runtime.sanity import health
from tests.training import training_helpers as th

FIXTURES = Path(__file__).resolve().parent / "health_fixtures"


def _text(name: str) -> str:
    return (FIXTURES / name).read_text()


def _lines(findings: list[health.Finding]) -> list[str]:
    return [f.line("ip-10-0-0-7") for f in findings]


def test_a_healthy_gpu_query_has_no_finding():
    assert health.parse_gpu_query(_text("nvidia-smi-query-healthy.csv"), list(health.QUERY)) == ([], [])


def test_ecc_row_remapping_clocks_and_a_reset_are_each_named_and_a_narrow_link_only_warned():
    findings, warnings = health.parse_gpu_query(_text("nvidia-smi-query-sick.csv"), list(health.QUERY))
    assert _lines(findings) == [
        "health: ip-10-0-0-7: ecc on GPU 1 (00000000:00:0A.0): 2 uncorrectable ECC errors since the driver loaded",
        "health: ip-10-0-0-7: row-remap on GPU 1 (00000000:00:0A.0): a row remapping is pending: the GPU needs a reset",
        "health: ip-10-0-0-7: clocks on GPU 2 (00000000:00:0B.0): hw_slowdown is active with no work on the GPU",
        "health: ip-10-0-0-7: reset on GPU 4 (00000000:00:0D.0): nvidia-smi reports [GPU requires reset]",
        "health: ip-10-0-0-7: row-remap on GPU 4 (00000000:00:0D.0): a row remapping failed: the GPU needs replacing",
    ]
    assert warnings == ["GPU 3 (00000000:00:0C.0): PCIe link x8 of x16 (an idle GPU may narrow it)"]


def test_an_inactive_nvlink_is_named_with_its_gpu():
    found = health.Health([], [], [])
    health._nvlink(_text("nvlink-inactive.txt"), found)
    assert _lines(found.findings) == ["health: ip-10-0-0-7: nvlink on GPU 3: Link 3 is inactive"]


def test_an_xid_that_needs_the_node_repaired_fails_and_a_programs_own_xid_does_not():
    # Xid 79 (fallen off the bus): EKS's agent replaces the node; Xid 13 is a program's fault.
    assert _lines(health.parse_kernel_log(_text("dmesg-xid.txt"))) == [
        "health: ip-10-0-0-7: xid on PCI 0000:2b:00: Xid 79, GPU has fallen off the bus."
    ]


def test_a_neuron_hardware_error_in_the_kernel_log_fails():
    (line,) = _lines(health.parse_kernel_log(_text("dmesg-neuron.txt")))
    assert (
        line == "health: ip-10-0-0-7: neuron-hw on a Neuron device: kernel log: NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR"
    )


def test_a_failed_dcgm_test_names_the_gpu_test_and_message():
    (line,) = _lines(health.parse_dcgm_diag(json.loads(_text("dcgm-diag-fail.json"))))
    assert line.startswith("health: ip-10-0-0-7: dcgm on GPU 1: memory: A memory mismatch was detected on GPU 1")


def test_dcgm_3x_output_is_read_too():
    assert health.parse_dcgm_diag(json.loads(_text("dcgm-diag-3x-pass.json"))) == []
    failed = {"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "Denylist", "results": [
        {"gpu_id": "1", "status": "Fail", "warnings": [{"warning": "denylisted"}]}]}]}]}}  # fmt: skip
    assert _lines(health.parse_dcgm_diag(failed)) == ["health: ip-10-0-0-7: dcgm on GPU 1: Denylist: denylisted"]


def test_a_dcgm_that_cannot_reach_its_host_engine_is_not_run_not_passed():
    found = health.Health([], [], [])
    health._dcgm((235, "Error: Unable to connect to host engine. Host engine connection invalid/disconnected."), found)
    assert found.findings == [] and found.not_run == ["DCGM diagnostics: no DCGM host engine to connect to"]
    health._dcgm((226, "not json"), found)  # dcgmi's status for a failed test (its own test suite checks 226)
    assert _lines(found.findings) == ["health: ip-10-0-0-7: dcgm on the node: dcgmi diag exited 226: not json"]


def test_neuron_uncorrectable_ecc_counters_fail_the_device(tmp_path):
    for device, value in (("neuron0", "0"), ("neuron1", "3")):
        counters = tmp_path / device / "stats" / "hardware"
        counters.mkdir(parents=True)
        (counters / "mem_ecc_uncorrected").write_text("0\n")
        (counters / "sram_ecc_uncorrected").write_text(f"{value}\n")
    not_run: list[str] = []
    assert _lines(health.neuron_counters(tmp_path, not_run)) == [
        "health: ip-10-0-0-7: neuron-ecc on neuron1: sram_ecc_uncorrected = 3: replace the instance"
    ]
    assert health.neuron_counters(tmp_path / "none", not_run) == [] and "no device under" in not_run[0]


def test_a_driver_without_remapped_rows_in_the_query_is_asked_again_and_says_so(monkeypatch):
    monkeypatch.setattr(health.shutil, "which", lambda tool: f"/usr/bin/{tool}" if tool == "nvidia-smi" else None)
    asked: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str]:
        asked.append(argv)
        if "remapped_rows.pending" in argv[1]:
            return 2, 'Field "remapped_rows.pending" is not a valid field to query.'
        if argv[1] == "nvlink":
            return 0, ""
        return 0, "0, 00000000:00:09.0, 3, Not Active, Not Active, 16, 16\n"

    found = health.check_node("cpu", run, dcgm_level=0)
    assert _lines(found.findings) == [
        "health: ip-10-0-0-7: ecc on GPU 0 (00000000:00:09.0): 3 uncorrectable ECC errors since the driver loaded"
    ]
    assert found.not_run == ["row remapping: this driver lists it only under --query-remapped-rows"]
    assert len(asked) == 3


def test_a_gpu_node_without_its_tools_says_which_checks_did_not_run(monkeypatch):
    monkeypatch.setattr(health.shutil, "which", lambda tool: None)
    found = health.check_node("gpu", lambda argv: (1, "dmesg: read kernel buffer failed: Operation not permitted"))
    assert found.findings == []
    assert [line.split(":")[0] for line in found.not_run] == [
        "nvidia-smi checks",
        "DCGM diagnostics",
        "kernel log (Xid, NEURON_HW_ERR)",
    ]


@pytest.mark.slow
def test_a_sick_gpu_fails_the_sanity_check_with_its_host_check_and_evidence(tmp_path):
    # The real sanity check on 2 CPU processes, with an nvidia-smi on PATH that prints the sick node's answers.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        f'#!/bin/sh\nif [ "$1" = nvlink ]; then cat {FIXTURES / "nvlink-inactive.txt"}; '
        f"else cat {FIXTURES / 'nvidia-smi-query-sick.csv'}; fi\n"
    )
    (fake / "nvidia-smi").chmod(0o755)
    report_path = tmp_path / "sanity.json"
    args = ["--sizes", "4K", "--warmup", "0", "--iters", "1", "--report", str(report_path)]
    path = f"{fake}:{os.environ['PATH']}"
    run = th.torchrun("sanity_check.py", args, ACCELERATOR_KIND="cpu", ACCELERATORS_PER_NODE="2", PATH=path)
    report = json.loads(report_path.read_text())
    assert run.returncode == 1 and not report["passed"], run.stderr[-2000:]
    (node,) = report["health"]  # one node: its local rank 0 checked it
    health_lines = [line for line in report["failures"] if line.startswith("health: ")]
    assert health_lines == node["failures"] and len(health_lines) == 6
    ecc = "ecc on GPU 1 (00000000:00:0A.0): 2 uncorrectable ECC errors since the driver loaded"
    assert health_lines[0] == f"health: {node['host']}: {ecc}"
    assert health_lines[-1] == f"health: {node['host']}: nvlink on GPU 3: Link 3 is inactive"
    assert health_lines[0] in run.stderr  # the node's own log names it too


def test_a_failed_training_attempt_names_this_nodes_health_in_its_log(monkeypatch, capsys):
    # launch.py after torchrun: a crash (1) or a hang (6) may be the hardware's; the exit code stays the attempt's.
    sick = health.Health([health.Finding("xid", "PCI 0000:2b:00", "Xid 79, GPU has fallen off the bus.")], [], [])
    monkeypatch.setattr(health, "check_node", lambda kind: sick)
    assert process.health_after_failure("train", 6, {"ACCELERATOR_KIND": "gpu"}, host="ip-10-0-0-7") == 6
    assert capsys.readouterr().err == (
        "launch.py: after the failed attempt (exit 6): health: ip-10-0-0-7: xid on PCI 0000:2b:00: Xid 79, GPU has "
        "fallen off the bus.\n"
    )


@pytest.mark.parametrize("code", [0, 2, 4, 5, 7, 143])
def test_an_attempt_that_ended_for_its_own_reasons_checks_no_host(monkeypatch, code):
    monkeypatch.setattr(health, "check_node", lambda kind: pytest.fail("checked the hosts"))
    assert process.health_after_failure("train", code, {}) == code
    assert process.health_after_failure("sanity", 1, {}) == 1  # the sanity check runs them itself


def test_a_check_that_breaks_is_named_not_raised(monkeypatch):
    # A sick node's local rank 0 must not die while the other ranks wait for it in all_gather_object.
    monkeypatch.setattr(health.shutil, "which", lambda tool: f"/usr/bin/{tool}")

    def run(argv: list[str]) -> tuple[int, str]:
        raise RuntimeError("an answer of a shape not foreseen")

    found = health.check_node("gpu", run, dcgm_level=1)
    assert found.not_run == ["health checks stopped: RuntimeError('an answer of a shape not foreseen')"]


def test_dcgm_output_with_a_line_after_its_json_is_still_read():
    found = health.Health([], [], [])
    health._dcgm((226, _text("dcgm-diag-fail.json") + "\nWarning: a line after the JSON\n"), found)
    assert [f.check for f in found.findings] == ["dcgm"] and found.findings[0].device == "GPU 1"
    health._dcgm((0, "no JSON at all"), found)
    assert found.not_run == ["DCGM diagnostics: no JSON in its output: no JSON at all"]


def test_an_xid_after_which_nvidia_asks_for_no_reset_does_not_fail_a_reused_node():
    log = (
        "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.\n"
    )
    assert health.parse_kernel_log(log) == []  # the pending remap itself is nvidia-smi's remapped_rows.pending


def test_an_nvidia_smi_that_never_answers_is_a_lost_gpu_not_a_wait(monkeypatch):
    # A tool stuck on a lost GPU must not hold this node's rank 0 while the group waits for it (run_command's bound).
    monkeypatch.setattr(health, "TOOL_SECONDS", 0.5)
    fake = {"nvidia-smi": ["sleep", "5"]}
    monkeypatch.setattr(health.subprocess, "run", _bounded_sleep(fake))
    assert health.run_command(["nvidia-smi", "--query-gpu=index"]) == (
        health.TIMED_OUT,
        "nvidia-smi did not answer within 0.5 s",
    )
    monkeypatch.setattr(health.shutil, "which", lambda tool: "/usr/bin/nvidia-smi" if tool == "nvidia-smi" else None)
    found = health.check_node("cpu", dcgm_level=0)
    assert [f.check for f in found.findings] == ["gpu-lost"]


def _bounded_sleep(fake: dict):
    """subprocess.run with the argv replaced: the real timeout applies to a real process that sleeps."""
    import subprocess

    real = subprocess.run

    def run(argv, **kwargs):
        return real(fake.get(argv[0], argv), **kwargs)

    return run
