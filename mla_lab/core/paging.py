"""The paged KV cache of a decode loop: which page holds which token, and moving pages.

The kernels only read a pool of pages through a block table and a length per
stream.  Someone has to decide which pages a stream gets, write the draft's new
rows into them, take rows back when the draft is rejected, and, once streams
have grown and shrunk for a while, gather each stream's pages back together.
That is this module:

* :class:`PageTable` keeps, on the host, every stream's pages and committed
  length and a free list, and renders the block table and lengths for the GPU.
* :func:`append_slots` turns (block table, lengths) into the pool row each of
  the draft's rows is written to, on the GPU, with no host sync, so it can be
  part of a captured step.
* Speculative acceptance is bookkeeping only: a verify step appends ``q_len``
  rows after each stream's committed length; :meth:`PageTable.accept` then
  moves the length forward by the rows that were accepted.  Rejected rows stay
  where they are, beyond the length, and the next step's rows overwrite them.
  No copy is made.
* :meth:`PageTable.defragment` rewrites the block table so that each stream's
  pages form one run of consecutive page ids, moves the pages' contents to
  match, and returns every page nobody uses to the free list.

Page :data:`SINK_PAGE` of every pool belongs to no stream: rows that have
nowhere valid to go (a padded stream of a captured bucket, a stream whose
table or length is bad) are written there, and no stream ever reads it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

SINK_PAGE = 0  # written by streams that have no valid slot; never read


class OutOfPages(RuntimeError):
    """The pool has no free page left for a stream that grows."""


@dataclass
class DefragPlan:
    """What :func:`plan_defragment` decided: the new page lists and the moves that realise them."""

    pages: list[list[int]]  # each stream's pages after, in token order
    src: list[int]  # page ids to move from ...
    dst: list[int]  # ... and to (all distinct; a move may read a page another move writes)
    free: list[int]  # every page no stream uses after, ascending

    @property
    def moved(self) -> int:
        return len(self.src)


def plan_defragment(pages: list[list[int]], num_pages: int, reserved=(SINK_PAGE,)) -> DefragPlan:
    """Pack the streams' pages into consecutive runs, stream after stream, from the lowest free id.

    Stream ``b`` gets the ids right after stream ``b - 1``'s, in the order of
    its tokens; reserved ids are skipped.  Pages already in their place are not
    moved.  The rule is the simplest that makes every stream one run; it may
    move more pages than the fewest possible.
    """
    reserved = set(reserved)
    usable = [p for p in range(num_pages) if p not in reserved]
    total = sum(len(ps) for ps in pages)
    if total > len(usable):
        raise ValueError(f"{total} pages in use but the pool has only {len(usable)} usable pages")
    seen = set()
    for b, ps in enumerate(pages):
        for p in ps:
            if p in reserved or not 0 <= p < num_pages or p in seen:
                raise ValueError(f"stream {b} holds page {p}: reserved, outside the pool or held twice")
            seen.add(p)
    new_pages, src, dst = [], [], []
    i = 0
    for ps in pages:
        run = usable[i:i + len(ps)]
        i += len(ps)
        new_pages.append(run)
        for old, new in zip(ps, run):
            if old != new:
                src.append(old)
                dst.append(new)
    return DefragPlan(pages=new_pages, src=src, dst=dst, free=usable[i:])


def move_pages(pools, src: list[int], dst: list[int]) -> None:
    """Copy page ``src[i]`` to page ``dst[i]`` in every pool, as if all at once.

    ``pools``: one pool ``[pages, page_size, 576]`` or a stack of them (one per
    layer) ``[layers, pages, page_size, 576]``.  Each pool's moved pages are
    gathered into a temporary first, so a move may read a page another move
    overwrites; one pool at a time, to bound the temporary's size.
    """
    if not src:
        return
    stack = pools if pools.dim() == 4 else pools.unsqueeze(0)
    s = torch.tensor(src, dtype=torch.long, device=stack.device)
    d = torch.tensor(dst, dtype=torch.long, device=stack.device)
    for pool in stack:
        pool.index_copy_(0, d, pool.index_select(0, s))


def append_slots(block_table: torch.Tensor, kv_lens: torch.Tensor, q_len: int, page_size: int,
                 num_pages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the draft's rows go: ``(slots, positions)``, both ``[streams * q_len]`` int64.

    ``kv_lens`` are the lengths *after* the append (the draft included), as the
    kernels take them, so row ``t`` of stream ``b`` is token
    ``kv_lens[b] - q_len + t``.  ``slots`` index the pool seen as
    ``[pages * page_size, 576]``.  A row with no valid slot (position negative
    or past the table, page id outside the pool) goes to the sink page.
    Tensor ops only: no host sync, so a captured step recomputes them from the
    lengths and table of each replay.  ``positions`` (clamped at 0) feed RoPE.
    """
    dev = block_table.device
    t = torch.arange(q_len, device=dev)
    pos = kv_lens.to(torch.long)[:, None] - q_len + t[None, :]  # [streams, q_len]
    ok = (pos >= 0) & (pos < block_table.shape[1] * page_size)
    col = torch.where(ok, pos // page_size, 0)
    page = torch.gather(block_table.to(torch.long), 1, col)
    ok &= (page >= 0) & (page < num_pages)
    slots = torch.where(ok, page * page_size + pos % page_size, SINK_PAGE * page_size)
    return slots.reshape(-1), pos.clamp(min=0).reshape(-1)


class PageTable:
    """Host bookkeeping of a paged cache: each stream's pages and length, and the free list.

    ``scatter_seed`` hands out free pages in a random order (pages of one
    token at scattered ids, as a long-running server's pool ends up); without
    it, in ascending order.  Lengths are committed tokens; a verify step's rows
    are appended beyond them (:meth:`begin_step`) and accepted or rolled back
    by :meth:`accept`.
    """

    def __init__(self, num_pages: int, page_size: int, max_pages: int, streams: int, *,
                 scatter_seed: int | None = None, reserved=(SINK_PAGE,)):
        if num_pages <= len(set(reserved)):
            raise ValueError(f"a pool of {num_pages} pages has none left beside the reserved {sorted(reserved)}")
        self.num_pages, self.page_size, self.max_pages = num_pages, page_size, max_pages
        self.reserved = tuple(sorted(set(reserved)))
        self.free = [p for p in range(num_pages) if p not in self.reserved]
        if scatter_seed is not None:
            random.Random(scatter_seed).shuffle(self.free)
        self.free.reverse()  # pop() from the end hands out the front of the order
        self.pages: list[list[int]] = [[] for _ in range(streams)]
        self.lengths = [0] * streams
        self.pending = [0] * streams  # rows of the current step appended beyond the length

    @property
    def streams(self) -> int:
        return len(self.pages)

    def _grow(self, b: int, tokens: int) -> None:
        need = -(-tokens // self.page_size)
        if need > self.max_pages:
            raise OutOfPages(f"stream {b} needs {need} pages for {tokens} tokens; its table has {self.max_pages}")
        while len(self.pages[b]) < need:
            if not self.free:
                raise OutOfPages(f"no free page for stream {b} ({tokens} tokens); {self.num_pages} pages in the pool")
            self.pages[b].append(self.free.pop())

    def add_prefix(self, b: int, tokens: int) -> None:
        """Give stream ``b`` ``tokens`` committed tokens (a prompt whose rows the caller writes)."""
        self._grow(b, self.lengths[b] + tokens)
        self.lengths[b] += tokens

    def begin_step(self, q_len: int) -> list[int]:
        """Make room for ``q_len`` rows after every stream's length; returns the kernels' ``kv_lens``."""
        for b in range(self.streams):
            self._grow(b, self.lengths[b] + q_len)
            self.pending[b] = q_len
        return [n + q_len for n in self.lengths]

    def accept(self, keep: list[int]) -> None:
        """Keep the first ``keep[b]`` of stream ``b``'s appended rows; the rest are rolled back.

        Rolling back is a length: the rejected rows stay in their slots, past
        the length, and the next step writes over them.  Pages stay with the
        stream (the next step needs them); :meth:`trim` returns unused ones.
        """
        if len(keep) != self.streams:
            raise ValueError(f"keep has {len(keep)} entries for {self.streams} streams")
        for b, k in enumerate(keep):
            if not 0 <= k <= self.pending[b]:
                raise ValueError(f"stream {b}: cannot keep {k} of the {self.pending[b]} rows appended")
        for b, k in enumerate(keep):
            self.lengths[b] += k
            self.pending[b] = 0

    def trim(self) -> int:
        """Return pages beyond each stream's length to the free list; how many."""
        freed = 0
        for b, ps in enumerate(self.pages):
            need = -(-(self.lengths[b] + self.pending[b]) // self.page_size)
            while len(ps) > need:
                self.free.append(ps.pop())
                freed += 1
        return freed

    def release(self, b: int) -> None:
        """Stream ``b`` is finished: all its pages go back to the free list."""
        self.free.extend(reversed(self.pages[b]))
        self.pages[b] = []
        self.lengths[b] = self.pending[b] = 0

    def is_contiguous(self) -> bool:
        """Does every stream's page list form one run of consecutive ids?"""
        return all(all(b - a == 1 for a, b in zip(ps, ps[1:])) for ps in self.pages)

    def defragment(self, pools=None) -> DefragPlan:
        """Pack every stream into one run of pages (:func:`plan_defragment`), moving the contents
        of ``pools`` (a pool or a stack of per-layer pools) to match, and rebuild the free list.

        The block table changes, so a caller with a captured step copies the
        new table in before its next replay (as it does every step anyway).
        """
        plan = plan_defragment(self.pages, self.num_pages, self.reserved)
        if pools is not None:
            move_pages(pools, plan.src, plan.dst)
        self.pages = plan.pages
        # Hand out the lowest free ids first.  Pages a stream takes later do not extend its run
        # (the next stream's run follows it): contiguity lasts until the streams grow again.
        self.free = list(reversed(plan.free))
        return plan

    def block_table(self, device=None, width: int | None = None) -> torch.Tensor:
        """``[streams, width]`` int32; slots beyond a stream's pages hold the sink page."""
        width = width or self.max_pages
        table = torch.full((self.streams, width), SINK_PAGE, dtype=torch.int32)
        for b, ps in enumerate(self.pages):
            if ps:
                table[b, :len(ps)] = torch.tensor(ps, dtype=torch.int32)
        return table.to(device) if device is not None else table

    def kv_lens(self, device=None, with_pending: bool = True) -> torch.Tensor:
        lens = [n + (p if with_pending else 0) for n, p in zip(self.lengths, self.pending)]
        t = torch.tensor(lens, dtype=torch.int32)
        return t.to(device) if device is not None else t


def gather_stream(pool: torch.Tensor, pages: list[int], length: int) -> torch.Tensor:
    """Stream rows ``0 .. length - 1`` of one pool, in token order: ``[length, 576]``."""
    P = pool.shape[1]
    pos = torch.arange(length)
    ids = torch.tensor(pages, dtype=torch.long)[pos // P] if length else torch.zeros(0, dtype=torch.long)
    return pool[ids.to(pool.device), (pos % P).to(pool.device)]
