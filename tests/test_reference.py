"""The fp32 reference against the textbook formula, its causal mask, and its input checks."""

import math

import pytest
import torch

from mla_lab.core.problem import D_V, Problem, make_workload
from mla_lab.core.reference import dense_attention_fp64, reference_attention, reference_for
from mla_lab.core.validate import InputError

SHAPES = [
    Problem(streams=1, q_len=1, heads=1, prefix=0, page_size=1, scattered=True),
    Problem(streams=1, q_len=9, heads=3, prefix=0, page_size=16, scattered=False),
    Problem(streams=1, q_len=1, heads=5, prefix=77, page_size=64, scattered=True),
    Problem(streams=3, q_len=4, heads=2, prefix=(0, 37, 13), page_size=1, scattered=True),
    Problem(streams=3, q_len=9, heads=4, prefix=(70, 5, 130), page_size=16, scattered=True),
    Problem(streams=2, q_len=17, heads=1, prefix=(3, 100), page_size=64, scattered=True),
]


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("p", SHAPES, ids=lambda p: p.label())
def test_fp32_reference_matches_dense_fp64(p):
    w = make_workload(p, seed=2, poison=True)
    out, lse = reference_attention(*w.args())
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert out.shape == (p.streams, p.q_len, p.heads, D_V) and lse.shape == (p.streams, p.q_len, p.heads)
    d_out, d_lse = dense_attention_fp64(*w.args())
    # Same bf16 inputs, fp32 vs fp64 arithmetic: only fp32 rounding separates them.
    assert rel_l2(out, d_out) < 1e-5
    assert float((lse.double() - d_lse).abs().max()) < 1e-5 * max(1.0, float(d_lse.abs().max()))


@pytest.mark.parametrize("p", SHAPES[2:5], ids=lambda p: p.label())
def test_fp64_reference_matches_dense_to_1e12(p):
    w = make_workload(p, seed=4, poison=True)
    out, lse = reference_attention(*w.args(), precision=torch.float64)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    d_out, d_lse = dense_attention_fp64(*w.args())
    assert rel_l2(out, d_out) < 1e-12
    assert float((lse - d_lse).abs().max()) < 1e-12


def test_chunk_invariance():
    # chunk 3 splits every stream into many online-softmax steps (and prefix 40 + 9 = 49
    # keys is not a multiple of 3); chunk 4096 takes each stream in one step.
    p = Problem(streams=3, q_len=9, heads=3, prefix=(40, 0, 17), page_size=16)
    w = make_workload(p, seed=8)
    a_out, a_lse = reference_attention(*w.args(), chunk=3)
    b_out, b_lse = reference_attention(*w.args(), chunk=4096)
    torch.testing.assert_close(a_out, b_out, rtol=5e-6, atol=5e-6)
    torch.testing.assert_close(a_lse, b_lse, rtol=5e-6, atol=5e-6)
    # and both are the fp64 answer to fp32 accuracy
    d_out, _ = dense_attention_fp64(*w.args())
    assert rel_l2(a_out, d_out) < 1e-5


@pytest.mark.parametrize("t", [0, 2, 5])
def test_causal_boundary(t):
    """Key prefix + t + 1 is visible to rows > t only: changing it changes exactly those rows."""
    prefix, T = 7, 7
    p = Problem(streams=1, q_len=T, heads=2, prefix=prefix, page_size=1, scattered=True)
    w = make_workload(p, seed=1)
    before_out, before_lse = reference_attention(*w.args(), chunk=4)
    key = prefix + t + 1  # row r sees keys 0 .. prefix + r, so this key is seen by rows r >= t + 1
    page = int(w.block_table[0, key])  # pages of 1 token: slot 0 of page table[key]
    w.kv_cache[page, 0] = (3 * torch.randn(576, generator=torch.Generator().manual_seed(t))).bfloat16()
    after_out, after_lse = reference_attention(*w.args(), chunk=4)
    # Rows <= t: the key is masked to -inf, exp(-inf) = 0 exactly: bit-identical.
    assert torch.equal(after_out[:, :t + 1], before_out[:, :t + 1])
    assert torch.equal(after_lse[:, :t + 1], before_lse[:, :t + 1])
    # Rows > t: every (row, head) changes.
    for r in range(t + 1, T):
        for h in range(2):
            assert not torch.equal(after_out[0, r, h], before_out[0, r, h]), (r, h)
            assert after_lse[0, r, h] != before_lse[0, r, h], (r, h)


