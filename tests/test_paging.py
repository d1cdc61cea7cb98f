"""The paged cache's bookkeeping: appending, accepting and rolling back, defragmenting (CPU)."""

import random

import pytest
import torch

from mla_lab.serving.decode_loop import acceptance_loop
from mla_lab.serving.model_step import reference_attend
from mla_lab.core.paging import (SINK_PAGE, OutOfPages, PageTable, append_slots, gather_stream, move_pages,
                            plan_defragment)


def _pool(num_pages, page_size, layers=None):
    """A pool whose every row says where it is: value = page * 1000 + slot (+ layer * 1e6)."""
    shape = (num_pages, page_size, 576) if layers is None else (layers, num_pages, page_size, 576)
    pool = torch.zeros(shape, dtype=torch.float32)
    ids = torch.arange(num_pages)[:, None] * 1000 + torch.arange(page_size)[None, :]
    if layers is None:
        pool[...] = ids[..., None].float()
    else:
        pool[...] = (ids[None] + torch.arange(layers)[:, None, None] * 1_000_000)[..., None].float()
    return pool


def _scattered_table(seed=0, streams=4, page_size=4, num_pages=64):
    table = PageTable(num_pages, page_size, 16, streams, scatter_seed=seed)
    rng = random.Random(seed)
    for _ in range(6):  # streams grow in turns, so their pages interleave
        for b in range(streams):
            table.add_prefix(b, rng.randint(0, 5))
    table.release(1)  # a finished stream leaves holes
    table.add_prefix(1, 9)
    return table


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("layers", [None, 3])
def test_defragment_preserves_every_streams_keys(seed, layers):
    table = _scattered_table(seed)
    pool = _pool(table.num_pages, table.page_size, layers)
    stack = pool if layers else pool[None]
    before = [[gather_stream(p, table.pages[b], table.lengths[b]).clone() for b in range(table.streams)]
              for p in stack]
    assert not table.is_contiguous()  # the setup is fragmented
    old_pages = [list(ps) for ps in table.pages]
    plan = table.defragment(pool)
    assert table.is_contiguous()
    for i, p in enumerate(stack):
        for b in range(table.streams):
            assert torch.equal(gather_stream(p, table.pages[b], table.lengths[b]), before[i][b])
    used = [p for ps in table.pages for p in ps]
    assert len(used) == len(set(used)) == sum(len(ps) for ps in old_pages)
    assert SINK_PAGE not in used and SINK_PAGE not in table.free
    assert sorted(used + table.free) == list(range(1, table.num_pages))  # every page is used or free, once
    assert plan.moved == sum(o != n for ps_o, ps_n in zip(old_pages, table.pages) for o, n in zip(ps_o, ps_n))
    # the runs are packed from page 1, stream after stream
    assert used == list(range(1, 1 + len(used)))


def test_defragment_of_a_contiguous_table_moves_nothing():
    plan = plan_defragment([[1, 2, 3], [4, 5]], 8)
    assert plan.moved == 0 and plan.pages == [[1, 2, 3], [4, 5]] and plan.free == [6, 7]


def test_move_pages_handles_chains_and_cycles():
    pool = _pool(5, 2)
    move_pages(pool, [1, 2, 3, 4], [2, 1, 4, 3])  # two swaps: each move reads a page another writes
    assert pool[2, 0, 0] == 1000 and pool[1, 0, 0] == 2000 and pool[4, 1, 0] == 3001 and pool[3, 1, 0] == 4001
    assert pool[0, 0, 0] == 0


@pytest.mark.parametrize("pages, words", [
    ([[1, 2], [2]], "held twice"),
    ([[0, 1]], "reserved"),
    ([[1, 9]], "outside the pool"),
])
def test_plan_defragment_rejects_inconsistent_tables(pages, words):
    with pytest.raises(ValueError, match=words):
        plan_defragment(pages, 8)


def test_steps_accept_and_roll_back_by_length():
    table = PageTable(20, 4, 5, 2)
    table.add_prefix(0, 3)
    table.add_prefix(1, 8)
    assert [len(ps) for ps in table.pages] == [1, 2]
    assert table.begin_step(5) == [8, 13]  # lengths the kernels get: the draft included
    assert [len(ps) for ps in table.pages] == [2, 4]
    assert table.kv_lens().tolist() == [8, 13] and table.kv_lens(with_pending=False).tolist() == [3, 8]
    table.accept([2, 5])
    assert table.lengths == [5, 13] and table.pending == [0, 0]
    assert [len(ps) for ps in table.pages] == [2, 4]  # rolled-back rows keep their pages for the next step
    assert table.trim() == 0  # stream 0 still needs its second page (5 tokens)
    table.begin_step(5)
    table.accept([1, 1])
    assert table.lengths == [6, 14]
    # stream 0 had room for 10 tokens (3 pages), 6 need 2; stream 1 for 18 (5 pages), 14 need 4
    assert table.trim() == 2
    pages_before = sum(len(ps) for ps in table.pages) + len(table.free)
    table.release(0)
    assert table.pages[0] == [] and table.lengths[0] == 0
    assert sum(len(ps) for ps in table.pages) + len(table.free) == pages_before == 19


