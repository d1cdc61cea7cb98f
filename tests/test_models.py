"""The CPU models of the kernel stages: answers against the reference, byte counts against the
closed form, and the relations between stages that the chapters rely on."""

import pytest
import torch

from mla_lab.core import stages
from mla_lab.models import MODELS, model_tensor_core, Traffic, dot_chunks16, dot_serial, dot_warp, run_model, traffic
from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.reference import reference_attention

STAGE_IDS = [s.id for s in stages.cuda_stages()]

CASES = [
    # (problem, num_splits)
    # 3 streams of different lengths (9 keys is not a multiple of any tile), pages of 16
    (Problem(streams=3, q_len=3, heads=3, prefix=(0, 13, 40), page_size=16), 3),
    # one stream, one row, one head, scattered pages of 1
    (Problem(streams=1, q_len=1, heads=1, prefix=0, page_size=1), 1),
    # 17 rows: two row groups (16 + 1) for shared_rows
    (Problem(streams=1, q_len=17, heads=2, prefix=5, page_size=1), 2),
    # 9 heads: flash_ht8 / kv_split take a full tile of 8 and a partial tile of 1
    (Problem(streams=2, q_len=1, heads=9, prefix=(20, 3), page_size=64), 2),
    # more splits than tiles: kv_lens 23 and 6 -> at most ceil(23/8) = 3 tiles of 8; 7 splits, most empty
    (Problem(streams=2, q_len=3, heads=2, prefix=(20, 3), page_size=16, scattered=False), 7),
    # a single split of a longer stream
    (Problem(streams=1, q_len=9, heads=8, prefix=50, page_size=16), 1),
]
CASE_IDS = [f"{p.label()} s{ns}" for p, ns in CASES]


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def references():
    out = {}
    for i, (p, _) in enumerate(CASES):
        w = make_workload(p, seed=10 + i, poison=True)  # a model that reads poison returns NaN
        out[i] = (w, *reference_attention(*w.args()))
    return out


def test_every_cuda_stage_has_a_model():
    assert sorted(MODELS) == sorted(STAGE_IDS)


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASE_IDS)
@pytest.mark.parametrize("stage", STAGE_IDS)
def test_model_matches_reference(references, stage, case):
    p, ns = CASES[case]
    w, ref_out, ref_lse = references[case]
    out, lse, tr = run_model(stage, w, ns)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    if stage == "tensor_core" or stages.get(stage).persistent:
        # P rounded to bf16 before it meets V (the tensor cores' operand type): a few 1e-4
        assert rel_l2(out, ref_out) < 2e-3
        out, lse, _ = MODELS[stage](w, ns, round_p=False)
    # fp32 throughout, only the order of the sums differs from the reference
    assert rel_l2(out, ref_out) < 1e-5
    assert float((lse - ref_lse).abs().max()) < 1e-5 * max(1.0, float(ref_lse.abs().max()))
    # the counted bytes equal the closed form, part by part
    assert tr.parts == traffic(stage, p, ns).parts


@pytest.mark.parametrize("stage, live", [
    # float4, tiles of 8: per_split = ceil(ceil(23 / 7) / 8) * 8 = 8 for stream 0 (and 8 for stream 1:
    # ceil(ceil(6 / 7) / 8) * 8).  Stream 0's rows see 21, 22, 23 keys: splits 0..7, 8..15, 16..
    # are live for each (3 x 3); stream 1's rows see 4, 5, 6 keys: split 0 only (3 x 1).
    ("float4", 3 * 3 + 3 * 1),
    # per_head, tiles of 16: per_split = ceil(4 / 16) * 16 = 16 for stream 0: 2 live splits per row
    # (0..15, 16..); stream 1: 1.  3 x 2 + 3 x 1
    ("per_head", 3 * 2 + 3 * 1),
])
def test_empty_splits_are_counted(references, stage, live):
    """The case of 7 splits for kv_lens 23 and 6: most splits are empty."""
    i = 4
    p, ns = CASES[i]
    w = references[i][0]
    assert p.kv_lens == (23, 6) and ns == 7
    _, _, tr = run_model(stage, w, ns)
    B, T, H = 2, 3, 2
    # partial lse: one float per (stream, row, head, split), live or not; the combine reads them all
    assert tr.parts["partial lse"] == 4 * B * T * H * ns
    assert tr.parts["combine reads lse"] == 4 * B * T * H * ns
    # partial out: 512 floats per live (row, head, split); the combine reads only the live ones
    assert tr.parts["partial out"] == 4 * 512 * live * H
    assert tr.parts["combine reads partial out"] == tr.parts["partial out"]
    # q is read once per live split (and head)
    assert tr.parts["q"] == 2 * 576 * live * H


