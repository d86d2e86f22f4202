"""Pre-flight check of a node group: accelerators present, collectives exact, bandwidth enough.

    torchrun --nnodes 2 --nproc-per-node 8 ... sanity_check.py --min-busbw-gbps 26 --report /fsx/reports/run1.json
(in the container: `launch.py sanity ...`). Exit 0 = pass, 1 = a check failed, 2 = bad usage,
3 = the checks passed but the report could not be written (S3 AccessDenied, unwritable path).

1. The node has ACCELERATORS_PER_NODE devices of kind ACCELERATOR_KIND (gpu|neuron|cpu).
2. all_reduce, all_gather and reduce_scatter over all ranks give exactly the expected values.
3. Where EFA_INTERFACES > 0 (the job environment of every EFA job): the container sees that many EFA devices
   (uverbs and libfabric's efa provider) and NCCL's own log shows the EFA network plugin with provider efa,
   not its socket fallback (efa_proof.py says which lines and why).
4. Bandwidth over a range of sizes, with the nccl-tests definitions
   (github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
     algbw = S / t, S = bytes of the full buffer (all_reduce: the tensor; all_gather: the
             gathered output; reduce_scatter: the input before scattering)
     busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for all_gather and reduce_scatter
   The all_reduce busbw at one fixed large message (--busbw-bytes, env BUSBW_MESSAGE_BYTES: 2 GiB on EFA
   jobs, the size AWS's published two-node figures use) must reach --min-busbw-gbps (GB/s, 1e9 bytes);
   never an average over sizes, which small messages drag down.

Test-only fault injection: SANITY_TEST_CORRUPT_RANK=R makes rank R add 1 to its contribution,
so the exact-verification failure path can be exercised.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import efa_proof
from distributed import DEVICES, KIND_TO_DEVICE, Runtime, destroy_distributed, init_distributed, resolve_device
from errors import UsageError, exit_with_usage_error
from run_paths import expected_nodes_error
from storage import under_prefix, write_json

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
DEFAULT_SIZES = {"cuda": "1M,16M,128M,1G,2G", "xla": "1M,16M,128M,1G,2G", "cpu": "64K,1M,4M"}
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
EXIT_FAILED = 1
EXIT_REPORT_NOT_WRITTEN = 3  # not "the node group is bad": the pipeline must not retire the nodes for it


def parse_size(text: str, flag: str = "--sizes") -> int:
    text = text.strip().upper()
    try:
        value = int(text[:-1]) * UNITS[text[-1]] if text[-1:] in UNITS else int(text)
    except (ValueError, IndexError):
        raise UsageError(flag, text, "not a size", "bytes as 4096, 64K, 16M or 1G") from None
    if value < 4:
        raise UsageError(flag, text, "too small", ">= 4 bytes")
    return value


def bus_bandwidth(op: str, algbw: float, world_size: int) -> float:
    return algbw * BUS_FACTOR[op](world_size)


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


def _sync(rt: Runtime) -> None:
    if rt.device_type == "cuda":
        torch.cuda.synchronize()
    elif rt.xm is not None:
        rt.xm.mark_step()
        rt.xm.wait_device_ops()


def _inputs(op: str, size_bytes: int, rt: Runtime) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input, output buffer, expected output): small integers, so float32 sums are exact."""
    n, w, r = rt.world_size, rt.world_size, rt.rank
    per_rank = max(1, size_bytes // 4 // (1 if op == "all_reduce" else w))
    ramp = lambda k, m: torch.arange(k, dtype=torch.float32) % m  # noqa: E731
    rank_sum = w * (w + 1) / 2
    if op == "all_reduce":
        x = ramp(per_rank, 13) + (r + 1)
        expected, out = w * ramp(per_rank, 13) + rank_sum, None
    elif op == "all_gather":
        x = ramp(per_rank, 7) + (r + 1)
        expected = torch.cat([ramp(per_rank, 7) + (q + 1) for q in range(n)])
        out = torch.empty(per_rank * n)
    else:
        x = ramp(per_rank * n, 11) + (r + 1)
        expected = (w * ramp(per_rank * n, 11) + rank_sum)[r * per_rank:(r + 1) * per_rank]
        out = torch.empty(per_rank)
    if os.environ.get("SANITY_TEST_CORRUPT_RANK") == str(r):
        x[0] += 1.0  # test-only: a wrong contribution from this rank
    move = lambda t: None if t is None else t.to(rt.device)  # noqa: E731
    return move(x), move(out), expected


def _run(op: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if op == "all_reduce":
        dist.all_reduce(x)
        return x
    if op == "all_gather":
        if hasattr(dist, "all_gather_single"):  # the name torch >= 2.13 prefers; DLC images may be older
            dist.all_gather_single(out, x)
        else:
            dist.all_gather_into_tensor(out, x)
        return out
    if hasattr(dist, "reduce_scatter_single"):
        dist.reduce_scatter_single(out, x)
    else:
        dist.reduce_scatter_tensor(out, x)
    return out


def measure(op: str, size_bytes: int, rt: Runtime, warmup: int, iters: int) -> dict:
    x, out, expected = _inputs(op, size_bytes, rt)
    result = _run(op, x, out)
    _sync(rt)
    correct = torch.equal(result.cpu(), expected)
    # all_gather keeps each rank's contribution apart: its wrong chunks name the rank that sent bad data.
    bad_sources = [q for q, (got, want) in enumerate(zip(result.cpu().chunk(rt.world_size), expected.chunk(rt.world_size)))
                   if not torch.equal(got, want)] if op == "all_gather" and not correct else []
    for _ in range(warmup):
        _run(op, x, out)
    _sync(rt)
    start = time.perf_counter()
    for _ in range(iters):
        _run(op, x, out)  # all_reduce in place: values grow, the timing does not care
    _sync(rt)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=rt.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective is as slow as its slowest rank
    seconds = float(elapsed.item())
    total_bytes = x.numel() * 4 if op != "all_gather" else out.numel() * 4
    algbw = total_bytes / seconds / 1e9
    return {"op": op, "size_bytes": total_bytes, "time_us": seconds * 1e6, "algbw_gbps": algbw,
            "busbw_gbps": bus_bandwidth(op, algbw, rt.world_size), "correct": bool(correct),
            "wrong_data_from_ranks": bad_sources}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--min-busbw-gbps", type=float, default=float(os.environ.get("EXPECTED_BUSBW_GBPS", "0") or 0),
                   help="fail if all_reduce bus bandwidth at the largest size is below this, GB/s "
                        "(default: env EXPECTED_BUSBW_GBPS, else 0 = do not check)")
    p.add_argument("--sizes", default="",
                   help="comma-separated message sizes, e.g. 1M,16M,1G (default: 1M..1G on accelerators, 64K..4M on CPU)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--report", default=os.environ.get("SANITY_REPORT", ""),
                   help="write the JSON report to this path as well as stdout (default: env SANITY_REPORT)")
    p.add_argument("--device", default="auto", help=f"{', '.join(DEVICES)} (default auto: from ACCELERATOR_KIND)")
    p.add_argument("--run-id", default=os.environ.get("RUN_ID"), help="run id, names the report under --report-prefix "
                                                                     "(default: env RUN_ID)")
    p.add_argument("--report-prefix", default=os.environ.get("REPORT_PREFIX", ""),
                   help="also write the report to PREFIX<run-id>/sanity.json, PREFIX a path or s3://bucket/prefix/ "
                        "(default: env REPORT_PREFIX)")
    p.add_argument("--expected-nodes", type=int, default=None,
                   help="fail unless this many nodes joined (torchrun's GROUP_WORLD_SIZE)")
    p.add_argument("--busbw-bytes", default=os.environ.get("BUSBW_MESSAGE_BYTES", ""),
                   help="the message size the bandwidth gate applies at, added to --sizes if missing "
                        "(default: env BUSBW_MESSAGE_BYTES, else the largest of --sizes)")
    p.add_argument("--uverbs-dir", default=efa_proof.UVERBS_DIR, help="where the EFA uverbs devices appear")
    p.add_argument("--fi-info", default=None, help="libfabric's fi_info (default: on PATH or /opt/amazon/efa/bin)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _efa_checks(args: argparse.Namespace, rt: Runtime, efa_interfaces: int, nccl_log: str,
                kind: str) -> tuple[dict, int, int]:
    """(this rank's EFA report, devices-bad flag, transport code); devices are probed once per node."""
    if not efa_interfaces:
        return {"expected_interfaces": 0, "checked": False}, 0, 0
    evidence = efa_proof.collect(efa_interfaces, nccl_log, uverbs_dir=args.uverbs_dir, fi_info=args.fi_info,
                                 transport_proof_required=kind != "neuron")
    for line in evidence.warnings():
        print(f"sanity_check: rank {rt.rank}: warning: {line}", file=sys.stderr, flush=True)
    devices_checked = int(os.environ.get("LOCAL_RANK", "0")) == 0
    report = evidence.report()
    device_problems = [f for f in report["failures"] if f.startswith("EFA devices")] if devices_checked else []
    for line in report["failures"] if devices_checked else [f for f in report["failures"] if f.startswith("transport")]:
        print(f"sanity_check: rank {rt.rank}: {line}", file=sys.stderr, flush=True)  # this node's own log names it
    return ({**report, "checked": True, "devices_checked": devices_checked},
            int(bool(device_problems)),
            0 if evidence.warnings() else efa_proof.TRANSPORTS.index(evidence.transport.kind))


def run_checks(args: argparse.Namespace, rt: Runtime, sizes: list[int], kind: str, expected: int | None,
               gate_bytes: int, efa_interfaces: int = 0, nccl_log: str = "") -> dict:
    accel = check_accelerators(kind, expected)
    results = [measure(op, size, rt, args.warmup, args.iters) for op in COLLECTIVES for size in sizes]
    by_size = {r["size_bytes"]: r["busbw_gbps"] for r in results if r["op"] == "all_reduce"}
    measured = by_size[gate_bytes]
    efa, devices_bad, transport = _efa_checks(args, rt, efa_interfaces, nccl_log, kind)
    failures = []
    # Every rank's own verdicts are combined, so all ranks exit with the same code.
    local_bad = torch.tensor([0 if accel["ok"] else 1, sum(not r["correct"] for r in results), devices_bad],
                             dtype=torch.int64, device=rt.device)
    dist.all_reduce(local_bad)
    worst_transport = torch.tensor([transport], dtype=torch.int64, device=rt.device)
    dist.all_reduce(worst_transport, op=dist.ReduceOp.MAX)
    bad_accel, bad_results, bad_devices = (int(v) for v in local_bad.tolist())
    if bad_accel:
        failures.append(f"accelerators: {bad_accel} rank(s) found fewer/other than {expected} {kind} devices")
    if bad_results:
        # This rank (0, which prints) only observed the errors; all_gather's chunks say whose data was wrong.
        wrong = sorted({r["op"] for r in results if not r["correct"]})
        sources = sorted({q for r in results for q in r["wrong_data_from_ranks"]})
        failures.append(f"collectives: {bad_results} wrong result(s) across ranks"
                        + (f" ({', '.join(wrong)} seen on rank {rt.rank}" if wrong else "")
                        + (f"; wrong data came from rank(s) {', '.join(map(str, sources))})" if sources
                           else ")" if wrong else ""))
    if bad_devices:
        mine = [f for f in efa.get("failures", []) if f.startswith("EFA devices")]
        failures.append(mine[0] + (f" (and {bad_devices - 1} more node(s))" if bad_devices > 1 else "")
                        if mine else f"EFA devices: wrong on {bad_devices} node(s); see those nodes' logs")
    if efa_interfaces and worst_transport.item():
        kind_found = efa_proof.TRANSPORTS[int(worst_transport.item())]
        mine = efa["transport"]
        failures.append(f"transport: NCCL used {kind_found} ({mine['evidence']}), not EFA" if mine["kind"] == kind_found
                        else f"transport: NCCL used {kind_found}, not EFA, on another rank; see its log")
    nodes_problem = expected_nodes_error(args.expected_nodes)
    if nodes_problem:
        failures.append(f"nodes: {nodes_problem}")
    if args.min_busbw_gbps > 0 and measured < args.min_busbw_gbps:
        failures.append(f"bandwidth: all_reduce busbw {measured:.3f} GB/s at {gate_bytes} bytes "
                        f"< --min-busbw-gbps {args.min_busbw_gbps}")
    return {"passed": not failures, "failures": failures, "world_size": rt.world_size,
            "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")), "device": rt.device_type,
            "accelerators": accel, "efa": efa, "threshold_busbw_gbps": args.min_busbw_gbps,
            "threshold_source": os.environ.get("BUSBW_SOURCE", "--min-busbw-gbps"),
            "measured_busbw_gbps": measured, "measured_at_bytes": gate_bytes,
            "busbw_gbps_by_size": {str(size): busbw for size, busbw in sorted(by_size.items())}, "results": results}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
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
        # float32 buffers: each size is measured as its whole 4-byte elements
        sizes = [size - size % 4 for size in (parse_size(s) for s in (args.sizes or DEFAULT_SIZES[device_type]).split(","))]
        gate_bytes = parse_size(args.busbw_bytes, "--busbw-bytes") if args.busbw_bytes else max(sizes)
        if gate_bytes % 4:
            raise UsageError("--busbw-bytes", args.busbw_bytes, "not a whole number of float32 elements",
                             "a multiple of 4 bytes")
        sizes = sorted({*sizes, gate_bytes})
        efa_text = os.environ.get("EFA_INTERFACES", "") or "0"
        if not efa_text.isdigit():
            raise UsageError("EFA_INTERFACES", efa_text, "not a count", "the instance's EFA interfaces, or 0")
        if args.report_prefix and not args.run_id:
            raise UsageError("--report-prefix", args.report_prefix, "needs a run id", "--run-id or env RUN_ID")
        # Before the process group: NCCL reads its logging settings when it creates a communicator.
        nccl_log = (efa_proof.prepare_nccl_logging(os.environ, int(os.environ.get("RANK", "0")))
                    if int(efa_text) else "")
        rt = init_distributed(device_type)
        try:
            report = run_checks(args, rt, sizes, kind, int(expected_text) if expected_text else None, gate_bytes,
                                int(efa_text), nccl_log)
        finally:
            destroy_distributed()
    except UsageError as err:
        exit_with_usage_error("sanity_check.py", err)
    report_written = True
    if rt.is_main:
        print(json.dumps(report, indent=2), flush=True)
        print(f"sanity_check: {'PASS' if report['passed'] else 'FAIL: ' + '; '.join(report['failures'])}",
              file=sys.stderr, flush=True)
        for location in [args.report] + ([under_prefix(args.report_prefix, args.run_id, "sanity.json")]
                                         if args.report_prefix else []):
            if not location:
                continue
            try:
                write_json(location, report)
            except Exception as exc:  # noqa: BLE001  S3 ClientError, OSError...: one line, its own exit code
                print(f"sanity_check.py: error: could not write the report to {location}: "
                      f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                      file=sys.stderr, flush=True)
                report_written = False
    if not report["passed"]:
        return EXIT_FAILED  # a bad node group outranks a lost report
    return 0 if report_written else EXIT_REPORT_NOT_WRITTEN


if __name__ == "__main__":
    sys.exit(main())
