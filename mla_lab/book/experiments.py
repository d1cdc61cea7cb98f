"""The experiments: a Hopper stage with one piece swapped, built beside the extension.

Each file in ``csrc/experiments/`` holds a few variants of one idea (the work
of a tile taken away, a tile's timeline, a loader as first written, the
seesaw's pieces one at a time, a short call taken apart...); each variant is a
kernel of that file and a launch as the op's launcher would make it (without
the op's choice of kernel: every call runs the variant).  A file builds into a
module of its own with ``csrc/experiments/binding.cpp`` (:func:`load`, for
sm_90a; ``python -m mla_lab.book.experiments build NAME`` builds the file that
holds NAME), and :func:`runner` calls a variant as :func:`mla_lab.core.ops.runner`
calls a stage.  None is an op: several answer wrongly on purpose.

:data:`EXPERIMENTS` lists them, with the stage each starts from.  The chapters
time them beside the stages; the tests read their SASS, compiled on the CPU
(:func:`main_sass`, :func:`sass_counts`), to hold each to the one piece it
swaps.  The stages that earlier chapters timed as builds of one file are now
stages of their own (the book's old build names: ``cp_async`` is ``wgmma``,
``loader_choice`` is ``tensor_copy``, ``fill_eighth`` is ``seesaw``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..core.extension import CSRC, load_sm90a
from ..core.problem import Workload


@dataclass(frozen=True)
class Experiment:
    name: str
    file: str      # csrc/experiments/<file>.cu
    stage: str     # the stage it swaps a piece of
    kernel: str    # its main kernel where a stream's pairs fill the seesaw's tiles (else the tile on N's, see tile_n)
    what: str      # the piece swapped, in a line
    right: bool = True  # whether its answers are right (else it takes work away, or is for timing only)
    stamps: str | None = None  # "tiles" (timeline) or "merge" (merge_timeline): what it stamps
    tile_n: str | None = None  # its tile-on-N kernel where that is not `kernel`


def _e(name, file, stage, what, kernel=None, **kw):
    return name, Experiment(name, file, stage, kernel or f"{name}_kernel", what, **kw)


EXPERIMENTS: dict[str, Experiment] = dict([
    # Stage 10: where a tile's time goes
    _e("no_copies", "wgmma_ablation", "wgmma", "the loader reads nothing and publishes each chunk as its slot frees",
       right=False),
    _e("no_math", "wgmma_ablation", "wgmma", "the compute warpgroups wait for each tile and hand it back", right=False),
    _e("neither", "wgmma_ablation", "wgmma", "neither copies nor math: the scheduler, barriers, Q, outputs, merge",
       right=False),
    _e("timeline", "wgmma_timeline", "wgmma", "clock stamps at six points of each tile of block 0", stamps="tiles"),
    _e("pingpong", "wgmma_timeline", "wgmma", "the compute warpgroups take turns at the tensor cores"),
    _e("pingpong_no_copies", "wgmma_timeline", "wgmma", "pingpong's math alone", right=False),
    _e("pingpong_timeline", "wgmma_timeline", "wgmma", "pingpong with the tile stamps", stamps="tiles"),
    _e("early_scores", "wgmma_early_scores", "wgmma", "the next tile's scores issued behind this tile's products"),
    _e("early_scores_timeline", "wgmma_early_scores", "wgmma", "early_scores with the tile stamps", stamps="tiles"),
    # Stage 11: the tensor-copy loader's other forms (every call on the tensor copy)
    _e("tma", "tensor_copy_loaders", "tensor_copy", "the TMA loader with the fence before every chunk's products"),
    _e("tma_fewer_fences", "tensor_copy_loaders", "tensor_copy", "the TMA loader as stage 11 runs it, on every call"),
    _e("tma_first", "tensor_copy_loaders", "tensor_copy",
       "the TMA loader as first written: each box's coordinates per chunk and per box"),
    _e("tma_no_math", "tensor_copy_loaders", "tensor_copy", "the TMA loader alone (no math)", right=False),
    _e("tma_first_no_math", "tensor_copy_loaders", "tensor_copy", "the first TMA loader alone (no math)",
       right=False),
    # Stage 12: the pairs on M with a loader, and the seesaw's pieces one at a time
    _e("rows", "rows_layout", "seesaw", "the pairs on M, fed by a loader warpgroup (a ring of two tiles)",
       tile_n="rows_tile_n_kernel"),
    _e("rows_no_copies", "rows_layout", "seesaw", "the rows layout's math alone", right=False,
       tile_n="rows_no_copies_tile_n_kernel"),
    _e("rows_no_math", "rows_layout", "seesaw", "the rows layout's loads alone", right=False,
       tile_n="rows_no_math_tile_n_kernel"),
    _e("rows_tma", "rows_layout", "seesaw", "the rows layout fed by the tensor-copy loader",
       tile_n="rows_tma_tile_n_kernel"),
    _e("rows_tma_no_math", "rows_layout", "seesaw", "those loads alone", right=False,
       tile_n="rows_tma_no_math_tile_n_kernel"),
    _e("seesaw", "seesaw_uncrossed", "seesaw",
       "the seesaw as first written: uncrossed, pages by division, chunks one by one", tile_n="tile_n_kernel"),
    _e("seesaw_timeline", "seesaw_uncrossed", "seesaw", "the first seesaw with the tile stamps", stamps="tiles",
       tile_n="tile_n_kernel"),
    _e("seesaw_steps", "seesaw_uncrossed", "seesaw", "the first seesaw with page lookups by steps",
       tile_n="tile_n_kernel"),
    _e("seesaw_cross", "seesaw_chunk_copies", "seesaw", "crossed; pages by division, chunks one by one",
       tile_n="tile_n_kernel"),
    _e("seesaw_cross_timeline", "seesaw_chunk_copies", "seesaw", "seesaw_cross with the tile stamps",
       stamps="tiles", tile_n="tile_n_kernel"),
    _e("seesaw_cross_steps", "seesaw_chunk_copies", "seesaw", "crossed, pages by steps, chunks one by one",
       tile_n="tile_n_kernel"),
    _e("seesaw_cross_steps_timeline", "seesaw_chunk_copies", "seesaw", "seesaw_cross_steps with the tile stamps",
       stamps="tiles", tile_n="tile_n_kernel"),
    _e("seesaw_cross_behind", "seesaw_copies_behind", "seesaw",
       "seesaw_cross_steps with the copies asked for behind the products", tile_n="tile_n_kernel"),
    _e("seesaw_cross_behind_timeline", "seesaw_copies_behind", "seesaw", "seesaw_cross_behind with the tile stamps",
       stamps="tiles", tile_n="tile_n_kernel"),
    _e("seesaw_cross_boxes", "seesaw_crossed", "seesaw",
       "four chunks in one copy: stage 12's seesaw for any pages, wherever it fits", tile_n="tile_n_kernel"),
    _e("seesaw_cross_boxes_timeline", "seesaw_crossed", "seesaw", "seesaw_cross_boxes with the tile stamps",
       stamps="tiles", tile_n="tile_n_kernel"),
    _e("seesaw_whole", "seesaw_crossed", "seesaw",
       "and compiled for whole tiles: stage 12's two seesaw kernels, wherever it fits", tile_n="tile_n_kernel"),
    _e("even_starts", "seesaw_crossed", "seesaw", "every slot of the plan a tile: a unit's start takes none",
       tile_n="tile_n_kernel"),
    _e("softmax_fmul", "seesaw_crossed", "seesaw",
       "the softmax as first written: every score scaled and tested in every tile", tile_n="tile_n_kernel"),
    _e("softmax_fmul_timeline", "seesaw_crossed", "seesaw", "softmax_fmul with the tile stamps", stamps="tiles",
       tile_n="tile_n_kernel"),
    _e("shares_apart", "seesaw_crossed", "seesaw", "block c takes share c: the same keys' shares apart",
       tile_n="tile_n_kernel"),
    # Stage 13 and the short call (stage 10's kernel, which short calls run in every Hopper stage)
    _e("launch_only", "short_call", "wgmma", "both kernels launched, each returning at once", right=False),
    _e("scheduler_only", "short_call", "wgmma", "the main kernel stops after the scheduler's cut", right=False),
    _e("no_combine", "short_call", "wgmma", "the main kernel whole and no merge launched", kernel="main_kernel",
       right=False),
    _e("no_q", "short_call", "wgmma", "everything but the copies of the units' Q", right=False),
    _e("direct_out", "short_call", "wgmma", "a whole unit's rows stored straight from the fragments"),
    _e("wide_combine", "short_call", "wgmma", "every merge block of 256 threads", kernel="main_kernel"),
    _e("block_per_pair_merge", "short_call", "wgmma", "a merge block for each whole pair", kernel="main_kernel"),
    _e("merge_timeline", "merge_timeline", "wgmma", "the global timer read in the main blocks, the merge, block 0",
       stamps="merge"),
])
FILES = tuple(dict.fromkeys(e.file for e in EXPERIMENTS.values()))
# The experiments that stamp a tile's timeline (timeline() reads them).
STAMPING = tuple(n for n, e in EXPERIMENTS.items() if e.stamps == "tiles")
# The book's earlier names for what are now stages.
STAGE_OF_BUILD = {"cp_async": "wgmma", "loader_choice": "tensor_copy", "fill_eighth": "seesaw", "op": "hopper"}

# What csrc/experiments/tile_stamps.cuh stamps (kStampTiles, kStampEvents there).
STAMP_TILES = 64
STAMP_EVENTS = ("tile start", "scores done", "softmax pass done", "P stored", "products issued", "products done")
# What the seesaw stamps instead, per pair of tiles (A, scored by warpgroup 0; B, by warpgroup 1), in warpgroup 0
# and in warpgroup 1: its order as first written (the experiment seesaw_timeline) ...
SEESAW_STAMP_EVENTS = (("pair start", "A's softmax done", "A's products done", "B's reference known", "P_B known",
                        "next A's scores done"),
                       ("pair start", "A's reference known", "B's softmax done", "P_A known", "its products done",
                        "next B's scores done"))
# ... and the crossed order's (the stages').
SEESAW_CROSS_STAMP_EVENTS = (("pair start", "P_A handed over", "A's products done", "P_B known",
                              "next A's scores issued", "next A's scores done"),
                             ("pair start", "P_A known", "B's softmax done", "A's products done",
                              "next A's scores done", "next B's scores done"))
# The tensor cores' work in a pair of tiles of the seesaw: two tiles' scores (2 x 36 products of 64 x 64 x 16) and
# four products of P V of 64 x 256 x 64 (each 4 of 64 x 256 x 16), at the H200's dense bf16 rate per SM and cycle
# (4096 FLOP: 989 TFLOP/s over 132 SMs at 1.83 GHz).
SEESAW_PAIR_TENSOR_CYCLES = (2 * 36 * 2 * 64 * 64 * 16 + 4 * 4 * 2 * 64 * 256 * 16) // 4096
# merge_timeline's stamps (csrc/experiments/merge_stamps.cuh).
MERGE_EVENTS = ("start", "past the wait", "unit read", "weights known", "pieces added")
MERGE_STAMP_BLOCKS = 320  # kMergeStampBlocks: the merge blocks of one cut unit, four slices of 80 pairs
BLOCK0_EVENTS = ("past the wait", "cut known", "first page id", "Q landed", "first chunk landed", "tile landed",
                 "first scores")
MAIN_STAMP_BLOCKS = 256   # kMaxSplitsHere


def get(name: str) -> Experiment:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise KeyError(f"no experiment {name!r}; the experiments are {', '.join(EXPERIMENTS)}") from None


def source(file: str):
    return CSRC / "experiments" / f"{file}.cu"


@functools.lru_cache(maxsize=None)
def load(file: str, verbose: bool = False):
    """Build (once) and import the module of one experiment file (sm_90a only); its ``run(variant, ...)`` calls a
    variant, and, where the file stamps, ``timeline_read`` / ``merge_timeline_read`` read the stamps."""
    if file not in FILES:
        raise KeyError(f"no experiment file {file!r}; the files are {', '.join(FILES)}")
    return load_sm90a(f"mla_lab_experiment_{file}", [source(file), CSRC / "experiments" / "binding.cpp"],
                      f"experiment-{file}-sm90a", verbose=verbose)


def build(name: str, verbose: bool = False):
    """Build the file that holds experiment ``name`` (or the file ``name``); returns its module."""
    return load(get(name).file if name in EXPERIMENTS else name, verbose)


def prebuild(jobs: int | None = None) -> int:
    """Compile every experiment file and the two probes side by side (``jobs`` at a time, one per CPU by
    default), so that a chapter finds each built; returns how many."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from . import load_rate, wgmma_rate

    builds = [functools.partial(load, f) for f in FILES] + [load_rate.load, wgmma_rate.load]
    jobs = max(1, min(len(builds), jobs or os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda b: b(), builds))
    return len(builds)


