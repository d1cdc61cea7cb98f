"""Stage 10 with part of its work taken away: where the time of a tile goes.

A kernel that overlaps two kinds of work (here the loader's copies of the key
tiles and the compute warpgroups' products and softmax) runs at the speed of
the slower one only if the overlap is perfect.  Taking one kind away and timing
what is left says how long the other takes alone:

* ``no_copies``: the loader reads neither the cache nor the block table; it
  zeroes its ring of chunks once and publishes each chunk as soon as the slot
  is free.  What remains is the math, fed as fast as the ring turns.
* ``no_math``: the compute warpgroups wait for each tile's chunks and hand
  them straight back.  What remains is the loading.
* ``neither``: only the skeleton: scheduler, barriers, ``Q``'s load, outputs,
  combine.

Each variant is ``csrc/stage10_hopper.cu`` compiled with ``-DMLA_HOPPER_ABLATE``
(1, 2, 3) and ``csrc/stage10_ablation.cpp`` into a module of its own under
``build/``; its answers are wrong on purpose, so it never becomes an op.  It
needs a compute capability 9.0 GPU, like the stage.

Other builds (:data:`BUILDS`) change how the work is done, not how much of
it.  ``tma`` (``-DMLA_HOPPER_TMA=1``) loads the key tiles another way: where
the cache's pages hold 16 keys or more (a multiple or a divisor of 64), each
whole tile is copied by TMA, the bulk tensor copy, one instruction per 8 KB
chunk (or per page within one), instead of gathered with 16-byte
``cp.async``.  ``tma_first`` (``-DMLA_HOPPER_TMA=2``) is the same loader as
first written, which worked out each copy's coordinates per chunk and per box
and gathered a stream's last tile with one warp.  Their answers are right:
chapter 10 times both against the op.  ``tma_no_math`` and
``tma_first_no_math`` are those loaders with the math taken away, as
``no_math`` takes it from the op's: the loaders alone.  ``tma_fewer_fences``
(``-DMLA_HOPPER_FENCE_GATHERED_ONLY=1`` on top of ``tma``) drops the compute
warps' proxy fence (``fence.proxy.async``) before a chunk's products: the
tensor copy writes through the async proxy, which the tensor cores read
through, and the loader's gathering warps fence the chunks they write with
``cp.async`` themselves, after waiting for their copies.  ``timeline``
(``-DMLA_HOPPER_TIMELINE=1``) does all the work and adds clock reads: thread 0
of each compute warpgroup of block 0 stamps six points of each tile
(:data:`STAMP_EVENTS`).  :func:`timeline` runs it and :func:`timeline_summary`
says how long each phase takes and for how much of a tile both warpgroups are
in their softmax at once, when neither has a product on the tensor cores.

The :data:`ROWS_BUILDS` compute in another layout (``-DMLA_HOPPER_ROWS=1``):
where a stream's pairs fill their ``wgmma`` tiles (at most a third of
padding, so 48 pairs or more), the pairs are the M of every product (64 per
unit, ``S = Q K^T`` with N = 64 keys, ``O += P V`` with N = 64 dims), and the two
compute warpgroups score alternate tiles and split the 512 output dims; the
main kernel is then ``hopper_rows_kernel``.  ``rows`` is that kernel whole
(its answers are right), ``rows_no_copies`` and ``rows_no_math`` take away
what ``no_copies`` and ``no_math`` take from the op.  ``rows_tma``
(``-DMLA_HOPPER_TMA=1`` on top of ``rows``) feeds the rows kernel with the
``tma`` build's loader, which fills the same chunks in the same swizzle; its
answers are right, and ``rows_tma_no_math`` is its loads alone.

``seesaw`` (``-DMLA_HOPPER_SEESAW=1``) is the rows layout scheduled as
FlashMLA's deep-dive describes (its "seesaw"), in a kernel of its own,
``hopper_seesaw_kernel``: two warpgroups and no loader, each holding half of
O's dims; warpgroup 0 scores the even tiles and warpgroup 1 the odd ones, and
one softmax reference passes from tile to tile between them, so that one
warpgroup's softmax runs beside the other's products; each chunk of the next
two tiles is asked of the tensor copy by a compute thread the moment its last
reader is done.  Where a stream's pairs do not fill tiles of 64, or the pages
cannot be read by the tensor copy (pages of 1), its calls run the op's
``cp.async`` kernel.  Its answers are right; ``seesaw_timeline`` stamps six
points of each pair of tiles in each warpgroup (:data:`SEESAW_STAMP_EVENTS`,
:func:`seesaw_timeline_summary`).  ``seesaw_cross``
(``-DMLA_HOPPER_SEESAW_CROSS=1`` on top) crosses its hand-over: warpgroup 0
hands P_A over in A's own reference as soon as A's softmax is done, warpgroup 1
adds P_A V_A while it runs B's softmax, and a warpgroup whose O B's reference
moves rescales it before adding P_B V_B; warpgroup 1 scores the next B only once
the next A's scores are done.  ``seesaw_cross_timeline`` stamps it
(:data:`SEESAW_CROSS_STAMP_EVENTS`).  ``seesaw_steps`` and ``seesaw_cross_steps``
(``-DMLA_HOPPER_PAGE_STEPS=1`` on top of each) find a tile's block-table entry
by steps set once per kernel (a shift where a page holds a power of two of
tiles) instead of dividing its first key by the page size at every tile;
``seesaw_cross_steps_timeline`` stamps the second.  On top of
``seesaw_cross_steps``: ``seesaw_cross_behind`` (``-DMLA_HOPPER_COPY_BEHIND=1``)
asks for two of each warpgroup's groups of copies right after the products they
stood before (slower: the chunks land later), and ``seesaw_cross_boxes``
(``-DMLA_HOPPER_COPY_BOXES=1``) copies a tile's chunks 0..3 and 4..7 in one
four-dimensional box each, on one barrier a group (the op's seesaw kernel is
this build's, instruction for instruction); each has a timeline build.
``even_starts`` (``-DMLA_HOPPER_UNIT_START_TILES=0`` on top of
``seesaw_cross_boxes``) is the op's seesaw with its scheduler as first
written: every slot of the plan a tile, where the op gives each unit's start
five slots ahead of its tiles (a share that starts many short units then
gets fewer tiles).  Its answers are right.  ``softmax_fmul``
(``-DMLA_HOPPER_SOFTMAX_FMUL=1`` on top of ``seesaw_cross_boxes``) is the op's
seesaw with its softmax as first written: every score multiplied by the scale,
and tested against its row's end in every tile (ptxas made the test selects),
where the op tests only a stream's edge tiles, behind a branch, and folds the
scale into the exponent's one fused multiply-add.  Its answers are right, and
not the op's bits; ``softmax_fmul_timeline`` stamps it.  ``shares_apart``
(``-DMLA_HOPPER_SHARES_APART=1`` on top of ``seesaw_cross_boxes``) is the op's
seesaw with its blocks in the order first written: block c takes share c, so
the groups' shares that read the same keys at the same time sit C/G blocks
apart, where the op gives them neighbouring blocks.  The same work, the op's
bits.

``early_scores`` (``-DMLA_HOPPER_EARLY_SCORES=1``) changes only the order of
a tile's work: a compute warpgroup issues the next tile's scores right behind
this tile's products, handing each V chunk back as its products finish,
instead of waiting for all of the products first.  Its answers are right;
``early_scores_timeline`` is that build with the timeline's stamps (its
"products done" is then the moment the next tile's scores are all issued).

``pingpong`` (``-DMLA_HOPPER_PINGPONG=1``) makes the two compute warpgroups
take turns at the tensor cores: warpgroup 0 issues its scores, then
warpgroup 1 its scores, then 0 its products, then 1 its products, each turn
passed on a named barrier, so that one warpgroup's softmax runs while the
other's products are on the tensor cores (FlashAttention-3's ping-pong).
Where a stream has at most 40 pairs only warpgroup 0 computes, and nothing
changes.  Its answers are the op's to the bit; ``pingpong_no_copies`` takes the
loads away as ``no_copies`` does, and ``pingpong_timeline`` stamps its tiles
as ``timeline`` does.

The :data:`CALL_PARTS` take a short call apart instead of a tile
(``-DMLA_HOPPER_CALL_PART``): ``launch_only`` launches both kernels, and each
returns as soon as it may read its inputs; ``scheduler_only`` stops the main
kernel once the scheduler has cut the work (the combine still runs);
``no_combine`` does all of the main kernel's work and launches no combine,
which is right only where no unit is cut; ``no_q`` does all of the op's work
except copying the units' ``Q`` (its answers are wrong: it is for timing only).

Four builds keep a part of the op as it was first written, so that a chapter
can time what its change was worth; their answers are right.  ``fill_eighth``
(``-DMLA_HOPPER_FILL_EIGHTH=1``, built with the op's choice of kernel) runs the
seesaw only where a stream has 64 pairs or more with an eighth of padding at
most, where the op runs it with up to a third with pages of 64 keys or a
multiple (9 rows of 16 heads, 144 pairs, in three units of 48, say).  ``direct_out``
(``-DMLA_HOPPER_DIRECT_OUT=1``) stores a whole unit's bf16 rows straight from
the ``wgmma`` fragments, half a sector at a time, where the op stages them in
shared memory and writes whole lines.  ``wide_combine``
(``-DMLA_HOPPER_WIDE_COMBINE=1``) launches every block of the merge with 256
threads, where the op narrows the blocks of a sliced grid of more than two
units to 128 so that the grid fits in one wave or close to it.
``block_per_pair_merge`` (``-DMLA_HOPPER_BLOCK_PER_PAIR_MERGE=1``) merges
every whole pair with a block of its own, where the op has one warp merge
each pair when the units are cut into a few pieces each (``num_splits`` at
most three times the units: many units, as at 8 streams of 64 heads).

``merge_timeline`` (``-DMLA_HOPPER_MERGE_TIMELINE=1``) does all of the op's
work and reads the GPU's global timer at the start and end of each block of
the main kernel and at five points of each merge block of the first cut unit
(:data:`MERGE_EVENTS`); :func:`merge_timeline` runs it once and returns the
stamps (and ``block0``: :data:`BLOCK0_EVENTS`, block 0's way to its first
tile's scores).
"""

