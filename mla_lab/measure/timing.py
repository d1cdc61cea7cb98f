"""Timing GPU calls honestly.

* ``triton.testing.do_bench``: warm-up, then many timed runs with CUDA events,
  and before each run it writes a 256 MB buffer, which evicts the L2 (so every
  run starts cold, as a real decode step does) and keeps the GPU's queue busy
  (so the host's launch latency hides behind it).  We take the median.
* Short calls are also timed as CUDA-graph replays: the launches of one call
  are recorded once and replayed as a unit, which is how serving engines run
  decode steps, and which removes the Python and dispatcher cost per launch.
* ``per_call_us``: calls back to back with no flush, CUDA events around many of
  them (``back_to_back_us`` replays a captured call that way).
"""

from __future__ import annotations

import statistics

import torch


def cuda_graph(fn, warmup_calls: int = 3) -> torch.cuda.CUDAGraph:
    """Capture ``fn`` (after warming it up on a side stream, as capture requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_calls):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def median_us(fn, *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn()`` in microseconds, L2 flushed before each run."""
    from triton.testing import do_bench

    return 1e3 * do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def events_us(fn, n: int) -> float:
    """Microseconds per call of ``n`` calls of ``fn`` issued back to back, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def per_call_us(fn, calls: int = 100, repeats: int = 5, warmup: int = 3) -> float:
    """Median over ``repeats`` of the time per call of ``calls`` calls issued back to back (no L2 flush)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(events_us(fn, calls) for _ in range(repeats))


def back_to_back_us(fn, *, calls: int = 200, rounds: int = 5) -> float:
    """Microseconds per call of ``fn`` captured in a graph and replayed ``calls`` times in a row, L2 not flushed.

    Each replay finds the L2 as the one before left it (its code, its inputs),
    so this is a call's cost in a loop of its own, beside :func:`time_call`'s
    cold one; the difference is what the flush costs the call.  The median of
    ``rounds`` rounds, each timed by two CUDA events around all of its replays.
    """
    if calls < 1 or rounds < 1:
        raise ValueError(f"need at least one call and one round, got calls={calls}, rounds={rounds}")
    return per_call_us(cuda_graph(fn).replay, calls=calls, repeats=rounds, warmup=min(calls, 20))


def time_call(fn, *, graph: bool, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    if graph:
        g = cuda_graph(fn)
        return median_us(g.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)
    return median_us(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)


def measure_ceilings(copy_bytes: int = 2 << 30, matmul_n: int = 8192) -> dict:
    """The two ceilings of the roofline, measured on this GPU now.

    Bandwidth: a device-to-device copy, counting bytes read plus written.
    Matrix rate: an ``n x n x n`` bf16 matmul on random data.
    """
    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_us = median_us(lambda: dst.copy_(src))
    del src, dst
    a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16)
    mm_us = median_us(lambda: a @ b)
    a32, b32 = a.float(), b.float()
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        mm32_us = median_us(lambda: a32 @ b32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    flop = 2.0 * matmul_n**3
    return {
        "copy_tbs": 2 * copy_bytes / copy_us / 1e6,
        "bf16_matmul_tflops": flop / mm_us / 1e6,
        "fp32_matmul_tflops": flop / mm32_us / 1e6,
        "copy_bytes": copy_bytes,
        "matmul_n": matmul_n,
    }
