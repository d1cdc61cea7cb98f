"""Stage 10's ablation variants (chapter 10's budget of a tile): built from the stage's own source."""

import pytest
import torch

from mla_lab.book import experiments as ablation
from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.validate import InputError

from conftest import needs_gpu

# The builds run where stage 10 does: compute capability 9.0 (skipped on any other GPU).
sm90_only = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                               reason="stage 10 runs on compute capability 9.0 only")


@pytest.fixture(scope="module")
def counts():
    return {v: ablation.sass_counts(v) for v in (None, *ablation.VARIANTS, ablation.TMA, ablation.TMA_NO_MATH,
                                                 ablation.TMA_FIRST, ablation.TMA_FEWER_FENCES, *ablation.CALL_PARTS)}


def test_each_variant_takes_away_what_it_says(counts):
    op = counts[None]
    assert op["HGMMA"] > 0 and op["LDGSTS"] > 1
    # no math: not one product left; the copies all there
    assert counts["no_math"]["HGMMA"] == 0 and counts["no_math"]["LDGSTS"] == op["LDGSTS"]
    # no copies: every product there; only Q's copy left (one cp.async in its loop)
    assert counts["no_copies"]["HGMMA"] == op["HGMMA"] and counts["no_copies"]["LDGSTS"] == 1
    assert dict(counts["neither"], WAIT=0) == dict(counts["no_copies"], HGMMA=0, WAIT=0)  # no product: none to wait for


def test_the_tma_build_copies_keys_by_tma_and_keeps_the_rest(counts):
    tma = counts[ablation.TMA]
    assert counts[None]["UTMALDG"] == 0 and tma["UTMALDG"] > 0  # the op's hopper_kernel never uses TMA
    assert tma["HGMMA"] == counts[None]["HGMMA"]
    assert tma["LDGSTS"] >= counts[None]["LDGSTS"]  # the gathers stay, for the tiles TMA cannot copy
    assert ablation.TMA not in ablation.VARIANTS
    assert ablation.build_defines(ablation.TMA) == ["-DMLA_HOPPER_TMA=1", ablation.NO_DISPATCH]


def test_the_first_tma_loader_is_built_apart_and_also_copies_by_tma(counts):
    first, tma = counts[ablation.TMA_FIRST], counts[ablation.TMA]
    assert first["UTMALDG"] > 0 and first["HGMMA"] == counts[None]["HGMMA"]
    assert ablation.build_defines(ablation.TMA_FIRST) == ["-DMLA_HOPPER_TMA=2", ablation.NO_DISPATCH]
    assert set(ablation.build_defines(ablation.TMA_FIRST_NO_MATH)) == {"-DMLA_HOPPER_TMA=2", "-DMLA_HOPPER_ABLATE=2",
                                                                       ablation.NO_DISPATCH}
    # the first loader issues its boxes from a loop; the other has every box of a chunk written out
    assert first["UTMALDG"] < tma["UTMALDG"]
    assert ablation.main_sass(ablation.TMA_FIRST) != ablation.main_sass(ablation.TMA)


def _body(sass_text):
    """A kernel's SASS without its addresses and blank lines: two builds of one kernel compare equal."""
    import re

    return [re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip() for line in sass_text.splitlines()[1:] if line.strip()]


def _work_counts(sass_text):
    """sass_counts' counts of a kernel's SASS, and its stmatrix stores and named-barrier operations."""
    from mla_lab.book.sass import count_opcodes, instruction_mix

    mix = instruction_mix(sass_text)
    return dict(ablation.work_counts(sass_text), STSM=count_opcodes(mix, "STSM"), BAR=count_opcodes(mix, "BAR"))


def test_the_ops_three_main_kernels_are_the_cp_async_the_fewer_fences_and_the_four_chunk_builds():
    """The op picks its kernel per call; each of its three main kernels does a build's work, product for product and
    copy for copy.  The seesaw kernel is the four-chunk build's instruction for instruction: it is launched only
    where the seesaw runs, so it never asks the rule.  The other two are not: they also work out whether the seesaw
    pays (the cp.async kernel stands in for it where the cache gets no tensor map), which a build without the choice
    never asks, so that every kernel of a call agrees on its units."""
    from mla_lab.book.sass import kernel_sass
    from mla_lab.measure.resources import compile_cubin

    op = compile_cubin(ablation.CSRC / "stage10_hopper.cu", "9.0")
    for kernel, build in (("hopper_kernel", ablation.CP_ASYNC), ("hopper_tma_kernel", ablation.TMA_FEWER_FENCES)):
        mine, theirs = kernel_sass(op, kernel), ablation.main_sass(build)
        assert _work_counts(mine) == _work_counts(theirs), kernel
        assert _body(mine) != _body(theirs), kernel  # the choice is there
        assert abs(len(_body(mine)) - len(_body(theirs))) < 0.05 * len(_body(theirs)), kernel
    # The seesaw twice: for whole tiles (seesaw_whole's kernel), and for any pages (seesaw_cross_boxes's).
    seesaw, any_pages = _body(kernel_sass(op, "hopper_seesaw_kernel")), _body(kernel_sass(op, "hopper_seesaw_any_pages_kernel"))
    assert seesaw == _body(ablation.main_sass(ablation.SEESAW_WHOLE))
    assert any_pages == _body(ablation.main_sass(ablation.SEESAW_CROSS_BOXES))
    assert any_pages != _body(ablation.main_sass(ablation.SEESAW_CROSS_STEPS))  # and the comparison can tell builds apart
    assert seesaw != any_pages
    assert ablation.build_defines(ablation.CP_ASYNC) == [ablation.NO_DISPATCH]
    # every build but loader_choice and fill_eighth is made without the choice: its one main kernel is compared with
    # the op's cp.async kernel
    for name in list(ablation.BUILDS) + list(ablation.VARIANTS):
        if name not in (ablation.LOADER_CHOICE, ablation.FILL_EIGHTH):
            assert ablation.build_defines(name)[-1] == ablation.NO_DISPATCH, name


def test_the_loader_choice_build_is_the_op_before_the_seesaw():
    """loader_choice: the op's choice of loader without the seesaw; its two main kernels are, instruction for
    instruction, the cp_async and the fewer-fences builds' (no seesaw to ask about), and it has no third."""
    from mla_lab.book.sass import cubin_sass, kernel_sass
    from mla_lab.measure.resources import compile_cubin

    defines = ablation.build_defines(ablation.LOADER_CHOICE)
    assert defines == ["-DMLA_HOPPER_SEESAW=0", "-DMLA_HOPPER_DISPATCH=1"]
    cubin = compile_cubin(ablation.CSRC / "stage10_hopper.cu", "9.0", defines, f"-{ablation.LOADER_CHOICE}")
    assert _body(kernel_sass(cubin, "hopper_kernel")) == _body(ablation.main_sass(ablation.CP_ASYNC))
    assert _body(kernel_sass(cubin, "hopper_tma_kernel")) == _body(ablation.main_sass(ablation.TMA_FEWER_FENCES))
    assert "hopper_seesaw_kernel" not in cubin_sass(cubin) and "hopper_seesaw_kernel" in cubin_sass(
        compile_cubin(ablation.CSRC / "stage10_hopper.cu", "9.0"))


def test_the_fewer_fences_build_is_the_tma_build_with_its_fences_chosen(counts):
    defines = ablation.build_defines(ablation.TMA_FEWER_FENCES)
    assert set(defines) == set(ablation.build_defines(ablation.TMA)) | {"-DMLA_HOPPER_FENCE_GATHERED_ONLY=1"}
    # the same products and copies as the TMA build; only whether a chunk's fence runs differs
    assert counts[ablation.TMA_FEWER_FENCES] == counts[ablation.TMA]
    assert ablation.main_sass(ablation.TMA_FEWER_FENCES) != ablation.main_sass(ablation.TMA)


def test_the_tma_loader_alone_is_the_tma_build_without_math(counts):
    defines = ablation.build_defines(ablation.TMA_NO_MATH)
    assert set(defines) == set(ablation.build_defines(ablation.TMA)) | set(ablation.build_defines("no_math"))
    alone = counts[ablation.TMA_NO_MATH]
    assert alone["HGMMA"] == 0 and alone["UTMALDG"] == counts[ablation.TMA]["UTMALDG"]