def runner(name: str, w: Workload, *, num_splits: int | None = None):
    """A no-argument call of experiment ``name`` on ``w``, like :func:`mla_lab.core.ops.runner` for a stage.

    The arguments go through the op's own checks first, and the grid is the stage's (``num_splits`` by default:
    one block per SM), so the experiment and its stage differ only in the piece swapped.
    """
    from ..core import ops, stages
    from ..core.validate import check_contents, check_metadata

    e = get(name)
    st = stages.get(e.stage)
    check_metadata(*w.args(), device_type="cuda", align_bytes=st.align_bytes, name=f"experiment {name}")
    check_contents(*w.args()[:4], name=f"experiment {name}")
    module = load(e.file)
    ns = int(num_splits if num_splits is not None else ops.default_num_splits(st, w.q, w.kv_cache, w.block_table))
    out, lse = w.new_outputs(poison=True)
    q, kv, bt, lens = w.args()[:4]
    scale = float(w.scale)

    def call():
        module.run(name, q, kv, bt, lens, scale, ns, out, lse)

    call.out, call.lse, call.num_splits = out, lse, ns  # type: ignore[attr-defined]
    return call


def flashmla_runner(w: Workload):
    """FlashMLA's call on ``w`` (as ``mla-lab bench --peers`` times it), or ``None`` where it is not importable."""
    try:
        import flash_mla  # noqa: F401
    except Exception:
        return None
    from ..measure.bench import _peer_runner

    return _peer_runner("flashmla", w)