from __future__ import annotations

import functools

from ..core.extension import CSRC, load_sm90a
from ..core.problem import Workload

VARIANTS = {"no_copies": 1, "no_math": 2, "neither": 3}
TIMELINE = "timeline"
TMA = "tma"
TMA_NO_MATH = "tma_no_math"  # the TMA loader with no math: its loads alone, beside no_math's
# The TMA loader as first written (-DMLA_HOPPER_TMA=2: each box's coordinates worked out per chunk), and its loads alone.
TMA_FIRST = "tma_first"
TMA_FIRST_NO_MATH = "tma_first_no_math"
# The TMA loader with the compute warps' proxy fence kept only for the chunks gathered with cp.async.
TMA_FEWER_FENCES = "tma_fewer_fences"
# A short call taken apart (-DMLA_HOPPER_CALL_PART): both kernels launched and returning at once; the main
# kernel stopping after the scheduler's cut; the main kernel whole and no combine launched; the op without its
# units' Q copies (wrong answers: timing only).
CALL_PARTS = {"launch_only": 1, "scheduler_only": 2, "no_combine": 3, "no_q": 4}
# The rows layout (-DMLA_HOPPER_ROWS=1), whole and with each half of the work taken away.
ROWS = "rows"
ROWS_BUILDS = {ROWS: ["-DMLA_HOPPER_ROWS=1"],
               "rows_no_copies": ["-DMLA_HOPPER_ROWS=1", f"-DMLA_HOPPER_ABLATE={VARIANTS['no_copies']}"],
               "rows_no_math": ["-DMLA_HOPPER_ROWS=1", f"-DMLA_HOPPER_ABLATE={VARIANTS['no_math']}"]}