def test_the_call_parts_stop_the_main_kernel_where_they_say(counts):
    # stopped before the work: no product and no key copy is left in the main kernel
    for part in ("launch_only", "scheduler_only"):
        assert counts[part]["HGMMA"] == 0 and counts[part]["LDGSTS"] == 0, part
    # no_combine changes only the host's launches: the main kernel is the op's
    assert counts["no_combine"] == counts[None]
    # no_q: the one cp.async of Q's copy loop is gone, every product and key copy is there
    assert counts["no_q"] == dict(counts[None], LDGSTS=counts[None]["LDGSTS"] - 1)
    assert set(ablation.CALL_PARTS).isdisjoint(ablation.VARIANTS)
    assert ablation.build_defines("no_combine") == ["-DMLA_HOPPER_CALL_PART=3", ablation.NO_DISPATCH]


def test_the_op_writes_a_whole_unit_through_shared_memory_and_direct_out_from_the_fragments(counts):
    from mla_lab.book.sass import count_opcodes, instruction_mix

    op, direct = instruction_mix(ablation.main_sass(None)), instruction_mix(ablation.main_sass(ablation.DIRECT_OUT))
    # the op: each warp's 40 pairs x 512 dims as 20 stmatrix of four transposed 8x8 blocks, then 16-byte stores
    assert op["STSM.16.MT88.4"] == 20 and count_opcodes(op, "STG.E.128") > 0
    # direct_out: two bf16 stores of each of 8 chunks for each of 10 columns, and none of that
    assert count_opcodes(direct, "STG.E.U16") - count_opcodes(op, "STG.E.U16") == 2 * 8 * 10
    assert direct["STSM.16.MT88.4"] == 0 and count_opcodes(direct, "STG.E.128") == 0
    # the rest is the same: the products and the copies of the keys
    assert ablation.sass_counts(ablation.DIRECT_OUT) == dict(counts[None])
    assert ablation.build_defines(ablation.DIRECT_OUT) == ["-DMLA_HOPPER_DIRECT_OUT=1", ablation.NO_DISPATCH]


def test_the_rows_build_puts_the_pairs_on_m_and_keeps_its_products_in_flight(counts):
    # two warpgroups, each 36 products of scores (64 x 64 x 16) and 2 x 4 of P V, a
    # warpgroup's 256 dims in one product per k-step (64 x 256 x 16)
    assert ablation.hgmma_shapes(ablation.ROWS) == {"64x64x16": 72, "64x256x16": 16}
    assert ablation.hgmma_shapes(None) == {"64x40x16": counts[None]["HGMMA"]}
    rows = ablation.sass_counts(ablation.ROWS)
    # ptxas puts a wait after every wgmma (and says C7515) when an instruction seems to write
    # an accumulator while a product is in flight: the waits must stay the few the source asks for
    assert 0 < rows["WAIT"] < rows["HGMMA"] // 8
    assert 0 < counts[None]["WAIT"] < counts[None]["HGMMA"] // 4
    assert ablation.main_kernel(ablation.ROWS) == "hopper_rows_kernel" and ablation.main_kernel(None) == "hopper_kernel"
    # its halves taken away as the op's are
    assert ablation.sass_counts("rows_no_math")["HGMMA"] == 0
    alone = ablation.sass_counts("rows_no_copies")
    assert alone["HGMMA"] == rows["HGMMA"] and alone["LDGSTS"] == 1
    assert all(ablation.build_defines(b)[0] == "-DMLA_HOPPER_ROWS=1" for b in ablation.ROWS_BUILDS)


def test_the_rows_tma_build_is_the_rows_kernel_with_the_tma_loader(counts):
    assert set(ablation.build_defines(ablation.ROWS_TMA)) == {"-DMLA_HOPPER_ROWS=1", "-DMLA_HOPPER_TMA=1", ablation.NO_DISPATCH}
    assert set(ablation.build_defines(ablation.ROWS_TMA_NO_MATH)) == (
        set(ablation.build_defines(ablation.ROWS_TMA)) | set(ablation.build_defines("no_math")))
    assert ablation.main_kernel(ablation.ROWS_TMA) == "hopper_rows_kernel"
    assert ablation.main_kernel(ablation.ROWS_TMA_NO_MATH) == "hopper_rows_kernel"
    rows, rows_tma = ablation.sass_counts(ablation.ROWS), ablation.sass_counts(ablation.ROWS_TMA)
    # the rows kernel's products and waits, untouched; its keys copied by the tensor copy, as the tma build's are
    assert ablation.hgmma_shapes(ablation.ROWS_TMA) == ablation.hgmma_shapes(ablation.ROWS)
    assert rows_tma["WAIT"] == rows["WAIT"] and rows["UTMALDG"] == 0
    assert rows_tma["UTMALDG"] == counts[ablation.TMA]["UTMALDG"]
    alone = ablation.sass_counts(ablation.ROWS_TMA_NO_MATH)
    assert alone["HGMMA"] == 0 and alone["UTMALDG"] == rows_tma["UTMALDG"]


def test_the_early_scores_build_issues_a_second_copy_of_the_scores_and_waits_per_v_chunk(counts):
    early = ablation.sass_counts(ablation.EARLY_SCORES)
    # the op's 68 products, and the next tile's 36 products of scores issued behind the products of P V
    assert early["HGMMA"] == counts[None]["HGMMA"] + 36
    assert ablation.hgmma_shapes(ablation.EARLY_SCORES) == {"64x40x16": early["HGMMA"]}
    # a wait for each of the eight V chunks handed back before the next tile's chunk goes in (wait_group 7), and
    # one wait_group 0 more where the compiled loop joins: far fewer than one per product
    assert early["WAIT"] == counts[None]["WAIT"] + 9 and early["WAIT"] < early["HGMMA"] // 4
    assert early["LDGSTS"] == counts[None]["LDGSTS"]
    stamped = ablation.sass_counts(ablation.EARLY_SCORES_TIMELINE)
    assert stamped["HGMMA"] == early["HGMMA"] and stamped["LDGSTS"] == early["LDGSTS"]
    assert ablation.EARLY_SCORES not in ablation.VARIANTS


def test_the_pingpong_build_adds_only_the_turns(counts):
    from mla_lab.book.sass import count_opcodes, instruction_mix

    pp = ablation.sass_counts(ablation.PINGPONG)
    assert {k: pp[k] for k in ("HGMMA", "WAIT", "LDGSTS")} == {k: counts[None][k] for k in ("HGMMA", "WAIT", "LDGSTS")}
    assert ablation.hgmma_shapes(ablation.PINGPONG) == ablation.hgmma_shapes(None)
    op_mix, pp_mix = instruction_mix(ablation.main_sass(None)), instruction_mix(ablation.main_sass(ablation.PINGPONG))
    # a turn taken before the scores and before the products, and warpgroup 0's last one after the loop; a turn
    # passed after each, and warpgroup 1's first before the loop
    assert count_opcodes(pp_mix, "BAR.SYNC") == count_opcodes(op_mix, "BAR.SYNC") + 3
    assert count_opcodes(pp_mix, "BAR.ARV") == count_opcodes(op_mix, "BAR.ARV") + 3
    assert ablation.sass_counts(ablation.PINGPONG_NO_COPIES)["HGMMA"] == pp["HGMMA"]
    assert ablation.PINGPONG_TIMELINE in ablation.STAMPING and ablation.PINGPONG not in ablation.STAMPING


