"""The sanity check's checks, in the order they run: the plan from the flags and the job environment (validated before
the process group exists), the accelerators and each node's deep health (health.py), the collectives and their
bandwidth, the EFA proof, and the group's verdict, agreed by every rank (cli.py runs them and writes the report)."""

from __future__ import annotations

import argparse
import glob
import os
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from efa_training.runtime import bad_hosts
from efa_training.runtime.distributed import KIND_TO_DEVICE, Runtime, resolve_device
from efa_training.runtime.errors import UsageError
from efa_training.runtime.run_paths import expected_nodes_error
from efa_training.runtime.sanity import compute, efa_proof, health
from efa_training.runtime.sanity.collectives import COLLECTIVES, measure

DEFAULT_SIZES = {"cuda": "1M,16M,128M,1G,2G", "xla": "1M,16M,128M,1G,2G", "cpu": "64K,1M,4M"}
# The compute gate's default: on accelerators a rank under 0.8 of the group's median matmul rate is a slow device;
# CPU ranks share cores with everything else on the host, so there it only reports unless asked.
DEFAULT_MIN_COMPUTE_OF_MEDIAN = {"cuda": 0.8, "xla": 0.8, "cpu": 0.0}
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
EXIT_FAILED = 1
# The checks passed but the report is lost: a code of its own, so the job's log and exit code say the nodes are
# fine. The pipeline does not tell it from 1: any failed sanity job is submitted once more on a fresh placement,
# then fails the run (constructs/pipeline/training_pipeline.py); it is not one of contracts/run.py's REFUSED_EXIT_CODES.
# Its value is errors.EXIT_REPORT_NOT_WRITTEN (cli.py returns it).


@dataclass(frozen=True)
class Plan:
    """What to check, from the flags and the job environment, all validated before the process group exists."""

    device_type: str
    kind: str  # ACCELERATOR_KIND
    expected: int | None  # ACCELERATORS_PER_NODE
    sizes: list[int]
    gate_bytes: int  # the one size the bandwidth gate applies at
    efa_interfaces: int
    min_compute_of_median: float  # 0: the compute check reports only


def parse_size(text: str, flag: str = "--sizes") -> int:
    text = text.strip().upper()
    try:
        value = int(text[:-1]) * UNITS[text[-1]] if text[-1:] in UNITS else int(text)
    except (ValueError, IndexError):
        raise UsageError(flag, text, "not a size", "bytes as 4096, 64K, 16M or 1G") from None
    if value < 4:
        raise UsageError(flag, text, "too small", ">= 4 bytes")
    return value


def check_accelerators(kind: str, expected: int | None) -> dict:
    if kind == "gpu":
        found = torch.cuda.device_count()
    elif kind == "neuron":
        # One /dev/neuronN per Neuron device; NEURON_CORES_PER_DEVICE cores each (trn1: 2; trn2 with LNC=2: 4).
        found = len(glob.glob("/dev/neuron[0-9]*")) * int(os.environ.get("NEURON_CORES_PER_DEVICE", "2"))
    else:
        found = os.cpu_count() or 1
    ok = expected is None or (found >= expected if kind == "cpu" else found == expected)
    return {"kind": kind, "expected": expected, "found": found, "ok": ok}


