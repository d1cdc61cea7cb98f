"""Long graph replays and two CUDA streams at once: what a serving engine does to a kernel that a test grid does not.

* :func:`soak` captures one verify call in a CUDA graph and replays it many
  times, changing the lengths and the block table in place between replays (as
  an engine does between decode steps).  Every ``compare_every``-th replay is
  compared with an eager call on the same inputs and with the fp32 reference;
  the memory PyTorch holds is recorded before the first replay and after the last.
* :func:`concurrency` runs two stages on two workloads on two CUDA streams at
  the same time, many calls each, and compares the last answers with the ones
  the same calls gave one after the other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..core.problem import POISON_PAGE_ID, D_QK, Problem, Workload, make_workload
from ..core.stages import Stage
from ..core.verify import DEFAULT_TOL, compare

TOLERANCE = {"triton": 3e-3}

# The soak's shape: 4 streams, q_len 9, 16 heads, pages of 16, block tables of 32
# pages (up to 512 tokens per stream), 8 sets of lengths and tables.
SOAK_STREAMS, SOAK_Q_LEN, SOAK_HEADS, SOAK_PAGE, SOAK_TABLE_PAGES, SOAK_VARIANTS = 4, 9, 16, 16, 32, 8


@dataclass(frozen=True)
class SoakShape:
    streams: int = SOAK_STREAMS
    q_len: int = SOAK_Q_LEN
    heads: int = SOAK_HEADS
    page: int = SOAK_PAGE
    table_pages: int = SOAK_TABLE_PAGES
    variants: int = SOAK_VARIANTS
    num_splits: int | None = None  # None: the stage's own count

    def describe(self) -> str:
        blocks = "" if self.num_splits is None else f", {self.num_splits} blocks"
        return (f"{self.streams} streams, q_len {self.q_len}, {self.heads} heads, pages of {self.page}, tables of "
                f"{self.table_pages} pages, {self.variants} sets of lengths and tables{blocks}")


SOAK = SoakShape()
# The Hopper stages' other main kernels, which the shape above does not reach (144 pairs with pages of 16, 8 tiles a
# stream): 64 pairs a stream, pages of 64, and 8 blocks, so that the table's 4 x 32 tiles give each block the seesaw's
# 15 (stages 12 and 13) or, in units of 80 pairs, the tensor copy's 12 (stage 11).  Its plan, and which units it cuts,
# change with every set of lengths.
SEESAW_SOAK = SoakShape(streams=4, q_len=8, heads=8, page=64, table_pages=32, num_splits=8)

CONCURRENT_A = Problem(streams=3, q_len=9, heads=16, prefix=(1500, 700, 3000), page_size=16)
CONCURRENT_B = Problem(streams=2, q_len=4, heads=64, prefix=(2000, 333), page_size=1)


def _variants(num_pages: int, gen: torch.Generator, device, shape: SoakShape = SOAK):
    """Lengths and scattered tables for the soak: each stream its own pages, unused slots poisoned."""
    out = []
    cap = shape.table_pages * shape.page
    for _ in range(shape.variants):
        lens = torch.randint(shape.q_len, cap + 1, (shape.streams,), generator=gen, dtype=torch.int32)
        table = torch.full((shape.streams, shape.table_pages), POISON_PAGE_ID, dtype=torch.int32)
        order = torch.randperm(num_pages, generator=gen).to(torch.int32)
        used = 0
        for b, L in enumerate(lens.tolist()):
            n = -(-L // shape.page)
            table[b, :n] = order[used:used + n]
            used += n
        out.append((table.to(device), lens.to(device)))
    return out


def _memory() -> dict:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return dict(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(), device_free=free)


def soak(st: Stage, replays: int, compare_every: int = 1000, *, seed: int = 0, shape: SoakShape = SOAK) -> dict:
    from ..core.ops import attention, default_num_splits, runner
    from ..core.reference import reference_attention
    from ..measure.timing import cuda_graph

    gen = torch.Generator().manual_seed(seed)
    num_pages = shape.streams * shape.table_pages + 8
    problem = Problem(streams=shape.streams, q_len=shape.q_len, heads=shape.heads, prefix=0, page_size=shape.page)
    q = torch.randn(shape.streams, shape.q_len, shape.heads, D_QK, generator=gen).to(torch.bfloat16).cuda()
    kv = torch.randn(num_pages, shape.page, D_QK, generator=gen).to(torch.bfloat16).cuda()
    variants = _variants(num_pages, gen, "cuda", shape)
    refs = [reference_attention(q, kv, t, l, problem.scale) for t, l in variants]
    table, lens = variants[0][0].clone(), variants[0][1].clone()  # what the graph reads; rewritten in place
    w = Workload(problem=problem, q=q, kv_cache=kv, block_table=table, kv_lens=lens)
    ns = None
    if st.splits:
        ns = shape.num_splits if shape.num_splits is not None else default_num_splits(st, q, kv, table)
    call = runner(st, w, num_splits=ns)
    graph = cuda_graph(call)
    order = torch.randint(0, shape.variants, (replays,), generator=gen).tolist()
    tol = TOLERANCE.get(st.id, DEFAULT_TOL)

    def compare_now(v: int):
        """(vs eager, vs reference, bit-equal to eager) for the replay just made on variant v."""
        torch.cuda.synchronize()
        got_out, got_lse = call.out.clone(), call.lse.clone()
        eager_out, eager_lse = attention(st, q, kv, variants[v][0], variants[v][1], problem.scale, num_splits=ns)
        same = torch.equal(got_out, eager_out) and torch.equal(got_lse, eager_lse)
        return (compare(got_out, got_lse, eager_out, eager_lse, tol=tol), compare(got_out, got_lse, *refs[v], tol=tol),
                same)

    # One comparison before the count starts, so that the allocator already holds what comparisons use.
    table.copy_(variants[0][0])
    lens.copy_(variants[0][1])
    graph.replay()
    compare_now(0)
    mem_start = _memory()
    compared = mismatches = bitwise = 0
    first = []
    t0 = time.perf_counter()
    for i, v in enumerate(order):
        table.copy_(variants[v][0])
        lens.copy_(variants[v][1])
        graph.replay()
        if (i + 1) % compare_every:
            continue
        vs_eager, vs_ref, same = compare_now(v)
        compared += 1
        bitwise += int(same)
        if not (vs_eager.ok and vs_ref.ok):
            mismatches += 1
            if len(first) < 3:
                first.append(f"replay {i + 1} (lengths {variants[v][1].tolist()}): vs eager {vs_eager}; vs reference {vs_ref}")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    mem_end = _memory()
    del graph
    return dict(stage=st.id, replays=replays, compared=compared, mismatches=mismatches, bitwise_equal=bitwise,
                num_splits=ns, seconds=round(seconds, 2), memory_start=mem_start, memory_end=mem_end,
                memory_growth=max(0, mem_end["allocated"] - mem_start["allocated"])
                + max(0, mem_end["reserved"] - mem_start["reserved"]),
                first_mismatches=first,
                shape=shape.describe())


def concurrency(a: Stage, b: Stage, iterations: int, *, seed: int = 0) -> dict:
    """Stage ``a`` on workload A and stage ``b`` on workload B, on two streams at once."""
    from ..core.ops import attention, default_num_splits
    from ..core.reference import reference_attention

    wa = make_workload(CONCURRENT_A, device="cuda", seed=seed, poison=True)
    wb = make_workload(CONCURRENT_B, device="cuda", seed=seed + 1, poison=True)
    ns_a = default_num_splits(a, wa.q, wa.kv_cache, wa.block_table) if a.splits else None
    ns_b = default_num_splits(b, wb.q, wb.kv_cache, wb.block_table) if b.splits else None

    def both(outs, streams):
        for st, w, ns, (o, l), s in ((a, wa, ns_a, outs[0], streams[0]), (b, wb, ns_b, outs[1], streams[1])):
            with torch.cuda.stream(s):
                attention(st, *w.args(), out=o, lse=l, num_splits=ns, check=False)

    seq = [wa.new_outputs(), wb.new_outputs()]
    cur = torch.cuda.current_stream()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iterations):
        both(seq, (cur, cur))
    torch.cuda.synchronize()
    t_seq = time.perf_counter() - t0
    par = [wa.new_outputs(), wb.new_outputs()]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    s1.wait_stream(cur)
    s2.wait_stream(cur)
    t0 = time.perf_counter()
    for _ in range(iterations):
        both(par, (s1, s2))
    cur.wait_stream(s1)
    cur.wait_stream(s2)
    torch.cuda.synchronize()
    t_par = time.perf_counter() - t0
    equal = all(torch.equal(x, y) for (o1, l1), (o2, l2) in zip(seq, par) for x, y in ((o1, o2), (l1, l2)))
    refs = [reference_attention(*wa.args()), reference_attention(*wb.args())]
    checks = [compare(*par[i], *refs[i], tol=TOLERANCE.get(st.id, DEFAULT_TOL)) for i, st in enumerate((a, b))]
    return dict(stages=[a.id, b.id], iterations=iterations, equal_to_sequential=equal,
                match_reference=all(c.ok for c in checks), seconds_sequential=round(t_seq, 3),
                seconds_concurrent=round(t_par, 3), ok=equal and all(c.ok for c in checks),
                detail="; ".join(str(c) for c in checks if not c.ok))