def test_the_seesaw_build_has_no_loader_and_asks_the_tensor_copy_for_every_tile():
    assert ablation.main_kernel(ablation.SEESAW) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(ablation.SEESAW)) == {"-DMLA_HOPPER_SEESAW=1", ablation.NO_DISPATCH}
    # the unit's first scores (one code path for both warpgroups), then warpgroup 0's scores of the next A in
    # two parts (chunks 0..3, 4..8) and warpgroup 1's of the next B: 36 + 36 + 36 products of 64 x 64 x 16; four
    # products of P V (A and B, in registers and from shared memory), each 4 k-steps of 64 x 256 x 16
    assert ablation.hgmma_shapes(ablation.SEESAW) == {"64x64x16": 108, "64x256x16": 16}
    c = ablation.sass_counts(ablation.SEESAW)
    assert c["UTMALDG"] > 0  # every tile by the tensor copy, issued by the compute warpgroups
    assert 0 < c["WAIT"] <= 8  # only the waits the source asks for: ptxas serialised no product
    tl = ablation.sass_counts(ablation.SEESAW_TIMELINE)
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (c["HGMMA"], c["UTMALDG"], c["WAIT"])


def test_the_crossed_seesaw_is_the_seesaw_with_the_same_products_and_copies():
    assert ablation.main_kernel(ablation.SEESAW_CROSS) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(ablation.SEESAW_CROSS)) == {
        "-DMLA_HOPPER_SEESAW=1", "-DMLA_HOPPER_SEESAW_CROSS=1", ablation.NO_DISPATCH}
    # the same products as the seesaw (only their order and the hand-overs change), and the same copies
    assert ablation.hgmma_shapes(ablation.SEESAW_CROSS) == ablation.hgmma_shapes(ablation.SEESAW)
    c, see = ablation.sass_counts(ablation.SEESAW_CROSS), ablation.sass_counts(ablation.SEESAW)
    assert c["UTMALDG"] == see["UTMALDG"]
    assert 0 < c["WAIT"] <= 8  # only the waits the source asks for: ptxas serialised no product
    tl = ablation.sass_counts(ablation.SEESAW_CROSS_TIMELINE)
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (c["HGMMA"], c["UTMALDG"], c["WAIT"])
    assert ablation.SEESAW_CROSS_TIMELINE in ablation.STAMPING and ablation.SEESAW_CROSS not in ablation.STAMPING
    assert [len(e) for e in ablation.SEESAW_CROSS_STAMP_EVENTS] == [6, 6]


@pytest.mark.parametrize("steps, dividing", [(ablation.SEESAW_STEPS, ablation.SEESAW),
                                             (ablation.SEESAW_CROSS_STEPS, ablation.SEESAW_CROSS)])
def test_the_page_steps_builds_change_only_how_a_tile_finds_its_pages(steps, dividing):
    assert ablation.main_kernel(steps) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(steps)) == set(ablation.build_defines(dividing)) | {"-DMLA_HOPPER_PAGE_STEPS=1"}
    # the same products, copies and waits as the build that divides
    assert ablation.hgmma_shapes(steps) == ablation.hgmma_shapes(dividing)
    c, d = ablation.sass_counts(steps), ablation.sass_counts(dividing)
    assert (c["HGMMA"], c["UTMALDG"], c["WAIT"]) == (d["HGMMA"], d["UTMALDG"], d["WAIT"])
    assert ablation.SEESAW_CROSS_STEPS_TIMELINE in ablation.STAMPING and steps not in ablation.STAMPING
    tl = ablation.sass_counts(ablation.SEESAW_CROSS_STEPS_TIMELINE)
    cross = ablation.sass_counts(ablation.SEESAW_CROSS_STEPS)
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (cross["HGMMA"], cross["UTMALDG"], cross["WAIT"])


def test_the_behind_build_moves_only_where_the_copies_are_asked_for():
    """seesaw_cross_behind: the crossed order with steps, each warpgroup's copies asked for behind products it has
    issued.  The same products, copies and waits as seesaw_cross_steps, in another order (one wait now lets two
    groups of products run on, not one), and not serialised (a wait for each product would show as many waits as
    products: ptxas does that where the copies sit between a product and its wait across a branch); and its
    timeline build likewise."""
    behind, steps = ablation.SEESAW_CROSS_BEHIND, ablation.SEESAW_CROSS_STEPS
    assert ablation.main_kernel(behind) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(behind)) == set(ablation.build_defines(steps)) | {"-DMLA_HOPPER_COPY_BEHIND=1"}
    assert ablation.hgmma_shapes(behind) == ablation.hgmma_shapes(steps)
    b, c = ablation.sass_counts(behind), ablation.sass_counts(steps)
    assert (b["HGMMA"], b["UTMALDG"], b["WAIT"]) == (c["HGMMA"], c["UTMALDG"], c["WAIT"])
    behind_sass, steps_sass = ablation.main_sass(behind), ablation.main_sass(steps)
    assert _body(behind_sass) != _body(steps_sass)
    wait_2 = "WARPGROUP.DEPBAR.LE gsb0, 0x2"  # a wait that lets two groups of products run on
    assert behind_sass.count(wait_2) == steps_sass.count(wait_2) + 1
    assert b["WAIT"] < b["HGMMA"] / 10
    assert ablation.SEESAW_CROSS_BEHIND_TIMELINE in ablation.STAMPING and behind not in ablation.STAMPING
    tl = ablation.sass_counts(ablation.SEESAW_CROSS_BEHIND_TIMELINE)
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])


def test_the_boxes_build_copies_a_pair_of_tiles_in_six_copies():
    """seesaw_cross_boxes: the same products and waits as seesaw_cross_steps; where a tile is one page's 64 keys the
    six groups of a pair of tiles are copied by four-dimensional boxes (six UTMALDG.4D in the kernel: the unit's
    first two tiles and the loop's four groups of four), and each group's barrier is armed once; not serialised;
    and its timeline build likewise."""
    from mla_lab.book.sass import count_opcodes, instruction_mix

    boxes, steps = ablation.SEESAW_CROSS_BOXES, ablation.SEESAW_CROSS_STEPS
    assert ablation.main_kernel(boxes) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(boxes)) == set(ablation.build_defines(steps)) | {"-DMLA_HOPPER_COPY_BOXES=1"}
    assert ablation.hgmma_shapes(boxes) == ablation.hgmma_shapes(steps)
    b, c = ablation.sass_counts(boxes), ablation.sass_counts(steps)
    assert (b["HGMMA"], b["WAIT"]) == (c["HGMMA"], c["WAIT"]) and b["WAIT"] < b["HGMMA"] / 10
    sass = ablation.main_sass(boxes)
    assert sass.count("UTMALDG.4D") == 6  # one in each of the unit's two first tiles' loops, the pairs' four groups
    assert "UTMALDG.4D" not in ablation.main_sass(steps)
    arms = lambda text: count_opcodes(instruction_mix(text), "SYNCS.ARRIVE.TRANS64")
    assert arms(sass) < arms(ablation.main_sass(steps))
    assert ablation.SEESAW_CROSS_BOXES_TIMELINE in ablation.STAMPING and boxes not in ablation.STAMPING
    tl = ablation.sass_counts(ablation.SEESAW_CROSS_BOXES_TIMELINE)
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])


