"""Deep health checks of one node's accelerators, run by its local rank 0 in the sanity check, before training.

A GPU that passes a matmul and a collective can still be failing: uncorrectable ECC errors, a row remap pending or
failed, clocks slowed by hardware, an NVLink down, an Xid in the kernel log, a DCGM diagnostic that fails. Each check
runs where its tool is there (nvidia-smi, dcgmi, the kernel log, Neuron's sysfs counters); one that cannot run is
named in the report, never silently passed. A finding is one line naming the host, the check and the evidence.
  nvidia-smi --query-gpu  ECC, row remapping, clock slowdowns, PCIe width (https://docs.nvidia.com/deploy/nvidia-smi/)
  nvidia-smi nvlink -s    a link shown `<inactive>`
  kernel log (dmesg)      `NVRM: Xid (PCI:...): N,` for the Xids EKS's node monitoring agent repairs; Neuron's
                          `NEURON_HW_ERR=...` markers (Neuron runtime troubleshooting, "Hardware Errors")
  dcgmi diag -r L -j      DCGM diagnostics at level L (DCGM_DIAG_LEVEL: 1 takes seconds, 2 about two minutes, 3 about
                          15; 0 skips), where the image or host runs DCGM's host engine
  Neuron sysfs            stats/hardware/{mem,sram}_ecc_uncorrected of every device (Neuron sysfs user guide)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Run = Callable[[list[str]], tuple[int, str]]  # argv -> (exit code, stdout)
QUERY = ("index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total", "clocks_throttle_reasons.hw_slowdown",
         "clocks_throttle_reasons.sw_thermal_slowdown", "pcie.link.width.current", "pcie.link.width.max",
         "remapped_rows.pending", "remapped_rows.failure")  # fmt: skip
# nvidia-smi exits 2 on a field it does not know and prints nothing (its manual, RETURN VALUE); drivers before the
# 550s list remapped_rows.* only under --query-remapped-rows, so the query is asked again without them.
OPTIONAL_FIELDS = 2
FELL_OFF_THE_BUS = 15  # nvidia-smi: "The GPU has fallen off the bus or has otherwise become inaccessible"
# The Xids after which EKS's node monitoring agent reboots or replaces a node (EKS user guide, "Detect node health
# issues": AcceleratedHardwareReady), less 13 and 31, which a faulty program causes, and 63 and 94, after which the
# NVIDIA Xid catalog asks for no reset (a row remap recorded; a contained error: restart the program): the kernel
# log holds every Xid since the instance booted, and a reused instance must not fail for an earlier job's.
NODE_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120, 121, 140})
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),(.*)")
NEURON_HW_ERROR = re.compile(r"NEURON_HW_ERR=(SRAM_UNCORRECTABLE_ERROR|NC_UNCORRECTABLE_ERROR|HBM_UNCORRECTABLE_ERROR"
                             r"|DMA_ERROR)")  # fmt: skip
NEURON_SYSFS = "/sys/devices/virtual/neuron_device"
NEURON_COUNTERS = ("mem_ecc_uncorrected", "sram_ecc_uncorrected")
DCGM_FAILED = {226: "a test failed", 205: "a test failed and asks to isolate the GPU"}  # dcgmi's exit statuses
DCGM_NO_HOST_ENGINE = 235
TOOL_SECONDS = 60  # nvidia-smi and dmesg answer in seconds; one that does not is a finding (a GPU gone) or not run
# Each DCGM level's bound: its documented length (1 seconds, 2 about two minutes, 3 about 15) with room; level 4 has
# no documented length and gets what is left of the sanity stage's hour.
DCGM_SECONDS = {"1": 300, "2": 600, "3": 1800, "4": 3000}
TIMED_OUT = -2


@dataclass(frozen=True)
class Finding:
    check: str  # ecc, row-remap, clocks, nvlink, xid, dcgm, gpu-lost, neuron-ecc, neuron-hw
    device: str
    evidence: str

    def line(self, host: str) -> str:
        return f"health: {host}: {self.check} on {self.device}: {self.evidence}"


@dataclass
class Health:
    findings: list[Finding]
    warnings: list[str]  # seen, not failing (a PCIe link narrower than its maximum: idle GPUs may narrow it)
    not_run: list[str]  # which check could not run, and why

    def report(self, host: str) -> dict:
        return {"host": host, "failures": [f.line(host) for f in self.findings], "warnings": self.warnings,
                "not_run": self.not_run}  # fmt: skip


def run_command(argv: list[str]) -> tuple[int, str]:
    """(exit code, output); TIMED_OUT past the command's bound, so that a tool stuck on a lost GPU cannot keep this
    node's rank 0 from the group, which waits for it in all_gather_object."""
    timeout = DCGM_SECONDS.get(argv[3], DCGM_SECONDS["4"]) if argv[:2] == ["dcgmi", "diag"] else TOOL_SECONDS
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return TIMED_OUT, f"{argv[0]} did not answer within {timeout} s"
    except OSError as error:
        return -1, str(error)
    return done.returncode, done.stdout + done.stderr


