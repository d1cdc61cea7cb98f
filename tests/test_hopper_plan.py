"""The Hopper stages' scheduler on the CPU (how the key tiles of all streams are shared among the blocks), the
loaders' protocols, and each rule of the stage files as the sources state it (csrc/hopper/, csrc/stage1[0-3]_*.cu)."""

import random
import re

import pytest

from mla_lab.core import stages
from mla_lab.core.extension import CSRC
from mla_lab.models import ROWS_RING_CHUNKS, hopper_plan, rows_ring_schedule, tma_gather_schedule

K = stages.HOPPER_KEYS_PER_TILE


HOPPER_IDS = ("wgmma", "tensor_copy", "seesaw", "hopper")


def hopper_source(*names: str) -> str:
    """The pieces the Hopper stages share, csrc/hopper/<name>.cuh (all of them where no name is given)."""
    names = names or tuple(sorted(f.stem for f in (CSRC / "hopper").glob("*.cuh")))
    return "\n".join((CSRC / "hopper" / f"{n}.cuh").read_text() for n in names)


def stage_source(stage_id: str = "hopper") -> str:
    """A Hopper stage's own file: its rule, its kernels and its launcher."""
    return (CSRC / stages.get(stage_id).source).read_text()


def kernel_body(src: str, kernel: str) -> str:
    """A __global__ kernel's definition in a stage file, from its name to its #endif."""
    start = re.search(rf"\b{kernel}\(const MlaParams p", src).start()
    return src[start:src.index("#endif", start)]


def covered(plan):
    """Every (unit, tile) as the blocks' shares list it, in order."""
    return [(u, t) for c in range(plan.blocks) for u, t0, t1 in plan.share(c) for t in range(t0, t1)]


CASES = [
    ([1033], 9, 8, 132),                 # one stream of the article's shape: 17 tiles, 9 blocks of 2
    ([65545], 9, 8, 132),                # 1025 tiles over 132 blocks
    ([16393] * 8, 9, 64, 132),           # 8 streams x 8 groups of 72 pairs
    ([65545] + [521] * 7, 9, 8, 132),    # one long stream among short ones
    ([1, 64, 65, 128, 129], 1, 1, 7),    # lengths at tile boundaries, one pair per stream
    ([5, 3, 70000], 5, 17, 256),         # 85 pairs: two groups of 43 and 42
    ([16, 16], 16, 128, 3),              # 2048 pairs: 26 groups per stream
]


# A unit's start slots: none (every slot a tile), and the seesaw's.
START_SLOTS = [0, stages.HOPPER_SEE_UNIT_START_TILES]