def test_the_softmax_fmul_build_scales_and_hides_every_score_in_every_tile():
    """softmax_fmul: the four-chunk seesaw with its softmax as first written.  The same products, copies and waits;
    each warpgroup's softmax multiplies its 32 scores by the scale (the op folds the scale into the exponent's fused
    multiply-add, and keeps the subtraction there), and the op's hiding of keys past a row's end sits behind a
    branch: the build's selects run in every tile, in line."""
    from mla_lab.book.sass import count_opcodes, instruction_mix

    fmul, boxes = ablation.SOFTMAX_FMUL, ablation.SEESAW_CROSS_BOXES
    assert ablation.main_kernel(fmul) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(fmul)) == set(ablation.build_defines(boxes)) | {"-DMLA_HOPPER_SOFTMAX_FMUL=1"}
    assert ablation.hgmma_shapes(fmul) == ablation.hgmma_shapes(boxes)
    f, b = ablation.sass_counts(fmul), ablation.sass_counts(boxes)
    assert (f["HGMMA"], f["UTMALDG"], f["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])
    fm, bm = instruction_mix(ablation.main_sass(fmul)), instruction_mix(ablation.main_sass(boxes))
    # two softmaxes in the loop (one a warpgroup), 32 scores each: at least 64 multiplies and subtractions fewer
    assert count_opcodes(fm, "FMUL") - count_opcodes(bm, "FMUL") >= 60
    assert count_opcodes(fm, "FADD") - count_opcodes(bm, "FADD") >= 60
    assert count_opcodes(bm, "FFMA") - count_opcodes(fm, "FFMA") >= 60
    assert count_opcodes(bm, "MUFU.EX2") == count_opcodes(fm, "MUFU.EX2")
    assert ablation.SOFTMAX_FMUL_TIMELINE in ablation.STAMPING and fmul not in ablation.STAMPING
    tl = ablation.sass_counts(ablation.SOFTMAX_FMUL_TIMELINE)
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (f["HGMMA"], f["UTMALDG"], f["WAIT"])


def test_the_shares_apart_build_differs_from_the_op_only_in_its_blocks_order():
    """shares_apart: the four-chunk seesaw with block c taking share c.  The same products, copies, waits and
    softmax; only the plan's order of shares differs (a division and a few integer instructions, which ptxas then
    schedules around), so the kernel's length stays within 2%."""
    from mla_lab.book.sass import count_opcodes, instruction_mix

    apart, boxes = ablation.SHARES_APART, ablation.SEESAW_CROSS_BOXES
    assert ablation.main_kernel(apart) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(apart)) == set(ablation.build_defines(boxes)) | {"-DMLA_HOPPER_SHARES_APART=1"}
    assert ablation.hgmma_shapes(apart) == ablation.hgmma_shapes(boxes)
    a, b = ablation.sass_counts(apart), ablation.sass_counts(boxes)
    assert (a["HGMMA"], a["UTMALDG"], a["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])
    am, bm = instruction_mix(ablation.main_sass(apart)), instruction_mix(ablation.main_sass(boxes))
    for op in ("FFMA", "FMUL", "MUFU.EX2", "STS", "LDS"):
        assert count_opcodes(am, op) == count_opcodes(bm, op), op
    assert abs(sum(am.values()) - sum(bm.values())) < 0.02 * sum(am.values())


def test_the_whole_tiles_build_compiles_the_seesaw_twice_and_its_loop_is_a_third_shorter():
    """seesaw_whole: hopper_seesaw_kernel knows that a tile is one box of 64 keys copied four chunks at once, and
    hopper_seesaw_any_pages_kernel is seesaw_cross_boxes's kernel, which asks.  The same products, waits, softmax and
    four-chunk copies; what goes is the code of the other answers (copies of one, two and four boxes a chunk, chunk
    by chunk), and the tile loop is at most 70% of the one that asks."""
    from mla_lab.book.sass import count_opcodes, instruction_mix, kernel_sass, tile_loop_instructions
    from mla_lab.measure.resources import compile_cubin

    whole, boxes = ablation.SEESAW_WHOLE, ablation.SEESAW_CROSS_BOXES
    assert ablation.main_kernel(whole) == "hopper_seesaw_kernel"
    assert set(ablation.build_defines(whole)) == set(ablation.build_defines(boxes)) | {"-DMLA_HOPPER_SEESAW_WHOLE=1"}
    cubin = compile_cubin(ablation.CSRC / "stage10_hopper.cu", "9.0", ablation.build_defines(whole), f"-{whole}")
    assert _body(kernel_sass(cubin, "hopper_seesaw_any_pages_kernel")) == _body(ablation.main_sass(boxes))
    w, b = ablation.main_sass(whole), ablation.main_sass(boxes)
    assert ablation.hgmma_shapes(whole) == ablation.hgmma_shapes(boxes)
    sw, sb = ablation.sass_counts(whole), ablation.sass_counts(boxes)
    assert (sw["HGMMA"], sw["WAIT"]) == (sb["HGMMA"], sb["WAIT"])
    wm, bm = instruction_mix(w), instruction_mix(b)
    for op in ("FFMA", "MUFU.EX2", "STS"):
        assert count_opcodes(wm, op) == count_opcodes(bm, op), op
    # (the unit's first two tiles' loop of copies is unrolled where it knows its boxes: 8 four-chunk copies, not 6)
    assert count_opcodes(wm, "UTMALDG.4D") >= count_opcodes(bm, "UTMALDG.4D") == 6
    assert count_opcodes(wm, "UTMALDG") < count_opcodes(bm, "UTMALDG") / 2  # the copies box by box are gone
    assert count_opcodes(wm, "LDS") < count_opcodes(bm, "LDS")  # and the reads of the other boxes' page ids
    assert 0 < tile_loop_instructions(w) < 0.7 * tile_loop_instructions(b)


def test_the_seesaw_summary_reads_its_pairs_of_tiles():
    import numpy as np

    st = np.zeros((2, ablation.STAMP_TILES, 6))
    for t in range(6):  # a pair every 8000 cycles; each phase 1000 cycles in warpgroup 0, 1500 in warpgroup 1
        st[0, t] = [8000 * t + 1 + 1000 * e for e in range(6)]
        st[1, t] = [8000 * t + 2 + 1500 * e for e in range(6)]
    out = ablation.seesaw_timeline_summary(st)
    assert out["period"] == 8000 and out["pairs"] == 3  # pairs 2, 3, 4 (5 has no successor)
    assert all(v == 1000 for v in out["phases"][0].values()) and all(v == 1500 for v in out["phases"][1].values())
    assert out["over_tensor"] == 8000 / ablation.SEESAW_PAIR_TENSOR_CYCLES
    assert ablation.SEESAW_PAIR_TENSOR_CYCLES == 4352
    assert out["scores_end_apart"] == 2501 / 8000  # warpgroup 1's last stamp 2501 cycles after warpgroup 0's
    assert out["to_next_pair"] == [3000, 500]  # 8000 - 5 x 1000 and 8000 - 5 x 1500
    with pytest.raises(ValueError, match="no complete pair"):
        ablation.seesaw_timeline_summary(np.zeros((2, ablation.STAMP_TILES, 6)))
    crossed = ablation.seesaw_timeline_summary(st, events=ablation.SEESAW_CROSS_STAMP_EVENTS)
    assert list(crossed["phases"][0]) == ["pair start -> P_A handed over", "P_A handed over -> A's products done",
                                          "A's products done -> P_B known", "P_B known -> next A's scores issued",
                                          "next A's scores issued -> next A's scores done"]
    assert list(crossed["phases"][0].values()) == list(out["phases"][0].values())


def test_the_pingpong_turns_are_balanced_in_the_source():
    # Every arrival at a turn's barrier must meet a wait, or a later use of the barrier id would complete early:
    # warpgroup 1 passes the first turn before its loop, warpgroup 0 takes the last one after its loop, and
    # within a tile each warpgroup takes and passes two.
    import re

    from mla_lab.core.extension import CSRC

    src = (CSRC / "stage10_hopper.cu").read_text()
    body = src[src.index("__device__ void compute("):src.index("// ---- the rows layout")]
    assert re.search(r"if \(group == 1\) pass_turn\(\);", body)
    assert re.search(r"if \(group == 0\) take_turn\(\);", body)
    assert body.count("take_turn();") == 3 and body.count("pass_turn();") == 3
    assert re.search(r"named_barrier\(kBarTurn \+ group, 256\)", body)
    assert re.search(r"named_barrier_arrive\(kBarTurn \+ 1 - group, 256\)", body)
    assert re.search(r"kPingPong && sh\.per_group > kPairsPerGroup", body)  # both warpgroups compute, or no turns


def test_only_the_stamping_builds_give_a_timeline():
    w = make_workload(Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=64), device="cpu", seed=0)
    with pytest.raises(ValueError, match="does not stamp"):
        ablation.timeline(w, variant=ablation.EARLY_SCORES)


def test_the_combine_has_four_pieces_in_flight_per_thread():
    import itertools
    import re

    from mla_lab.book.sass import kernel_sass
    from mla_lab.core.extension import CSRC
    from mla_lab.measure.resources import compile_cubin

    # Each of the merge's variants (one slice; four slices in blocks of 256 or of 128 threads) loads
    # four pieces before its first multiply-add; loaded and added one at a time, every load waited
    # for the one before.
    text = kernel_sass(compile_cubin(CSRC / "stage10_hopper.cu", "9.0"), "hopper_combine_kernel")
    assert "hopper_combine_kernel" in text.splitlines()[0]
    order = re.findall(r"\b(LDG\.E\.128|FFMA)\b", text)
    runs = [len(list(run)) for op, run in itertools.groupby(order) if op == "LDG.E.128"]
    assert runs == [4, 4, 4]


def test_profile_target_takes_a_build_for_hopper_only():
    from mla_lab.book.explore import profile_target

    p = Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=64)
    with pytest.raises(ValueError, match="hopper"):
        profile_target("tensor_core", p, build="no_math")
    with pytest.raises(ValueError, match="unknown ablation"):
        profile_target("hopper", p, build="no_softmax")


def test_profile_target_checks_its_peer_before_any_gpu_work():
    from mla_lab.book.explore import profile_target

    p64 = Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=64)
    with pytest.raises(ValueError, match="not both"):
        profile_target("hopper", p64, build="no_math", peer="flashmla")
    with pytest.raises(ValueError, match="no peer 'flashinfer'"):
        profile_target("hopper", p64, peer="flashinfer")
    with pytest.raises(ValueError, match="pages of 64"):
        profile_target("hopper", Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=16), peer="flashmla")


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="no_copies, no_math, neither"):
        ablation.build_defines("no_softmax")