# The rows layout fed by the TMA loader, whole and its loads alone.
ROWS_TMA = "rows_tma"
ROWS_TMA_NO_MATH = "rows_tma_no_math"
# The rows layout in FlashMLA's seesaw schedule, with no loader (-DMLA_HOPPER_SEESAW=1), and its timeline.
SEESAW = "seesaw"
SEESAW_TIMELINE = "seesaw_timeline"
# The seesaw in its crossed order (-DMLA_HOPPER_SEESAW_CROSS=1): P_A handed over in A's own reference, and its timeline.
SEESAW_CROSS = "seesaw_cross"
SEESAW_CROSS_TIMELINE = "seesaw_cross_timeline"
# Both orders with their tiles' page ids found by steps, not by division (-DMLA_HOPPER_PAGE_STEPS=1), and a timeline.
SEESAW_STEPS = "seesaw_steps"
SEESAW_CROSS_STEPS = "seesaw_cross_steps"
SEESAW_CROSS_STEPS_TIMELINE = "seesaw_cross_steps_timeline"
# The crossed order with steps and each warpgroup's copies asked for behind products it has issued
# (-DMLA_HOPPER_COPY_BEHIND=1), not in their way, and its timeline.
SEESAW_CROSS_BEHIND = "seesaw_cross_behind"
SEESAW_CROSS_BEHIND_TIMELINE = "seesaw_cross_behind_timeline"
# The crossed order with steps and, with pages of 64 keys or more, chunks 0..3 and 4..7 of a tile each one tensor copy
# of a box of four chunks, counted on one barrier (-DMLA_HOPPER_COPY_BOXES=1; the op's seesaw), and its timeline.
SEESAW_CROSS_BOXES = "seesaw_cross_boxes"
SEESAW_CROSS_BOXES_TIMELINE = "seesaw_cross_boxes_timeline"
# The op's seesaw with every slot of the plan a tile, as first written (-DMLA_HOPPER_UNIT_START_TILES=0): a unit's
# start takes no slots, so a share that starts many short units gets as many tiles as one inside a long unit.
EVEN_STARTS = "even_starts"
# The op's seesaw with its softmax as first written (-DMLA_HOPPER_SOFTMAX_FMUL=1): each score scaled by a multiply and
# hidden by a select in every tile, where the op hides only in a stream's edge tiles and scales inside the exponent.
SOFTMAX_FMUL = "softmax_fmul"
SOFTMAX_FMUL_TIMELINE = "softmax_fmul_timeline"
# The op's seesaw with block c taking share c, as first written (-DMLA_HOPPER_SHARES_APART=1): the groups' shares that
# read the same keys C/G blocks apart, where the op puts them on neighbouring blocks.
SHARES_APART = "shares_apart"
# The crossed seesaw compiled twice (-DMLA_HOPPER_SEESAW_WHOLE=1), as the op is: hopper_seesaw_kernel for tiles of one
# box of 64 keys, copied four chunks at once, and hopper_seesaw_any_pages_kernel, SEESAW_CROSS_BOXES's kernel, for
# every other cache.
SEESAW_WHOLE = "seesaw_whole"
# The next tile's scores issued behind this tile's products (-DMLA_HOPPER_EARLY_SCORES=1), and its timeline.
EARLY_SCORES = "early_scores"
EARLY_SCORES_TIMELINE = "early_scores_timeline"
# The compute warpgroups taking turns at the tensor cores (-DMLA_HOPPER_PINGPONG=1), its math alone, its timeline.
PINGPONG = "pingpong"
PINGPONG_NO_COPIES = "pingpong_no_copies"
PINGPONG_TIMELINE = "pingpong_timeline"
# A whole unit's output stored straight from the fragments, as first written (-DMLA_HOPPER_DIRECT_OUT=1).
DIRECT_OUT = "direct_out"
# Every block of the merge of 256 threads, as first written (-DMLA_HOPPER_WIDE_COMBINE=1): the op narrows the blocks
# of a sliced grid of more than two units to 128 threads.
WIDE_COMBINE = "wide_combine"
# A block of the merge for each pair wherever pairs are merged whole, as first written
# (-DMLA_HOPPER_BLOCK_PER_PAIR_MERGE=1): the op merges a pair with one warp where units are cut into a few pieces.
BLOCK_PER_PAIR_MERGE = "block_per_pair_merge"
# The op with the GPU's global timer read at the start and end of each main block and at MERGE_EVENTS points of each
# merge block of the first cut unit (-DMLA_HOPPER_MERGE_TIMELINE=1): merge_timeline() reads them.
MERGE_TIMELINE = "merge_timeline"
MERGE_EVENTS = ("start", "past the wait", "unit read", "weights known", "pieces added")
MERGE_STAMP_BLOCKS = 320  # kMergeStampBlocks: the merge blocks of one cut unit, four slices of 80 pairs
# Block 0's way to its first tile's scores (kBlock0Events): thread 0 past the wait and with the scheduler's cut; the
# loader's first page id; thread 128's Q^T landed, the first tile's first chunk and all nine landed, its scores done.
BLOCK0_EVENTS = ("past the wait", "cut known", "first page id", "Q landed", "first chunk landed", "tile landed",
                 "first scores")