def test_lse_and_out_by_hand():
    """One stream, 3 rows, 2 heads, prefix 4, pages of 16: the formula written out with Python floats."""
    p = Problem(streams=1, q_len=3, heads=2, prefix=4, page_size=16, scattered=False)
    w = make_workload(p, seed=12)
    out, lse = reference_attention(*w.args())
    # Contiguous pages: token j sits at page table[0, j // 16], slot j % 16.
    keys = [w.kv_cache[int(w.block_table[0, j // 16]), j % 16].double().tolist() for j in range(p.kv_lens[0])]
    for t in range(3):
        for h in range(2):
            q = w.q[0, t, h].double().tolist()
            visible = range(p.prefix + t + 1)  # keys 0 .. prefix + t
            s = [p.scale * math.fsum(a * b for a, b in zip(q, keys[j])) for j in visible]
            m = max(s)
            total = math.fsum(math.exp(x - m) for x in s)
            expect_lse = m + math.log(total)  # log sum_j exp(s_j)
            assert abs(float(lse[0, t, h]) - expect_lse) < 1e-5, (t, h)
            for d in (0, 1, 255, 511):  # out = sum_j softmax_j * v_j[d]
                expect = math.fsum(math.exp(x - expect_lse) * keys[j][d] for j, x in zip(visible, s))
                assert abs(float(out[0, t, h, d]) - expect) < 1e-5, (t, h, d)


@pytest.mark.parametrize("p", SHAPES, ids=lambda p: p.label())
def test_never_reads_poisoned_slots(p):
    w = make_workload(p, seed=6, poison=True)
    out, lse = reference_for(w)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_poison_would_show():
    """The previous test can fail: reading one slot past a stream's length gives NaN."""
    p = Problem(streams=2, q_len=2, heads=1, prefix=(5, 20), page_size=16)  # kv_lens 7 and 22
    w = make_workload(p, seed=6, poison=True)
    lens = w.kv_lens.clone()
    lens[1] += 1  # token 22 is slot 6 of stream 1's second page: poisoned, and within capacity
    out, lse = reference_attention(w.q, w.kv_cache, w.block_table, lens, w.scale)
    assert torch.isfinite(out[0]).all()
    assert torch.isnan(out[1, -1]).all() and torch.isnan(lse[1, -1]).all()


# ---- check_contents through the reference --------------------------------------

def _w():
    # kv_lens (5+4, 20+4, 0+4) = (9, 24, 4); pages of 8: (2, 3, 1) pages; table width 3 + 1 = 4
    return make_workload(Problem(streams=3, q_len=4, heads=2, prefix=(5, 20, 0), page_size=8), seed=0)


def test_kv_len_beyond_capacity():
    w = _w()
    lens = w.kv_lens.clone()
    lens[1] = 4 * 8 + 1  # 33 tokens > 4 columns x 8
    with pytest.raises(InputError, match=r"stream 1 has kv_len 33, beyond its block table's capacity 4 pages x 8 = 32"):
        reference_attention(w.q, w.kv_cache, w.block_table, lens, w.scale)
    lens[1] = 32  # exactly the capacity: passes the capacity check, then its slot 3 holds the poison id
    with pytest.raises(InputError, match=r"block_table\[1, 3\] = 1073741824 is not a page of the pool"):
        reference_attention(w.q, w.kv_cache, w.block_table, lens, w.scale)


@pytest.mark.parametrize("bad", [-1, 8, 10**6])
def test_page_id_out_of_range_in_a_used_slot(bad):
    w = _w()
    num_pages = w.kv_cache.shape[0]  # 2 + 3 + 1 used + 2 spare = 8
    assert num_pages == 8
    bt = w.block_table.clone()
    bt[2, 0] = bad
    with pytest.raises(InputError, match=rf"reference_attention: block_table\[2, 0\] = {bad} is not a page of the pool \(0 .. 7\)"):
        reference_attention(w.q, w.kv_cache, bt, w.kv_lens, w.scale)


def test_unused_slots_are_not_checked():
    w = _w()
    bt = w.block_table.clone()
    bt[0, 2:] = -5  # stream 0 uses 2 pages; slots 2 and 3 are never read
    out, _ = reference_attention(w.q, w.kv_cache, bt, w.kv_lens, w.scale)
    assert torch.isfinite(out).all()


def test_kv_len_shorter_than_draft():
    w = _w()
    lens = w.kv_lens.clone()
    lens[2] = 3
    with pytest.raises(InputError, match=r"stream 2 has kv_len 3 < q_len 4"):
        reference_attention(w.q, w.kv_cache, w.block_table, lens, w.scale)


def test_reference_checks_metadata_but_not_device():
    w = _w()
    with pytest.raises(InputError, match="reference_attention: q must be bfloat16"):
        reference_attention(w.q.float(), w.kv_cache, w.block_table, w.kv_lens, w.scale)
    with pytest.raises(InputError, match="scale must be a finite positive number"):
        reference_attention(w.q, w.kv_cache, w.block_table, w.kv_lens, 0.0)
    # check=False skips the checks: a stream shorter than its draft then leaves its
    # row 0 with no visible key (prefix -1), and the answer there is NaN, not an error.
    lens = w.kv_lens.clone()
    lens[2] = 3
    out, _ = reference_attention(w.q, w.kv_cache, w.block_table, lens, w.scale, check=False)
    assert torch.isnan(out[2, 0]).all() and torch.isfinite(out[:2]).all()