def test_the_timeline_build_only_adds_clock_reads(counts):
    import re

    from mla_lab.core.extension import CSRC

    src = (CSRC / "stage10_hopper.cu").read_text()
    found = re.search(r"constexpr int kStampTiles = (\d+), kStampEvents = (\d+);", src)
    assert found and (int(found[1]), int(found[2])) == (ablation.STAMP_TILES, len(ablation.STAMP_EVENTS))
    timeline = ablation.sass_counts(ablation.TIMELINE)
    assert timeline["HGMMA"] == counts[None]["HGMMA"] and timeline["LDGSTS"] == counts[None]["LDGSTS"]
    assert ablation.TIMELINE not in ablation.VARIANTS  # not an ablation: chapter 10 times those


def test_the_merge_timeline_build_only_adds_timer_reads(counts):
    import re

    from mla_lab.book.sass import kernel_sass
    from mla_lab.core.extension import CSRC
    from mla_lab.measure.resources import compile_cubin

    src = (CSRC / "stage10_hopper.cu").read_text()
    found = re.search(r"constexpr int kMergeEvents = (\d+), kMergeStampBlocks = 4 \* 80;", src)
    assert found and int(found[1]) == len(ablation.MERGE_EVENTS) and ablation.MERGE_STAMP_BLOCKS == 4 * 80
    assert re.search(r"constexpr int kMaxSplitsHere = (\d+);", src)[1] == str(ablation.MAIN_STAMP_BLOCKS)
    assert re.search(r"constexpr int kBlock0Events = (\d+);", src)[1] == str(len(ablation.BLOCK0_EVENTS))
    # the main kernel: the op's products, copies, barriers and waits, two reads of the timer for every block and one
    # at each of block 0's events (the first chunk's and the last chunk's in the unrolled loop over chunks)
    assert ablation.sass_counts(ablation.MERGE_TIMELINE) == dict(counts[None])
    timer = lambda text: len(re.findall(r"SR_GLOBALTIMER", text))
    assert timer(ablation.main_sass(None)) == 0
    assert timer(ablation.main_sass(ablation.MERGE_TIMELINE)) == 2 + len(ablation.BLOCK0_EVENTS)
    # the merge: three reads in the kernel and two in each of its three variants of combine_slice
    cubin = compile_cubin(CSRC / "stage10_hopper.cu", "9.0", ablation.build_defines(ablation.MERGE_TIMELINE),
                          f"-{ablation.MERGE_TIMELINE}")
    assert timer(kernel_sass(cubin, "hopper_combine_kernel")) == 3 + 2 * 3
    assert timer(kernel_sass(compile_cubin(CSRC / "stage10_hopper.cu", "9.0"), "hopper_combine_kernel")) == 0


def test_the_timeline_summary_reads_phases_and_overlap():
    import numpy as np

    st = np.zeros((2, ablation.STAMP_TILES, len(ablation.STAMP_EVENTS)))
    for g in (0, 1):
        for t in range(10):  # the second warpgroup 50 cycles behind
            base = 1000 * t + 50 * g + 1
            st[g, t] = [base, base + 400, base + 500, base + 700, base + 900, base + 950]
    s = ablation.timeline_summary(st)
    assert s["tiles"] == 7 and s["tile"] == pytest.approx(1000)  # tiles 2..8 (9 has no successor)
    assert (s["scores"], s["softmax pass"], s["P to shared memory"]) == pytest.approx((400, 100, 200))
    assert s["overlap"] == pytest.approx(0.25)  # [400, 700] and [450, 750] share 250 cycles
    with pytest.raises(ValueError, match="no complete tile"):
        ablation.timeline_summary(st[:, :3])


def test_the_timeline_median_takes_each_field_over_the_calls():
    import numpy as np

    def stamps(lag):  # the second warpgroup `lag` cycles behind the first
        st = np.zeros((2, ablation.STAMP_TILES, len(ablation.STAMP_EVENTS)))
        for g in (0, 1):
            for t in range(10):
                base = 1000 * t + lag * g + 1
                st[g, t] = [base, base + 400, base + 500, base + 700, base + 900, base + 950]
        return st

    m = ablation.timeline_median([stamps(0), stamps(50), stamps(300)])  # overlaps 0.3, 0.25, 0.0
    assert m["calls"] == 3 and m["overlap"] == pytest.approx(0.25)
    assert m["overlap_range"] == pytest.approx((0.0, 0.3)) and m["tile"] == pytest.approx(1000)
    with pytest.raises(ValueError, match="no call"):
        ablation.timeline_median([])


def test_the_runner_checks_arguments_as_the_op_does():
    w = make_workload(Problem(streams=1, q_len=2, heads=2, prefix=10), seed=0)  # on the CPU
    with pytest.raises(InputError, match="hopper \\(no_math\\)"):
        ablation.runner("no_math", w)


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_timeline_build_computes_what_the_op_does_and_stamps_in_order():
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), device="cuda",
                      seed=6, poison=True)
    call = ablation.runner(ablation.TIMELINE, w)
    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok
    st = ablation.timeline(w)
    tiles = [t for t in range(st.shape[1]) if (st[:, t, 0] > 0).all()]
    assert len(tiles) >= 3
    for g in (0, 1):
        for t in tiles:
            assert (st[g, t, 1:] >= st[g, t, :-1]).all()  # the six points in order
        for t in tiles[:-1]:
            assert st[g, t + 1, 0] >= st[g, t, 5]  # a tile starts after the last one ended
    assert ablation.timeline_summary(st)["tile"] > 0


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("variant", list(ablation.VARIANTS))
def test_every_variant_runs_and_replays_in_a_graph(variant):
    from mla_lab.measure.timing import cuda_graph

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), device="cuda",
                      seed=5, poison=True)
    call = ablation.runner(variant, w)
    call()
    g = cuda_graph(call)
    g.replay()
    torch.cuda.synchronize()
    if variant == "no_copies":  # keys all zero: every score 0, every output the mean of zeros
        assert torch.isfinite(call.out.float()).all() and call.out.float().abs().max() == 0


def _right(call, ref):
    """``call`` (a build's runner), called once, matches the reference."""
    from mla_lab.core.verify import compare

    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *ref).ok


def _right_again_in_a_graph(call, ref):
    """``call``, captured in a graph and replayed into an output of NaN, matches the reference."""
    from mla_lab.measure.timing import cuda_graph
    from mla_lab.core.verify import compare

    call.out.fill_(float("nan"))
    g = cuda_graph(call)
    g.replay()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *ref).ok