MAIN_STAMP_BLOCKS = 256   # kMaxSplitsHere
# The op without its choice of loader (-DMLA_HOPPER_DISPATCH=0): every call gathers its tiles with cp.async, as
# every other build here does, so that each build is compared with this one rather than with the op, which copies
# the tiles of long calls by TMA (hopper_tma_kernel) or runs them on the crossed seesaw (hopper_seesaw_kernel).
CP_ASYNC = "cp_async"
# The op with its choice of loader and without the seesaw (-DMLA_HOPPER_SEESAW=0): its two main kernels, hopper_kernel
# and hopper_tma_kernel, instruction for instruction those of CP_ASYNC and TMA_FEWER_FENCES, as the op had them before
# it also ran the crossed seesaw where that pays.  One of the two builds made with the op's choice (FILL_EIGHTH the
# other).
LOADER_CHOICE = "loader_choice"
# The op with the seesaw's line for a stream's pairs as first written: 64 pairs or more and an eighth of padding at
# most (the op takes a third of padding with pages of 64 keys or a multiple, and so 48 pairs or more).  Built with
# the op's choice of kernel, like LOADER_CHOICE: it differs from the op only where a stream's pairs pad their tiles
# by an eighth to a third and the pages hold whole tiles.
FILL_EIGHTH = "fill_eighth"
# The crossed order with its page lookups by steps: the builds below it add one define each.
_CROSS_STEPS = ["-DMLA_HOPPER_SEESAW=1", "-DMLA_HOPPER_SEESAW_CROSS=1", "-DMLA_HOPPER_PAGE_STEPS=1"]
BUILDS = {CP_ASYNC: [], LOADER_CHOICE: ["-DMLA_HOPPER_SEESAW=0", "-DMLA_HOPPER_DISPATCH=1"],
          FILL_EIGHTH: ["-DMLA_HOPPER_FILL_EIGHTH=1", "-DMLA_HOPPER_DISPATCH=1"],
          TIMELINE: ["-DMLA_HOPPER_TIMELINE=1"], TMA: ["-DMLA_HOPPER_TMA=1"], **ROWS_BUILDS,
          EARLY_SCORES: ["-DMLA_HOPPER_EARLY_SCORES=1"],
          SEESAW: ["-DMLA_HOPPER_SEESAW=1"],
          SEESAW_TIMELINE: ["-DMLA_HOPPER_SEESAW=1", "-DMLA_HOPPER_TIMELINE=1"],
          SEESAW_CROSS: ["-DMLA_HOPPER_SEESAW=1", "-DMLA_HOPPER_SEESAW_CROSS=1"],
          SEESAW_CROSS_TIMELINE: ["-DMLA_HOPPER_SEESAW=1", "-DMLA_HOPPER_SEESAW_CROSS=1", "-DMLA_HOPPER_TIMELINE=1"],
          SEESAW_STEPS: ["-DMLA_HOPPER_SEESAW=1", "-DMLA_HOPPER_PAGE_STEPS=1"],
          SEESAW_CROSS_STEPS: _CROSS_STEPS,
          SEESAW_CROSS_STEPS_TIMELINE: _CROSS_STEPS + ["-DMLA_HOPPER_TIMELINE=1"],
          SEESAW_CROSS_BEHIND: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BEHIND=1"],
          SEESAW_CROSS_BEHIND_TIMELINE: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BEHIND=1", "-DMLA_HOPPER_TIMELINE=1"],
          SEESAW_CROSS_BOXES: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1"],
          SEESAW_CROSS_BOXES_TIMELINE: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1", "-DMLA_HOPPER_TIMELINE=1"],
          EVEN_STARTS: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1", "-DMLA_HOPPER_UNIT_START_TILES=0"],
          SOFTMAX_FMUL: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1", "-DMLA_HOPPER_SOFTMAX_FMUL=1"],
          SOFTMAX_FMUL_TIMELINE: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1", "-DMLA_HOPPER_SOFTMAX_FMUL=1",
                                                 "-DMLA_HOPPER_TIMELINE=1"],
          SHARES_APART: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1", "-DMLA_HOPPER_SHARES_APART=1"],
          SEESAW_WHOLE: _CROSS_STEPS + ["-DMLA_HOPPER_COPY_BOXES=1", "-DMLA_HOPPER_SEESAW_WHOLE=1"],
          DIRECT_OUT: ["-DMLA_HOPPER_DIRECT_OUT=1"],
          WIDE_COMBINE: ["-DMLA_HOPPER_WIDE_COMBINE=1"],
          BLOCK_PER_PAIR_MERGE: ["-DMLA_HOPPER_BLOCK_PER_PAIR_MERGE=1"],
          MERGE_TIMELINE: ["-DMLA_HOPPER_MERGE_TIMELINE=1"],
          EARLY_SCORES_TIMELINE: ["-DMLA_HOPPER_EARLY_SCORES=1", "-DMLA_HOPPER_TIMELINE=1"],
          PINGPONG: ["-DMLA_HOPPER_PINGPONG=1"],
          PINGPONG_NO_COPIES: ["-DMLA_HOPPER_PINGPONG=1", f"-DMLA_HOPPER_ABLATE={VARIANTS['no_copies']}"],
          PINGPONG_TIMELINE: ["-DMLA_HOPPER_PINGPONG=1", "-DMLA_HOPPER_TIMELINE=1"],
          TMA_NO_MATH: ["-DMLA_HOPPER_TMA=1", f"-DMLA_HOPPER_ABLATE={VARIANTS['no_math']}"],
          TMA_FIRST: ["-DMLA_HOPPER_TMA=2"],
          TMA_FIRST_NO_MATH: ["-DMLA_HOPPER_TMA=2", f"-DMLA_HOPPER_ABLATE={VARIANTS['no_math']}"],
          TMA_FEWER_FENCES: ["-DMLA_HOPPER_TMA=1", "-DMLA_HOPPER_FENCE_GATHERED_ONLY=1"],
          ROWS_TMA: ["-DMLA_HOPPER_ROWS=1", "-DMLA_HOPPER_TMA=1"],
          ROWS_TMA_NO_MATH: ["-DMLA_HOPPER_ROWS=1", "-DMLA_HOPPER_TMA=1", f"-DMLA_HOPPER_ABLATE={VARIANTS['no_math']}"],
          **{name: [f"-DMLA_HOPPER_CALL_PART={part}"] for name, part in CALL_PARTS.items()}}
