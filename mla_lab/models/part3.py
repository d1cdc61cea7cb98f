"""Part III's stages (Hopper): the GPU scheduler's plan, the tile on N and the seesaw's loops, and the
protocols of the loaders and of a unit's output, played on the CPU."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..core import stages as _stages
from ..core.problem import D_QK, D_V, Workload

from .common import BF16, FP32, Traffic, _kv_rows


# ---- the Hopper stages (10 to 13): the scheduler's plan ----------------------------

@dataclass(frozen=True)
class HopperPlan:
    """What the Hopper stages' scheduler works out (each block of the main kernel, from kv_lens; plan_share in
    csrc/hopper/scheduler.cuh): the units, their tiles, each block's share.

    A unit is (stream, group of up to 80 pairs); its tiles are its stream's
    64-key tiles.  Units are numbered group by group (``u = group * streams +
    stream``) and all slots unit by unit: a unit with tiles has
    ``start_slots`` slots for its start (its Q, its first tiles' round trip,
    its output), then one slot a tile; a unit without tiles has none.  Block
    ``c`` of the ``blocks`` that get a share takes slots ``[start(c), start(c +
    1))`` with ``start(c) = c * W // blocks``, so shares differ by at most one
    slot, and a share that starts more units gets fewer tiles.  Only the
    seesaw counts starts (``start_slots`` > 0, see
    :func:`mla_lab.core.stages.hopper_unit_start_slots`); elsewhere a slot is a tile.

    When there are no more groups than blocks, ``blocks`` is a multiple of the
    groups where that keeps at least 15/16 of them: every group's tiles are then
    cut at the same keys, so the blocks of all groups walk a stream's keys
    together and each key is read from DRAM once, the other groups finding it in
    L2 (see :func:`hopper_blocks` for that rule and the one for short shares).
    """

    groups: int  # pair groups per stream
    per_group: int  # pairs per group (the last may have fewer)
    offsets: tuple[int, ...]  # first slot of each unit, then W
    blocks: int  # blocks that get a share (0 when there is no tile at all)
    streams: int = 1
    start_slots: int = 0  # slots a unit's start takes before its tiles

    def stream_of(self, u: int) -> int:
        return u % self.streams

    def group_of(self, u: int) -> int:
        return u // self.streams

    @property
    def total_slots(self) -> int:
        """W: the slots of all units, which the shares divide."""
        return self.offsets[-1]

    @property
    def total_tiles(self) -> int:
        return sum(self.tiles(u) for u in range(len(self.offsets) - 1))

    def tiles(self, u: int) -> int:
        """Unit u's key tiles."""
        slots = self.offsets[u + 1] - self.offsets[u]
        return slots - self.start_slots if slots else 0

    def first_tile(self, u: int) -> int:
        """The slot of unit u's tile 0 (after its start slots)."""
        return self.offsets[u] + self.start_slots

    def start(self, c: int) -> int:
        return c * self.total_slots // self.blocks

    def block_of_tile(self, x: int) -> int:
        """The block whose share holds slot x."""
        return ((x + 1) * self.blocks + self.total_slots - 1) // self.total_slots - 1

    def share_of_block(self, cta: int) -> int:
        """The share the seesaw's block ``cta`` takes (``share_of_block``, csrc/hopper/scheduler.cuh).  Where the
        blocks are a multiple of the groups, the groups' shares that read the same keys (``k``, ``k + blocks /
        groups``, ...) go to neighbouring blocks, ``groups * k + g`` taking ``(blocks / groups) * g + k``; elsewhere
        block c takes share c, as the tile on N's kernels always do."""
        G, C = self.groups, self.blocks
        if G > 1 and C > G and C % G == 0 and cta < C:
            return (cta % G) * (C // G) + cta // G
        return cta

    def share(self, c: int) -> list[tuple[int, int, int]]:
        """Block c's pieces: (unit, first tile, end tile) in unit-local tile numbers.  A share that ends in a
        unit's start slots leaves that unit to the next block."""
        x, end, out = self.start(c), self.start(c + 1), []
        u = 0
        while x < end:
            while self.offsets[u + 1] <= x:
                u += 1
            first, n = self.first_tile(u), self.tiles(u)
            t0, t1 = max(x, first) - first, min(end, first + n) - first
            if t1 <= t0:
                break
            out.append((u, t0, t1))
            x = first + t1
        return out

    def cut_units(self) -> list[tuple[int, int, int]]:
        """(unit, first block, last block) of every unit whose tiles span two shares or more."""
        out = []
        for u in range(len(self.offsets) - 1):
            n = self.tiles(u)
            if n == 0 or not self.blocks:
                continue
            c0, c1 = self.block_of_tile(self.first_tile(u)), self.block_of_tile(self.first_tile(u) + n - 1)
            if c0 != c1:
                out.append((u, c0, c1))
        return out


def hopper_plan(kv_lens, q_len: int, heads: int, max_blocks: int, capacity: int | None = None,
                pairs_per_block: int | None = None, start_slots: int = 0) -> HopperPlan:
    """The Hopper stages' scheduler on the CPU (the same integer arithmetic as the main kernels' ``plan_share``).

    ``capacity`` is the block table's tokens per stream; a stream whose length
    is below ``q_len`` or above it gets no tiles (the kernel writes it NaN).
    ``pairs_per_block``: a unit's most pairs (the tile on N's 80 by default; the
    seesaw's 64).  ``start_slots``: the slots a unit's start takes
    (:func:`mla_lab.core.stages.hopper_unit_start_slots`; 0, every slot a tile, by default).
    """
    st = _stages.get("hopper")
    pairs = q_len * heads
    groups = -(-pairs // (pairs_per_block or _stages.HOPPER_PAIRS_PER_BLOCK))
    per_group = -(-pairs // groups)
    lens = [int(x) for x in kv_lens]
    tiles = [-(-L // st.keys_per_tile) if L >= q_len and (capacity is None or L <= capacity) else 0 for L in lens]
    offsets, run = [], 0
    for _ in range(groups):
        for n in tiles:
            offsets.append(run)
            run += n + start_slots if n else 0
    offsets.append(run)
    # The aligned cut counts only the units with tiles, and asks that they all have stream 0's: streams of length 0
    # (a batch padded to a captured bucket ends with them) change no cut.
    filled = groups * sum(1 for n in tiles if n > 0)
    same = bool(tiles) and tiles[0] > 0 and all(n in (0, tiles[0]) for n in tiles)
    blocks = hopper_blocks(run, groups, max_blocks, units=filled, same_tiles=same)
    return HopperPlan(groups, per_group, tuple(offsets), blocks, len(lens), start_slots)


def hopper_blocks(total_tiles: int, groups: int, max_blocks: int, units: int | None = None,
                  same_tiles: bool = False) -> int:
    """How many blocks get a share: at least HOPPER_MIN_TILES_PER_BLOCK tiles each, a multiple of the groups
    when there are at least as many as groups (so every group's tiles are cut at the same keys) and that
    multiple keeps at least 15/16 of the blocks (else all of them: 15 groups would idle 12 of 132 SMs).

    Where all ``units`` (those with tiles) have the same tiles (``same_tiles``) and a share is short
    (at most HOPPER_ALIGNED_SHARE_TILES tiles per block on average), a multiple of
    the units instead, if that keeps at least 7/8 of the blocks: every unit is then
    cut into the same number of whole pieces, and no block's share straddles two
    units (a second unit's start on the call's critical path).  The pieces are
    then as few as keep the longest share as long as it was: fewer partials to
    write and merge, and the call's critical path no longer.
    """
    blocks = 0 if total_tiles == 0 else min(max_blocks, -(-total_tiles // _stages.HOPPER_MIN_TILES_PER_BLOCK))
    if same_tiles and units and units <= blocks and total_tiles <= _stages.HOPPER_ALIGNED_SHARE_TILES * blocks:
        aligned = blocks - blocks % units
        if 8 * aligned >= 7 * blocks:
            tiles, pieces = total_tiles // units, aligned // units
            longest = -(-tiles // pieces)
            return units * -(-tiles // longest)
    multiple = blocks - blocks % groups
    return multiple if blocks >= groups and 16 * multiple >= 15 * blocks else blocks


HOPPER_RESCALE_LOG2 = 8.0  # the Hopper stages move a softmax reference only when a score passes it by this


def _tile_scores(w, b, q, vis, tile, tr):
    """The Hopper stages' scores of one key tile of stream b, base 2, with the keys each pair may not see hidden;
    and the tile's rows of the cache."""
    K = _stages.HOPPER_KEYS_PER_TILE
    keys = torch.arange(tile * K, min((tile + 1) * K, int(w.kv_lens[b])))
    kv = _kv_rows(w, b, keys, tr)
    s_ = (q @ kv.T) * (w.scale * (1.0 / math.log(2.0)))
    return s_.masked_fill(keys[None, :] >= vis[:, None], -math.inf), kv


def _moved(s_, ref):
    """The Hopper stages' lazy softmax reference: it moves only where a score passes it by more than 2^8.  Returns
    the new reference, the factor of what was summed under the old one, and P = 2^(s - reference)."""
    t = s_.max(-1).values
    new = torch.where(t > ref + HOPPER_RESCALE_LOG2, t, ref)
    use = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    factor = torch.where(new == ref, torch.ones_like(ref), torch.exp2(ref - use))
    return new, factor, torch.exp2(s_ - use[:, None])


def _hopper_tiles(w, b, q, vis, tiles, tr, round_p):
    """The tile on N's loop over one piece of a unit (every Hopper stage's gather and tensor-copy kernels): tile
    after tile, one lazy softmax reference per pair."""
    m = torch.full((q.shape[0],), -math.inf)
    l = torch.zeros(q.shape[0])
    acc = torch.zeros(q.shape[0], D_V)
    for tile in tiles:
        s_, kv = _tile_scores(w, b, q, vis, tile, tr)
        m, alpha, p_ = _moved(s_, m)
        l = l * alpha + p_.sum(-1)
        p_v = p_.bfloat16().float() if round_p else p_
        acc = acc * alpha[:, None] + p_v @ kv[:, :D_V]
    return acc, m, l


def _seesaw_tiles(w, b, q, vis, tiles, tr, round_p, cross=False):
    """The seesaw's loop over one piece of a unit (stages 12 and 13, csrc/hopper/seesaw.cuh): the tiles in pairs,
    A scored by warpgroup 0 (dims 0..255 of O), B by warpgroup 1 (dims 256..511), one lazy reference passed
    A -> B -> next A; each warpgroup's sum covers its own tiles, and, as first written, P_A reaches warpgroup 1 in
    B's reference.

    ``cross``: the crossed order, the stages': P_A reaches warpgroup 1 in A's own reference (rounded once, like
    every P), and warpgroup 1 adds it before B's softmax; where B moves the reference, each warpgroup's half of O
    and its sum follow B's reference before P_B's products."""
    half = D_V // 2
    rnd = (lambda x: x.bfloat16().float()) if round_p else (lambda x: x)
    n = q.shape[0]
    m = torch.full((n,), -math.inf)
    l_a, l_b = torch.zeros(n), torch.zeros(n)
    o_left, o_right = torch.zeros(n, half), torch.zeros(n, half)
    scores = lambda tile: _tile_scores(w, b, q, vis, tile, tr)

    tiles = list(tiles)
    for i in range(0, len(tiles), 2):
        has_b = i + 1 < len(tiles)
        s_a, kv_a = scores(tiles[i])
        ref_a, f_a, p_a = _moved(s_a, m)                      # [0] A's softmax
        l_a = l_a * f_a + p_a.sum(-1)
        p_a = rnd(p_a)
        o_left = o_left * f_a[:, None] + p_a @ kv_a[:, :half]
        if cross:
            o_right = o_right * f_a[:, None] + p_a @ kv_a[:, half:D_V]  # [1] P_A in A's reference
        ref_b, f_b = ref_a, torch.ones(n)
        if has_b:                                            # [1] B's softmax, from A's reference
            s_b, kv_b = scores(tiles[i + 1])
            ref_b, f_b, p_b = _moved(s_b, ref_a)
        l_b = l_b * (f_a * f_b) + (p_b.sum(-1) if has_b else 0.0)
        o_right = o_right * (f_b if cross else f_a * f_b)[:, None]
        if has_b:
            p_b = rnd(p_b)
            o_right = o_right + p_b @ kv_b[:, half:D_V]
        if not cross:
            o_right = o_right + rnd(p_a * f_b[:, None]) @ kv_a[:, half:D_V]  # [1] P_A in B's reference
        l_a, o_left = l_a * f_b, o_left * f_b[:, None]       # [0] A's half follows B's reference
        if has_b:
            o_left = o_left + p_b @ kv_b[:, :half]
        m = ref_b
    return torch.cat([o_left, o_right], dim=1), m, l_a + l_b


def _model_persistent(w: Workload, num_splits, round_p, pairs_per_block, tile_loop, start_slots=0):
    """A Hopper stage's plan, each block's share piece by piece (``tile_loop``), and the merge of the cut units."""
    B, T, H, _ = w.q.shape
    C = num_splits or 132
    capacity = w.block_table.shape[1] * w.kv_cache.shape[1]
    plan = hopper_plan(w.kv_lens.tolist(), T, H, C, capacity, pairs_per_block, start_slots)
    out = torch.full((B, T, H, D_V), float("nan"))
    lse = torch.full((B, T, H), float("nan"))
    tr = Traffic()
    partial = {}  # (unit, block) -> {pair: (o, lse)}

    def unit_pairs(u):
        first = plan.group_of(u) * plan.per_group
        return list(range(first, min(T * H, first + plan.per_group)))

    for c in range(plan.blocks):
        for u, t0, t1 in plan.share(c):
            b = plan.stream_of(u)
            L = int(w.kv_lens[b])
            prs = unit_pairs(u)
            q = torch.stack([w.q[b, pr // H, pr % H] for pr in prs]).float()
            tr.add("q", BF16 * D_QK * len(prs))
            vis = torch.tensor([L - T + pr // H + 1 for pr in prs])
            acc, m, l = tile_loop(w, b, q, vis, range(t0, t1), tr, round_p)
            whole = t0 == 0 and t1 == plan.tiles(u)
            for i, pr in enumerate(prs):
                ln = (m[i] + torch.log2(l[i])) * math.log(2.0)
                if whole:
                    out[b, pr // H, pr % H] = acc[i] / l[i]
                    lse[b, pr // H, pr % H] = ln
                    tr.add("out", BF16 * D_V)
                    tr.add("lse", FP32)
                else:
                    partial.setdefault(u, {})[(c, pr)] = (acc[i] / l[i], ln) if l[i] > 0 else None
                    tr.add("partial out", FP32 * D_V)
                    tr.add("partial lse", FP32)
    for u, c0, c1 in plan.cut_units():
        b = plan.stream_of(u)
        for pr in unit_pairs(u):
            parts = [partial[u][(c, pr)] for c in range(c0, c1 + 1)]
            tr.add("combine reads lse", FP32 * len(parts))
            live = [pt for pt in parts if pt is not None]
            tr.add("combine reads partial out", FP32 * D_V * len(live))
            mx = max(float(ls) for _, ls in live)
            wts = torch.tensor([math.exp(float(ls) - mx) for _, ls in live])
            out[b, pr // H, pr % H] = sum(wt * o for wt, (o, _) in zip(wts, live)) / wts.sum()
            lse[b, pr // H, pr % H] = mx + math.log(float(wts.sum()))
            tr.add("out", BF16 * D_V)
            tr.add("lse", FP32)
    return out, lse, tr


SEESAW_PAIRS = _stages.HOPPER_ROWS_PAIRS  # the seesaw's unit: 64 pairs on wgmma's M


def model_hopper(w: Workload, num_splits: int | None = None, round_p: bool = True, stage: str = "hopper"):
    """A Hopper stage (by default the op): the plan, each block's share piece by piece, the merge of the cut units.

    As on the tensor cores of stage 9, P is rounded to bf16 before it
    multiplies V and the softmax runs in base 2; ``round_p=False`` keeps P in
    fp32.  ``num_splits`` is the persistent grid (blocks); default 132.
    Where the stage runs the seesaw (:func:`mla_lab.core.stages.hopper_seesaw_pays`, from the block table's
    width), this is :func:`model_seesaw` with ``cross``; elsewhere the tile on N (which loader fed it changes
    nothing here).
    """
    B, T, H, _ = w.q.shape
    if _stages.hopper_seesaw_pays(B, T, H, w.block_table.shape[1], w.kv_cache.shape[1], num_splits or 132, stage):
        return model_seesaw(w, num_splits, round_p, cross=True, stage=stage)
    return _model_persistent(w, num_splits, round_p, None, _hopper_tiles)


def model_seesaw(w: Workload, num_splits: int | None = None, round_p: bool = True, cross: bool = False,
                 stage: str = "hopper"):
    """The seesaw where it runs its own kernel (a stream's pairs fill tiles of 64): the same plan in units of 64
    pairs, each piece's tiles in pairs as :func:`_seesaw_tiles` says (with ``cross``, in the crossed order the
    stages run; without, as first written), the same merge.  Where ``stage`` would run it
    (:func:`mla_lab.core.stages.hopper_seesaw_pays`) a unit's start takes slots of the plan."""
    B, T, H, _ = w.q.shape
    S = _stages.hopper_unit_start_slots(B, T, H, w.block_table.shape[1], w.kv_cache.shape[1], num_splits or 132,
                                        stage)
    return _model_persistent(w, num_splits, round_p, SEESAW_PAIRS,
                             functools.partial(_seesaw_tiles, cross=cross), S)


def seesaw_page_steps(page_size: int) -> tuple[int, int, int]:
    """The seesaw's steps for a page size the tensor copy reads (``PageSteps`` in csrc/hopper/seesaw_pieces.cuh, set
    once per kernel): (boxes a tile, tiles a page, log2 of tiles a page or -1 where that is not a power of two)."""
    box_keys = min(page_size, _stages.HOPPER_KEYS_PER_TILE)
    boxes = _stages.HOPPER_KEYS_PER_TILE // box_keys
    tiles = page_size // _stages.HOPPER_KEYS_PER_TILE if box_keys == _stages.HOPPER_KEYS_PER_TILE else 1
    shift = tiles.bit_length() - 1 if tiles & (tiles - 1) == 0 else -1
    return boxes, tiles, shift


def seesaw_tile_boxes(page_size: int, tile: int, kv_len: int, by_steps: bool = True) -> tuple[list[int], int]:
    """The block-table entries of a tile's boxes that hold keys of a stream of ``kv_len`` keys, and the tile's
    first key within its page: by steps (the stages' ``PageSteps``: the tile's first entry once, a shift where the
    page holds a power of two of tiles) or, with ``by_steps=False``, as first written (each box's first key
    divided by the page size)."""
    box_keys = min(page_size, _stages.HOPPER_KEYS_PER_TILE)
    key0 = tile * _stages.HOPPER_KEYS_PER_TILE
    used = [i for i in range(4) if i * box_keys < _stages.HOPPER_KEYS_PER_TILE and key0 + i * box_keys < kv_len]
    if not by_steps:
        in_page = key0 % page_size if box_keys == _stages.HOPPER_KEYS_PER_TILE else 0
        return [(key0 + i * box_keys) // page_size for i in used], in_page
    boxes, tiles, shift = seesaw_page_steps(page_size)
    page = tile >> shift if shift >= 0 else tile // tiles
    return [page * boxes + i for i in used], (tile - page * tiles) * _stages.HOPPER_KEYS_PER_TILE


# ---- the rows layout (an experiment build, "rows"): the ring's protocol ---------------

ROWS_RING_CHUNKS = 18  # the rows build's kRowsRing: two whole tiles of 9 chunks


def _rows_programs(pieces, chunks: int = 9):
    """The ring operations of the two compute warpgroups of ``compute_rows``, in program order.

    ``pieces`` lists the tiles of each (unit) piece of a block's share.  An
    operation is ``("full", seq)`` (wait until chunk seq has landed),
    ``("free", seq)`` (this warpgroup hands chunk seq back), ``("arrive", bar)``
    / ``("sync", bar)`` for the barriers that publish P_A ("A") and P_B ("B"),
    or ``("both",)``, where both warpgroups meet.  Waits for products in flight
    are left out: they depend on nothing but the operations before them.
    """
    progs: tuple[list, list] = ([], [])
    seq = 0
    for tiles in pieces:
        for g in (0, 1):
            progs[g].append(("both",))  # the unit's start (Q's load)
        prev = None
        for tile in range(0, tiles, 2):
            has_b = tile + 1 < tiles
            sa, sb = seq, seq + chunks
            w0, w1 = progs
            if prev is not None and prev[1]:  # what the previous pair left, once its products are done
                w0 += [("free", prev[0] + chunks + k) for k in range(0, 5)]
                w1 += [("free", prev[0] + chunks + k) for k in range(5, 9)]
            # warpgroup 0: scores of A, P_A into A's RoPE slot, P_A V (dims 0..255), then P_B V
            w0 += [("full", sa + j) for j in range(chunks)]
            w0 += [("free", sa + k) for k in range(5, 9)] + [("free", sa), ("arrive", "A")]
            w0 += [("free", sa + k) for k in range(1, 5)]
            if has_b:
                w0 += [("sync", "B")] + [("free", sb + k) for k in range(5, 9)]
            # warpgroup 1: scores of B, then P_A V (dims 256..511), P_B into B's RoPE slot, P_B V
            if has_b:
                w1 += [("full", sb + j) for j in range(chunks)]
            w1 += [("sync", "A")] + [("free", sa + k) for k in range(1, 5)]
            if has_b:
                w1 += [("free", sb + k) for k in range(1, 5)] + [("free", sb), ("arrive", "B")]
            w1 += [("free", sa)] + [("free", sa + k) for k in range(5, 9)]
            prev = (sa, has_b)
            seq += 2 * chunks if has_b else chunks
        if prev is not None and prev[1]:
            progs[0].extend(("free", prev[0] + chunks + k) for k in range(0, 5))
            progs[1].extend(("free", prev[0] + chunks + k) for k in range(5, 9))
        for g in (0, 1):
            progs[g].append(("both",))  # the sums met, the unit written
    return progs, seq


def rows_ring_schedule(pieces, ring: int = ROWS_RING_CHUNKS, chunks: int = 9) -> dict:
    """Run the loader and the two compute warpgroups of the rows layout against a ring of ``ring`` chunk slots.

    The loader fills chunk ``seq`` once both warpgroups have handed back chunk
    ``seq - ring`` (the slot's previous use).  Every actor goes as far as it
    can, in turn, until all are done or none can move.  Returns ``done`` (no
    deadlock), ``loaded`` (chunks filled), ``frees`` (per chunk, how many
    warpgroups handed it back: 2 each when the protocol is right) and
    ``early`` (chunks handed back before they landed: none when it is right).
    The programs are written from ``compute_rows`` by hand (a change there
    must be made here too); the tests run them over many shares.
    """
    progs, total = _rows_programs(pieces, chunks)
    loaded = 0                        # chunks 0 .. loaded-1 have landed
    frees = [0] * total
    pc = [0, 0]
    arrived = {"A": 0, "B": 0}
    synced = {"A": 0, "B": 0}
    met = [0, 0]                      # "both" barriers reached by each warpgroup
    waiting = [False, False]          # a warpgroup at a "both" barrier, counted in met
    early: list[int] = []

    def step(g) -> bool:
        if pc[g] >= len(progs[g]):
            return False
        op = progs[g][pc[g]]
        if op[0] == "full":
            if op[1] >= loaded:
                return False
        elif op[0] == "free":
            frees[op[1]] += 1
            if op[1] >= loaded:  # handed back before it landed: it would count toward the slot's previous use
                early.append(op[1])
        elif op[0] == "arrive":
            arrived[op[1]] += 1
        elif op[0] == "sync":
            if arrived[op[1]] <= synced[op[1]]:
                return False
            synced[op[1]] += 1
        elif op[0] == "both":
            arrived_now = not waiting[g]
            if arrived_now:
                met[g] += 1
                waiting[g] = True
            if met[1 - g] < met[g]:  # the other is not here yet
                return arrived_now
            waiting[g] = False
        pc[g] += 1
        return True

    moved = True
    while moved:
        moved = False
        while loaded < total and (loaded < ring or frees[loaded - ring] == 2):
            loaded += 1
            moved = True
        for g in (0, 1):
            while step(g):
                moved = True
    done = loaded == total and all(pc[g] == len(progs[g]) for g in (0, 1))
    return {"done": done, "loaded": loaded, "frees": frees, "early": early}


# ---- the tensor-copy loader (stage 11 onwards, csrc/hopper/tma_loader.cuh): its protocol on the CPU ----


TMA_LOADER_PROTOCOLS = ("progress", "skip_wait", "none")


def tma_gather_schedule(tiles, ring: int = _stages.HOPPER_RING_CHUNKS, chunks: int = 9,
                        protocol: str = "progress", lagging: str | None = None) -> dict:
    """Run the fixed TMA loader's two kinds of loader warp and the consumers against a ring of ``ring`` slots.

    ``tiles`` is a block's walk, a bool per tile: whole (asked for by the
    issuing warp, by TMA) or not (a stream's last tile, or one with a page
    outside the pool: gathered by two other warps).  Both kinds of warp walk
    every tile, and the one that fills a tile claims each chunk's slot by
    waiting on the slot's *empty* mbarrier.  Such a wait names only the parity
    of the phase it waits for: it passes when the barrier's completed phases
    differ in parity from the one asked for, so a wait two phases behind the
    barrier passes at once, and one two phases ahead waits for a phase that
    needs the waiter itself.  The consumers take the chunks in order and hand
    each back (one phase of its slot's barrier).

    ``protocol`` is how each kind of warp keeps to the other at the tiles it
    skips: ``"progress"`` (``load_keys_tma``): each raises a counter as it
    passes a tile; the gatherers start a tile only once the issuer has passed
    every tile before it, and the issuer passes a gathered tile only once the
    gatherers have claimed it (all 9 slots, before their copies land and they
    arrive on the 9 barriers); ``"skip_wait"`` (the loader before): at a tile
    the other fills, a warp waits for that tile's last slot; ``"none"``.

    ``lagging`` (``"issuer"`` or ``"gatherer"``) makes that warp move only when
    no other actor can, as a warp that falls behind; by default the loaders
    move before the consumers.  Returns ``done`` (every chunk consumed),
    ``overwrites`` (chunks written into a slot whose previous chunk had not
    been handed back), ``consumed`` and ``stuck`` (no actor can move and work
    is left: a hang).  The programs are written from ``load_keys_tma`` by hand.
    """
    if protocol not in TMA_LOADER_PROTOCOLS:
        raise ValueError(f"protocol must be one of {TMA_LOADER_PROTOCOLS}, got {protocol!r}")
    total = len(tiles) * chunks
    phases = [0] * ring            # completed phases of each slot's empty barrier (hand-backs)
    holds = [None] * ring          # the chunk a slot holds
    overwrites: list[int] = []
    counter = {"issuer": 0, "gatherer": 0}

    def slot_free(seq) -> bool:    # mbarrier.try_wait.parity for the phase that frees chunk seq's slot
        if seq < ring:
            return True
        return phases[seq % ring] % 2 != (seq // ring - 1) % 2

    progs = {"issuer": [], "gatherer": []}
    for t, whole in enumerate(tiles):
        seq0 = t * chunks
        filler, skipper = ("issuer", "gatherer") if whole else ("gatherer", "issuer")
        if protocol == "progress" and not whole:
            progs["gatherer"].append(("after", "issuer", t))      # every tile before this one passed
            progs["issuer"].append(("after", "gatherer", t + 1))  # this one claimed
            # the gatherers claim all 9 slots, raise their count, wait for their copies, then arrive on all 9
            progs["gatherer"] += [("wait", seq0 + j) for j in range(chunks)] + [("count", t + 1)]
            progs["gatherer"] += [("fill", seq0 + j) for j in range(chunks)]
            progs["issuer"].append(("count", t + 1))
            continue
        for j in range(chunks):
            progs[filler] += [("wait", seq0 + j), ("fill", seq0 + j)]
        if protocol == "skip_wait":
            progs[skipper].append(("wait", seq0 + chunks - 1))
        if protocol == "progress":
            progs[filler].append(("count", t + 1))
    pc = {"issuer": 0, "gatherer": 0}
    consumed = 0

    def step(who) -> bool:
        nonlocal consumed
        if who == "consumer":
            if consumed >= total or holds[consumed % ring] != consumed:
                return False
            holds[consumed % ring] = None
            phases[consumed % ring] += 1
            consumed += 1
            return True
        if pc[who] >= len(progs[who]):
            return False
        op = progs[who][pc[who]]
        if op[0] == "wait" and not slot_free(op[1]):
            return False
        if op[0] == "after" and counter[op[1]] < op[2]:
            return False
        if op[0] == "count":
            counter[who] = op[1]
        if op[0] == "fill":
            seq = op[1]
            if seq >= ring and phases[seq % ring] < seq // ring:
                overwrites.append(seq)
            holds[seq % ring] = seq
        pc[who] += 1
        return True

    actors = ["issuer", "gatherer", "consumer"]
    if lagging is not None:
        if lagging not in ("issuer", "gatherer"):
            raise ValueError(f"lagging must be 'issuer', 'gatherer' or None, got {lagging!r}")
        actors = [a for a in actors if a != lagging]
    moved = True
    while moved and not overwrites:
        moved = False
        for who in actors:
            while not overwrites and step(who):
                moved = True
        if not moved and lagging is not None and not overwrites and step(lagging):
            moved = True  # the lagging warp takes one step only when nothing else can move
    done = consumed == total and not overwrites
    return {"done": done, "overwrites": overwrites, "consumed": consumed, "stuck": not done and not overwrites}


# ---- the tile on N: a whole unit's rows, through shared memory ------------------------

HOPPER_STAGE_ROW_BYTES = 2 * D_V + 16  # csrc/hopper/common.cuh, kStageRowBytes: a pair's bf16 row, padded


def hopper_out_staging(pairs: int = _stages.HOPPER_PAIRS_PER_GROUP) -> dict:
    """Where ``compute``'s epilogue puts a whole unit's output, for one warpgroup of ``pairs`` pairs.

    Each thread (warp ``w``, lane ``l``: fragment row ``g = l // 4``, columns
    ``c = 2 (l % 4)``, +1) holds the accumulator of ``O^T`` (dims on M): element
    ``o[j][4 i + 2 h + e]`` is dim ``64 j + 16 w + 8 h + g`` of pair ``8 i + c + e``.
    One ``stmatrix.x4.trans`` per (i, j even) stores four 8x8 blocks, lane ``8 m + r``
    naming the shared-memory row of pair ``8 i + r`` of block ``m`` (dims
    ``16 w + 8 (m % 2)`` of chunk ``j + m // 2``), and the block is stored
    transposed: stored row ``r`` is the fragment's column ``r``, 8 dims of one
    pair.  Returns ``written`` ({byte offset: (pair, dim)} for every bf16 written),
    ``bank_sets`` (for each block of each stmatrix, the 32-bit banks its 8 rows of
    16 bytes touch) and ``copies`` (for each copy-out step of each warp, the
    (pair, first byte) of its 32 lanes' 16-byte loads).
    """
    row = HOPPER_STAGE_ROW_BYTES
    written: dict[int, tuple[int, int]] = {}
    bank_sets = []
    for w in range(4):
        for i in range(5):
            for j in range(0, D_V // 64, 2):
                for m in range(4):
                    banks = []
                    for r in range(8):
                        addr = r * row + 2 * (64 * (m // 2) + 16 * w + 8 * (m % 2)) + 8 * i * row + 2 * 64 * j
                        pair, dim0 = 8 * i + r, 64 * (j + m // 2) + 16 * w + 8 * (m % 2)
                        for d in range(8):  # stored row r: the fragment's column r, rows (dims) 0..7
                            written[addr + 2 * d] = (pair, dim0 + d)  # a byte written twice leaves one entry too few
                        banks.extend(((addr + 4 * q) // 4) % 32 for q in range(4))
                    bank_sets.append(banks)
    copies = []
    vectors = D_V // 8  # 16-byte vectors of a pair's row
    for warp in range(4):  # each warp whole pairs' rows: pairs warp, warp + 4, ...; 32 vectors a store
        for n in range(warp, pairs, 4):
            for first in range(0, vectors, 32):
                copies.append([(n, n * row + 16 * x) for x in range(first, min(first + 32, vectors))])
    return {"written": written, "bank_sets": bank_sets, "copies": copies}
