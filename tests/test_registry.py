"""The stage registry: order, files, kernels, ops, split rule, shared-memory sizes."""

import re

import pytest
import torch

from mla_lab.core import stages
from mla_lab.core.extension import CSRC
from mla_lab.core.stages import COMBINE_KERNEL, MAX_SPLITS, STAGES, choose_num_splits

CUDA = stages.cuda_stages()


def test_order_numbers_and_ids():
    # chapter 7 (CUDA graphs) has no stage of its own; the numbers skip it
    assert [s.number for s in STAGES] == [n for n in range(len(STAGES) + 1) if n != 7]
    assert [c.number for c in stages.CHAPTERS_WITHOUT_STAGE] == [7]
    assert [n for n, *_ in stages.chapter_map()] == list(range(len(STAGES) + 1)) == list(range(14))
    assert STAGES[0].id == "triton" and STAGES[0].kind == "triton" and not STAGES[0].is_cuda
    assert all(s.kind == "cuda" for s in STAGES[1:])
    ids = [s.id for s in STAGES]
    assert len(set(ids)) == len(ids)
    assert ids == ["triton", "naive", "flash_ht8", "kv_split", "per_head", "warp_per_key", "float4", "shared_rows",
                   "tensor_core", "wgmma", "tensor_copy", "seesaw", "hopper"]
    assert [s.id for s in CUDA] == ids[1:]
    # chapters are numbered like their stage
    for s in STAGES:
        assert s.chapter.startswith(f"{s.number:02d}_") and s.chapter.endswith(".ipynb")
    # every stage after kv_split keeps the split-KV design
    assert [s.splits for s in CUDA] == [False, False] + [True] * 10
    # Part III's four stages alone run a persistent grid (num_splits is its size) with a scheduler of their own,
    # and only they have a Hopper design
    assert [(s.number, s.id) for s in CUDA if s.persistent] == [(10, "wgmma"), (11, "tensor_copy"), (12, "seesaw"),
                                                                 (13, "hopper")]
    assert [s.id for s in CUDA if s.hopper is not None] == [s.id for s in CUDA if s.persistent]


def test_get_and_names():
    assert stages.get("float4") is STAGES[6]
    with pytest.raises(KeyError, match="no stage 'float5'; stages are triton, naive"):
        stages.get("float5")
    assert STAGES[0].op_name is None and STAGES[0].kernels == ()
    assert stages.get("naive").op_name == "mla_lab::naive"
    assert stages.get("naive").kernels == ("naive_kernel",)
    assert stages.get("per_head").kernels == ("per_head_kernel", COMBINE_KERNEL)
    with pytest.raises(ValueError, match="not a CUDA stage"):
        STAGES[0].launches(1, 1, 1, 1, 1)


HOPPER_IDS = ["wgmma", "tensor_copy", "seesaw", "hopper"]


def test_the_hopper_stages_designs():
    """Each Hopper stage adds one idea: wgmma gathers only (no tensor copy, no seesaw), tensor_copy adds the TMA
    kernel, seesaw the seesaw's two kernels with the eighth line, hopper (the op) the same with the third line."""
    d = {s.id: s.hopper for s in CUDA if s.persistent}
    assert list(d) == HOPPER_IDS
    assert d["wgmma"].kernels == ("wgmma_kernel", "wgmma_combine_kernel", "wgmma_merge_by_warps_kernel")
    assert d["tensor_copy"].kernels == ("tensor_copy_gather_kernel", "tensor_copy_kernel", "tensor_copy_combine_kernel",
                                        "tensor_copy_merge_by_warps_kernel")
    assert d["seesaw"].kernels == ("seesaw_gather_kernel", "seesaw_tma_kernel", "seesaw_kernel",
                                   "seesaw_combine_kernel", "seesaw_merge_by_warps_kernel", "seesaw_any_pages_kernel")
    assert d["hopper"].kernels == ("hopper_kernel", "hopper_tma_kernel", "hopper_seesaw_kernel",
                                   "hopper_combine_kernel", "hopper_merge_by_warps_kernel",
                                   "hopper_seesaw_any_pages_kernel")
    assert stages.HOPPER_KERNELS == d["hopper"].kernels == stages.get("hopper").kernels
    # <id>_kernel: the kernel of the stage's idea
    assert [d["wgmma"].gather, d["tensor_copy"].tma, d["seesaw"].seesaw_kernel, d["hopper"].gather] == [
        f"{i}_kernel" for i in HOPPER_IDS]
    assert [x.seesaw for x in d.values()] == [None, None, "eighth", "third"]
    assert d["wgmma"].tma is None and d["wgmma"].seesaw_kernel is None and d["wgmma"].seesaw_any_pages is None
    assert d["tensor_copy"].seesaw_kernel is None and d["tensor_copy"].seesaw_any_pages is None
    for sid in ("wgmma", "tensor_copy"):
        with pytest.raises(ValueError, match="no seesaw kernel"):
            stages.hopper_seesaw_kernel_for(64, sid)
    with pytest.raises(ValueError, match="not a Hopper stage"):
        stages.hopper_seesaw_pays(1, 16, 64, 1000, 64, 132, "tensor_core")