NO_DISPATCH = "-DMLA_HOPPER_DISPATCH=0"
# The builds that stamp a tile's timeline (timeline() reads them).
STAMPING = (TIMELINE, EARLY_SCORES_TIMELINE, PINGPONG_TIMELINE, SEESAW_TIMELINE, SEESAW_CROSS_TIMELINE,
            SEESAW_CROSS_STEPS_TIMELINE, SEESAW_CROSS_BEHIND_TIMELINE, SEESAW_CROSS_BOXES_TIMELINE,
            SOFTMAX_FMUL_TIMELINE)
# What csrc/stage10_hopper.cu stamps (kStampTiles, kStampEvents there).
STAMP_TILES = 64
STAMP_EVENTS = ("tile start", "scores done", "softmax pass done", "P stored", "products issued", "products done")
# What the seesaw kernel stamps instead, per pair of tiles (A, scored by warpgroup 0; B, by warpgroup 1), in
# warpgroup 0 and in warpgroup 1.
SEESAW_STAMP_EVENTS = (("pair start", "A's softmax done", "A's products done", "B's reference known", "P_B known",
                        "next A's scores done"),
                       ("pair start", "A's reference known", "B's softmax done", "P_A known", "its products done",
                        "next B's scores done"))
# And the crossed order's (seesaw_cross).
SEESAW_CROSS_STAMP_EVENTS = (("pair start", "P_A handed over", "A's products done", "P_B known",
                              "next A's scores issued", "next A's scores done"),
                             ("pair start", "P_A known", "B's softmax done", "A's products done",
                              "next A's scores done", "next B's scores done"))
