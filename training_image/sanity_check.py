"""Pre-flight check of a node group: accelerators present, collectives exact, bandwidth enough.

    torchrun --nnodes 2 --nproc-per-node 8 ... sanity_check.py --min-busbw-gbps 250 \
        --report-prefix s3://<data bucket>/runs/ --run-id run-7
(in the container: `launch.py sanity ...`; the report lands at runs/run-7/sanity.json, config/layout.py).
Exit 0 = pass, 1 = a check failed, 2 = bad usage, 3 = the checks passed but the report could not be written
(S3 AccessDenied, unwritable path).

1. The node has ACCELERATORS_PER_NODE devices of kind ACCELERATOR_KIND (gpu|neuron|cpu).
2. all_reduce, all_gather and reduce_scatter over all ranks give exactly the expected values (collectives.py).
3. Where EFA_INTERFACES > 0 (the job environment of every EFA job): the container sees that many EFA devices
   (uverbs and libfabric's efa provider; with EFA_COUNT_CONFIRMED=0, on SageMaker, at least one, the count found
   reported) and NCCL's own log shows the EFA network plugin with provider efa, not its socket fallback
   (efa_proof.py says which lines and why).
4. Bandwidth over a range of sizes, with the nccl-tests definitions (collectives.py). The all_reduce busbw at one
   fixed large message (--busbw-bytes, env BUSBW_MESSAGE_BYTES: 2 GiB on EFA jobs, the size AWS's published
   two-node figures use) must reach --min-busbw-gbps (GB/s, 1e9 bytes); never an average over sizes, which small
   messages drag down.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

import efa_proof
from collectives import COLLECTIVES, measure
from distributed import DEVICES, KIND_TO_DEVICE, Runtime, destroy_distributed, init_distributed, resolve_device
from errors import EXIT_REPORT_NOT_WRITTEN, UsageError, exit_process, exit_with_usage_error
from run_paths import expected_nodes_error
from storage import under_prefix, write_json

DEFAULT_SIZES = {"cuda": "1M,16M,128M,1G,2G", "xla": "1M,16M,128M,1G,2G", "cpu": "64K,1M,4M"}
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
EXIT_FAILED = 1
# The checks passed but the report is lost: a code of its own, so the job's log and exit code say the nodes are
# fine. The pipeline does not tell it from 1: any failed sanity job is submitted once more on a fresh placement,
# then fails the run (constructs/pipeline/training_pipeline.py); it is not one of contracts/run.py's REFUSED_EXIT_CODES.
# Its value is errors.EXIT_REPORT_NOT_WRITTEN (imported above).


@dataclass(frozen=True)
class Plan:
    """What to check, from the flags and the job environment, all validated before the process group exists."""

    device_type: str
    kind: str  # ACCELERATOR_KIND
    expected: int | None  # ACCELERATORS_PER_NODE
    sizes: list[int]
    gate_bytes: int  # the one size the bandwidth gate applies at
    efa_interfaces: int


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--min-busbw-gbps",
        type=float,
        default=float(os.environ.get("EXPECTED_BUSBW_GBPS", "0") or 0),
        help="fail if the all_reduce bus bandwidth at --busbw-bytes is below this, GB/s "
        "(default: env EXPECTED_BUSBW_GBPS, else 0 = do not check)",
    )
    p.add_argument(
        "--sizes",
        default="",
        help="comma-separated message sizes, e.g. 1M,16M,1G (default: 1M..2G on accelerators, 64K..4M on CPU)",
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument(
        "--report",
        default=os.environ.get("SANITY_REPORT", ""),
        help="write the JSON report to this path as well as stdout (default: env SANITY_REPORT)",
    )
    p.add_argument("--device", default="auto", help=f"{', '.join(DEVICES)} (default auto: from ACCELERATOR_KIND)")
    p.add_argument(
        "--run-id",
        default=os.environ.get("RUN_ID"),
        help="run id, names the report under --report-prefix (default: env RUN_ID)",
    )
    p.add_argument(
        "--report-prefix",
        default=os.environ.get("REPORT_PREFIX", ""),
        help="also write the report to PREFIX<run-id>/sanity.json, PREFIX a path or s3://bucket/prefix/ "
        "(default: env REPORT_PREFIX)",
    )
    p.add_argument(
        "--expected-nodes",
        type=int,
        default=None,
        help="fail unless this many nodes joined (torchrun's GROUP_WORLD_SIZE)",
    )
    p.add_argument(
        "--busbw-bytes",
        default=os.environ.get("BUSBW_MESSAGE_BYTES", ""),
        help="the message size the bandwidth gate applies at, added to --sizes if missing "
        "(default: env BUSBW_MESSAGE_BYTES, else the largest of --sizes)",
    )
    p.add_argument("--uverbs-dir", default=efa_proof.UVERBS_DIR, help="where the EFA uverbs devices appear")
    p.add_argument("--fi-info", default=None, help="libfabric's fi_info (default: on PATH or /opt/amazon/efa/bin)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


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
    return Plan(device_type, kind, int(expected_text) if expected_text else None, sizes, gate_bytes, int(efa_text))


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


def run_checks(args: argparse.Namespace, rt: Runtime, plan: Plan, nccl_log: str = "") -> dict:
    accel = check_accelerators(plan.kind, plan.expected)
    results = [measure(op, size, rt, args.warmup, args.iters) for op in COLLECTIVES for size in plan.sizes]
    by_size = {r["size_bytes"]: r["busbw_gbps"] for r in results if r["op"] == "all_reduce"}
    measured = by_size[plan.gate_bytes]
    efa, devices_bad, transport = _efa_checks(args, rt, plan.efa_interfaces, nccl_log, plan.kind)
    # Every rank's own verdicts are combined, so all ranks exit with the same code.
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
        "efa": efa,
        "threshold_busbw_gbps": args.min_busbw_gbps,
        "threshold_source": os.environ.get("BUSBW_SOURCE", "--min-busbw-gbps"),
        "measured_busbw_gbps": measured,
        "measured_at_bytes": plan.gate_bytes,
        "busbw_gbps_by_size": {str(size): busbw for size, busbw in sorted(by_size.items())},
        "results": results,
    }


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


def write_reports(args: argparse.Namespace, report: dict) -> bool:
    """Rank 0: the report on stdout, a verdict line on stderr, and the report at --report and --report-prefix."""
    print(json.dumps(report, indent=2), flush=True)
    print(
        f"sanity_check: {'PASS' if report['passed'] else 'FAIL: ' + '; '.join(report['failures'])}",
        file=sys.stderr,
        flush=True,
    )
    written = True
    prefixed = under_prefix(args.report_prefix, args.run_id, "sanity.json") if args.report_prefix else ""
    for location in filter(None, [args.report, prefixed]):
        try:
            write_json(location, report)
        except Exception as exc:  # S3 ClientError, OSError...: one line, its own exit code
            print(
                f"sanity_check.py: error: could not write the report to {location}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                file=sys.stderr,
                flush=True,
            )
            written = False
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = plan_checks(args)
        # Before the process group: NCCL reads its logging settings when it creates a communicator.
        nccl_log = (
            efa_proof.prepare_nccl_logging(os.environ, int(os.environ.get("RANK", "0"))) if plan.efa_interfaces else ""
        )
        rt = init_distributed(plan.device_type)
        try:
            report = run_checks(args, rt, plan, nccl_log)
        finally:
            destroy_distributed()
    except UsageError as err:
        exit_with_usage_error("sanity_check.py", err)
    report_written = write_reports(args, report) if rt.is_main else True
    if not report["passed"]:
        return EXIT_FAILED  # a bad node group outranks a lost report
    return 0 if report_written else EXIT_REPORT_NOT_WRITTEN


if __name__ == "__main__":
    exit_process(main())