def test_traffic_parts_add():
    a, b = Traffic(), Traffic()
    a.add("kv", 10)
    a.add("q", 1)
    b.add("kv", 5)
    b.add("out", 2)
    c = a + b
    assert c.parts == {"kv": 15, "q": 1, "out": 2} and c.total == 18
    assert a.parts == {"kv": 10, "q": 1}  # unchanged


# ---- relations between stages, in closed form ---------------------------------------------

P9 = Problem(streams=1, q_len=9, heads=8, prefix=1000, page_size=1)


@pytest.mark.parametrize("ns", [1, 5, 64])
def test_per_head_reads_8x_the_keys_of_flash_ht8(ns):
    # flash_ht8 stages each key once per tile of 8 heads; per_head once per head.  Splits do not
    # change which keys a row reads, only how they are cut.
    kv_ht8 = traffic("flash_ht8", P9).parts["kv"]
    assert traffic("per_head", P9, ns).parts["kv"] == 8 * kv_ht8
    assert traffic("kv_split", P9, ns).parts["kv"] == kv_ht8
    # flash_ht8: every row t reads its prefix + t + 1 keys once, 576 bf16 each
    assert kv_ht8 == sum(1000 + t + 1 for t in range(9)) * 576 * 2


@pytest.mark.parametrize("prefix, ns", [(1000, 1), (1000, 7), (16384, 1), (0, 1)])
def test_shared_rows_reads_each_key_once_per_head(prefix, ns):
    p = P9.with_(prefix=prefix)
    H, T = 8, 9
    kv_sr = traffic("shared_rows", p, ns).parts["kv"]
    kv_ph = traffic("per_head", p, ns).parts["kv"]
    # shared_rows: one pass over the stream's prefix + 9 keys per head (all 9 rows in one group)
    assert kv_sr == H * (prefix + T) * 576 * 2
    # per_head: one pass per (row, head): rows see prefix + 1 .. prefix + 9 keys = 9 prefix + 45
    assert kv_ph == H * (T * prefix + 45) * 576 * 2
    # so the ratio is (9 prefix + 45) / (prefix + 9): 9 only in the limit of a long prefix, 5 at prefix 0
    ratio = kv_ph / kv_sr
    assert ratio == pytest.approx((9 * prefix + 45) / (prefix + 9))
    assert 5 <= ratio < 9
    if prefix >= 16384:
        assert ratio > 8.99
    # the same keys, so the same block-table reads, relative to each other
    assert traffic("per_head", p, ns).parts["block table"] * 576 * 2 == kv_ph * 4


def test_shared_rows_two_groups():
    # 17 rows: group 0 (rows 0..15) reads prefix + 16 keys, group 1 (row 16) prefix + 17
    p = Problem(streams=1, q_len=17, heads=3, prefix=100)
    assert traffic("shared_rows", p).parts["kv"] == 3 * ((100 + 16) + (100 + 17)) * 576 * 2
    assert traffic("shared_rows", p).parts["q"] == 3 * 17 * 576 * 2  # every row's query once


def test_naive_reads_k_and_v_per_row_and_head():
    p = Problem(streams=2, q_len=3, heads=5, prefix=(10, 0))
    tr = traffic("naive", p)
    # keys summed over rows: stream 0: 11 + 12 + 13 = 36; stream 1: 1 + 2 + 3 = 6 -> 42
    keys = 42
    # phase 1 reads all 576 values of each key, phase 3 the 512 of V again, per (row, head)
    assert tr.parts["kv"] == keys * 5 * (576 + 512) * 2
    assert tr.parts["block table"] == keys * 5 * 2 * 4  # a table lookup per key in both phases
    assert tr.parts["q"] == 2 * 3 * 5 * 576 * 2
    assert tr.parts["out"] == 2 * 3 * 5 * 512 * 2 and tr.parts["lse"] == 2 * 3 * 5 * 4


def test_every_stage_moves_at_least_the_minimum():
    from mla_lab.measure.roofline import min_bytes

    p = Problem(streams=3, q_len=9, heads=8, prefix=(300, 17, 64), page_size=16)
    least = min_bytes(p)
    for sid in STAGE_IDS:
        assert traffic(sid, p, 4).total >= least, sid
    # the ladder's point: shared_rows moves fewer bytes than the per-row stages before it
    assert traffic("shared_rows", p, 4).total < traffic("float4", p, 4).total == traffic("warp_per_key", p, 4).total


# ---- the ways a dot product is split over threads -------------------------------------------