# ---- the compiled code, on the CPU ----------------------------------------------------

def cubin(file: str):
    """An experiment file compiled for sm_90a as the extension compiles (nvcc, no GPU), cached by its sources."""
    from ..measure.resources import compile_cubin

    return compile_cubin(source(file), "9.0")


def main_sass(name: str, kernel: str | None = None) -> str:
    """The SASS of an experiment's main kernel (or of ``kernel``, another kernel of its file), or of a stage's
    first main kernel where ``name`` is a stage id (``hopper``: the op's hopper_kernel)."""
    from ..core import stages
    from .sass import kernel_sass
    from ..measure.resources import compile_cubin

    if name in EXPERIMENTS:
        e = EXPERIMENTS[name]
        return kernel_sass(cubin(e.file), kernel or e.kernel)
    st = stages.get(STAGE_OF_BUILD.get(name, name))
    return kernel_sass(compile_cubin(CSRC / st.source, "9.0"), kernel or st.kernel)


def sass_counts(name: str, kernel: str | None = None) -> dict[str, int]:
    """Instructions of a main kernel compiled for sm_90a (:func:`main_sass`).

    ``HGMMA``: the products; ``LDGSTS``: the copies (``cp.async``) of keys and of ``Q``; ``SYNCS``: the barrier
    operations; ``UTMALDG``: the TMA copies; ``WAIT``: the waits for products in flight
    (``WARPGROUP.DEPBAR``).  A static count (each instruction once, however often it runs).
    """
    return work_counts(main_sass(name, kernel))