def plan_checks(args: argparse.Namespace) -> Plan:
    if args.warmup < 0 or args.iters < 1:
        raise UsageError("--iters/--warmup", (args.iters, args.warmup), "out of range", "iters >= 1, warmup >= 0")
    if args.min_busbw_gbps < 0:
        raise UsageError("--min-busbw-gbps", args.min_busbw_gbps, "negative", ">= 0")
    device_type = resolve_device(args.device)
    kind = os.environ.get("ACCELERATOR_KIND") or {v: k for k, v in KIND_TO_DEVICE.items()}[device_type]
    if kind not in KIND_TO_DEVICE:
        raise UsageError("ACCELERATOR_KIND", kind, "unknown accelerator kind", ", ".join(KIND_TO_DEVICE))
    expected_text = os.environ.get("ACCELERATORS_PER_NODE", "")
    if expected_text and not expected_text.isdigit():
        raise UsageError("ACCELERATORS_PER_NODE", expected_text, "not a count", "a positive integer")
    sizes, gate_bytes = _sizes(args, device_type)
    efa_text = os.environ.get("EFA_INTERFACES", "") or "0"
    if not efa_text.isdigit():
        raise UsageError("EFA_INTERFACES", efa_text, "not a count", "the instance's EFA interfaces, or 0")
    if args.report_prefix and not args.run_id:
        raise UsageError("--report-prefix", args.report_prefix, "needs a run id", "--run-id or env RUN_ID")
    compute_gate = DEFAULT_MIN_COMPUTE_OF_MEDIAN[device_type] if args.min_compute_of_median is None else \
        args.min_compute_of_median  # fmt: skip
    if not 0 <= compute_gate < 1:
        raise UsageError("--min-compute-of-median", compute_gate, "out of range", "from 0 (report only) to under 1")
    expected = int(expected_text) if expected_text else None
    return Plan(device_type, kind, expected, sizes, gate_bytes, int(efa_text), compute_gate)


def _sizes(args: argparse.Namespace, device_type: str) -> tuple[list[int], int]:
    """The message sizes, whole float32 elements each, and the bandwidth gate's size among them."""
    texts = (args.sizes or DEFAULT_SIZES[device_type]).split(",")
    sizes = [size - size % 4 for size in (parse_size(text) for text in texts)]
    gate_bytes = parse_size(args.busbw_bytes, "--busbw-bytes") if args.busbw_bytes else max(sizes)
    if gate_bytes % 4:
        raise UsageError(
            "--busbw-bytes", args.busbw_bytes, "not a whole number of float32 elements", "a multiple of 4 bytes"
        )
    return sorted({*sizes, gate_bytes}), gate_bytes


def _efa_checks(
    args: argparse.Namespace, rt: Runtime, efa_interfaces: int, nccl_log: str, kind: str
) -> tuple[dict, int, int]:
    """(this rank's EFA report, devices-bad flag, transport code); devices are probed once per node."""
    if not efa_interfaces:
        return {"expected_interfaces": 0, "checked": False}, 0, 0
    evidence = efa_proof.collect(
        efa_interfaces,
        nccl_log,
        uverbs_dir=args.uverbs_dir,
        fi_info=args.fi_info,
        transport_proof_required=kind != "neuron",
        count_confirmed=os.environ.get("EFA_COUNT_CONFIRMED", "1") != "0",
    )
    for line in evidence.warnings() + evidence.notes():
        print(f"sanity_check: rank {rt.rank}: warning: {line}", file=sys.stderr, flush=True)
    devices_checked = int(os.environ.get("LOCAL_RANK", "0")) == 0
    report = evidence.report()
    device_problems = [f for f in report["failures"] if f.startswith("EFA devices")] if devices_checked else []
    for line in report["failures"] if devices_checked else [f for f in report["failures"] if f.startswith("transport")]:
        print(f"sanity_check: rank {rt.rank}: {line}", file=sys.stderr, flush=True)  # this node's own log names it
    return (
        {**report, "checked": True, "devices_checked": devices_checked},
        int(bool(device_problems)),
        0 if evidence.warnings() else efa_proof.TRANSPORTS.index(evidence.transport.kind),
    )


def node_health(rt: Runtime, kind: str, run_id: str | None = None) -> tuple[list[dict], list[str]]:
    """Every node's deep health report (health.py, run by its local rank 0) and the group's failure lines. A node
    with failures records itself for quarantine (bad_hosts.py): only it knows its instance id or node name."""
    own = None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        own = health.check_node(kind).report(socket.gethostname())
        for line in own["failures"]:
            print(f"sanity_check: rank {rt.rank}: {line}", file=sys.stderr, flush=True)  # in this node's own log
        if own["failures"]:
            bad_hosts.record(os.environ, run_id, "failed the health check before training", own["failures"])
    everyone: list[dict | None] = [None] * rt.world_size
    dist.all_gather_object(everyone, own)
    nodes = [report for report in everyone if report]
    return nodes, [line for report in nodes for line in report["failures"]]