def test_page_table_refuses_what_it_cannot_hold():
    table = PageTable(4, 2, 2, 2)  # 3 usable pages
    with pytest.raises(OutOfPages, match="table has 2"):
        table.add_prefix(0, 5)
    table.add_prefix(0, 4)
    with pytest.raises(OutOfPages, match="no free page"):
        table.add_prefix(1, 3)
    table.begin_step(0)
    with pytest.raises(ValueError, match="cannot keep 1"):
        table.accept([1, 0])
    with pytest.raises(ValueError, match="keep has 1 entries"):
        table.accept([0])


def test_block_table_and_scattered_allocation():
    a = PageTable(50, 1, 10, 2, scatter_seed=1)
    b = PageTable(50, 1, 10, 2)
    for t in (a, b):
        t.add_prefix(0, 4)
        t.add_prefix(1, 3)
    assert b.pages == [[1, 2, 3, 4], [5, 6, 7]]
    assert a.pages != b.pages and not a.is_contiguous()
    bt = a.block_table(width=6)
    assert bt.dtype == torch.int32 and bt.shape == (2, 6)
    assert bt[0, :4].tolist() == a.pages[0] and bt[1, 3:].tolist() == [SINK_PAGE] * 3


def test_append_slots_by_hand():
    P = 4
    table = torch.tensor([[7, 2, 9], [5, 0, 0], [3, 8, 40], [6, 1, -3]], dtype=torch.int32)
    # stream 0: 10 tokens after the append, q_len 3: positions 7, 8, 9 -> pages table[0][1], [0][2], [0][2]
    # stream 1: length 0 (a padded stream): every row to the sink
    # stream 2: positions 9..11 -> page 40, outside a pool of 12 pages: sink
    # stream 3: positions 5..7 -> column 1, page 1: slots 1*4+1 .. 1*4+3; length 13 would pass the table
    lens = torch.tensor([10, 0, 12, 8], dtype=torch.int32)
    slots, pos = append_slots(table, lens, 3, P, 12)
    assert slots.view(4, 3).tolist() == [[2 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1], [0, 0, 0], [0, 0, 0], [5, 6, 7]]
    assert pos.view(4, 3).tolist() == [[7, 8, 9], [0, 0, 0], [9, 10, 11], [5, 6, 7]]
    slots, _ = append_slots(table, torch.tensor([10, 3, 13, 13], dtype=torch.int32), 2, P, 12)
    # stream 3 at positions 11, 12: 11 is column 2 (page -3: sink), 12 is past the table (sink)
    assert slots.view(4, 2)[3].tolist() == [0, 0]
    assert slots.view(4, 2)[1].tolist() == [5 * 4 + 1, 5 * 4 + 2]


@pytest.mark.slow
def test_acceptance_loop_on_cpu():
    """100 verify steps of the small model through the fp32 reference attention, with a padded bucket
    and defragmentation every 25 steps: cache exact and output within tolerance at every step."""
    r = acceptance_loop(reference_attend, steps=100, streams=3, bucket_streams=4, q_len=4, prefix=(5, 40, 17),
                        page_size=4, defrag_every=25, seed=2)
    assert r.steps == 100 and r.defrags == 4
    assert r.cache_checks == 100 * 2 * 3 + 4 * 2 * 3
    assert 3 * 100 <= r.accepted < r.appended == 3 * 4 * 100
    assert r.final_lengths == [p + k for p, k in zip((5, 40, 17), _kept_per_stream(2, 100, 3, 4))]
    assert r.max_rel_err < 3e-2


def _kept_per_stream(seed, steps, streams, q_len):
    rng = random.Random(seed)
    kept = [0] * streams
    for _ in range(steps):
        for b in range(streams):
            kept[b] += rng.randint(1, q_len)
    return kept


def test_acceptance_loop_catches_a_bookkeeping_slip(monkeypatch):
    """A table that keeps one row more than it was told (a rejected row left visible) must be caught."""
    real_accept = PageTable.accept

    def sloppy(self, keep):
        real_accept(self, keep)
        self.lengths[0] += 1 if self.lengths[0] % 2 else 0

    monkeypatch.setattr(PageTable, "accept", sloppy)
    with pytest.raises(AssertionError):
        acceptance_loop(reference_attend, steps=20, q_len=3, seed=4)
