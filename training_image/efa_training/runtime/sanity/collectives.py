"""One collective at one message size: verified exactly, then timed, with the nccl-tests bandwidth definitions.

(github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)
  algbw = S / t, S = bytes of the full buffer (all_reduce: the tensor; all_gather: the gathered output;
          reduce_scatter: the input before scattering), t the slowest rank's time
  busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for all_gather and reduce_scatter

Test-only fault injection: SANITY_TEST_CORRUPT_RANK=R makes rank R add 1 to its contribution,
so the exact-verification failure path can be exercised; SANITY_TEST_SLOW_RANK=R:MS makes rank R wait MS
milliseconds before each timed call (a straggler every rank's timing must see).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from efa_training.runtime.distributed import Runtime

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def bus_bandwidth(op: str, algbw: float, world_size: int) -> float:
    return algbw * BUS_FACTOR[op](world_size)


def _sync(rt: Runtime) -> None:
    if rt.device_type == "cuda":
        torch.cuda.synchronize()
    elif rt.xm is not None:
        rt.xm.mark_step()
        rt.xm.wait_device_ops()


def _ramp(k: int, m: int) -> torch.Tensor:
    return torch.arange(k, dtype=torch.float32) % m


def _inputs(op: str, size_bytes: int, rt: Runtime) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(input, output buffer, expected output): small integers, so float32 sums are exact."""
    w, r = rt.world_size, rt.rank
    per_rank = max(1, size_bytes // 4 // (1 if op == "all_reduce" else w))
    rank_sum = w * (w + 1) / 2
    out: torch.Tensor | None = None
    if op == "all_reduce":
        x = _ramp(per_rank, 13) + (r + 1)
        expected = w * _ramp(per_rank, 13) + rank_sum
    elif op == "all_gather":
        x = _ramp(per_rank, 7) + (r + 1)
        expected = torch.cat([_ramp(per_rank, 7) + (q + 1) for q in range(w)])
        out = torch.empty(per_rank * w)
    else:
        x = _ramp(per_rank * w, 11) + (r + 1)
        expected = (w * _ramp(per_rank * w, 11) + rank_sum)[r * per_rank : (r + 1) * per_rank]
        out = torch.empty(per_rank)
    if os.environ.get("SANITY_TEST_CORRUPT_RANK") == str(r):
        x[0] += 1.0  # test-only: a wrong contribution from this rank
    return x.to(rt.device), None if out is None else out.to(rt.device), expected


def _run(op: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if op == "all_reduce" or out is None:
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
    result = result.cpu()
    correct = torch.equal(result, expected)
    # all_gather keeps each rank's contribution apart: its wrong chunks name the rank that sent bad data.
    chunks = zip(result.chunk(rt.world_size), expected.chunk(rt.world_size), strict=True)
    bad_sources = (
        [q for q, (got, want) in enumerate(chunks) if not torch.equal(got, want)]
        if op == "all_gather" and not correct
        else []
    )
    seconds = _timed(op, x, out, rt, warmup, iters)
    total_bytes = (out if op == "all_gather" and out is not None else x).numel() * 4
    algbw = total_bytes / seconds / 1e9
    return {
        "op": op,
        "size_bytes": total_bytes,
        "time_us": seconds * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": bus_bandwidth(op, algbw, rt.world_size),
        "correct": bool(correct),
        "wrong_data_from_ranks": bad_sources,
    }


def _timed(op: str, x: torch.Tensor, out: torch.Tensor | None, rt: Runtime, warmup: int, iters: int) -> float:
    """Seconds per call, of the slowest rank: the collective is as slow as its slowest rank."""
    for _ in range(warmup):
        _run(op, x, out)
    _sync(rt)
    delay = _test_delay_seconds(rt.rank)
    start = time.perf_counter()
    for _ in range(iters):
        if delay:
            time.sleep(delay)
        _run(op, x, out)  # all_reduce in place: values grow, the timing does not care
    _sync(rt)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=rt.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _test_delay_seconds(rank: int) -> float:
    """SANITY_TEST_SLOW_RANK=R:MS (tests only): this rank's wait before each timed call, 0 for the others."""
    slow, _, ms = os.environ.get("SANITY_TEST_SLOW_RANK", "").partition(":")
    return float(ms) / 1000 if slow == str(rank) and ms else 0.0