def _right_on_two_grids(build, w, ref, few_blocks=7):
    """``build`` matches the reference with one block per SM and with ``few_blocks`` blocks (long shares,
    units cut), and again replayed in a graph."""
    for splits in (None, few_blocks):
        call = ablation.runner(build, w, num_splits=splits)
        _right(call, ref)
    _right_again_in_a_graph(call, ref)


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # TMA tiles and a last one gathered
    Problem(streams=2, q_len=9, heads=8, prefix=(1, 4096), page_size=16),           # four boxes per chunk
    Problem(streams=3, q_len=2, heads=16, prefix=(5000, 127, 129), page_size=128),  # two tiles per page
    Problem(streams=2, q_len=4, heads=8, prefix=(700, 33), page_size=32, scattered=True),
    Problem(streams=4, q_len=1, heads=16, prefix=(63, 64, 65, 130), page_size=1),   # no TMA: every tile gathered
    # several units per block, each ending in a gathered tile after many whole ones: the gathering warps
    # skip whole tiles, and a version that let them run more than a ring ahead broke here
    Problem(streams=2, q_len=9, heads=64, prefix=(16384, 9001), page_size=64, scattered=True),
    Problem(streams=8, q_len=9, heads=8, prefix=(6000, 77, 5000, 4097, 3000, 64, 7000, 1), page_size=32),
    # streams shorter than a tile between long ones: gathered tiles in a row, which the issuing warp skips
    Problem(streams=7, q_len=2, heads=8, prefix=(3000, 10, 20, 30, 40, 50, 5000), page_size=64),
], ids=lambda p: p.label())
@pytest.mark.parametrize("build", [ablation.TMA, ablation.TMA_FIRST, ablation.TMA_FEWER_FENCES])
def test_the_tma_builds_compute_what_the_op_does_and_replay(problem, build):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=7, poison=True)
    # one block per SM, and one block walking every tile
    _right_on_two_grids(build, w, reference_attention(*w.args(), check=False), few_blocks=1)


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("build", [ablation.TMA, ablation.TMA_FIRST, ablation.TMA_FEWER_FENCES, ablation.ROWS_TMA])
@pytest.mark.parametrize("splits", [None, 1])
def test_pages_outside_the_pool_poison_only_their_stream_in_the_tma_builds(build, splits):
    heads = 64 if build == ablation.ROWS_TMA else 8  # the rows kernel takes a stream that fills tiles of 64
    w = make_workload(Problem(streams=3, q_len=9, heads=heads, prefix=(3000, 2000, 777), page_size=64), device="cuda",
                      seed=11, poison=True)
    call = ablation.runner(build, w, num_splits=splits)  # the checks run here, on the good table
    w.block_table[0, 5:9] = 1 << 30  # then four used slots of stream 0 go bad (gathered tiles in a row),
    call()                           # as a graph replay would see them
    torch.cuda.synchronize()
    assert torch.isnan(call.out[0].float()).all() and torch.isfinite(call.out[1:].float()).all()


# The seesaw's builds: both orders, dividing by the page size and by steps.
SEESAW_BUILDS = [ablation.SEESAW, ablation.SEESAW_CROSS, ablation.SEESAW_STEPS, ablation.SEESAW_CROSS_STEPS,
                 ablation.SEESAW_CROSS_BEHIND, ablation.SEESAW_CROSS_BOXES, ablation.SOFTMAX_FMUL, ablation.SHARES_APART,
                 ablation.SEESAW_WHOLE]
# Their shapes: pages of 16 to 256 keys (192: tiles a page not a power of two), empty and short streams, mixed
# lengths, and shapes the seesaw leaves to the op's cp.async kernel.
SEESAW_PROBLEMS = [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # 9 units of 64 pairs a stream
    Problem(streams=2, q_len=16, heads=128, prefix=(0, 700), page_size=16),         # an empty stream; 4 boxes a chunk
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=64),  # one unit, a tile or two
    Problem(streams=3, q_len=2, heads=128, prefix=(5000, 127, 129), page_size=128),  # two tiles per page
    Problem(streams=3, q_len=9, heads=64, prefix=(5000, 130, 1999), page_size=192),  # three (not a power of two)
    Problem(streams=2, q_len=4, heads=64, prefix=(4099, 256), page_size=256),         # four
    Problem(streams=2, q_len=5, heads=128, prefix=(3000, 20000), page_size=32),     # two boxes a chunk
    Problem(streams=2, q_len=16, heads=8, prefix=(5000, 1), page_size=64, scattered=True),  # 128 pairs: two units
    Problem(streams=40, q_len=2, heads=64, prefix=tuple(range(0, 4000, 100)), page_size=64),  # mixed lengths
    Problem(streams=2, q_len=9, heads=64, prefix=(16384, 9001), page_size=64),       # many tiles a block
    Problem(streams=2, q_len=9, heads=16, prefix=(3001, 129), page_size=64),        # 144 pairs: three units of 48
    Problem(streams=2, q_len=9, heads=16, prefix=(3001, 129), page_size=16),        # 144, pages of 16: the op's kernel
    Problem(streams=2, q_len=9, heads=8, prefix=(3001, 129), page_size=64),         # 72 pairs: the op's kernel
    Problem(streams=2, q_len=4, heads=16, prefix=(700, 33), page_size=1),           # pages of 1: the op's kernel
    # a unit a stream, of lengths mixed so that many blocks end (and start) in a stream's last tiles
    Problem(streams=40, q_len=4, heads=16, prefix=tuple((7919 * i) % 9000 for i in range(40)), page_size=64),
]


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", SEESAW_PROBLEMS, ids=lambda p: p.label())
@pytest.mark.parametrize("build", SEESAW_BUILDS)
def test_the_seesaw_build_computes_what_the_op_does_and_replays(problem, build):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=13, poison=True)
    _right_on_two_grids(build, w, reference_attention(*w.args(), check=False), few_blocks=3)


# The op runs the crossed seesaw where the table's width gives each block 15 tiles of 64-pair units (pages of 64
# keys or a multiple) or 56 (pages of 16 or 32): over the seesaw's shapes with one block per SM (most below that
# line), with three blocks and with one (all above it, where the pairs fill tiles of 64 and the pages suit the tensor
# copy), poisoned, and replayed in a graph.
@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", SEESAW_PROBLEMS, ids=lambda p: p.label())
def test_the_op_runs_the_seesaw_where_it_pays_and_is_right(problem):
    from mla_lab.core import ops, stages
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    w = make_workload(problem, device="cuda", seed=17, poison=True)
    ref = reference_attention(*w.args(), check=False)
    kernels = set()
    for splits in (None, 3, 1):
        call = ops.runner("hopper", w, num_splits=splits)
        (main, *_) = stages.get("hopper").launches(problem.streams, problem.q_len, problem.heads,
                                                   w.block_table.shape[1], problem.page_size, call.num_splits)
        kernels.add(main.kernel)
        call()
        torch.cuda.synchronize()
        assert compare(call.out, call.lse, *ref).ok, (splits, main.kernel)
    _right_again_in_a_graph(call, ref)
    one_block = stages.hopper_seesaw_pays(problem.streams, problem.q_len, problem.heads, w.block_table.shape[1],
                                          problem.page_size, 1)
    # (either seesaw kernel: for whole tiles, or for pages of 16 or 32)
    assert any(k.startswith("hopper_seesaw") for k in kernels) == one_block, kernels


