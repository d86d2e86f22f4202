"""Pre-flight check of a node group: accelerators present, collectives exact, bandwidth enough.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m efa_training.runtime.sanity --min-busbw-gbps 250 \
        --report-prefix s3://<data bucket>/runs/ --run-id run-7
(in the container: `launch.py sanity ...`; the report lands at runs/run-7/sanity.json, config/layout.py).
Exit 0 = pass, 1 = a check failed, 2 = bad usage, 3 = the checks passed but the report could not be written
(S3 AccessDenied, unwritable path).

1. The node has ACCELERATORS_PER_NODE devices of kind ACCELERATOR_KIND (gpu|neuron|cpu), and passes the deep health
   checks its tools allow (health.py: ECC, row remapping, clocks, NVLink, Xids, DCGM diagnostics, Neuron ECC).
2. all_reduce, all_gather and reduce_scatter over all ranks give exactly the expected values (collectives.py).
3. Where EFA_INTERFACES > 0 (the job environment of every EFA job): the container sees that many EFA devices
   (uverbs and libfabric's efa provider; with EFA_COUNT_CONFIRMED=0, on SageMaker, at least one, the count found
   reported) and NCCL's own log shows the EFA network plugin with provider efa, not its socket fallback
   (efa_proof.py says which lines and why).
4. Compute: every rank's matmul rate against the group's median (compute.py): a slow accelerator is named.
5. Bandwidth over a range of sizes, with the nccl-tests definitions (collectives.py). The all_reduce busbw at one
   fixed large message (--busbw-bytes, env BUSBW_MESSAGE_BYTES: 2 GiB on EFA jobs, the size AWS's published
   two-node figures use) must reach --min-busbw-gbps (GB/s, 1e9 bytes); never an average over sizes, which small
   messages drag down.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from efa_training.runtime import tracking
from efa_training.runtime.distributed import DEVICES, destroy_distributed, init_distributed
from efa_training.runtime.errors import EXIT_REPORT_NOT_WRITTEN, UsageError, exit_with_usage_error
from efa_training.runtime.sanity import efa_proof
from efa_training.runtime.sanity.checks import EXIT_FAILED, plan_checks, run_checks
from efa_training.runtime.storage import under_prefix, write_json

PROG = "sanity_check.py"  # the name its usage and error lines carry in the job logs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument(
        "--min-compute-of-median",
        type=float,
        default=float(os.environ["MIN_COMPUTE_OF_MEDIAN"]) if os.environ.get("MIN_COMPUTE_OF_MEDIAN") else None,
        help="fail a rank whose matmul rate is under this share of the group's median (default: env "
        "MIN_COMPUTE_OF_MEDIAN, else 0.8 on accelerators and 0 = report only on CPU)",
    )
    p.add_argument("--uverbs-dir", default=efa_proof.UVERBS_DIR, help="where the EFA uverbs devices appear")
    p.add_argument("--fi-info", default=None, help="libfabric's fi_info (default: on PATH or /opt/amazon/efa/bin)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


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
                f"{PROG}: error: could not write the report to {location}: "
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
        exit_with_usage_error(PROG, err)
    report_written = write_reports(args, report) if rt.is_main else True
    if rt.is_main and args.run_id:
        tracking.record_sanity(os.environ, args.run_id, report)  # where tracking is on: the run's MLflow run
    if not report["passed"]:
        return EXIT_FAILED  # a bad node group outranks a lost report
    return 0 if report_written else EXIT_REPORT_NOT_WRITTEN