# (streams, q_len, heads, max_pages, page_size, num_splits) and the main kernel each Hopper stage launches
# (by role): "gather", "tma", "seesaw" (with pages of 64 keys or a multiple) or "any" (the seesaw's other kernel).
HOPPER_CALLS = [
    ((8, 9, 8, 64, 64, 132), ("gather", "gather", "gather", "gather")),  # 3.9 tiles a block: no tensor copy
    ((8, 9, 8, 1024, 64, 132), ("gather", "tma", "tma", "tma")),  # 72 pairs never fill tiles of 64
    ((8, 16, 64, 257, 64, 132), ("gather", "tma", "seesaw", "seesaw")),  # 1024 pairs fill them
    ((8, 9, 16, 1025, 64, 132), ("gather", "tma", "tma", "seesaw")),  # 144 pairs: within a third, not an eighth
    ((8, 9, 16, 4097, 16, 132), ("gather", "tma", "tma", "tma")),  # ... and pages of 16: an eighth for the op too
    ((4, 2, 128, 1000, 32, 132), ("gather", "tma", "any", "any")),  # 256 pairs, pages of 32
    ((8, 15, 8, 4097, 16, 132), ("gather", "tma", "any", "any")),  # 120 pairs: an eighth of padding
    ((8, 16, 64, 4097, 16, 8448), ("gather", "tma", "tma", "tma")),  # more blocks, fewer tiles each
]


HOPPER_CALL_IDS = ["x".join(map(str, shape)) for shape, _ in HOPPER_CALLS]


@pytest.mark.parametrize("shape, roles", HOPPER_CALLS, ids=HOPPER_CALL_IDS)
def test_each_hopper_stage_runs_its_own_kernels(shape, roles):
    B, T, H, mp, ps, ns = shape
    for sid, role in zip(HOPPER_IDS, roles):
        st = stages.get(sid)
        d = st.hopper
        main = st.launches(B, T, H, mp, ps, num_splits=ns)[0]
        kernel = dict(gather=d.gather, tma=d.tma, seesaw=d.seesaw_kernel, any=d.seesaw_any_pages)[role]
        assert main.kernel == kernel, (sid, shape)
        see = stages.hopper_seesaw_pays(B, T, H, mp, ps, ns, sid)
        assert see == (role in ("seesaw", "any")), (sid, shape)
        assert stages.hopper_tma_pays(B, T, H, mp, ps, ns, sid) == (role == "tma"), (sid, shape)
        if see:
            assert stages.hopper_seesaw_kernel_for(ps, sid) == kernel
            assert stages.hopper_units(B, T, H, mp, ps, ns, sid) == B * stages.hopper_seesaw_groups(T, H)
        else:
            assert stages.hopper_units(B, T, H, mp, ps, ns, sid) == B * stages.hopper_groups(T, H)


@pytest.mark.parametrize("shape", [shape for shape, _ in HOPPER_CALLS], ids=HOPPER_CALL_IDS)
def test_each_hopper_stage_launches_what_the_extension_says(ext, shape):
    """The compiled stage's kernel list and the launches it reports: the kernels with a grid are the registry's
    launches.  The C++ side gives both seesaw kernels the same geometry (the host picks one per call from the
    cache's tensor map); the one a call launches is the one hopper_seesaw_kernel_for names."""
    table = {row["id"]: row for row in ext.stage_table()}
    for sid in HOPPER_IDS:
        st = stages.get(sid)
        assert tuple(table[sid]["kernels"]) == st.kernels == st.hopper.kernels
        every = ext.launch_geometry(sid, *shape)
        assert [c["kernel"] for c in every] == list(st.kernels)
        launched = {c["kernel"] for c in every if c["grid"][0] > 0}
        if stages.hopper_seesaw_pays(*shape, sid):
            assert {st.hopper.seesaw_kernel, st.hopper.seesaw_any_pages} <= launched
            launched -= {st.hopper.seesaw_kernel, st.hopper.seesaw_any_pages} - {
                stages.hopper_seesaw_kernel_for(shape[4], sid)}
        assert launched == {x.kernel for x in st.launches(*shape[:5], num_splits=shape[5])}, sid