def test_dot_variants_use_every_element_once():
    # q = e_i (a unit vector), k = i + 1: the product picks element i alone
    k = torch.arange(1, 577, dtype=torch.float32)
    eye = torch.eye(576)
    for dot in (dot_serial, dot_warp, dot_chunks16):
        assert torch.equal(dot(eye, k.expand(576, 576)), k), dot.__name__


def test_dot_variants_exact_on_small_integers():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 9, (7, 576), generator=g).float()
    k = torch.randint(-8, 9, (7, 576), generator=g).float()
    exact = (q.double() * k.double()).sum(-1).float()  # |sum| <= 576 * 64: exact in fp32
    for dot in (dot_serial, dot_warp, dot_chunks16):
        assert torch.equal(dot(q, k), exact), dot.__name__


def test_dot_variants_agree_to_fp32_rounding():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 3, 576, generator=g)
    k = torch.randn(4, 3, 576, generator=g)
    ref = dot_serial(q, k)
    bound = 576 * 2**-23 * (q * k).abs().sum(-1)  # n * eps * sum |q_i k_i|: a worst-case fp32 sum error
    for dot in (dot_warp, dot_chunks16):
        got = dot(q, k)
        assert got.shape == ref.shape == (4, 3)
        assert ((got - ref).abs() <= bound).all(), dot.__name__
        assert torch.allclose(got.double(), (q.double() * k.double()).sum(-1), rtol=0, atol=float(bound.max()))


# The seesaw's tile loop (seesaw_kernel, hopper_seesaw_kernel): tiles in pairs, one reference passed between the two
# warpgroups.  Shapes whose pairs fill tiles of 64: odd tile counts (a last pair with A alone), pieces cut
# between blocks (few blocks), streams shorter than a tile, and scores large enough to move the reference in
# both halves of a pair (q scaled up).
SEESAW_CASES = [
    (Problem(streams=2, q_len=4, heads=16, prefix=(300, 17), page_size=16), 5, 1.0),
    (Problem(streams=1, q_len=1, heads=64, prefix=200, page_size=64), 3, 1.0),
    (Problem(streams=3, q_len=2, heads=32, prefix=(0, 129, 64), page_size=64), 7, 1.0),
    (Problem(streams=1, q_len=2, heads=64, prefix=450, page_size=32), 2, 6.0),
    (Problem(streams=2, q_len=16, heads=8, prefix=(190, 1), page_size=16), 1, 6.0),
]


@pytest.mark.parametrize("case", range(len(SEESAW_CASES)),
                         ids=[f"{p.label()} s{ns} x{k}" for p, ns, k in SEESAW_CASES])
def test_the_seesaw_model_matches_reference(case):
    from mla_lab.models import model_seesaw

    p, ns, q_scale = SEESAW_CASES[case]
    w = make_workload(p, seed=40 + case, poison=True)
    w.q.mul_(q_scale)  # large scores: later keys pass the reference by far more than 2^8
    ref_out, ref_lse = reference_attention(*w.args())
    out, lse, _ = model_seesaw(w, ns)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert rel_l2(out, ref_out) < 3e-3  # P rounded to bf16, twice for P_A where B moved the reference
    assert (lse - ref_lse).abs().max() < 1e-4
    out, lse, _ = model_seesaw(w, ns, round_p=False)
    assert rel_l2(out, ref_out) < 1e-5 and (lse - ref_lse).abs().max() < 1e-4


@pytest.mark.parametrize("case", range(len(SEESAW_CASES)),
                         ids=[f"{p.label()} s{ns} x{k}" for p, ns, k in SEESAW_CASES])