def test_the_ops_seesaw_problems_reach_the_seesaw():
    """Most of the seesaw's problems cross the op's line to the seesaw with three blocks or one, 144 pairs (a third
    of padding) with pages of 64 among them, and the ones it leaves to the op's other kernels (72 pairs, 144 with
    pages of 16, pages of 1) never do."""
    from mla_lab.core import stages

    def reaches(p, splits):
        return stages.hopper_seesaw_pays(p.streams, p.q_len, p.heads, max(p.pages_per_stream) + 1, p.page_size, splits)

    assert sum(reaches(p, 1) for p in SEESAW_PROBLEMS) >= 9
    assert sum(reaches(p, 3) for p in SEESAW_PROBLEMS) >= 7
    assert any(reaches(p, 1) for p in SEESAW_PROBLEMS if p.q_len * p.heads == 144 and p.page_size == 64)
    assert not any(reaches(p, 1) for p in SEESAW_PROBLEMS
                   if p.q_len * p.heads == 72 or p.page_size == 1 or (p.q_len * p.heads == 144 and p.page_size == 16))


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("splits", [None, 2])
@pytest.mark.parametrize("build", SEESAW_BUILDS + [None])  # None: the op, which runs the seesaw here with 2 blocks
def test_pages_outside_the_pool_poison_only_their_stream_in_the_seesaw(splits, build):
    from mla_lab.core import ops

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(3000, 2000, 777), page_size=64), device="cuda",
                      seed=11, poison=True)
    # the checks run here, on the good table
    call = ops.runner("hopper", w, num_splits=splits) if build is None else ablation.runner(build, w, num_splits=splits)
    w.block_table[0, 5:9] = 1 << 30  # then four used slots of stream 0 go bad, as a graph replay would see them
    w.block_table[2, 3] = -7
    call()
    torch.cuda.synchronize()
    assert torch.isnan(call.out[0].float()).all() and torch.isnan(call.out[2].float()).all()
    assert torch.isfinite(call.out[1].float()).all() and torch.isfinite(call.lse[1]).all()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("build", [ablation.SEESAW_TIMELINE, ablation.SEESAW_CROSS_TIMELINE,
                                   ablation.SEESAW_CROSS_STEPS_TIMELINE, ablation.SEESAW_CROSS_BEHIND_TIMELINE,
                                   ablation.SEESAW_CROSS_BOXES_TIMELINE, ablation.SOFTMAX_FMUL_TIMELINE])
def test_the_seesaw_timeline_stamps_in_order_and_its_answers_are_right(build):
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    w = make_workload(Problem(streams=8, q_len=16, heads=64, prefix=4096, page_size=64), device="cuda", seed=5,
                      poison=True)
    st = ablation.timeline(w, variant=build)
    call = ablation.runner(build, w)
    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok
    out = ablation.seesaw_timeline_summary(st)
    assert out["pairs"] >= 20 and out["over_tensor"] > 1.0  # no pair faster than the tensor cores' own time
    for g in (0, 1):
        t = [i for i in range(st.shape[1]) if st[g, i, 5] > 0]
        assert all((st[g, i, 1:] >= st[g, i, :-1]).all() for i in t)  # each pair's stamps in order


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # 9 units of 64 pairs a stream
    Problem(streams=2, q_len=16, heads=128, prefix=(0, 700), page_size=16),         # an empty stream
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=1),   # one unit, a tile or two
    Problem(streams=3, q_len=2, heads=128, prefix=(5000, 127, 129), page_size=128),
    Problem(streams=2, q_len=16, heads=8, prefix=(5000, 1), page_size=64, scattered=True),  # 128 pairs: two units
    Problem(streams=40, q_len=2, heads=64, prefix=tuple(range(0, 4000, 100)), page_size=64),  # mixed lengths
    Problem(streams=2, q_len=9, heads=16, prefix=(3001, 129), page_size=16),        # 144 pairs: three units of 48
    Problem(streams=2, q_len=9, heads=8, prefix=(3001, 129), page_size=16),         # 72 pairs: the op's layout
], ids=lambda p: p.label())
@pytest.mark.parametrize("build", [ablation.ROWS, ablation.ROWS_TMA])
def test_the_rows_builds_compute_what_the_op_does_and_replay(problem, build):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=9, poison=True)
    _right_on_two_grids(build, w, reference_attention(*w.args(), check=False))


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # several units, one tile long
    Problem(streams=5, q_len=4, heads=8, prefix=(5000, 1, 33, 640, 2047), page_size=64),
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=1),   # a tile or two per unit
    Problem(streams=1, q_len=1, heads=1, prefix=777, page_size=16, scattered=True),
], ids=lambda p: p.label())
def test_the_early_scores_build_computes_what_the_op_does_and_replays(problem):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=10, poison=True)
    _right_on_two_grids(ablation.EARLY_SCORES, w, reference_attention(*w.args(), check=False))
    st = ablation.timeline(w, num_splits=7, variant=ablation.EARLY_SCORES_TIMELINE)
    tiles = [t for t in range(st.shape[1]) if (st[:, t, 0] > 0).all()]
    for g in (0, 1):
        for t in tiles:
            assert (st[g, t, 1:] >= st[g, t, :-1]).all()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # several units, cut and whole
    Problem(streams=5, q_len=16, heads=8, prefix=(5000, 1, 33, 640, 2047), page_size=16),
    Problem(streams=2, q_len=9, heads=8, prefix=(65531, 3), page_size=64),          # long shares: many turns
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=1),   # 64 pairs: both warpgroups
    Problem(streams=2, q_len=3, heads=5, prefix=(17, 300), page_size=1),           # 15 pairs: no turns taken
], ids=lambda p: p.label())
def test_the_pingpong_build_gives_the_ops_bits_and_replays(problem):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=12, poison=True)
    _right_on_two_grids(ablation.PINGPONG, w, reference_attention(*w.args(), check=False))
    for splits in (None, 7):
        mine, op = ablation.runner(ablation.PINGPONG, w, num_splits=splits), ablation.runner(ablation.CP_ASYNC, w,
                                                                                               num_splits=splits)
        mine(), op()
        torch.cuda.synchronize()
        assert torch.equal(mine.out, op.out) and torch.equal(mine.lse, op.lse)  # the same products in the same order
    st = ablation.timeline(w, num_splits=7, variant=ablation.PINGPONG_TIMELINE)
    for g in (0, 1):
        for t in [t for t in range(st.shape[1]) if (st[g, t, 0] > 0)]:
            assert (st[g, t, 1:] >= st[g, t, :-1]).all()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=1, q_len=9, heads=8, prefix=55, page_size=64),                 # one tile: the unit is whole
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # whole units and cut ones
    Problem(streams=2, q_len=3, heads=5, prefix=(17, 300), page_size=1),           # 15 pairs: part of a warpgroup
], ids=lambda p: p.label())
def test_the_direct_out_build_computes_what_the_op_does(problem):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=12, poison=True)
    _right_on_two_grids(ablation.DIRECT_OUT, w, reference_attention(*w.args(), check=False))


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem,splits", [
    (Problem(streams=4, q_len=9, heads=8, prefix=(5000, 70, 3000, 1), page_size=16), None),  # 4 units, sliced
    (Problem(streams=8, q_len=9, heads=8, prefix=4096, page_size=64), None),                 # 8 even units, sliced
    (Problem(streams=3, q_len=9, heads=8, prefix=(65536, 1, 5), page_size=64), 256),         # >128 pieces: two lse a thread
    (Problem(streams=2, q_len=9, heads=8, prefix=(9000, 3000), page_size=64), None),         # 2 units: blocks of 256
], ids=lambda x: x.label() if isinstance(x, Problem) else str(x))
def test_the_narrow_merge_and_wide_combine_both_compute_what_the_reference_does(problem, splits):
    """The op's merge in blocks of 128 threads (a sliced grid of more than two units) and the build that keeps
    every block at 256 threads, against the reference, on the grid the op chooses and in a graph."""
    from mla_lab.core import ops, stages
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=31, poison=True)
    ref = reference_attention(*w.args(), check=False)
    ns = splits or torch.cuda.get_device_properties(0).multi_processor_count
    (_, comb) = stages.get("hopper").launches(problem.streams, problem.q_len, problem.heads, w.block_table.shape[1],
                                              problem.page_size, ns)
    assert comb.block[0] == (256 if problem.streams <= 2 else 128)
    op = ops.runner("hopper", w, num_splits=splits)
    _right(op, ref)
    _right_again_in_a_graph(op, ref)
    wide = ablation.runner(ablation.WIDE_COMBINE, w, num_splits=splits)
    _right(wide, ref)
    _right_again_in_a_graph(wide, ref)


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem,splits", [
    (Problem(streams=8, q_len=9, heads=64, prefix=1024, page_size=64), None),                # 64 units of 2 pieces
    (Problem(streams=4, q_len=16, heads=128, prefix=(1500, 77, 4000, 9), page_size=64), 37),  # 104 units, odd splits
    (Problem(streams=6, q_len=3, heads=40, prefix=(900, 2, 3000, 17, 640, 1), page_size=1), 18),  # a partial group
    (Problem(streams=3, q_len=1, heads=1, prefix=(100, 5000, 1), page_size=16), 3),          # one pair a unit
], ids=lambda x: x.label() if isinstance(x, Problem) else str(x))
def test_the_merge_by_warps_and_a_block_per_pair_both_compute_what_the_reference_does(problem, splits):
    """Where the units are cut into a few pieces each, the op merges a pair with one warp; the build
    block_per_pair_merge keeps a block a pair. Both against the reference, eagerly and in a graph."""
    from mla_lab.core import ops, stages
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=37, poison=True)
    ref = reference_attention(*w.args(), check=False)
    ns = splits or torch.cuda.get_device_properties(0).multi_processor_count
    units = problem.streams * stages.hopper_groups(problem.q_len, problem.heads)
    assert stages.hopper_combine_by_warps(ns, units)
    for call in (ops.runner("hopper", w, num_splits=splits), ablation.runner(ablation.BLOCK_PER_PAIR_MERGE, w, num_splits=splits)):
        _right(call, ref)
        _right_again_in_a_graph(call, ref)


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_merge_timeline_stamps_in_order_and_its_answers_are_right():
    import numpy as np

    from mla_lab.core.reference import reference_attention

    w = make_workload(Problem(streams=8, q_len=9, heads=8, prefix=1024, page_size=64), device="cuda", seed=5, poison=True)
    _right_on_two_grids(ablation.MERGE_TIMELINE, w, reference_attention(*w.args(), check=False))
    t = ablation.merge_timeline(w)
    main, merge = t["main"], t["merge"]
    assert main.shape == (torch.cuda.get_device_properties(0).multi_processor_count, 2)
    assert np.all(main[:, 0] >= 0) and main[:, 0].min() == 0  # every block starts; the first at 0
    busy = main[np.isfinite(main[:, 1])]  # the blocks with a share (the others return before their end stamp)
    assert len(busy) > 8 and np.all(busy[:, 1] > busy[:, 0])
    # the first cut unit's merge: a block a pair (80, 72 of them with a pair to merge), the five points in order
    assert np.isfinite(merge[:80, :3]).all() and np.isnan(merge[80:]).all()
    whole = merge[np.isfinite(merge[:, 4])]
    assert len(whole) == 72 and np.all(np.diff(whole, axis=1) >= 0)
    # no merge block passes its wait before the main kernel's last block has written its units
    assert merge[:80, 1].min() >= busy[:, 1].max()
    # nothing cut: the merge's blocks stop after reading the plan
    one = make_workload(Problem(streams=1, q_len=9, heads=8, prefix=55, page_size=64), device="cuda", seed=6)
    t1 = ablation.merge_timeline(one)
    m = t1["merge"]
    assert np.isfinite(m[:80, :2]).all() and np.isnan(m[:, 2:]).all()
    # block 0's way to its one tile: every event stamped, each after those it waits for, all before its end
    e = dict(zip(ablation.BLOCK0_EVENTS, t1["block0"]))
    assert np.isfinite(t1["block0"]).all(), e
    chain = ("past the wait", "cut known", "first page id", "first chunk landed", "tile landed", "first scores")
    assert all(e[a] <= e[b] for a, b in zip(chain, chain[1:])), e
    assert e["cut known"] <= e["Q landed"] <= e["first scores"] <= t1["main"][0, 1], e


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_call_parts_do_what_they_say():
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    # One tile per stream and a block for each: no unit is cut, so without the combine the answer is whole.
    w = make_workload(Problem(streams=5, q_len=9, heads=8, prefix=55, page_size=64), device="cuda", seed=8, poison=True)
    call = ablation.runner("no_combine", w)
    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok
    # Returning at once, the main kernel writes nothing: the poisoned output stays NaN.
    for part in ("launch_only", "scheduler_only"):
        call = ablation.runner(part, w)
        call()
        torch.cuda.synchronize()
        assert torch.isnan(call.out.float()).all(), part
    # Without Q the scores are of whatever shared memory held: the answer is not the reference's.
    call = ablation.runner("no_q", w)
    call()
    torch.cuda.synchronize()
    assert not compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok


# The op's tensor-copy kernel's shapes (and blocks; None: one a SM of the H200), each where the host's rule picks it.
TMA_OP_PROBLEMS = [
    (Problem(streams=2, q_len=9, heads=8, prefix=(3001, 1500), page_size=16), 4),    # four boxes per chunk
    # whole tiles and gathered ones (120 blocks: 12.8 tiles a block of 80-pair units, past the tensor copy's 12, and
    # 14.4 of 64-pair units, short of the seesaw's 15)
    (Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), 120),
    (Problem(streams=4, q_len=1, heads=16, prefix=(6000, 63, 64, 65), page_size=128), 5),  # two tiles per page
    (Problem(streams=8, q_len=9, heads=8, prefix=16384, page_size=64), None),        # the grid's own: 15.5 tiles a block
]


def test_the_tma_kernels_problems_are_where_the_rule_picks_it():
    """Each of them past the tensor copy's line and short of the seesaw's, with its blocks (132 on the H200)."""
    from mla_lab.core import stages

    for problem, splits in TMA_OP_PROBLEMS:
        width = max(problem.pages_per_stream) + 1  # make_workload's table: a page more than the longest stream
        (main, *_) = stages.get("hopper").launches(problem.streams, problem.q_len, problem.heads, width,
                                                   problem.page_size, splits or 132)
        assert main.kernel == "hopper_tma_kernel", problem.label()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem, splits", TMA_OP_PROBLEMS)
def test_the_ops_tma_kernel_is_right_and_gives_its_cp_async_kernels_bits(problem, splits):
    """Where the rule picks hopper_tma_kernel, the op matches the reference (cache past each length poisoned, unused
    table slots out of range, outputs poisoned), gives the same bits as the cp_async build, and replays in a graph."""
    from mla_lab.core import ops, stages
    from mla_lab.core.reference import reference_for
    from mla_lab.measure.timing import cuda_graph
    from mla_lab.core.verify import compare

    w = make_workload(problem, device="cuda", seed=31, poison=True)
    ref = reference_for(w)
    op = ops.runner("hopper", w, num_splits=splits)
    cp = ablation.runner(ablation.CP_ASYNC, w, num_splits=splits)
    ns = cp.num_splits
    (main, _) = stages.get("hopper").launches(problem.streams, problem.q_len, problem.heads, w.block_table.shape[1],
                                              problem.page_size, ns)
    assert main.kernel == "hopper_tma_kernel"
    op()
    cp()
    torch.cuda.synchronize()
    assert compare(op.out, op.lse, *ref).ok
    assert torch.equal(op.out, cp.out) and torch.equal(op.lse, cp.lse)
    first = op.out.clone()
    op.out.fill_(float("nan"))
    g = cuda_graph(op)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(op.out, first)


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_ops_tma_kernel_gives_nan_only_in_streams_with_bad_pages():
    """check=False on a call the rule sends to hopper_tma_kernel: a page id past the pool inside one stream's
    length, a negative one in another; those streams' outputs are NaN, every other stream's is right."""
    from mla_lab.core import ops, stages
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    p = Problem(streams=4, q_len=4, heads=8, prefix=(3000, 2000, 2500, 1000), page_size=16)
    w = make_workload(p, device="cuda", seed=41, poison=True)
    q, kv, bt, lens, scale = w.args()
    (main, _) = stages.get("hopper").launches(4, 4, 8, bt.shape[1], 16, 2)
    assert main.kernel == "hopper_tma_kernel"
    ref_out, ref_lse = reference_attention(q, kv, bt, lens, scale)
    bad_bt = bt.clone()
    bad_bt[1, 70] = kv.shape[0]  # one past the pool, inside stream 1's 2004 tokens (page 70 holds 1120..1135)
    bad_bt[3, 0] = -1
    out, lse = ops.attention("hopper", q, kv, bad_bt, lens, scale, num_splits=2, check=False)
    torch.cuda.synchronize()
    for b in (1, 3):
        assert (torch.isnan(out[b].float()).any(-1) | torch.isnan(lse[b])).all(), b
    good = [0, 2]
    assert compare(out[good], lse[good], ref_out[good], ref_lse[good]).ok