def test_the_seesaw_lines():
    """Where each stage runs the seesaw, over many shapes: never in wgmma and tensor_copy; in seesaw where the pairs
    fill tiles of 64 with an eighth of padding at most; in hopper also within a third, with pages of 64 or a multiple;
    and wherever seesaw runs it, hopper does too."""
    calls = [(B, T, H, 16384 // ps + 1, ps) for B in (1, 8) for T in (1, 2, 3, 4, 8, 9, 15, 16)
             for H in (8, 16, 64, 128) for ps in (16, 32, 64, 128)]
    for B, T, H, mp, ps in calls:
        pays = {sid: stages.hopper_seesaw_pays(B, T, H, mp, ps, 132, sid) for sid in HOPPER_IDS}
        assert not pays["wgmma"] and not pays["tensor_copy"]
        fits = stages.hopper_tma_pages(ps) and B * stages.hopper_seesaw_groups(T, H) * stages.hopper_table_tiles(
            mp, ps) >= stages.hopper_see_tiles_per_block(ps) * 132
        eighth = stages.hopper_fills_rows(T * H, eighth=True)
        third = stages.hopper_fills_rows(T * H, eighth=ps % 64 != 0)
        assert pays["seesaw"] == (eighth and fits), (B, T, H, ps)
        assert pays["hopper"] == (third and fits), (B, T, H, ps)
        assert pays["hopper"] >= pays["seesaw"]
        if not pays["seesaw"]:
            assert stages.hopper_tma_pays(B, T, H, mp, ps, 132, "seesaw") == stages.hopper_tma_pays(
                B, T, H, mp, ps, 132, "tensor_copy")
    assert not stages.hopper_tma_pays(8, 16, 64, 100000, 64, 132, "wgmma")


def _global_functions(path):
    text = path.read_text()
    return set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text))


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_source_file_and_kernel(st):
    path = CSRC / st.source
    assert path.is_file(), path
    assert st.source.startswith(f"stage{st.number:02d}_")
    assert st.kernel in _global_functions(path), f"no __global__ {st.kernel} in {st.source}"
    if st.persistent:
        # A Hopper stage's file defines every kernel of its design, each named after the stage; ``kernel`` is the
        # one a call runs where neither the tensor copy nor the seesaw does (the gather), and <id>_kernel is the
        # kernel of the stage's own idea (test_the_hopper_stages_designs).
        assert set(st.hopper.kernels) <= _global_functions(path), st.source
        assert all(k.startswith(f"{st.id}_") for k in st.hopper.kernels)
        assert st.kernel == st.hopper.gather and f"{st.id}_kernel" in st.hopper.kernels
    else:
        assert st.kernel == f"{st.id}_kernel"
    if st.splits:
        assert COMBINE_KERNEL in _global_functions(CSRC / "combine_splits.cu")


def test_ops_and_extension_stage_ids(ext):
    assert list(ext.stage_ids()) == [s.id for s in CUDA]
    for st in CUDA:
        op = getattr(torch.ops.mla_lab, st.id)
        assert op.default.name() == st.op_name
    assert not hasattr(torch.ops.mla_lab, "triton")


# ---- choose_num_splits -----------------------------------------------------------

get = stages.get