@pytest.mark.parametrize("S", START_SLOTS)
@pytest.mark.parametrize("lens, T, H, C", CASES)
def test_every_tile_once_and_shares_within_one_slot(lens, T, H, C, S):
    plan = hopper_plan(lens, T, H, C, start_slots=S)
    groups = stages.hopper_groups(T, H)
    assert plan.groups == groups and plan.per_group <= stages.HOPPER_PAIRS_PER_BLOCK
    assert plan.per_group * groups >= T * H > plan.per_group * (groups - 1)
    tiles = [-(-L // K) if L >= T else 0 for L in lens]  # a stream shorter than its draft gets none
    B = len(lens)
    expected = [(g * B + b, t) for g in range(groups) for b, n in enumerate(tiles) for t in range(n)]
    assert covered(plan) == expected  # each tile of each unit exactly once, units group by group
    assert all(plan.stream_of(g * B + b) == b and plan.group_of(g * B + b) == g for g in range(groups) for b in range(B))
    sizes = [plan.start(c + 1) - plan.start(c) for c in range(plan.blocks)]
    assert max(sizes) - min(sizes) <= 1
    most = min(C, -(-plan.total_slots // stages.HOPPER_MIN_TILES_PER_BLOCK))
    units = groups * B
    if plan.blocks % units == 0 and plan.blocks <= most - groups:  # cut at whole units (test_equal_short_units_...)
        assert len(set(tiles)) == 1 and 8 * plan.blocks >= 7 * most
    elif most >= groups and 16 * (most - most % groups) >= 15 * most:  # the largest multiple of the groups
        assert plan.blocks % groups == 0 and most - groups < plan.blocks <= most
    else:  # (a multiple would leave more than a sixteenth of the blocks idle)
        assert plan.blocks == most
    assert set(sizes) <= {plan.total_slots // plan.blocks, -(-plan.total_slots // plan.blocks)}
    assert plan.total_slots == plan.total_tiles + S * sum(1 for u in range(units) if plan.tiles(u))


@pytest.mark.parametrize("S", START_SLOTS)
@pytest.mark.parametrize("lens, T, H, C", CASES)
def test_cut_units_are_the_units_split_between_blocks(lens, T, H, C, S):
    plan = hopper_plan(lens, T, H, C, start_slots=S)
    owners = {}
    for c in range(plan.blocks):
        for u, t0, t1 in plan.share(c):
            owners.setdefault(u, []).append(c)
    cut = {u: (c0, c1) for u, c0, c1 in plan.cut_units()}
    for u, cs in owners.items():
        assert cs == list(range(cs[0], cs[-1] + 1))  # a unit's pieces come from consecutive blocks
        if len(cs) > 1:
            assert cut[u] == (cs[0], cs[-1])
        else:
            assert u not in cut  # written straight to out, never merged
    assert len(cut) <= max(plan.blocks - 1, 0)  # a cut needs a block boundary inside the unit
    # a block's share cuts at most its first and its last unit (its two partial slots)
    for c in range(plan.blocks):
        pieces = plan.share(c)
        inner = pieces[1:-1]
        assert all(t0 == 0 and t1 == plan.tiles(u) for u, t0, t1 in inner)
    # The merge finds a cut unit's first piece in slot 1 of its first block exactly where that block's share
    # starts before the unit's first slot (PieceRows): where it starts in the unit's start slots, the unit is
    # the share's first.
    for u, c0, _ in plan.cut_units():
        first_of_share = plan.share(c0)[0][0] == u
        assert first_of_share == (plan.start(c0) >= plan.offsets[u])


@pytest.mark.parametrize("lens, T, H", [
    ([65545] + [521] * 7, 9, 64),     # the mixed batch: 63 short units beside 9 long ones
    ([65545] + [65] * 15, 16, 64),    # 16 streams, 15 of two tiles
    ([9000, 10, 300, 64, 65, 2000, 1, 129], 9, 64),
    ([16393] * 8, 9, 64),             # even: each start is one unit's
])
def test_a_share_that_starts_more_units_gets_fewer_tiles(lens, T, H):
    """With start slots, every block's work counted as its tiles plus S for each unit it starts (a piece from a
    unit's tile 0) differs from block to block by at most 2 S + 1: a block whose share starts inside a unit pays that
    start without a slot for it, and one whose share ends in a unit's start slots does none of that start.  Without
    them, the shares that hold the short units' starts do the most work."""
    S = stages.HOPPER_SEE_UNIT_START_TILES

    def work(plan):
        return [sum(t1 - t0 + S * (t0 == 0) for _, t0, t1 in plan.share(c)) for c in range(plan.blocks)]

    weighted = work(hopper_plan(lens, T, H, 132, pairs_per_block=stages.HOPPER_ROWS_PAIRS, start_slots=S))
    assert max(weighted) - min(weighted) <= 2 * S + 1
    flat = work(hopper_plan(lens, T, H, 132, pairs_per_block=stages.HOPPER_ROWS_PAIRS))
    assert max(weighted) <= max(flat)
    if len(set(lens)) > 1:
        assert max(weighted) < max(flat)  # mixed lengths: the weighted plan's longest block is shorter


@pytest.mark.parametrize("lens, T, H, C", [c for c in CASES if 1 < stages.hopper_groups(c[1], c[2]) <= c[3]]
                         + [([16393] * 8, 16, 128, 132), ([9000, 10, 300, 64, 65, 2000, 1, 129], 16, 16, 132)])
def test_every_group_is_cut_at_the_same_keys(lens, T, H, C):
    """With no more groups than blocks, group g's share boundaries are group 0's, shifted by g's offset:
    the blocks of all groups walk each stream's keys in step, so L2 serves the later groups."""
    plan = hopper_plan(lens, T, H, C)
    G, B = plan.groups, len(lens)
    per_group = plan.total_tiles // G
    assert plan.blocks % G == 0
    k = plan.blocks // G
    cuts = [[plan.start(g * k + j) - g * per_group for j in range(k + 1)] for g in range(G)]
    assert all(cut == cuts[0] for cut in cuts)
    # and a block's share lies inside one group
    assert all(plan.group_of(u) == c // k for c in range(plan.blocks) for u, _, _ in plan.share(c))


@pytest.mark.parametrize("lens, T, H, C", [c for c in CASES if 1 < stages.hopper_groups(c[1], c[2]) <= c[3]]
                         + [([16393] * 8, 9, 64, 132), ([9000, 10, 300, 64, 65, 2000, 1, 129], 16, 16, 132)])
def test_the_seesaws_blocks_that_read_the_same_keys_are_neighbours(lens, T, H, C):
    """The seesaw's order: every share taken by exactly one block, and each run of `groups` neighbouring blocks
    takes one share of each group, all starting at the same keys of the same stream."""
    plan = hopper_plan(lens, T, H, C, pairs_per_block=64)
    G = plan.groups
    if plan.blocks % G or plan.blocks <= G:
        pytest.skip("no aligned cut: block c takes share c")
    order = [plan.share_of_block(c) for c in range(plan.blocks)]
    assert sorted(order) == list(range(plan.blocks))
    assert [plan.share_of_block(c) for c in range(plan.blocks, plan.blocks + 3)] == list(range(plan.blocks, plan.blocks + 3))
    per_group = plan.total_slots // G
    for c0 in range(0, plan.blocks, G):
        shares = [plan.share_of_block(c0 + g) for g in range(G)]
        assert [plan.group_of(plan.share(s)[0][0]) for s in shares if plan.share(s)] == \
            list(range(G))[:sum(1 for s in shares if plan.share(s))]
        starts = {plan.start(s) - g * per_group for g, s in enumerate(shares)}
        assert len(starts) == 1  # the same slot of each group: the same stream, the same keys


def test_without_an_aligned_cut_block_c_takes_share_c():
    """15 groups (a 15-row draft at 64 heads): 120 of 132 blocks would idle too many, so the cut is not aligned
    and the seesaw's blocks keep the plain order; one group has nothing to put side by side."""
    plan = hopper_plan([16393] * 8, 15, 64, 132, pairs_per_block=64)
    assert plan.groups == 15 and plan.blocks == 132
    assert [plan.share_of_block(c) for c in range(134)] == list(range(134))
    plan = hopper_plan([16393] * 8, 1, 64, 132, pairs_per_block=64)
    assert plan.groups == 1 and [plan.share_of_block(c) for c in range(plan.blocks)] == list(range(plan.blocks))


@pytest.mark.parametrize("lens, T, H, C, blocks", [
    ([1033] * 8, 16, 8, 132, 96),      # 16 units of 17 tiles: 8 pieces each (132 would straddle), 3 tiles at most: 6 do
    ([1033] * 8, 9, 8, 132, 72),       # 8 units of 17 tiles: 16 pieces of at most 2 tiles, or 9
    ([4105] * 8, 16, 8, 132, 128),     # 16 units of 65 tiles: 8.1 a block, still short; 8 pieces of at most 9 tiles
    ([1033] * 16, 1, 128, 132, 128),   # 32 units (2 groups of 16 streams): 4 pieces of at most 5 tiles
    ([2057] * 7, 9, 8, 132, 119),      # 7 units of 33 tiles: 126 keeps more than 7/8 of 132; 17 pieces of at most 2
    ([1033], 9, 8, 132, 17),           # one unit of 17 tiles: a tile a block
    ([65545], 9, 8, 132, 129),         # one unit of 1025 tiles: 132 pieces of at most 8 tiles, or 129
])
def test_equal_short_units_are_cut_into_whole_pieces(lens, T, H, C, blocks):
    """Equal streams and short shares: a multiple of the units, so no share straddles two units, and as few
    pieces as keep the longest share of that multiple."""
    plan = hopper_plan(lens, T, H, C)
    assert plan.blocks == blocks
    assert all(len(plan.share(c)) == 1 for c in range(plan.blocks))
    per_unit = blocks // (plan.groups * len(lens))
    assert all(c1 - c0 + 1 == per_unit for _, c0, c1 in plan.cut_units())


@pytest.mark.parametrize("tiles", [1, 2, 7, 16, 17, 33, 64, 65, 257])
@pytest.mark.parametrize("units", [1, 3, 8, 16])
def test_fewer_pieces_never_lengthen_the_longest_share(tiles, units):
    """Against the plain multiple of the units: the longest share is the same, and one piece fewer would lengthen it."""
    C = 132
    W = tiles * units
    if units > min(C, W) or W > stages.HOPPER_ALIGNED_SHARE_TILES * min(C, W):
        pytest.skip("not a short call of equal units")
    aligned = min(C, W) - min(C, W) % units
    plan = hopper_plan([tiles * stages.HOPPER_KEYS_PER_TILE - 9] * units, 9, 8, C)
    longest = max(plan.start(c + 1) - plan.start(c) for c in range(plan.blocks))
    assert longest == -(-tiles // (aligned // units))
    pieces = plan.blocks // units
    assert plan.blocks % units == 0 and (pieces == 1 or -(-tiles // (pieces - 1)) > longest)


@pytest.mark.parametrize("lens, T, H, C, blocks", [
    ([1033] * 7 + [1000], 16, 8, 132, 132),  # one stream shorter by a tile: no alignment, a multiple of the 2 groups
    ([16393] * 8, 16, 8, 132, 132),          # 16 units of 257 tiles: 31 a block, long shares
    ([1033] * 33, 1, 8, 132, 132),           # 33 units: 99 blocks would drop a quarter
    ([4105] * 6, 9, 8, 132, 132),            # 6 units of 65 tiles: 132 is already a multiple
])
def test_other_batches_keep_the_groups_rule(lens, T, H, C, blocks):
    assert hopper_plan(lens, T, H, C).blocks == blocks


def test_the_kernel_cuts_equal_short_units_by_the_same_rule():
    """blocks_with_share in the source holds the rule the CPU model states (constants and comparisons)."""
    src = hopper_source("scheduler")
    assert re.search(rf"constexpr int kAlignedShareTiles = {stages.HOPPER_ALIGNED_SHARE_TILES};", src)
    body = src[src.index("int blocks_with_share("):]
    body = body[:body.index("\n}\n")]
    assert re.search(r"if \(filled > 0 && filled <= most && W <= kAlignedShareTiles \* most\)", body)
    assert re.search(r"const int aligned = most - most % filled;\s*if \(8 \* aligned >= 7 \* most\) \{", body)
    assert re.search(r"const int pieces = aligned / filled;\s*"
                     r"const int longest = \(tiles_each \+ pieces - 1\) / pieces;\s*"
                     r"return filled \* \(\(tiles_each \+ longest - 1\) / longest\);", body)
    # Only the units with tiles count, and they must all have unit 0's (the model's `filled` and `same`).
    assert re.search(r"same = same && \(n == 0 \|\| n == tiles0\);", src)
    assert re.search(r"const bool same_tiles = one_stream \|\| __syncthreads_and\(same\) != 0;", src)
    assert re.search(r"const int filled = !same_tiles \|\| tiles0 == 0 \? 0 : one_stream \? sh\.units : W / slots0;", src)
    assert re.search(r"C = blocks_with_share\(p, sh, W, filled, slots0\);", src)


def test_the_kernel_counts_a_units_start_as_the_model_does():
    """The seesaw's start slots in the source: the constant, where they count (only in the seesaw's plan, only where
    the stage runs it), and a unit without tiles getting none."""
    src = hopper_source("scheduler")
    assert re.search(rf"constexpr int kSeeUnitStartTiles = {stages.HOPPER_SEE_UNIT_START_TILES};", src)
    assert re.search(r"return sh\.rows && seesaw_pays\(p\) \? kSeeUnitStartTiles : 0;", src)
    assert re.search(r"return tiles > 0 \? tiles \+ start_slots : 0;", src)
    assert re.search(r"const int S = kStartSlots \? unit_start_slots\(p, sh\) : 0;", src)
    # the seesaw's blocks count starts and take the seesaw's order of shares (their defaults); the tile on N's, neither
    seesaw, tile_n = hopper_source("seesaw"), hopper_source("tile_n")
    assert "template <class Parts, bool kStartSlots = true, bool kSameKeysAdjacent = true>" in seesaw
    assert seesaw.count("plan_share<kSeeThreads, kStartSlots, kSameKeysAdjacent>(") == 1
    assert tile_n.count("plan_share<kThreads, false, false>(") == 1 and "plan_share<kThreads, true" not in tile_n
    for sid in ("seesaw", "hopper"):  # the stages' seesaw kernels keep both
        assert len(re.findall(r"seesaw_block<SeesawParts<(?:true|false)>>\(p, kv\);", stage_source(sid))) == 2, sid
    # the seesaw's order of shares (HopperPlan.share_of_block), and no other kernel's
    assert "return aligned ? (cta % groups) * (C / groups) + cta / groups : cta;" in src
    assert "groups > 1 && C > groups && C % groups == 0 && cta < C" in src
    assert "cur.share = kSameKeysAdjacent ? share_of_block(cta, C, sh.groups) : cta;" in src
    # The cut list names a unit's tiles, after its start slots.
    assert re.search(r"block_of_tile\(a \+ S, W, C\) != block_of_tile\(a \+ S \+ n - 1, W, C\)", src)


@pytest.mark.parametrize("B, T, H, pages, ps", [(1, 9, 64, 1025, 64), (8, 9, 64, 130, 64), (8, 9, 8, 1025, 64),
                                                (1, 9, 64, 8, 64), (8, 16, 64, 4100, 16), (2, 9, 64, 2, 64),
                                                (8, 9, 16, 1025, 64)])
@pytest.mark.parametrize("stage", HOPPER_IDS)
def test_start_slots_only_where_the_seesaw_runs(B, T, H, pages, ps, stage):
    S = stages.hopper_unit_start_slots(B, T, H, pages, ps, 132, stage)
    assert S == (stages.HOPPER_SEE_UNIT_START_TILES if stages.hopper_seesaw_pays(B, T, H, pages, ps, 132, stage) else 0)
    if stage in ("wgmma", "tensor_copy"):
        assert S == 0


@pytest.mark.parametrize("lens, T, H, blocks", [
    ([16393], 9, 128, 132),      # 15 groups: a multiple (120) would idle 12 of 132 blocks, so all 132
    ([16393] * 8, 9, 128, 132),
    ([16393], 9, 64, 128),       # 8 groups: 128 keeps 4 idle, within a sixteenth
    ([16400], 16, 64, 130),      # 13 groups: 130
    ([30005], 4, 128, 126),      # 7 groups: 126 (6 idle, 1/22)
])
def test_groups_multiple_unless_it_idles_a_sixteenth(lens, T, H, blocks):
    """Long shares: the blocks are a multiple of the groups (every group cut at the same keys) where that
    keeps at least 15/16 of them, else every block (the groups' blocks then read a tile at different times)."""
    plan = hopper_plan(lens, T, H, 132)
    assert plan.blocks == blocks
    src = hopper_source("scheduler")
    assert re.search(r"return most >= sh\.groups && 16 \* multiple >= 15 \* most \? multiple : most;", src)


def test_invalid_streams_get_no_tiles():
    plan = hopper_plan([100, 3, 10**6], 9, 8, 132, capacity=5000)  # too short for its draft; beyond its table
    assert plan.offsets[1] - plan.offsets[0] == 2
    assert plan.offsets[2] == plan.offsets[1] and plan.offsets[3] == plan.offsets[2]
    assert hopper_plan([3], 9, 8, 132).blocks == 0  # nothing to do at all


@pytest.mark.parametrize("lens, T, H", [
    ([1033], 9, 8), ([16393], 9, 64), ([4105] * 3, 16, 64), ([300, 2000, 77], 9, 8),
    ([1033] * 8, 9, 8), ([16393], 9, 8), ([8192], 1, 128),  # the aligned cut: one stream, equal streams
    ([1033] * 7 + [1000], 16, 8), ([65545], 1, 128), ([16393, 3009], 9, 8), ([30009, 109], 9, 64),
])
@pytest.mark.parametrize("S", START_SLOTS)
def test_streams_of_length_zero_change_no_cut(lens, T, H, S):
    """A batch padded to a captured bucket (streams of length 0 at its end) is cut as the batch alone:
    the same blocks, each with the same (stream, group, tiles) pieces, so the same partials and merges."""
    def pieces(plan):
        return [[(plan.stream_of(u), plan.group_of(u), t0, t1) for u, t0, t1 in plan.share(c)]
                for c in range(plan.blocks)]

    alone = hopper_plan(lens, T, H, 132, start_slots=S)
    for pad in (1, 3, 8):
        padded = hopper_plan(lens + [0] * pad, T, H, 132, start_slots=S)
        assert padded.blocks == alone.blocks and pieces(padded) == pieces(alone)


@pytest.mark.parametrize("S", START_SLOTS)
def test_random_batches(S):
    rng = random.Random(0)
    for _ in range(200):
        B, T, H, C = rng.randint(1, 16), rng.randint(1, 16), rng.choice([1, 2, 8, 64, 128]), rng.randint(1, 256)
        lens = [rng.choice([rng.randint(T, 70000), rng.randint(T, 200)]) for _ in range(B)]
        plan = hopper_plan(lens, T, H, C, start_slots=S)
        assert len(covered(plan)) == plan.total_tiles == plan.groups * sum(-(-L // K) for L in lens)
        sizes = [plan.start(c + 1) - plan.start(c) for c in range(plan.blocks)]
        assert max(sizes) - min(sizes) <= 1


# ---- the rows layout's ring (the experiment build "rows"): its protocol on the CPU ----


def test_the_rows_ring_model_holds_the_kernels_ring():
    assert ROWS_RING_CHUNKS == 2 * 9
    # The rows layout is an experiment, not one of the stages (csrc/experiments/rows_layout.cu).
    src = (CSRC / "experiments" / "rows_layout.cu").read_text()
    assert re.search(r"constexpr int kRowsRing = 2 \* kChunks;", src)


@pytest.mark.parametrize("pieces", [[1], [2], [3], [8], [57], [1, 1], [2, 3], [1, 4, 1], [6, 1, 7], [9, 2]])
def test_every_chunk_of_the_rows_ring_lands_and_goes_back_once_per_warpgroup(pieces):
    r = rows_ring_schedule(pieces)
    assert r["done"] and r["loaded"] == 9 * sum(pieces)
    assert r["frees"] == [2] * r["loaded"] and r["early"] == []


def test_a_ring_one_chunk_short_of_two_tiles_deadlocks():
    # the model can fail: with 17 slots the second tile's last chunk waits for the first's RoPE slot,
    # which holds P_A until warpgroup 1 has used it, after B's scores
    assert rows_ring_schedule([1], ring=17)["done"]  # one tile fits
    for pieces in ([2], [7], [1, 1, 5]):
        assert not rows_ring_schedule(pieces, ring=17)["done"]


# ---- the tensor-copy loader (stage 11 onwards): its protocol on the CPU ----


@pytest.mark.parametrize("lagging", [None, "issuer", "gatherer"])
@pytest.mark.parametrize("tiles", [
    [False], [True], [True] * 3 + [False], [True] * 40 + [False], ([True] * 12 + [False]) * 3,
    [False, True, False, True, True, False], [True] * 7 + [False] * 3 + [True] * 20 + [False],
    [False] * 5 + [True] * 3 + [False] * 4 + [True],  # streams shorter than a tile, or pages outside the pool, in a row
])
def test_the_tma_loader_protocol_consumes_every_chunk_and_overwrites_none(tiles, lagging):
    r = tma_gather_schedule(tiles, lagging=lagging)
    assert r["done"] and r["consumed"] == 9 * len(tiles) and r["overwrites"] == [] and not r["stuck"]


def test_the_tma_loader_protocol_holds_on_random_walks_whichever_warp_falls_behind():
    import random

    rng = random.Random(10)
    for _ in range(300):
        tiles = [rng.random() < rng.choice((0.2, 0.7, 0.95)) for _ in range(rng.randint(1, 80))]
        for lagging in (None, "issuer", "gatherer"):
            assert tma_gather_schedule(tiles, lagging=lagging)["done"], (tiles, lagging)


def test_without_any_keeping_in_step_a_loader_overwrites_a_slot_in_use():
    # the model can fail: a parity wait two phases behind the barrier passes at once.  The gatherers run ahead
    # over whole tiles (on the GPU a version without waits faulted at 64 heads), the issuer over gathered ones.
    gatherers_ahead = [[True] * n + [False] for n in range(1, 40)]
    issuer_ahead = [[True] + [False] * n + [True] for n in range(1, 12)]
    for walks, least in ((gatherers_ahead, 30), (issuer_ahead, 8)):
        hit = [tiles for tiles in walks if tma_gather_schedule(tiles, protocol="none")["overwrites"]]
        assert len(hit) >= least
        assert all(tma_gather_schedule(tiles)["done"] for tiles in hit)  # the counters remove every one


def test_waiting_for_a_skipped_tiles_last_slot_hangs_when_a_loader_warp_falls_behind():
    # The loader before the counters: at a tile the other kind of warp fills, a warp waited for that tile's
    # last slot.  That keeps a warp from running ahead, but one that falls more than a ring behind then waits
    # for a phase two ahead of the barrier, which needs the waiter itself: the tma_no_math build hung this way
    # on the H200 at 8 streams of 65536 keys (62 whole tiles a block, then a stream's last tile to gather).
    walk = [True] * 60 + [False]
    assert tma_gather_schedule(walk, protocol="skip_wait")["done"]  # loaders first: it works
    old = tma_gather_schedule(walk, protocol="skip_wait", lagging="gatherer")
    assert old["stuck"] and old["consumed"] == 9 * 60 and old["overwrites"] == []
    assert tma_gather_schedule([True] + [False] * 3 + [True] * 30, protocol="skip_wait", lagging="issuer")["stuck"]
    assert tma_gather_schedule(walk, lagging="gatherer")["done"]


def tma_loader_source() -> str:
    """load_keys_tma, the tensor-copy loader's loop (csrc/hopper/tma_loader.cuh)."""
    src = hopper_source("tma_loader")
    return src[src.index("__device__ void load_keys_tma("):src.index("struct TmaLoader")]


def test_the_tma_loader_model_holds_the_kernels_progress_counters():
    body = tma_loader_source()
    # the issuer: at a gathered tile, wait until the gatherers have claimed it; after every tile, raise its count
    assert re.search(r"if \(!whole && lane == 0\) wait_until_at_least\(gathered, k \+ 1\);", body)
    assert re.search(r"if \(lane == 0\) st_release_shared\(issued, k \+ 1\);\s*__syncwarp\(\);\s*continue;", body)
    # the gatherers: skip a whole tile at once; before a gathered one, wait until the issuer passed every earlier
    # tile; after it, raise their count
    assert "if (key0 + kKeysPerTile <= kv_len && !bad_tile) continue;  // warp 0 asks for this one" in body
    # (one of the 64 waits, the rest at a named barrier; the count is raised once every slot is claimed)
    assert re.search(r"if \(key_in_tile == 0\) wait_until_at_least\(issued, k\);\s*named_barrier\(kBarGather, 64\);", body)
    assert re.search(r"named_barrier\(kBarGather, 64\);\n(\s*//[^\n]*\n)*\s*if \(key_in_tile == 0\) "
                     r"st_release_shared\(gathered, k \+ 1\);\s*cp_async_commit\(\);", body)
    # and no parity wait on a slot the warp does not fill is left
    assert "last / kSlots" not in body


def test_with_fewer_fences_every_chunk_written_by_a_generic_store_is_still_fenced():
    """The tensor-copy kernels (kFewerFences) skip the compute warps' proxy fence on every chunk the TMA loader
    filled.

    Read from the source: the issuing warp takes a tile only when it is whole and every page is in the pool, and
    the tensor copy writes through the async proxy; every other tile is the gatherers', who wait for all their
    copies (no arrival left to land with them), fence, and only then arrive on the tile's 9 barriers.
    """
    loader = tma_loader_source()
    assert "const bool whole = key0 + kKeysPerTile <= kv_len &&" in loader
    assert "if (key0 + kKeysPerTile <= kv_len && !bad_tile) continue;  // warp 0 asks for this one" in loader
    gathered = loader[loader.index("wait_until_at_least(issued, k);"):]
    waited = re.search(r"cp_async_commit\(\);\s*cp_async_wait<0>\(\);\s*fence_proxy_async\(\);[^\n]*\n"
                       r"\s*named_barrier\(kBarGather, 64\);[^\n]*\n\s*if \(key_in_tile == 0\)\n#pragma unroll 1\n"
                       r"\s*for \(int j = 0; j < kChunks; \+\+j\) mbar_arrive\(&full\[\(seq \+ j\) % kSlots\]\);", gathered)
    assert waited, "the gatherers must wait for and fence their copies before they arrive"
    assert "cp_async_arrive" not in loader  # no arrival that would complete with copies not fenced
    assert gathered.count("mbar_arrive(") == 1
    src = hopper_source("tile_n")
    fence = re.search(r"const bool fence_chunks = ([^;]+);", src)
    assert fence and fence.group(1) == "!kFewerFences || !tma_chunks"
    assert "if (fence_chunks) fence_proxy_async();" in src
    # Fewer fences only in the kernels whose loader is the tensor copy's; the gathering kernels fence every chunk.
    for sid in HOPPER_IDS:
        d, text = stages.get(sid).hopper, stage_source(sid)
        assert re.search(r"tile_n_block<\w+, CpAsyncLoader, false>\(p, kv\);", kernel_body(text, d.gather)), sid
        if d.tma:
            assert re.search(r"tile_n_block<\w+, TmaLoader, true>\(p, kv\);", kernel_body(text, d.tma)), sid
        else:
            assert "TmaLoader" not in text and "hopper/tma_loader.cuh" not in text, sid


def test_the_combine_grid_rule_matches_the_kernel():
    """The host's grid of the merge (four blocks a pair or one) as stages.launches states it and as the source does."""
    src = hopper_source("common", "merge", "launch")
    assert re.search(rf"constexpr int kSlicedPieces = {stages.HOPPER_SLICED_PIECES};", src)
    assert re.search(r"return num_splits >= 16 \* units && \(units <= 2 \|\| unit_tiles_bound >= kSlicedPieces\) "
                     r"\? kManySlices : 1;", src)
    s = stages.hopper_combine_slices
    assert s(132, 1, 2) == 4            # one stream: a grid of one row is sliced whatever its pieces
    assert s(132, 8, 18) == 1           # 8 streams of 1024 keys: at most 18 pieces a unit, merged whole
    assert s(132, 8, 1025) == 4         # a table wide enough for a unit of many pieces: sliced
    assert s(132, 9, 1025) == 1         # more units than 132 / 16: one block a pair
    for sid in HOPPER_IDS:  # these calls run no seesaw: every Hopper stage merges them alike
        merge_grid_rule(stages.get(sid))
    # many units, each cut into a few pieces (8 streams of 64 heads: 64 units): a warp a pair, 8 pairs a block
    assert re.search(r"constexpr bool combine_by_warps\(int num_splits, int units\) \{ return num_splits <= 3 \* units; \}",
                     src)
    assert "constexpr int kPairsPerWarpMergeBlock = kCombineThreads / 32;" in src
    assert stages.HOPPER_PAIRS_PER_WARP_MERGE_BLOCK == stages.HOPPER_COMBINE_THREADS // 32
    w = stages.hopper_combine_by_warps
    assert w(132, 64) and w(132, 44) and not w(132, 43) and not w(132, 16) and w(7, 3)
    # A table of one tile at most cuts no unit: the call is the main kernel alone.
    assert re.search(r"inline bool may_cut\(const MlaParams& p\) \{ return unit_tiles_bound\(p\) > 1; \}", src)
    assert "if (!may_cut(q)) return cudaSuccess;" in src
    assert src.count("if (!may_cut(p) || ") == 2  # neither merge's geometry has a grid there
    assert re.search(r"return combine_slices\(p\.num_splits, shape_of<Rule>\(p\)\.units, unit_tiles_bound\(p\)\);", src)
    assert re.search(r"return \(\(int64_t\)p\.max_pages \* p\.page_size \+ kKeysPerTile - 1\) / kKeysPerTile;", src)
    assert re.search(r"return merge_slices<Rule>\(p\) == 1 && combine_by_warps\(p\.num_splits, shape_of<Rule>\(p\)\.units\);",
                     src)
    # each stage launches its own two merges under its own rule
    for sid in HOPPER_IDS:
        d = stages.get(sid).hopper
        assert re.search(rf"launch_merge<\w+>\(q, stream, pdl, {d.combine}, {d.merge_by_warps}\)", stage_source(sid)), sid
    assert stages.HOPPER_KERNELS == ("hopper_kernel", "hopper_tma_kernel", "hopper_seesaw_kernel",
                                     "hopper_combine_kernel", "hopper_merge_by_warps_kernel",
                                     "hopper_seesaw_any_pages_kernel")


def merge_grid_rule(hop):
    """A Hopper stage's merges for calls that run no seesaw, as its launches state them."""
    d = hop.hopper
    (_, comb) = hop.launches(8, 9, 8, 18, 64, 132)
    assert comb.grid == (stages.HOPPER_PAIRS_PER_BLOCK, 8, 1) and comb.block == (256, 1, 1)
    (_, comb) = hop.launches(8, 9, 8, 1025, 64, 132)
    assert comb.grid == (4 * stages.HOPPER_PAIRS_PER_BLOCK, 8, 1) and comb.block == (128, 1, 1)
    (_, comb) = hop.launches(2, 9, 8, 1025, 64, 132)  # two units: 640 blocks of 256 threads, one wave
    assert comb.grid == (4 * stages.HOPPER_PAIRS_PER_BLOCK, 2, 1) and comb.block == (256, 1, 1)
    (_, comb) = hop.launches(3, 9, 8, 1025, 64, 132)
    assert comb.block == (128, 1, 1)
    (_, merge) = hop.launches(8, 9, 64, 18, 64, 132)
    assert merge.kernel == d.merge_by_warps
    assert merge.grid == (stages.HOPPER_PAIRS_PER_BLOCK // 8, 64, 1) and merge.block == (256, 1, 1)
    (_, comb) = hop.launches(8, 16, 8, 18, 64, 132)  # 16 units: a block a pair
    assert comb.kernel == d.combine and comb.grid == (stages.HOPPER_PAIRS_PER_BLOCK, 16, 1)
    (_, merge) = hop.launches(1, 9, 8, 2, 64, 2)  # a caller's two blocks: one unit in two pieces, by warps
    assert merge.kernel == d.merge_by_warps and merge.grid == (10, 1, 1)
    (_, comb) = hop.launches(1, 9, 8, 2, 64, 132)  # the same call on every SM: a sliced grid
    assert comb.kernel == d.combine and comb.grid == (4 * stages.HOPPER_PAIRS_PER_BLOCK, 1, 1)
    # A table of one tile at most cuts no unit: the call is the main kernel alone.
    assert [x.kernel for x in hop.launches(1, 9, 8, 1, 64, 132)] == [d.gather]
    assert [x.kernel for x in hop.launches(4, 1, 128, 4, 16, 132)] == [d.gather]
    assert len(hop.launches(4, 1, 128, 5, 16, 132)) == 2


def test_the_loader_rule_matches_the_kernel():
    """From stage 11 on, a call copies by TMA (tensor_copy_kernel, seesaw_tma_kernel, hopper_tma_kernel) where the
    table's width gives each block a dozen tiles and pages fit; stage 10 always gathers."""
    shared = hopper_source("common", "launch")
    assert re.search(r"return page_size % 16 == 0 && \(page_size % kKeysPerTile == 0 \|\| kKeysPerTile % page_size == 0\);",
                     shared)
    # the tensor map asks the same of pages (tma_cache), and kv_tensor makes none for a cache that fails it
    assert re.search(r"return tma_pages\(p\.page_size\) && reinterpret_cast<uintptr_t>\(p\.kv\) % 16 == 0", shared)
    assert re.search(r"if \(!tma_cache\(p\)\) return kv;", shared)
    assert "kTmaTilesPerBlock" not in stage_source("wgmma") and "tma_pays" not in stage_source("wgmma")
    for sid in ("tensor_copy", "seesaw", "hopper"):
        src = stage_source(sid)
        assert re.search(rf"constexpr int kTmaTilesPerBlock = {stages.HOPPER_TMA_TILES_PER_BLOCK};", src), sid
        assert re.search(r"const int64_t tiles_bound = \(int64_t\)sh\.units \* unit_tiles_bound\(p\);", src), sid
        # where the seesaw runs, the stage runs it instead (sh.rows: the call's units are the seesaw's)
        rule = r"!sh\.rows && " if stages.get(sid).hopper.seesaw else r"(?<!!sh\.rows && )"
        assert re.search(rule + r"tma_pages\(p\.page_size\) &&\s*tiles_bound >= \(int64_t\)kTmaTilesPerBlock \* "
                         r"p\.num_splits;", src), sid
    for sid in HOPPER_IDS:
        tma_rule(stages.get(sid))


def tma_rule(hop):
    """Where a Hopper stage copies by TMA, as stages.hopper_tma_pays and its launches say."""
    d = hop.hopper

    def pays(*call):
        return stages.hopper_tma_pays(*call, hop.id)

    if d.tma is None:  # stage 10: never
        assert not any(pays(*c) for c in [(8, 9, 8, 1024, 64, 132), (8, 16, 64, 257, 64, 132), (1, 9, 8, 256, 64, 2)])
        (main, _) = hop.launches(8, 9, 8, 1024, 64, 132)
        assert main.kernel == d.gather and main.dynamic_smem_bytes == stages.HOPPER_SMEM_BYTES
        return
    # 8 streams of 65536 keys at 8 heads: 62 tiles a block; one stream of 16384: 2; 8 x 16384 at 8 heads: 15.5
    assert pays(8, 9, 8, 1024, 64, 132) and not pays(1, 9, 8, 256, 64, 132) and pays(8, 9, 8, 256, 64, 132)
    assert not pays(8, 9, 8, 64, 64, 132)  # 8 x 4096: 3.9 a block
    assert pays(8, 9, 64, 25, 64, 132)  # 64 heads: 8 groups a stream, 12.1 tiles a block (the seesaw's line: 27.5)
    # 27.5 tiles a block: stage 11 copies by TMA, where stages 12 and 13 run the seesaw
    assert pays(8, 9, 64, 64, 64, 132) == (d.seesaw is None)
    assert stages.hopper_tma_pays(8, 9, 64, 64, 64, 132, "tensor_copy")
    assert pays(1, 9, 8, 1584, 64, 132) and not pays(1, 9, 8, 1583, 64, 132)  # 12 x 132 = 1584 tiles exactly
    assert pays(8, 9, 8, 4096, 16, 132) and pays(8, 9, 8, 2048, 32, 132) and pays(8, 9, 8, 512, 128, 132)
    assert not pays(8, 9, 8, 65536, 1, 132) and not pays(8, 9, 8, 16384, 8, 132) and not pays(8, 9, 8, 2731, 48, 132)
    assert pays(1, 9, 8, 256, 64, 2) and not pays(1, 9, 8, 256, 64, 22)  # fewer blocks, more tiles each
    (main, _) = hop.launches(8, 9, 8, 1024, 64, 132)
    assert main.kernel == d.tma and main.dynamic_smem_bytes == stages.HOPPER_TMA_SMEM_BYTES
    (main, _) = hop.launches(8, 9, 8, 64, 64, 132)
    assert main.kernel == d.gather and main.dynamic_smem_bytes == stages.HOPPER_SMEM_BYTES


def test_the_seesaw_rule_matches_the_kernel():
    """Stages 12 and 13 run the crossed seesaw where pairs fill tiles of 64, pages suit TMA and the table's width gives
    each block see_tiles_per_block tiles of 64-pair units (fewer with pages of 64 keys or a multiple than with pages
    of 16 or 32): stage 12 where the padding is an eighth at most, the op (13) within a third where the pages hold
    whole tiles.  Their seesaw is built with its page lookup by steps and its chunks copied four at a time; stages 10
    and 11 have none."""
    common = hopper_source("common")
    assert re.search(rf"constexpr int kSeeTilesPerBlock = {stages.HOPPER_SEE_TILES_PER_BLOCK};", common)
    assert re.search(rf"constexpr int kSeeTilesPerBlockSmallPages = {stages.HOPPER_SEE_TILES_PER_BLOCK_SMALL_PAGES};",
                     common)
    assert re.search(r"return page_size % kKeysPerTile == 0 \? kSeeTilesPerBlock : kSeeTilesPerBlockSmallPages;", common)
    assert stages.HOPPER_SEE_TILES_PER_BLOCK < stages.HOPPER_SEE_TILES_PER_BLOCK_SMALL_PAGES
    assert [stages.hopper_see_tiles_per_block(ps) for ps in (16, 32, 64, 128, 256)] == [56, 56, 15, 15, 15]
    assert re.search(r"const int64_t units = \(int64_t\)p\.batch \* \(\(p\.q_len \* p\.num_heads \+ kRowsPairs - 1\) "
                     r"/ kRowsPairs\);", common)
    assert re.search(r"return units \* unit_tiles_bound\(p\) >= \(int64_t\)see_tiles_per_block\(p\.page_size\) \* "
                     r"p\.num_splits;", common)
    # a unit's tiles: the table's width in 64-key tiles (stages.hopper_table_tiles)
    assert re.search(r"unit_tiles_bound\(const MlaParams& p\) \{\n  return \(\(int64_t\)p\.max_pages \* p\.page_size \+ "
                     r"kKeysPerTile - 1\) / kKeysPerTile;", common)
    # pairs fill their tiles within an eighth (64 pairs or more) or within a third
    assert re.search(r"return pairs >= kRowsPairs && 8 \* \(\(pairs \+ kRowsPairs - 1\) / kRowsPairs \* kRowsPairs\) <= "
                     r"9 \* pairs;", common)
    assert re.search(r"return 3 \* \(\(pairs \+ kRowsPairs - 1\) / kRowsPairs \* kRowsPairs\) <= 4 \* pairs;", common)
    assert re.search(r"constexpr int kSeeThreads = 256;", common)
    # each stage's rule: none in 10 and 11; an eighth in 12; a third with whole tiles, else an eighth, in 13
    for sid in ("wgmma", "tensor_copy"):
        src = stage_source(sid)
        assert "NoSeesaw" in src and "seesaw_block" not in src and "hopper/seesaw.cuh" not in src, sid
    assert re.search(r"return fills_rows_eighth\(p\.q_len \* p\.num_heads\) && tma_pages\(p\.page_size\) && "
                     r"seesaw_pays\(p\);", stage_source("seesaw"))
    assert "fills_rows_third" not in stage_source("seesaw")
    assert re.search(r"const bool whole_tiles = p\.page_size % kKeysPerTile == 0;\s*"
                     r"return \(!whole_tiles \? fills_rows_eighth\(pairs\) : fills_rows_third\(pairs\)\) && "
                     r"tma_pages\(p\.page_size\) &&\s*seesaw_pays\(p\);", stage_source("hopper"))
    # the seesaw kernel is launched only where the rule holds and takes its shape as known
    assert re.search(r"const Shape sh = shape_in\(p, true\);", hopper_source("seesaw"))
    # the op's pieces: the page lookup by steps, a tile's chunks four to a copy (a stage's kernels name no other)
    pieces = hopper_source("seesaw_pieces")
    seesaw = hopper_source("seesaw")
    parts = seesaw[seesaw.index("struct SeesawParts {"):]
    assert "using Boxes = SeeBoxes<kWholeTiles>;" in parts and "using Pages = PagesBySteps;" in parts
    assert "template <bool kWholeTiles, bool kFourChunks = true>\nstruct SeeBoxes" in pieces
    fills = stages.hopper_fills_rows
    assert [p for p in range(1, 400) if fills(p)] == [p for p in range(48, 400) if 3 * (-(-p // 64) * 64) <= 4 * p]
    assert fills(48) and not fills(47) and fills(96) and fills(144) and fills(160) and not fills(72) and not fills(80)
    assert not fills(136) and fills(576) and fills(1152)
    assert [p for p in range(1, 400) if fills(p, eighth=True)] == [p for p in range(64, 400)
                                                                    if 8 * (-(-p // 64) * 64) <= 9 * p]
    assert not fills(144, eighth=True) and fills(120, eighth=True) and not fills(48, eighth=True)
    pays, tma, hop = stages.hopper_seesaw_pays, stages.hopper_tma_pays, stages.get("hopper")
    # 16 units of 64 pairs, pages of 64: 124 tiles each give 15 a block over 132 blocks (15.03), 123 do not (14.9)
    assert pays(1, 16, 64, 124, 64, 132) and not pays(1, 16, 64, 123, 64, 132) and tma(1, 16, 64, 123, 64, 132)
    assert not tma(1, 16, 64, 124, 64, 132)  # one or the other
    # pages of 16 and 32: 462 tiles each give 56 a block exactly, 461 do not
    assert pays(1, 16, 64, 1848, 16, 132) and not pays(1, 16, 64, 1844, 16, 132)
    assert pays(1, 16, 64, 924, 32, 132) and not pays(1, 16, 64, 922, 32, 132)
    assert pays(1, 16, 64, 62, 128, 132) and not pays(1, 16, 64, 61, 128, 132)  # pages of 128: the lower line
    assert pays(8, 16, 64, 16, 64, 132) and not pays(8, 16, 64, 15, 64, 132)  # 15.5 and 14.5 tiles a block
    assert pays(8, 9, 64, 28, 64, 132) and not pays(8, 9, 64, 27, 64, 132)  # 15.3 and 14.7
    assert not pays(8, 9, 8, 1025, 64, 132)  # 72 pairs leave 56 of 128 rows empty: never the seesaw
    assert pays(8, 16, 8, 1025, 64, 132)  # 128 pairs: two whole units a stream
    assert pays(8, 9, 16, 1025, 64, 132) and pays(8, 3, 16, 1025, 64, 132)  # 144 and 48 pairs: a third of padding
    assert pays(8, 9, 16, 513, 128, 132)  # pages of 128: whole tiles too
    assert not pays(8, 9, 16, 4097, 16, 132) and not pays(8, 9, 16, 2049, 32, 132)  # pages of 16, 32: an eighth
    assert pays(8, 15, 8, 4097, 16, 132)  # 120 pairs: an eighth of padding, so with pages of 16 too
    assert not pays(8, 5, 16, 1025, 64, 132)  # 80 pairs leave 48 of 128 rows empty
    assert not pays(8, 16, 64, 1025, 48, 132) and not pays(8, 16, 64, 1025, 8, 132)  # pages TMA cannot read
    assert pays(8, 16, 64, 4097, 16, 132) and pays(8, 16, 64, 2049, 32, 132) and pays(8, 16, 64, 513, 128, 132)
    assert not pays(8, 16, 64, 4097, 16, 8448)  # more blocks, fewer tiles each
    # stage 12: the same line in tiles, the eighth whatever the pages; stages 10 and 11: never
    for call, see in (((8, 9, 16, 1025, 64, 132), False), ((8, 3, 16, 1025, 64, 132), False),
                      ((8, 9, 16, 513, 128, 132), False), ((8, 15, 8, 4097, 16, 132), True),
                      ((8, 16, 8, 1025, 64, 132), True), ((1, 16, 64, 124, 64, 132), True),
                      ((1, 16, 64, 123, 64, 132), False), ((8, 16, 64, 4097, 16, 8448), False)):
        assert pays(*call, "seesaw") == see, call
        assert not pays(*call, "wgmma") and not pays(*call, "tensor_copy")
    assert tma(8, 9, 16, 1025, 64, 132, "seesaw") and not tma(8, 9, 16, 1025, 64, 132)  # 144 pairs: TMA in 12 only
    assert stages.hopper_units(8, 16, 64, 65, 64, 132) == 8 * 16 and stages.hopper_units(8, 9, 64, 27, 64, 132) == 64
    assert stages.hopper_units(8, 9, 16, 1025, 64, 132) == 8 * 3 and stages.hopper_units(8, 9, 16, 1025, 64, 132,
                                                                                          "seesaw") == 8 * 2
    for sid in ("seesaw", "hopper"):
        st, src = stages.get(sid), stage_source(sid)
        d = st.hopper
        (main, merge) = st.launches(8, 16, 64, 257, 64, 132)
        assert (main.kernel, main.block, main.dynamic_smem_bytes) == (d.seesaw_kernel, (256, 1, 1),
                                                                       stages.HOPPER_SEE_SMEM_BYTES)
        assert merge.grid[1] == 128  # a row of merge blocks for each of the seesaw's 128 units
        # The seesaw kernel for whole tiles with pages of 64 keys or a multiple, the one that asks with pages of 16, 32
        for page_size, kernel in ((64, d.seesaw_kernel), (128, d.seesaw_kernel), (192, d.seesaw_kernel),
                                  (16, d.seesaw_any_pages), (32, d.seesaw_any_pages)):
            assert stages.hopper_seesaw_kernel_for(page_size, sid) == kernel
            launched = st.launches(8, 16, 64, 16384 // page_size + 1, page_size, 132)[0]
            assert launched.kernel == kernel and launched.dynamic_smem_bytes == stages.HOPPER_SEE_SMEM_BYTES, page_size
        assert re.search(rf"return kv\.box_keys == kKeysPerTile && kv\.chunk_boxes \? {d.seesaw_kernel} : "
                         rf"{d.seesaw_any_pages};", src), sid
        assert "seesaw_block<SeesawParts<true>>(p, kv);" in kernel_body(src, d.seesaw_kernel), sid
        assert "seesaw_block<SeesawParts<false>>(p, kv);" in kernel_body(src, d.seesaw_any_pages), sid
    # (the map of four chunks only for pages of 64 or a multiple)
    assert re.search(r"kv\.chunk_boxes = 0;\s*if \(four_chunks && box_keys == kKeysPerTile\) \{", hopper_source("launch"))


def test_the_combine_block_rule_matches_the_kernel():
    """Narrow blocks (128 threads) only in a sliced grid of more than two units, as the source says."""
    src = hopper_source("merge")
    assert re.search(rf"constexpr int kCombineThreads = {stages.HOPPER_COMBINE_THREADS};", src)
    assert re.search(rf"constexpr int kNarrowCombineThreads = {stages.HOPPER_NARROW_COMBINE_THREADS};", src)
    assert re.search(r"return slices > 1 && units > 2 \? kNarrowCombineThreads : kCombineThreads;", src)
    for sid in HOPPER_IDS:
        assert f"__launch_bounds__(kCombineThreads) {stages.get(sid).hopper.combine}(" in stage_source(sid), sid
    # the kernel picks the narrow merge from the launch's block size, which the host chose
    assert re.search(r"else if \(blockDim\.x == kNarrowCombineThreads\)\s*"
                     r"combine_slice<Rule, Stamps, kManySlices, kNarrowCombineThreads>", src)
    t = stages.hopper_combine_threads
    assert [t(1, u) for u in (1, 2, 3, 100)] == [256] * 4
    assert [t(4, u) for u in (1, 2, 3, 8)] == [256, 256, 128, 128]


def test_a_whole_units_rows_are_staged_once_each_without_bank_conflicts_and_leave_in_whole_lines():
    """The epilogue's layout (models.hopper_out_staging), and the source holding the same constants."""
    from mla_lab.models import HOPPER_STAGE_ROW_BYTES, hopper_out_staging

    st = hopper_out_staging()
    pairs = stages.HOPPER_PAIRS_PER_GROUP
    # every (pair, dim) of the warpgroup's 40 pairs is written exactly once, at its row's place
    assert sorted(st["written"].values()) == [(n, d) for n in range(pairs) for d in range(512)]
    assert all(off == n * HOPPER_STAGE_ROW_BYTES + 2 * d for off, (n, d) in st["written"].items())
    assert max(st["written"]) < 9 * pairs * 128  # inside the warpgroup's Q^T region (kQBytes)
    # each 8x8 block's 8 rows of 16 bytes fall in 32 different banks: one pass of shared memory
    assert len(st["bank_sets"]) == 4 * 5 * 4 * 4 and all(len(set(b)) == 32 for b in st["bank_sets"])
    # without the 16 bytes of padding, every row of a block would start in the same bank
    assert HOPPER_STAGE_ROW_BYTES % 128 == 16
    # the copy out: each warp's 32 lanes read 512 contiguous bytes of one pair's row (4 whole lines of out)
    for lanes in st["copies"]:
        assert len({n for n, _ in lanes}) == 1
        starts = [b for _, b in lanes]
        assert starts == list(range(starts[0], starts[0] + 16 * len(lanes), 16)) and len(lanes) == 32
    src = hopper_source("common", "tile_n")
    assert "constexpr int kStageRowBytes = kDimV * 2 + 16;" in src
    assert re.search(r"const uint32_t rows = smem_addr\(smem \+ kOffQ \+ group \* kQBytes\) \+ r \* kStageRowBytes \+\s*"
                     r"2 \* \(64 \* \(m / 2\) \+ 16 \* warp \+ 8 \* \(m % 2\)\);", src)
    assert "stmatrix_x4_trans(rows + 8 * i * kStageRowBytes + 2 * 64 * j," in src
    # block m holds chunk j + m / 2, dims + 8 (m % 2): the registers o[j][4i], o[j][4i + 2], o[j + 1][4i], o[j + 1][4i + 2]
    packs = re.findall(r"pack_bf16x2\(o\[(j(?: \+ 1)?)\]\[4 \* i( \+ 2)?\] \* inv\[2 \* i\], "
                       r"o\[\1\]\[4 \* i \+ (?:1|3)\] \* inv\[2 \* i \+ 1\]\)", src)
    assert packs == [("j", ""), ("j", " + 2"), ("j + 1", ""), ("j + 1", " + 2")]