def test_the_crossed_seesaw_model_matches_reference_and_the_seesaw(case):
    from mla_lab.models import model_seesaw

    p, ns, q_scale = SEESAW_CASES[case]
    w = make_workload(p, seed=40 + case, poison=True)
    w.q.mul_(q_scale)
    ref_out, ref_lse = reference_attention(*w.args())
    out, lse, tr = model_seesaw(w, ns, cross=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert rel_l2(out, ref_out) < 3e-3 and (lse - ref_lse).abs().max() < 1e-4  # every P rounded once
    see_out, see_lse, see_tr = model_seesaw(w, ns)
    assert tr.parts == see_tr.parts  # the same bytes: only the order of the work and its rescales differ
    assert torch.equal(lse, see_lse)  # the same references and sums
    # in fp32 the two orders differ only by the order of their additions
    out, _, _ = model_seesaw(w, ns, round_p=False, cross=True)
    see_out, _, _ = model_seesaw(w, ns, round_p=False)
    assert rel_l2(out, see_out) < 1e-6 and rel_l2(out, ref_out) < 1e-5


@pytest.mark.parametrize("ns, seesaw", [(1, True), (5, True), (6, False)])
@pytest.mark.parametrize("stage", ["wgmma", "tensor_copy", "seesaw", "hopper"])
def test_the_hopper_model_runs_the_crossed_seesaw_where_the_stage_does(stage, ns, seesaw):
    """576 pairs over a table of 9 tiles: 9 units of 64 pairs give one block 81 tiles and five blocks 16.2 each,
    where stages 12 and 13 run the crossed seesaw (stages.hopper_seesaw_pays: 15 tiles a block with pages of 64;
    576 pairs fill 9 tiles of 64 exactly), and six blocks 13.5 each, where they run 8 units of 72, as stages 10 and
    11 always do.  The model follows, and its bytes equal the closed form's, which reads the kernel from the table's
    width and the blocks."""
    from mla_lab.models import model_hopper, model_seesaw

    seesaw = seesaw and stages.get(stage).hopper.seesaw is not None
    p = Problem(streams=1, q_len=9, heads=64, prefix=440, page_size=64)
    w = make_workload(p, seed=61, poison=True)
    assert w.block_table.shape[1] == 9
    assert stages.hopper_seesaw_pays(1, 9, 64, 9, 64, ns, stage) == seesaw
    ref_out, ref_lse = reference_attention(*w.args())
    out, lse, tr = model_hopper(w, ns, stage=stage)
    assert rel_l2(out, ref_out) < 2e-3 and (lse - ref_lse).abs().max() < 1e-4
    cross_out, cross_lse, _ = model_seesaw(w, ns, cross=True, stage=stage)
    assert torch.equal(out, cross_out) == seesaw
    assert tr.parts == traffic(stage, p, ns).parts
    # every unit reads all of its stream's keys: 9 units of 64 pairs read 9/8 of what 8 of 72 do
    kept = traffic(stage, p, 6)  # 13.5 tiles a block: not the seesaw
    assert traffic(stage, p, ns).parts["kv"] * (8 if seesaw else 1) == kept.parts["kv"] * (9 if seesaw else 1)


def test_the_large_score_seesaw_case_moves_the_reference_in_a_b_tile():
    """The large-score case is the one that exercises the rescales: some pair's B tile (an odd tile) holds a
    score more than 2^8 above every score of the tiles before it, so warpgroup 1 moves the reference there
    and P_A is rounded a second time, in B's reference."""
    import math

    p, _, q_scale = SEESAW_CASES[3]
    w = make_workload(p, seed=43, poison=True)
    w.q.mul_(q_scale)
    L, K = int(w.kv_lens[0]), 64
    keys = w.kv_cache[w.block_table[0].long()[torch.arange(L) // p.page_size], torch.arange(L) % p.page_size].float()
    s = w.q[0].reshape(-1, 576).float() @ keys.T * (w.scale / math.log(2.0))
    tile_max = torch.stack([s[:, t * K:(t + 1) * K].max(-1).values for t in range(-(-L // K))], dim=1)
    before = torch.cummax(tile_max, dim=1).values
    jumps = tile_max[:, 1:] > before[:, :-1] + 8.0
    assert jumps[:, 0::2].any()  # tiles 1, 3, 5, ...: the B of a pair


# The seesaw's page lookup (PageSteps, csrc/hopper/seesaw_pieces.cuh): by steps set once per kernel, the
# same entries and offsets as the division it replaces, for every page size the tensor copy reads.
@pytest.mark.parametrize("page_size", [16, 32, 64, 128, 192, 256, 320, 512])
def test_the_seesaw_page_steps_find_what_the_division_finds(page_size):
    from mla_lab.models import seesaw_page_steps, seesaw_tile_boxes

    boxes, tiles, shift = seesaw_page_steps(page_size)
    assert boxes * min(page_size, 64) == 64 and (tiles == 1 or tiles * 64 == page_size)
    assert (shift >= 0) == (tiles & (tiles - 1) == 0)  # 192 and 320 keys: 3 and 5 tiles a page, still divided
    for kv_len in (1, 63, 64, 65, 777, 4096, 5000):
        for tile in range(-(-kv_len // 64)):
            entries, in_page = seesaw_tile_boxes(page_size, tile, kv_len)
            assert (entries, in_page) == seesaw_tile_boxes(page_size, tile, kv_len, by_steps=False)
            assert entries and all(0 <= e < -(-kv_len // page_size) for e in entries)  # only entries the stream has
            assert 0 <= in_page < page_size and in_page % 64 == 0
