"""Per-accelerator compute: a timed matmul on every rank, so a slow accelerator is caught before training.

In synchronous training every rank waits for the slowest, so one throttled GPU (clocks, power, a bad PCIe link) slows
the whole group without failing anything; the bandwidth gate cannot see it when the links are healthy. Each rank
times square matmuls on its own accelerator (bf16 on accelerators, float32 on CPU), keeps its best of ROUNDS rounds
(a short stall of the host is not a slow device), and the group compares: a rank under --min-compute-of-median of the
group's median is named with its host. Its share of the catalogue's bf16 peak (PEAK_TFLOPS_PER_ACCELERATOR, which
the jobs of a deployed environment carry; metrics.peak_tflops) is reported beside it, not gated: what a healthy
device reaches on this matmul was not measured here (no GPU).

Test-only fault injection: SANITY_TEST_SLOW_COMPUTE=R:MS makes rank R wait MS milliseconds inside each timed round.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist

from efa_training.runtime.distributed import Runtime
from efa_training.runtime.metrics import peak_tflops

SIZE = {"cuda": 8192, "xla": 4096, "cpu": 256}  # matrix side: long enough to fill the device, short on CPU
MATMULS_PER_ROUND = {"cuda": 10, "xla": 10, "cpu": 4}
ROUNDS = 5


def measure(rt: Runtime) -> float:
    """This rank's best TFLOPS over ROUNDS rounds of square matmuls."""
    dtype = torch.float32 if rt.device_type == "cpu" else torch.bfloat16
    n, count = SIZE[rt.device_type], MATMULS_PER_ROUND[rt.device_type]
    a = torch.randn(n, n, device=rt.device, dtype=dtype)
    b = torch.randn(n, n, device=rt.device, dtype=dtype)
    delay = _test_delay_seconds(rt.rank)
    best = float("inf")
    for round_ in range(ROUNDS + 1):  # the first round warms up (kernels chosen, clocks raised)
        _sync(rt)
        start = time.perf_counter()
        for _ in range(count):
            a @ b
        _sync(rt)
        time.sleep(delay)
        if round_:
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 * count / best / 1e12


def check(rt: Runtime, min_of_median: float) -> tuple[dict, list[str]]:
    """Every rank's TFLOPS and host (gathered), the group's median, and the failure line of each slow rank."""
    own = measure(rt)
    everyone: list[list] = [[] for _ in range(rt.world_size)]
    dist.all_gather_object(everyone, [own, socket.gethostname()])
    tflops = [float(value) for value, _ in everyone]
    median = statistics.median(tflops)
    peak = peak_tflops(torch.cuda.get_device_name(rt.device)) if rt.device_type == "cuda" else None
    report = {
        "tflops_by_rank": [round(value, 3) for value in tflops],
        "median_tflops": round(median, 3),
        "min_of_median": min_of_median,
        "peak_tflops": peak,
        "median_of_peak": round(median / peak, 3) if peak else None,
    }
    failures = [
        f"compute: rank {rank} on {host} reached {value:.3g} TFLOPS, under {min_of_median:g} of the group's median "
        f"{median:.3g}: a slow accelerator"
        for rank, (value, host) in enumerate(everyone)
        if min_of_median > 0 and value < min_of_median * median
    ]
    return report, failures


def _sync(rt: Runtime) -> None:
    if rt.device_type == "cuda":
        torch.cuda.synchronize(rt.device)
    elif rt.xm is not None:
        rt.xm.mark_step()
        rt.xm.wait_device_ops()


def _test_delay_seconds(rank: int) -> float:
    """SANITY_TEST_SLOW_COMPUTE=R:MS (tests only): this rank's wait inside each timed round, 0 for the others."""
    slow, _, ms = os.environ.get("SANITY_TEST_SLOW_COMPUTE", "").partition(":")
    return float(ms) / 1000 if slow == str(rank) and ms else 0.0