def work_counts(sass_text: str) -> dict[str, int]:
    """:func:`sass_counts`'s counts of any kernel's SASS."""
    from .sass import count_opcodes, instruction_mix

    mix = instruction_mix(sass_text)
    counts = {op: count_opcodes(mix, op) for op in ("HGMMA", "LDGSTS", "SYNCS", "UTMALDG")}
    counts["WAIT"] = count_opcodes(mix, "WARPGROUP.DEPBAR")
    return counts


def hgmma_shapes(name: str, kernel: str | None = None) -> dict[str, int]:
    """A main kernel's products by shape (``"64x64x16"``: count), as compiled for sm_90a."""
    from .sass import hgmma_shapes as shapes

    return shapes(main_sass(name, kernel))


# ---- the stamps ---------------------------------------------------------------------------

def timeline(w: Workload, *, num_splits: int | None = None, variant: str = "timeline"):
    """The stamps of one call on ``w``: a float array ``[2, STAMP_TILES, 6]``.

    ``[g, t, e]`` is the SM clock, in cycles from the start of compute warpgroup ``g`` of block 0, at event ``e``
    (:data:`STAMP_EVENTS`, or the seesaw's) of its tile (or pair of tiles) ``t``; zero where the block had no such
    tile, and in the second warpgroup's half where a stream has at most 40 pairs on the tile on N.  Both warpgroups
    start together, after the block's barrier, so their clocks can be compared.  The call is made once to warm
    up, then again with the stamps cleared.  ``variant`` is an experiment that stamps (:data:`STAMPING`).
    """
    import numpy as np

    if variant not in STAMPING:
        raise ValueError(f"{variant!r} does not stamp a timeline; the experiments that do are {', '.join(STAMPING)}")
    call = runner(variant, w, num_splits=num_splits)
    module = load(get(variant).file)
    call()
    module.timeline_clear()
    call()
    return np.asarray(module.timeline_read(STAMP_TILES, len(STAMP_EVENTS)))