def check_node(kind: str, run: Run = run_command, dcgm_level: int | None = None) -> Health:
    """Every check this node's tools allow. `kind` (gpu, neuron, cpu) says which missing tool is worth naming. A
    check that breaks (an output of a shape not foreseen, a counter that cannot be read) is named as not run: it must
    not end the sanity check on one node while the others wait for it, nor replace a failed attempt's exit code."""
    health = Health([], [], [])
    try:
        _check_node(kind, run, dcgm_level, health)
    except Exception as error:  # noqa: BLE001 - reported, never raised: see above
        health.not_run.append(f"health checks stopped: {error!r}"[:300])
    return health


def _check_node(kind: str, run: Run, dcgm_level: int | None, health: Health) -> None:
    if shutil.which("nvidia-smi"):
        _nvidia_smi(run, health)
        _nvlink(run(["nvidia-smi", "nvlink", "--status"])[1], health)
    elif kind == "gpu":
        health.not_run.append("nvidia-smi checks: nvidia-smi is not on PATH")
    level = int(os.environ.get("DCGM_DIAG_LEVEL", "1")) if dcgm_level is None else dcgm_level
    if level and shutil.which("dcgmi"):
        _dcgm(run(["dcgmi", "diag", "-r", str(level), "-j"]), health)
    elif level and kind == "gpu":
        health.not_run.append("DCGM diagnostics: dcgmi is not in the image")
    if kind != "cpu":
        code, log = run(["dmesg"])
        if code == 0:
            health.findings += parse_kernel_log(log)
        else:
            health.not_run.append(f"kernel log (Xid, NEURON_HW_ERR): dmesg exited {code}; reading it needs CAP_SYSLOG")
    if kind == "neuron":
        health.findings += neuron_counters(Path(os.environ.get("NEURON_SYSFS", NEURON_SYSFS)), health.not_run)


def _nvidia_smi(run: Run, health: Health) -> None:
    fields = list(QUERY)
    code, out = run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if code == 2:  # a field this driver does not know: ask without the remapped rows
        fields = fields[:-OPTIONAL_FIELDS]
        code, out = run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
        if code == 0:
            health.not_run.append("row remapping: this driver lists it only under --query-remapped-rows")
    if code in (FELL_OFF_THE_BUS, TIMED_OUT):
        health.findings.append(Finding("gpu-lost", "a GPU", f"nvidia-smi exited {code}: {out.strip()[:200]}"))
    elif code != 0:
        health.not_run.append(f"nvidia-smi --query-gpu exited {code}: {out.strip()[:200]}")
    else:
        found, warned = parse_gpu_query(out, fields)
        health.findings += found
        health.warnings += warned


