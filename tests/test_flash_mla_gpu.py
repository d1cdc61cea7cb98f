"""mla_lab.flash_mla on a GPU: the fp32 reference for every stage the GPU runs, FlashMLA's own answers on 32
shapes (where `import flash_mla` works: build it as docs/benchmark.md's "Peers" says), CUDA-graph replays with lengths
and tables that change, and the host time it adds to the bare op.  `scripts/gpu_session.sh flashmla_compat`
runs this file."""

import statistics
import time

import pytest
import torch

from conftest import HAS_GPU, needs_gpu

from mla_lab.core import stages
from mla_lab.core.verify import DEFAULT_TOL, compare
from mla_lab.flash_mla import fastest_stage, flash_mla_with_kvcache, get_mla_metadata

pytestmark = [needs_gpu, pytest.mark.gpu]

SCALE = 192 ** -0.5


def _cc():
    return torch.cuda.get_device_capability() if HAS_GPU else (0, 0)


def flashmla_reference(q, k_cache, block_table, cache_seqlens, causal, scale):
    """FlashMLA's documented semantics in fp32 on the GPU: causal masks with tril(diagonal=s_k - s_q);
    out (b, s_q, h_q, 512), lse (b, h_q, s_q)."""
    b, s_q, h_q, _ = q.shape
    page = k_cache.shape[1]
    out = torch.empty(b, s_q, h_q, 512, device=q.device)
    lse = torch.empty(b, h_q, s_q, device=q.device)
    for i, s_k in enumerate(cache_seqlens.tolist()):
        pos = torch.arange(s_k, device=q.device)
        k = k_cache[block_table[i].long()[pos // page], pos % page, 0].float()
        scores = torch.einsum("shd,kd->hsk", q[i].float(), k) * scale
        if causal:
            seen = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(diagonal=s_k - s_q)
            scores = scores.masked_fill(~seen, float("-inf"))
        lse[i] = scores.logsumexp(-1)
        out[i] = (scores.softmax(-1) @ k[:, :512]).transpose(0, 1)
    return out, lse


def inputs(b, s_q, h_q, lens, page, seed=0, extra_pages=1):
    """FlashMLA's layouts: k_cache (blocks, page, 1, 576), a scattered block table with a spare column."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = -(-max(lens) // page) + extra_pages
    blocks = b * width
    k_cache = torch.randn(blocks, page, 1, 576, generator=g, device="cuda").bfloat16()
    block_table = torch.randperm(blocks, generator=g, device="cuda").to(torch.int32).view(b, width)
    q = torch.randn(b, s_q, h_q, 576, generator=g, device="cuda").bfloat16()
    return q, k_cache, block_table, torch.tensor(lens, dtype=torch.int32, device="cuda")


def check(out, lse, ref_out, ref_lse, label="", tol=DEFAULT_TOL):
    c = compare(out, lse.transpose(1, 2), ref_out, ref_lse.transpose(1, 2), label=label, tol=tol)
    assert c.ok, c


def test_it_runs_the_fastest_stage_of_this_gpu():
    q, k_cache, block_table, lens = inputs(1, 2, 8, [100], 16)
    meta, _ = get_mla_metadata()
    flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, None, softmax_scale=SCALE, causal=True)
    assert meta.stage is fastest_stage(*_cc())


SHAPES = [(1, 1, 16, [777], 64, False), (2, 2, 32, [3000, 20000], 64, True), (3, 9, 8, [9, 100, 4000], 16, True),
          (4, 4, 128, [777, 5000, 30001, 65], 64, True), (2, 3, 16, [50, 1000], 1, True),
          (2, 5, 16, [200, 2000], 37, False), (8, 16, 64, [16384] * 8, 64, True), (1, 9, 64, [65536], 32, True)]


@pytest.mark.parametrize("stage", [s.id for s in stages.cuda_stages() if s.runs_on(*_cc()) and s.id != "naive"]
                         + ["triton", None])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"b{s[0]}-sq{s[1]}-h{s[2]}-p{s[4]}-{'causal' if s[5] else 'all'}")
def test_equals_the_reference(stage, shape):
    b, s_q, h_q, lens, page, causal = shape
    if stage in ("flash_ht8",) and max(lens) > 4096:
        pytest.skip("a block walks each row's whole cache: long calls take too long")
    q, k_cache, block_table, cache_seqlens = inputs(b, s_q, h_q, lens, page)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, None, None, softmax_scale=SCALE,
                                      causal=causal, stage=stage)
    assert out.shape == (b, s_q, h_q, 512) and lse.shape == (b, h_q, s_q) and lse.is_contiguous()
    check(out, lse, *flashmla_reference(q, k_cache, block_table, cache_seqlens, causal, SCALE), label=str(shape))


# 32 shapes, FlashMLA's pages of 64: streams 1 and 8, s_q 1 and 9 (plain decode and a draft), 16 and 128 heads,
# prefixes 1000 and 20000 (uneven across streams), causal or not.
FLASHMLA_SHAPES = [(b, s_q, h, prefix, causal) for b in (1, 8) for s_q in (1, 9) for h in (16, 128)
                   for prefix in (1000, 20000) for causal in (True, False)]


@pytest.fixture(scope="module")
def flash_mla():
    fm = pytest.importorskip("flash_mla", reason="FlashMLA is not importable (docs/benchmark.md, 'Peers': build it, put it on "
                                                 "PYTHONPATH)")
    if _cc() != (9, 0):
        pytest.skip("FlashMLA's dense decode runs on sm_90 here")
    return fm


def test_there_are_32_flashmla_shapes():
    assert len(FLASHMLA_SHAPES) == 32 and len(set(FLASHMLA_SHAPES)) == 32


@pytest.mark.parametrize("shape", FLASHMLA_SHAPES, ids=lambda s: "b{}-sq{}-h{}-pre{}-{}".format(*s[:4], "causal" if s[4]
                                                                                             else "all"))
def test_equals_flashmla(flash_mla, shape):
    b, s_q, h_q, prefix, causal = shape
    lens = [prefix + s_q + 37 * i for i in range(b)]
    q, k_cache, block_table, cache_seqlens = inputs(b, s_q, h_q, lens, 64, seed=sum(lens))
    theirs_meta, theirs_splits = flash_mla.get_mla_metadata(cache_seqlens, s_q * h_q, 1)  # either of its conventions
    ref_out, ref_lse = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, theirs_meta,
                                                        theirs_splits, softmax_scale=SCALE, causal=causal)
    for meta, splits in (get_mla_metadata(), get_mla_metadata(cache_seqlens, s_q * h_q, 1)):
        out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, splits,
                                          softmax_scale=SCALE, causal=causal)
        assert out.shape == ref_out.shape and out.dtype == ref_out.dtype
        assert lse.shape == ref_lse.shape and lse.dtype == ref_lse.dtype and lse.stride() == ref_lse.stride()
        check(out, lse, ref_out.float(), ref_lse, label=f"FlashMLA {shape}", tol=2 * DEFAULT_TOL)  # two bf16 outs
    check(out, lse, *flashmla_reference(q, k_cache, block_table, cache_seqlens, causal, SCALE), label=str(shape))


@pytest.mark.parametrize("convention", ["object", "older"])
@pytest.mark.parametrize("page, causal", [(64, True), (16, True), (64, False)])
def test_graph_replays_follow_lengths_and_tables(convention, page, causal):
    """Captured once; lengths and tables rewritten in place before each replay; each replay equals an eager call
    bit for bit (same split count) and the reference."""
    b, s_q, h_q, width = 4, 3, 16, 40
    q, k_cache, block_table, lens = inputs(b, s_q, h_q, [width * page - 1] * b, page, extra_pages=0)
    meta = get_mla_metadata() if convention == "object" else get_mla_metadata(lens, s_q * h_q, 1)
    call = lambda: flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, *meta, softmax_scale=SCALE,  # noqa: E731
                                          causal=causal)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for step in range(6):
        new_lens = torch.randint(s_q, width * page + 1, (b,), generator=gen, device="cuda", dtype=torch.int32)
        new_table = torch.randperm(k_cache.shape[0], generator=gen, device="cuda")[:b * width].to(torch.int32)
        lens.copy_(new_lens)
        block_table.copy_(new_table.view(b, width))
        graph.replay()
        eager_out, eager_lse = call()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), step
        check(out, lse, *flashmla_reference(q, k_cache, block_table, lens, causal, SCALE), label=f"replay {step}")


def _host_us(fn, calls=200, repeats=15) -> float:
    """Median host time of one call, from batches of calls issued without waiting (the GPU's queue holds them)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def test_host_overhead_over_the_bare_op_is_at_most_5_us():
    q, k_cache, block_table, lens = inputs(2, 2, 16, [300, 500], 64)
    meta, _ = get_mla_metadata()
    flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, None, softmax_scale=SCALE, causal=True)
    st, ns = meta.stage, meta.splits
    op = getattr(torch.ops.mla_lab, st.id)
    kv = k_cache.select(2, 0)
    out, lse = torch.empty(2, 2, 16, 512, dtype=torch.bfloat16, device="cuda"), torch.empty(2, 16, 2, device="cuda")
    lse_view = lse.transpose(1, 2)
    if st.splits:
        bare = lambda: op(q, kv, block_table, lens, SCALE, ns, out, lse_view)  # noqa: E731
    else:
        bare = lambda: op(q, kv, block_table, lens, SCALE, out, lse_view)  # noqa: E731
    ours = lambda: flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, None,  # noqa: E731
                                         softmax_scale=SCALE, causal=True)
    _host_us(bare, repeats=3), _host_us(ours, repeats=3)  # warm
    overhead = min(_host_us(ours) - _host_us(bare) for _ in range(3))
    print(f"{st.id}: flash_mla_with_kvcache adds {overhead:.2f} us of host time to the bare op")
    assert overhead <= 5.0