# The tensor cores' work in a pair of tiles of the seesaw: two tiles' scores (2 x 36 products of 64 x 64 x 16) and
# four products of P V of 64 x 256 x 64 (each 4 of 64 x 256 x 16), at the H200's dense bf16 rate per SM and cycle
# (4096 FLOP: 989 TFLOP/s over 132 SMs at 1.83 GHz).
SEESAW_PAIR_TENSOR_CYCLES = (2 * 36 * 2 * 64 * 64 * 16 + 4 * 4 * 2 * 64 * 256 * 16) // 4096


def build_defines(variant: str) -> list[str]:
    """The compiler flags that select ``variant``'s work (or one of the other :data:`BUILDS`).

    Every build but :data:`LOADER_CHOICE` and :data:`FILL_EIGHTH` is made without the op's choice of kernel
    (:data:`CP_ASYNC`).
    """
    if variant in BUILDS:
        own = list(BUILDS[variant])
        return own if any(d.startswith("-DMLA_HOPPER_DISPATCH=") for d in own) else own + [NO_DISPATCH]
    if variant not in VARIANTS:
        raise ValueError(f"unknown ablation {variant!r}; the variants are {', '.join(VARIANTS)} "
                         f"(and the builds {', '.join(BUILDS)})")
    return [f"-DMLA_HOPPER_ABLATE={VARIANTS[variant]}", NO_DISPATCH]


@functools.lru_cache(maxsize=None)
def load(variant: str, verbose: bool = False):
    """Build (once) and import the module of ``variant``; it has one function, ``run`` (and the timeline's two)."""
    return load_sm90a(f"mla_lab_hopper_{variant}", [CSRC / "stage10_hopper.cu", CSRC / "stage10_ablation.cpp"],
                      f"ablate-{variant}-sm90a", build_defines(variant), verbose)


def main_kernel(variant: str | None) -> str:
    """The name of the main kernel that ``variant``'s build launches on a stream of many pairs."""
    defines = build_defines(variant) if variant is not None else []
    if "-DMLA_HOPPER_SEESAW=1" in defines:
        return "hopper_seesaw_kernel"
    return "hopper_rows_kernel" if "-DMLA_HOPPER_ROWS=1" in defines else "hopper_kernel"


def main_sass(variant: str | None) -> str:
    """The SASS of the main kernel compiled for sm_90a (nvcc and cuobjdump, no GPU), ``None`` for the op's own build."""
    from .sass import kernel_sass, sass
    from ..measure.resources import compile_cubin

    if variant is None:
        return sass("hopper", "9.0")
    cubin = compile_cubin(CSRC / "stage10_hopper.cu", "9.0", build_defines(variant), f"-{variant}")
    return kernel_sass(cubin, main_kernel(variant))


def sass_counts(variant: str | None) -> dict[str, int]:
    """Instructions of the main kernel compiled for sm_90a, ``None`` for the op's own build.

    ``HGMMA``: the products; ``LDGSTS``: the copies (``cp.async``) of keys and of
    ``Q``; ``SYNCS``: the barrier operations; ``UTMALDG``: the TMA copies;
    ``WAIT``: the waits for products in flight (``WARPGROUP.DEPBAR``).  A
    static count (each instruction once, however often it runs).
    """
    return work_counts(main_sass(variant))


def work_counts(sass_text: str) -> dict[str, int]:
    """:func:`sass_counts`'s counts of any kernel's SASS (``kernel_sass`` of a cubin, for instance)."""
    from .sass import count_opcodes, instruction_mix

    mix = instruction_mix(sass_text)
    counts = {name: count_opcodes(mix, name) for name in ("HGMMA", "LDGSTS", "SYNCS", "UTMALDG")}
    counts["WAIT"] = count_opcodes(mix, "WARPGROUP.DEPBAR")
    return counts


def hgmma_shapes(variant: str | None) -> dict[str, int]:
    """The main kernel's products by shape (``"64x64x16"``: count), as compiled for sm_90a."""
    from .sass import hgmma_shapes as shapes

    return shapes(main_sass(variant))