@pytest.mark.parametrize("stage, args, expect", [
    # per_head: a block per (head, row, split). base = 1 * 9 * 8 = 72 blocks; 132 SMs x 6 = 792 slots;
    # 792 // 72 = 11; tiles of 16 in 1009 keys: 64.  -> 11
    ("per_head", (1, 9, 8, 1009, 132, 6), 11),
    # kv_split: 8 heads per block. base = 2 * 9 * ceil(64/8) = 144; 132 x 3 = 396; 396 // 144 = 2 -> 2
    ("kv_split", (2, 9, 64, 1009, 132, 3), 2),
    # more blocks than slots already (8 * 16 * 64 = 8192 > 792): at least 1
    ("per_head", (8, 16, 64, 5000, 132, 6), 1),
    # the SM cannot hold a block at all (0 slots): still 1
    ("float4", (1, 9, 8, 5000, 132, 0), 1),
    # shared_rows: 17 rows = 2 groups of 16. base = 1 * 2 * 8 = 16; 188 x 4 = 752; 752 // 16 = 47;
    # but 30 keys make only ceil(30/8) = 4 tiles  -> 4
    ("shared_rows", (1, 17, 8, 30, 188, 4), 4),
    # warp_per_key: base 1; 1056 slots; 100000 keys = 12500 tiles of 8; capped at MAX_SPLITS = 256
    ("warp_per_key", (1, 1, 1, 100000, 132, 8), 256),
    # exactly one tile (8 keys): 1 split even with free slots
    ("float4", (1, 1, 1, 8, 132, 8), 1),
    # 9 keys: 2 tiles of 8
    ("float4", (1, 1, 1, 9, 132, 8), 2),
    # tensor_core: 9 rows x 8 heads = 72 pairs = 5 tiles of 16. base = 5; 132 x 2 = 264 slots; 264 // 5 = 52;
    # 16384 keys = 512 tiles of 32  -> 52 (the split count the H200 bench records)
    ("tensor_core", (1, 9, 8, 16384, 132, 2), 52),
    # 8 streams of 9 rows x 64 heads: 8 x 36 = 288 blocks > 264 slots -> 1
    ("tensor_core", (8, 9, 64, 16384, 132, 2), 1),
    # stages without splits: always 1
    ("naive", (1, 1, 1, 100000, 132, 8), 1),
    ("flash_ht8", (1, 1, 1, 100000, 132, 8), 1),
])
def test_choose_num_splits(stage, args, expect):
    assert choose_num_splits(get(stage), *args) == expect
    assert 1 <= expect <= MAX_SPLITS


# ---- shared memory of the main launch --------------------------------------------

def test_smem_bytes():
    # flash_ht8: 32 row addresses x 8 B = 256; the key tile 32 x (576 + 2 padding) x 2 B = 36992;
    # fp32: q 8 x 576 = 4608, acc 8 x 512 = 4096, scores 8 x 32 = 256, state 3 x 8 = 24 -> 8984 x 4 = 35936.
    # 256 + 36992 + 35936 = 73184
    for mp, ps in ((1, 1), (1000, 1), (7, 64)):
        assert get("flash_ht8").smem_bytes(mp, ps) == 73184
        assert get("kv_split").smem_bytes(mp, ps) == 73184  # the same tile, split over blocks
    # per_head: 16 x 8 = 128; 16 x 578 x 2 = 18496; (576 + 512 + 16 + 3) x 4 = 4428 -> 23052
    for mp, ps in ((1, 1), (4096, 16), (3, 64)):
        assert get("per_head").smem_bytes(mp, ps) == 23052
    # warp_per_key: 8 x 8 = 64; 8 x 578 x 2 = 9248; (576 + 512 + 8 + 3) x 4 = 4396 -> 13708
    assert get("warp_per_key").smem_bytes(5, 16) == 13708
    # float4: no padding: 8 x 576 x 2 = 9216 -> 64 + 9216 + 4396 = 13676
    assert get("float4").smem_bytes(5, 16) == 13676
    # shared_rows: 16 rows, accumulators in registers: 64 + 9216 + (16 x 576 + 16 x 8 + 3 x 16) x 4
    #   = 64 + 9216 + (9216 + 128 + 48) x 4 = 64 + 9216 + 37568 = 46848
    assert get("shared_rows").smem_bytes(5, 16) == 46848
    # naive: fp32 query + one fp32 score per key the table can address
    assert get("naive").smem_bytes(7, 16) == (576 + 7 * 16) * 4 == 2752
    assert get("naive").smem_bytes(1000, 1) == (576 + 1000) * 4
    assert get("naive").smem_bytes(1, 64) == (576 + 64) * 4


def test_launches_geometry_by_hand():
    # shared_rows, 3 streams, 17 rows (2 groups), 5 heads, 7 splits:
    # main grid (heads, row groups, streams * splits) = (5, 2, 21); combine (heads, rows, streams) = (5, 17, 3)
    main, comb = get("shared_rows").launches(3, 17, 5, 10, 16, num_splits=7)
    assert (main.kernel, main.grid, main.block, main.dynamic_smem_bytes) == (
        "shared_rows_kernel", (5, 2, 21), (256, 1, 1), 46848)
    assert (comb.kernel, comb.grid, comb.block, comb.dynamic_smem_bytes) == (COMBINE_KERNEL, (5, 17, 3), (128, 1, 1), 0)
    assert main.blocks == 210 and main.threads_per_block == 256
    # flash_ht8, 9 heads -> 2 head tiles (8 + 1); no split, num_splits ignored
    (only,) = get("flash_ht8").launches(2, 3, 9, 10, 16, num_splits=7)
    assert only.grid == (2, 3, 2) and only.block == (128, 1, 1)