def run_checks(args: argparse.Namespace, rt: Runtime, plan: Plan, nccl_log: str = "") -> dict:
    accel = check_accelerators(plan.kind, plan.expected)
    health_nodes, health_failures = node_health(rt, plan.kind, args.run_id)
    compute_report, compute_failures = compute.check(rt, plan.min_compute_of_median)
    results = [measure(op, size, rt, args.warmup, args.iters) for op in COLLECTIVES for size in plan.sizes]
    by_size = {r["size_bytes"]: r["busbw_gbps"] for r in results if r["op"] == "all_reduce"}
    measured = by_size[plan.gate_bytes]
    efa, devices_bad, transport = _efa_checks(args, rt, plan.efa_interfaces, nccl_log, plan.kind)
    failures = _agreed_failures(rt, plan, accel, results, efa, devices_bad, transport) + compute_failures
    failures += health_failures
    nodes_problem = expected_nodes_error(args.expected_nodes)
    if nodes_problem:
        failures.append(f"nodes: {nodes_problem}")
    if args.min_busbw_gbps > 0 and measured < args.min_busbw_gbps:
        failures.append(
            f"bandwidth: all_reduce busbw {measured:.3f} GB/s at {plan.gate_bytes} bytes "
            f"< --min-busbw-gbps {args.min_busbw_gbps}"
        )
    return {
        "passed": not failures,
        "failures": failures,
        "world_size": rt.world_size,
        "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        "device": rt.device_type,
        "torch": torch.__version__,  # the PyTorch the image runs, beside what it proved
        "accelerators": accel,
        "compute": compute_report,
        "health": health_nodes,
        "efa": efa,
        "threshold_busbw_gbps": args.min_busbw_gbps,
        "threshold_source": os.environ.get("BUSBW_SOURCE", "--min-busbw-gbps"),
        "measured_busbw_gbps": measured,
        "measured_at_bytes": plan.gate_bytes,
        "busbw_gbps_by_size": {str(size): busbw for size, busbw in sorted(by_size.items())},
        "results": results,
    }


def _agreed_failures(
    rt: Runtime, plan: Plan, accel: dict, results: list[dict], efa: dict, devices_bad: int, transport: int
) -> list[str]:
    """The group's failure lines for accelerators, collectives and EFA: every rank's own verdicts are combined (two
    all-reduces), so all ranks exit with the same code."""
    local_bad = torch.tensor(
        [0 if accel["ok"] else 1, sum(not r["correct"] for r in results), devices_bad],
        dtype=torch.int64,
        device=rt.device,
    )
    dist.all_reduce(local_bad)
    worst_transport = torch.tensor([transport], dtype=torch.int64, device=rt.device)
    dist.all_reduce(worst_transport, op=dist.ReduceOp.MAX)
    bad_accel, bad_results, bad_devices = (int(v) for v in local_bad.tolist())
    failures = (
        [f"accelerators: {bad_accel} rank(s) found fewer/other than {plan.expected} {plan.kind} devices"]
        if bad_accel
        else []
    )
    failures += _collective_failures(bad_results, results, rt.rank)
    failures += efa_proof.group_failures(efa, bad_devices, int(worst_transport.item()) if plan.efa_interfaces else 0)
    return failures


def _collective_failures(bad_results: int, results: list[dict], rank: int) -> list[str]:
    if not bad_results:
        return []
    # This rank (0, which prints) only observed the errors; all_gather's chunks say whose data was wrong.
    wrong = sorted({r["op"] for r in results if not r["correct"]})
    sources = sorted({q for r in results for q in r["wrong_data_from_ranks"]})
    return [
        f"collectives: {bad_results} wrong result(s) across ranks"
        + (f" ({', '.join(wrong)} seen on rank {rank}" if wrong else "")
        + (f"; wrong data came from rank(s) {', '.join(map(str, sources))})" if sources else ")" if wrong else "")
    ]