def flashmla_runner(w: Workload):
    """FlashMLA's call on ``w`` (as ``mla-lab bench --peers`` times it), or ``None`` where it is not importable."""
    try:
        import flash_mla  # noqa: F401
    except Exception:
        return None
    from ..measure.bench import _peer_runner

    return _peer_runner("flashmla", w)


def load_all() -> dict:
    """Build every variant, three compilations side by side; returns ``{variant: module}``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        return dict(zip(VARIANTS, pool.map(load, VARIANTS)))


def prebuild(jobs: int | None = None) -> int:
    """Compile every build chapter 10 loads (:data:`BUILDS`, :data:`VARIANTS` and the two probes), side by side.

    Each build is a compilation of the whole stage.  One after another, as the
    chapter's cells first ask for them, they kept a run of the chapter on the
    H200's host (16 cores) compiling for more than nine minutes; 14 at a time
    they took under two.  Here they run ``jobs`` at a time (by default one per
    CPU), and the chapter then finds each one built.  Returns how many.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    from . import load_rate, wgmma_rate

    builds = [functools.partial(load, name) for name in (*BUILDS, *VARIANTS)] + [load_rate.load, wgmma_rate.load]
    jobs = max(1, min(len(builds), jobs or os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda build: build(), builds))
    return len(builds)


def runner(variant: str, w: Workload, *, num_splits: int | None = None):
    """A no-argument call of ``variant`` on ``w``, like :func:`mla_lab.core.ops.runner` for the op.

    The arguments go through the op's own checks first, and the grid is the
    op's (``num_splits`` by default: one block per SM), so the variant and the op
    differ only in the work the variant leaves out.
    """
    from ..core import ops, stages
    from ..core.validate import check_contents, check_metadata

    st = stages.get("hopper")
    check_metadata(*w.args(), device_type="cuda", align_bytes=st.align_bytes, name=f"hopper ({variant})")
    check_contents(*w.args()[:4], name=f"hopper ({variant})")
    module = load(variant)
    ns = int(num_splits if num_splits is not None else ops.default_num_splits(st, w.q, w.kv_cache, w.block_table))
    out, lse = w.new_outputs(poison=True)
    q, kv, bt, lens = w.args()[:4]
    scale = float(w.scale)

    def call():
        module.run(q, kv, bt, lens, scale, ns, out, lse)

    call.out, call.lse, call.num_splits = out, lse, ns  # type: ignore[attr-defined]
    return call


def timeline(w: Workload, *, num_splits: int | None = None, variant: str = TIMELINE):
    """The stamps of one call on ``w``: a float array ``[2, STAMP_TILES, 6]``.

    ``[g, t, e]`` is the SM clock, in cycles from the start of compute
    warpgroup ``g`` of block 0, at event ``e`` (:data:`STAMP_EVENTS`) of its
    tile ``t``; zero where the block had no such tile, and in the second
    warpgroup's half where a stream has at most 40 pairs (that warpgroup then
    has none, and only hands the chunks back).  Both warpgroups start
    together, after the block's barrier, so their clocks can be compared.
    The call is made once to warm up, then again with the stamps cleared.
    ``variant`` is a build that stamps (:data:`STAMPING`).
    """
    import numpy as np

    if variant not in STAMPING:
        raise ValueError(f"{variant!r} does not stamp a timeline; the builds that do are {', '.join(STAMPING)}")
    call = runner(variant, w, num_splits=num_splits)
    module = load(variant)
    call()
    module.timeline_clear()
    call()
    return np.asarray(module.timeline_read(STAMP_TILES, len(STAMP_EVENTS)))


def merge_timeline(w: Workload, *, num_splits: int | None = None, flush_bytes: int = 256 << 20) -> dict:
    """When each block of the main kernel and of the merge got where, in one call on ``w``.

    The call is made once to warm up; then the stamps are cleared, ``flush_bytes``
    of a buffer are written (as the timing does before each call, which evicts
    L2), and the call is made again, alone.  Returns ``main``, an array
    ``[blocks, 2]`` (start, end: thread 128's, once its warpgroup has written its
    last unit), and ``merge``, ``[merge blocks of the first cut unit,
    MERGE_EVENTS]``, and ``block0``, ``[BLOCK0_EVENTS]``, all in microseconds from
    the first main block's start, NaN where nothing was stamped (a block with no
    work ends at once; no unit cut, no merge stamps past the first two).
    """
    import numpy as np
    import torch

    call = runner(MERGE_TIMELINE, w, num_splits=num_splits)
    module = load(MERGE_TIMELINE)
    call()
    module.merge_timeline_clear()
    scratch = torch.empty(flush_bytes, dtype=torch.uint8, device=w.q.device)
    scratch.zero_()
    call()
    main, merge, block0 = (np.asarray(t, dtype=np.float64) for t in module.merge_timeline_read(
        MAIN_STAMP_BLOCKS, MERGE_STAMP_BLOCKS, len(MERGE_EVENTS), len(BLOCK0_EVENTS)))
    t0 = main[:, 0][main[:, 0] > 0].min()
    to_us = lambda a: np.where(a > 0, (a - t0) / 1e3, np.nan)
    return {"main": to_us(main[:call.num_splits]), "merge": to_us(merge), "block0": to_us(block0)}