def merge_timeline(w: Workload, *, num_splits: int | None = None, flush_bytes: int = 256 << 20) -> dict:
    """When each block of the main kernel and of the merge got where, in one call on ``w``.

    The call is made once to warm up; then the stamps are cleared, ``flush_bytes`` of a buffer are written (as
    the timing does before each call, which evicts L2), and the call is made again, alone.  Returns ``main``, an
    array ``[blocks, 2]`` (start, end: thread 128's, once its warpgroup has written its last unit), ``merge``,
    ``[merge blocks of the first cut unit, MERGE_EVENTS]``, and ``block0``, ``[BLOCK0_EVENTS]``, all in
    microseconds from the first main block's start, NaN where nothing was stamped.
    """
    import numpy as np
    import torch

    call = runner("merge_timeline", w, num_splits=num_splits)
    module = load(get("merge_timeline").file)
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

    Tiles ``first`` onwards count (the first ones include the pipeline's start), up to the last tile whose
    successor also started (its period is known).  ``overlap`` is the mean, over those tiles, of the time both
    warpgroups spend between "scores done" and "P stored" at once, as a fraction of the tile's period: a time
    when neither has a product in flight.
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
    :data:`SEESAW_CROSS_STAMP_EVENTS` for the crossed order's): the median period (cycles from one pair's start to
    the next's, each warpgroup), the median of each warpgroup's five phases, the period over
    :data:`SEESAW_PAIR_TENSOR_CYCLES` (the tensor cores' own time for a pair), how far apart the two warpgroups'
    scores of the next pair end (the median, as a fraction of the period), and each warpgroup's median time from
    its last stamp of a pair to the start of its next (``to_next_pair``).  Pairs ``first`` onwards count."""
    import numpy as np

    st = np.asarray(stamps, dtype=float)
    pairs = _timed_tiles(st, first, "pair of tiles")
    period = float(np.median([st[g, t + 1, 0] - st[g, t, 0] for g in (0, 1) for t in pairs]))
    phases = [{f"{events[g][e - 1]} -> {events[g][e]}":
               float(np.median([st[g, t, e] - st[g, t, e - 1] for t in pairs])) for e in range(1, 6)} for g in (0, 1)]
    apart = float(np.median([abs(st[1, t, 5] - st[0, t, 5]) for t in pairs])) / period
    to_next = [float(np.median([st[g, t + 1, 0] - st[g, t, 5] for t in pairs])) for g in (0, 1)]
    return {"period": period, "phases": phases, "pairs": len(pairs),
            "over_tensor": period / SEESAW_PAIR_TENSOR_CYCLES, "scores_end_apart": apart, "to_next_pair": to_next}


def timeline_median(calls, first: int = 2) -> dict:
    """:func:`timeline_summary` of several calls' stamps, each field the median over the calls (one call's block 0
    is one SM's history: how its warpgroups fall into step varies from call to call).  ``overlap_range`` is the
    smallest and largest ``overlap`` among the calls."""
    import numpy as np

    summaries = [timeline_summary(st, first) for st in calls]
    if not summaries:
        raise ValueError("no call's stamps to summarise")
    out = {k: float(np.median([s[k] for s in summaries])) for k in summaries[0]}
    out["calls"] = len(summaries)
    out["overlap_range"] = (min(s["overlap"] for s in summaries), max(s["overlap"] for s in summaries))
    return out


def main(argv=None) -> int:
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m mla_lab.book.experiments",
                                     description="Build or list the experiments (csrc/experiments/).")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every experiment: its file, its stage, what it swaps")
    b = sub.add_parser("build", help="build the file that holds an experiment (sm_90a; no GPU needed)")
    b.add_argument("name", choices=sorted(set(EXPERIMENTS) | set(FILES)), metavar="NAME",
                   help="an experiment or an experiment file")
    args = parser.parse_args(argv)
    if args.command == "list":
        for e in EXPERIMENTS.values():
            print(f"{e.name:<30} {e.file:<22} {e.stage:<12} {e.what}")
        return 0
    module = build(args.name, verbose=False)
    print(f"built {args.name}: variants {', '.join(module.variants())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
