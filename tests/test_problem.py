"""Problem validation and the paged workload that make_workload builds (CPU only)."""

import pytest
import torch

from mla_lab.core.problem import D_QK, D_V, POISON_PAGE_ID, Problem, Workload, gather_kv, make_workload

# ---- Problem ------------------------------------------------------------------


@pytest.mark.parametrize("kw, words", [
    (dict(streams=0), "streams, q_len and heads must be >= 1"),
    (dict(q_len=0), "streams, q_len and heads must be >= 1"),
    (dict(heads=0), "streams, q_len and heads must be >= 1"),
    (dict(heads=-3), "streams, q_len and heads must be >= 1"),
    (dict(page_size=0), "page_size must be >= 1"),
    (dict(streams=3, prefix=(1, 2)), "2 prefixes given for 3 streams"),
    (dict(streams=1, prefix=(1, 2)), "2 prefixes given for 1 streams"),
    (dict(streams=2, prefix=(5, -1)), "prefix lengths must be >= 0"),
    (dict(prefix=-1), "prefix lengths must be >= 0"),
])
def test_bad_problems_raise(kw, words):
    with pytest.raises(ValueError, match=words):
        Problem(**kw)


def test_kv_lens_and_pages_per_stream():
    p = Problem(streams=3, q_len=9, heads=2, prefix=(0, 7, 100), page_size=16)
    # kv_len = prefix + q_len: the draft's own keys are in the cache.
    assert p.prefixes == (0, 7, 100)
    assert p.kv_lens == (9, 16, 109)
    # ceil(9/16) = 1, ceil(16/16) = 1 (exactly one full page), ceil(109/16) = 7 (6*16 = 96 < 109 <= 112)
    assert p.pages_per_stream == (1, 1, 7)
    # One int prefix is shared by every stream.
    q = Problem(streams=4, q_len=1, prefix=5, page_size=64)
    assert q.prefixes == (5, 5, 5, 5) and q.kv_lens == (6,) * 4 and q.pages_per_stream == (1,) * 4
    # Pages of 1 token: one page per token.
    assert Problem(streams=2, q_len=3, prefix=(4, 0), page_size=1).pages_per_stream == (7, 3)


def test_with_and_label():
    p = Problem(streams=3, q_len=2, heads=5, prefix=(1, 2, 3), page_size=16, scattered=False)
    assert p.label() == "B3 T2 H5 prefix1/2/3 page16c"
    q = p.with_(page_size=1, scattered=True, prefix=(1, 2, 3))
    assert q.label() == "B3 T2 H5 prefix1/2/3 page1s" and p.page_size == 16
    with pytest.raises(ValueError):
        p.with_(streams=2)  # 3 prefixes no longer fit 2 streams


# ---- make_workload: the block table --------------------------------------------

LAYOUTS = [
    Problem(streams=3, q_len=5, heads=2, prefix=(0, 11, 40), page_size=1, scattered=True),
    Problem(streams=3, q_len=5, heads=2, prefix=(0, 11, 40), page_size=16, scattered=True),
    Problem(streams=2, q_len=1, heads=1, prefix=(70, 3), page_size=64, scattered=True),
    Problem(streams=3, q_len=5, heads=2, prefix=(0, 11, 40), page_size=16, scattered=False),
    Problem(streams=1, q_len=9, heads=1, prefix=23, page_size=1, scattered=False),
]


def _used_ids(w: Workload) -> list[int]:
    """The page ids of the used block-table slots, stream after stream."""
    ids = []
    for b, n in enumerate(w.problem.pages_per_stream):
        ids += w.block_table[b, :n].tolist()
    return ids


@pytest.mark.parametrize("p", LAYOUTS, ids=lambda p: p.label())
def test_block_table_layout(p):
    spare_pages, spare_slots = 2, 1
    w = make_workload(p, seed=3, spare_pages=spare_pages, spare_table_slots=spare_slots)
    need = p.pages_per_stream
    num_pages = sum(need) + spare_pages
    assert w.kv_cache.shape == (num_pages, p.page_size, D_QK)
    assert w.block_table.shape == (p.streams, max(need) + spare_slots)
    assert w.block_table.dtype == torch.int32 and w.kv_lens.dtype == torch.int32
    assert w.kv_lens.tolist() == list(p.kv_lens)
    ids = _used_ids(w)
    assert len(ids) == sum(need)
    assert len(set(ids)) == len(ids), "a page is given to two slots"
    assert all(0 <= i < num_pages for i in ids)
    if p.scattered:
        # The used ids and the spare pages together are a random permutation of
        # the pool: the used ids are not simply 0, 1, 2, ... (the probability that
        # randperm leaves them in order is 1/n!, for n >= 5 here).
        assert ids != list(range(len(ids)))
    else:
        assert ids == list(range(len(ids)))


@pytest.mark.parametrize("poison, fill", [(True, POISON_PAGE_ID), (False, 0)])
def test_unused_slots(poison, fill):
    p = Problem(streams=3, q_len=2, heads=1, prefix=(1, 30, 14), page_size=8)
    w = make_workload(p, poison=poison, spare_table_slots=2)
    # pages: ceil(3/8) = 1, ceil(32/8) = 4, ceil(16/8) = 2; table width 4 + 2 = 6
    assert p.pages_per_stream == (1, 4, 2) and w.block_table.shape == (3, 6)
    for b, n in enumerate(p.pages_per_stream):
        unused = w.block_table[b, n:]
        assert len(unused) == 6 - n
        assert (unused == fill).all(), (b, unused)
    assert w.poisoned is poison