def _timed_tiles(st, first: int, what: str) -> list[int]:
    """The stamped tiles (or pairs of tiles) that count: both warpgroups stamped their first and last points,
    from ``first`` on, up to the last whose successor also started (so its period is known)."""
    started = [t for t in range(st.shape[1]) if (st[:, t, 0] > 0).all() and (st[:, t, 5] > 0).all()]
    tiles = [t for t in started if t >= first and t + 1 in started]
    if not tiles:
        raise ValueError(f"no complete {what} after the first ones: the block had too few")
    return tiles


def timeline_summary(stamps, first: int = 2) -> dict:
    """Mean cycles of each phase of a tile, and how much of a tile the two warpgroups' softmax overlap.

    Tiles ``first`` onwards count (the first ones include the pipeline's start),
    up to the last tile whose successor also started (its period is known).
    ``overlap`` is the mean, over those tiles, of the time both warpgroups
    spend between "scores done" and "P stored" at once, as a fraction of the
    tile's period: a time when neither has a product in flight.
    """
    import numpy as np

    st = np.asarray(stamps, dtype=float)
    tiles = _timed_tiles(st, first, "tile")
    phases = {"scores": (0, 1), "softmax pass": (1, 2), "P to shared memory": (2, 3),
              "products issued": (3, 4), "products drained": (4, 5)}
    out = {name: float(np.mean([st[g, t, b] - st[g, t, a] for g in (0, 1) for t in tiles]))
           for name, (a, b) in phases.items()}
    period = [float(np.mean([st[g, t + 1, 0] - st[g, t, 0] for g in (0, 1)])) for t in tiles]
    out["tile"] = float(np.mean(period))
    both = [max(0.0, min(st[0, t, 3], st[1, t, 3]) - max(st[0, t, 1], st[1, t, 1])) / p
            for t, p in zip(tiles, period)]
    out["overlap"] = float(np.mean(both))
    out["tiles"] = len(tiles)
    return out


def seesaw_timeline_summary(stamps, first: int = 2, events=SEESAW_STAMP_EVENTS) -> dict:
    """The seesaw's pair of tiles from its stamps (``events``: :data:`SEESAW_STAMP_EVENTS`, or
    :data:`SEESAW_CROSS_STAMP_EVENTS` for the crossed order's): the median period (cycles from
    one pair's start to the next's, each warpgroup), the median of each warpgroup's five phases (from one stamp to
    the next), the period over :data:`SEESAW_PAIR_TENSOR_CYCLES`, the tensor cores' own time for a pair, how
    far apart the two warpgroups' scores of the next pair end (the median, as a fraction of the period), and
    each warpgroup's median time from its last stamp of a pair to the start of its next (``to_next_pair``).

    Pairs ``first`` onwards count (the first ones include the pipeline's start), up to the last whose successor
    also started.
    """
    import numpy as np

    st = np.asarray(stamps, dtype=float)
    pairs = _timed_tiles(st, first, "pair of tiles")
    period = float(np.median([st[g, t + 1, 0] - st[g, t, 0] for g in (0, 1) for t in pairs]))
    phases = [{f"{events[g][e - 1]} -> {events[g][e]}":
               float(np.median([st[g, t, e] - st[g, t, e - 1] for t in pairs])) for e in range(1, 6)} for g in (0, 1)]
    # how far apart the two warpgroups finish the next pair's scores, as a fraction of a pair
    apart = float(np.median([abs(st[1, t, 5] - st[0, t, 5]) for t in pairs])) / period
    # from each warpgroup's last stamp of a pair to its next pair's start (the loop's top, outside the phases)
    to_next = [float(np.median([st[g, t + 1, 0] - st[g, t, 5] for t in pairs])) for g in (0, 1)]
    return {"period": period, "phases": phases, "pairs": len(pairs),
            "over_tensor": period / SEESAW_PAIR_TENSOR_CYCLES, "scores_end_apart": apart, "to_next_pair": to_next}


def timeline_median(calls, first: int = 2) -> dict:
    """:func:`timeline_summary` of several calls' stamps, each field the median over the calls.

    One call's block 0 is one SM's history: how its two warpgroups fall into
    step (or out of it) varies from call to call, so a claim about the
    timeline is read from the median of a few.  ``overlap_range`` is the
    smallest and largest ``overlap`` among the calls.
    """
    import numpy as np

    summaries = [timeline_summary(st, first) for st in calls]
    if not summaries:
        raise ValueError("no call's stamps to summarise")
    out = {k: float(np.median([s[k] for s in summaries])) for k in summaries[0]}
    out["calls"] = len(summaries)
    out["overlap_range"] = (min(s["overlap"] for s in summaries), max(s["overlap"] for s in summaries))
    return out