def parse_gpu_query(text: str, fields: list[str]) -> tuple[list[Finding], list[str]]:
    """Findings and warnings from `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`."""
    findings, warnings = [], []
    for line in filter(None, (raw.strip() for raw in text.splitlines())):
        row = dict(zip(fields, (value.strip() for value in line.split(",")), strict=False))
        gpu = f"GPU {row.get('index', '?')} ({row.get('pci.bus_id', '?')})"
        if any(value == "[GPU requires reset]" for value in row.values()):
            findings.append(Finding("reset", gpu, "nvidia-smi reports [GPU requires reset]"))
        ecc = row.get("ecc.errors.uncorrected.volatile.total", "")
        if ecc.isdigit() and int(ecc) > 0:
            findings.append(Finding("ecc", gpu, f"{ecc} uncorrectable ECC errors since the driver loaded"))
        if row.get("remapped_rows.pending") == "Yes":
            findings.append(Finding("row-remap", gpu, "a row remapping is pending: the GPU needs a reset"))
        if row.get("remapped_rows.failure") == "Yes":
            findings.append(Finding("row-remap", gpu, "a row remapping failed: the GPU needs replacing"))
        for reason in ("hw_slowdown", "sw_thermal_slowdown"):
            if row.get(f"clocks_throttle_reasons.{reason}") == "Active":
                findings.append(Finding("clocks", gpu, f"{reason} is active with no work on the GPU"))
        width, widest = row.get("pcie.link.width.current", ""), row.get("pcie.link.width.max", "")
        if width.isdigit() and widest.isdigit() and int(width) < int(widest):
            warnings.append(f"{gpu}: PCIe link x{width} of x{widest} (an idle GPU may narrow it)")
    return findings, warnings


def _nvlink(text: str, health: Health) -> None:
    gpu = "a GPU"
    for line in text.splitlines():
        if line.startswith("GPU "):
            gpu = line.split(":", 1)[0]
        elif "<inactive>" in line:
            health.findings.append(Finding("nvlink", gpu, f"{line.strip().split(':')[0]} is inactive"))


def parse_kernel_log(log: str) -> list[Finding]:
    findings = []
    for line in log.splitlines():
        xid = XID.search(line)
        if xid and int(xid.group(2)) in NODE_XIDS:
            findings.append(Finding("xid", f"PCI {xid.group(1)}", f"Xid {xid.group(2)},{xid.group(3)}".strip()))
        neuron = NEURON_HW_ERROR.search(line)
        if neuron:
            findings.append(Finding("neuron-hw", "a Neuron device", f"kernel log: NEURON_HW_ERR={neuron.group(1)}"))
    return findings


def neuron_counters(root: Path, not_run: list[str]) -> list[Finding]:
    devices = sorted(root.glob("neuron[0-9]*"))
    if not devices:
        not_run.append(f"Neuron ECC counters: no device under {root}")
    findings = []
    for device in devices:
        for counter in NEURON_COUNTERS:
            path = device / "stats" / "hardware" / counter
            text = path.read_text().strip() if path.exists() else ""
            if text.isdigit() and int(text) > 0:
                findings.append(Finding("neuron-ecc", device.name, f"{counter} = {text}: replace the instance"))
    return findings


def _dcgm(result: tuple[int, str], health: Health) -> None:
    code, out = result
    if code == DCGM_NO_HOST_ENGINE:
        health.not_run.append("DCGM diagnostics: no DCGM host engine to connect to")
        return
    try:  # the JSON object, then whatever dcgmi printed after it
        if "{" not in out:
            raise ValueError("no JSON object")
        findings = parse_dcgm_diag(json.JSONDecoder().raw_decode(out[out.index("{") :])[0])
    except ValueError:
        findings = [Finding("dcgm", "the node", f"dcgmi diag exited {code}: {out.strip()[:200]}")] if code else []
        if not code:
            health.not_run.append(f"DCGM diagnostics: no JSON in its output: {out.strip()[:200]}")
    if code in DCGM_FAILED and not findings:
        findings = [Finding("dcgm", "the node", f"dcgmi diag: {DCGM_FAILED[code]}")]
    health.findings += findings


def parse_dcgm_diag(report: dict) -> list[Finding]:
    """Failed results of `dcgmi diag -j`: "DCGM Diagnostic" (DCGM 4) or "DCGM GPU Diagnostic" (3.x) at the top."""
    diag = report.get("DCGM Diagnostic") or report.get("DCGM GPU Diagnostic") or {}
    if "runtime_error" in diag:
        return [Finding("dcgm", "the node", f"the diagnostic could not run: {diag['runtime_error']}")]
    findings = []
    for category in diag.get("test_categories", []):
        for test in category.get("tests", []):
            for result in test.get("results", []):
                if result.get("status") == "Fail":
                    gpu = result.get("entity_id", result.get("gpu_id", "?"))
                    why = "; ".join(w.get("warning", "") for w in result.get("warnings", [])) or "failed"
                    findings.append(Finding("dcgm", f"GPU {gpu}", f"{test.get('name')}: {why}"))
    return findings