def _expected_nan_mask(w: Workload) -> torch.Tensor:
    """[num_pages, page_size]: True where no stream has a valid token."""
    P = w.problem.page_size
    valid = torch.zeros(w.kv_cache.shape[:2], dtype=torch.bool)
    for b, L in enumerate(w.problem.kv_lens):
        for pos in range(L):  # token pos of stream b sits in slot pos % P of page table[pos // P]
            valid[int(w.block_table[b, pos // P]), pos % P] = True
    return ~valid


@pytest.mark.parametrize("p", LAYOUTS, ids=lambda p: p.label())
def test_poison_exactly_where_no_kernel_may_read(p):
    w = make_workload(p, seed=11, poison=True, spare_pages=3)
    nan = torch.isnan(w.kv_cache.float())  # [pages, P, 576]
    expect = _expected_nan_mask(w)
    # A slot is either all NaN (all 576 values) or has no NaN at all.
    assert torch.equal(nan.all(-1), expect)
    assert torch.equal(nan.any(-1), expect)
    # The spare pages (not in any used slot) are NaN throughout.
    spare = sorted(set(range(w.kv_cache.shape[0])) - set(_used_ids(w)))
    assert len(spare) == 3 and nan[spare].all()
    # Per stream: its last page is NaN exactly past its length.
    for b, L in enumerate(p.kv_lens):
        n = p.pages_per_stream[b]
        last = int(w.block_table[b, n - 1])
        tail = L - (n - 1) * p.page_size  # valid slots in the last page
        assert not nan[last, :tail].any() and nan[last, tail:].all()
    assert not torch.isnan(w.q.float()).any()


def test_no_poison_no_nan():
    p = Problem(streams=2, q_len=3, heads=2, prefix=(5, 40), page_size=16)
    w = make_workload(p, poison=False)
    assert not torch.isnan(w.kv_cache.float()).any()
    assert (w.block_table[0, p.pages_per_stream[0]:] == 0).all()


def test_seed_and_dtype():
    p = Problem(streams=2, q_len=3, heads=2, prefix=(5, 40), page_size=16)
    a, b, c = make_workload(p, seed=7), make_workload(p, seed=7), make_workload(p, seed=8)
    assert torch.equal(a.q, b.q) and torch.equal(a.block_table, b.block_table)
    assert torch.equal(torch.nan_to_num(a.kv_cache.float()), torch.nan_to_num(b.kv_cache.float()))
    assert not torch.equal(a.q, c.q)
    assert a.q.shape == (2, 3, 2, D_QK) and a.q.dtype == torch.bfloat16 and a.kv_cache.dtype == torch.bfloat16
    f = make_workload(p, seed=7, dtype=torch.float32)
    assert f.q.dtype == torch.float32 and f.kv_cache.dtype == torch.float32
    # args(): the order every op takes
    q, kv, bt, lens, scale = a.args()
    assert q is a.q and kv is a.kv_cache and bt is a.block_table and lens is a.kv_lens and scale == p.scale


# ---- gather_kv round trip -------------------------------------------------------


@pytest.mark.parametrize("p", LAYOUTS, ids=lambda p: p.label())
def test_gather_kv_reads_what_was_written_through_the_table(p):
    w = make_workload(p, seed=5, poison=True)
    P = p.page_size
    # Write a known value into each stream's token slots through the block table:
    # element 0 = stream + 1, element 1 = position, element 2 = -(position % 7).
    # All are small integers, exact in bf16 (8 significant bits: up to 256).
    for b, L in enumerate(p.kv_lens):
        for pos in range(L):
            page, slot = int(w.block_table[b, pos // P]), pos % P
            w.kv_cache[page, slot, :3] = torch.tensor([b + 1, pos, -(pos % 7)], dtype=torch.bfloat16)
    for b, L in enumerate(p.kv_lens):
        rows = gather_kv(w, stream=b)
        assert rows.shape == (L, D_QK)
        assert rows[:, 0].tolist() == [b + 1] * L
        assert rows[:, 1].tolist() == list(range(L))
        assert rows[:, 2].tolist() == [-(i % 7) for i in range(L)]
        assert not torch.isnan(rows.float()).any(), "gather_kv read a poisoned slot"
        # The explicit form (cache, table, stream, length) agrees, for a shorter length too.
        part = gather_kv(w.kv_cache, w.block_table, stream=b, length=max(1, L - 2))
        assert torch.equal(part, rows[:max(1, L - 2)])
        via_lens = gather_kv(w.kv_cache, w.block_table, stream=b, kv_lens=w.kv_lens)
        assert torch.equal(via_lens, rows)


def test_new_outputs():
    p = Problem(streams=3, q_len=1, heads=5, prefix=(0, 3, 9), page_size=1)
    w = make_workload(p)
    out, lse = w.new_outputs()
    assert out.shape == (3, 1, 5, D_V) and out.dtype == torch.bfloat16
    assert lse.shape == (3, 1, 5) and lse.dtype == torch.float32
    assert torch.isnan(out.float()).all() and torch.isnan(lse).all()
    out2, _ = w.new_outputs()
    assert out2.data_ptr() != out.data_ptr()  # fresh buffers each call
