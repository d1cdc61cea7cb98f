"""The stage registry: the one ordered list the tests, the benchmark, the plots
and the README table all read.

Each stage is one rung of the ladder: one kernel file in ``csrc/`` (or the
Triton baseline), one chapter, one op in ``torch.ops.mla_lab``.  Its launch
geometry is written out here in Python, so a reader can do the occupancy
arithmetic by hand; a test holds it to what the C++ launcher really does.
Each CUDA stage also has one line in ``csrc/stage_list.h``, the C++ side's
list; a test holds the two to the same stages, in the same order, with the
same splits, alignment, compute capabilities and kernels.

A stage's number is its chapter's number.  Chapter 7 (CUDA graphs) has no
stage of its own: it captures whole verify steps built from the kernels of
the others, so the numbers go 0-6, then 8 onward.  Chapters 0-7 follow the
article's ladder; 8 and 9 (Part II) go beyond it on any GPU since Ampere, and 10 to 13 (Part III) on Hopper:
four stages that share csrc/hopper/ and differ in which kernels they hold and which one a call runs
(:class:`HopperDesign`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .problem import D_QK, D_V

MAX_SPLITS = 256  # the ops' limit (csrc/bindings.cpp)
TRITON_DEFAULT_SPLITS = 4  # the production baseline's KV splits: vLLM's long-standing default


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Stage:
    id: str
    number: int
    title: str
    chapter: str  # notebook in chapters/
    adds: str  # what this rung changes, in one line
    kind: str  # "triton" or "cuda"
    source: str | None = None  # kernel file in csrc/
    kernel: str | None = None  # its __global__ function
    threads: int = 0
    head_tile: int = 0  # heads that share one pass over the keys
    keys_per_tile: int = 0  # keys staged in shared memory per step (0: none)
    kv_row_stride: int = D_QK  # bf16 elements per staged key row (padding included)
    rows_per_block: int = 1  # query rows of a stream that share one pass over the keys
    acc_in_smem: bool = True  # output accumulators in shared memory (else registers)
    splits: bool = False  # split-KV with the combine kernel
    align_bytes: int = 4  # widest access to q, the cache and out
    pair_tile: int = 0  # (query row, head) pairs of a stream per block, flattened (tensor cores); 0: unused
    min_cc: int = 0  # lowest compute capability (major * 10 + minor) its kernels run on; 0: any
    max_cc: int = 0  # highest; 0: no limit (equal to min_cc: that architecture only)
    persistent: bool = False  # one block per SM sharing all the key tiles; num_splits is that grid
    hopper: "HopperDesign | None" = None  # a Hopper stage's kernels and its choice among them (persistent stages)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def takes_num_splits(self) -> bool:
        """Whether a call may pass ``num_splits``: the split stages, and the Triton baseline (its split count)."""
        return self.splits or self.kind == "triton"

    def runs_on(self, major: int, minor: int) -> bool:
        """Whether its kernels run on a GPU of compute capability ``major.minor`` (the op refuses others)."""
        cc = 10 * major + minor
        return (not self.min_cc or cc >= self.min_cc) and (not self.max_cc or cc <= self.max_cc)

    @property
    def op_name(self) -> str | None:
        return f"mla_lab::{self.id}" if self.is_cuda else None

    @property
    def kernels(self) -> tuple[str, ...]:
        if not self.is_cuda:
            return ()
        if self.persistent:
            return self.hopper.kernels
        return (self.kernel, COMBINE_KERNEL) if self.splits else (self.kernel,)

    def smem_bytes(self, max_pages: int, page_size: int) -> int:
        """Dynamic shared memory of the main kernel's launch."""
        if self.persistent:
            return HOPPER_SMEM_BYTES
        if self.id == "naive":
            # the query in fp32 and one fp32 score per key the block table can address
            return (D_QK + max_pages * page_size) * 4
        if self.pair_tile:
            # bf16 queries, two bf16 key tiles (rows padded), fp32 scores with 4 floats of padding per row
            rows = self.pair_tile * self.kv_row_stride * 2
            return rows + 2 * self.keys_per_tile * self.kv_row_stride * 2 + self.pair_tile * (self.keys_per_tile + 4) * 4
        vectors, tk = self.head_tile * self.rows_per_block, self.keys_per_tile  # queries per block
        row_addresses = tk * 8
        key_tile = tk * self.kv_row_stride * 2
        acc = vectors * D_V if self.acc_in_smem else 0
        floats = vectors * D_QK + acc + vectors * tk + 3 * vectors  # q, acc, scores, softmax state
        return row_addresses + key_tile + floats * 4

    def head_tiles(self, heads: int) -> int:
        return -(-heads // self.head_tile)

    def row_groups(self, q_len: int) -> int:
        return -(-q_len // self.rows_per_block)

    def blocks_per_split(self, q_len: int, heads: int) -> int:
        """Blocks that share one key range of one stream."""
        if self.pair_tile:
            return -(-(q_len * heads) // self.pair_tile)
        return self.head_tiles(heads) * self.row_groups(q_len)

    def grid(self, streams: int, q_len: int, heads: int, splits: int) -> tuple[int, int, int]:
        if self.pair_tile:
            return (self.blocks_per_split(q_len, heads), 1, streams * splits)
        return (self.head_tiles(heads), self.row_groups(q_len), streams * splits)

    def launches(self, streams: int, q_len: int, heads: int, max_pages: int, page_size: int,
                 num_splits: int = 1) -> list[Launch]:
        """Every kernel launch one call makes, in order."""
        if not self.is_cuda:
            raise ValueError(f"stage {self.id} is not a CUDA stage of this extension")
        splits = num_splits if self.splits else 1
        if self.persistent:  # persistent main kernel (its blocks schedule themselves), merge of the cut units
            k = self.hopper
            units = hopper_units(streams, q_len, heads, max_pages, page_size, splits, self.id)
            slices = hopper_combine_slices(splits, units, hopper_table_tiles(max_pages, page_size))
            if slices == 1 and hopper_combine_by_warps(splits, units):  # the merge by warps instead of the combine
                merge = Launch(k.merge_by_warps, (HOPPER_PAIRS_PER_BLOCK // HOPPER_PAIRS_PER_WARP_MERGE_BLOCK,
                                                  min(splits, units), 1), (HOPPER_COMBINE_THREADS, 1, 1), 0)
            else:
                merge = Launch(k.combine, (HOPPER_PAIRS_PER_BLOCK * slices, min(splits, units), 1),
                               (hopper_combine_threads(slices, units), 1, 1), 0)
            # A table too narrow for two tiles cuts no unit: such a call launches no merge (may_cut).
            merges = [merge] if hopper_table_tiles(max_pages, page_size) > 1 else []
            if hopper_seesaw_pays(streams, q_len, heads, max_pages, page_size, splits, self.id):
                see_kernel = hopper_seesaw_kernel_for(page_size, self.id)
                return [Launch(see_kernel, (splits, 1, 1), (HOPPER_SEE_THREADS, 1, 1), HOPPER_SEE_SMEM_BYTES), *merges]
            if hopper_tma_pays(streams, q_len, heads, max_pages, page_size, splits, self.id):
                return [Launch(k.tma, (splits, 1, 1), (self.threads, 1, 1), HOPPER_TMA_SMEM_BYTES), *merges]
            return [Launch(k.gather, (splits, 1, 1), (self.threads, 1, 1), HOPPER_SMEM_BYTES), *merges]
        main = Launch(self.kernel, self.grid(streams, q_len, heads, splits), (self.threads, 1, 1), self.smem_bytes(max_pages, page_size))
        if not self.splits:
            return [main]
        return [main, Launch(COMBINE_KERNEL, (heads, q_len, streams), (COMBINE_THREADS, 1, 1), 0)]


COMBINE_KERNEL = "combine_splits_kernel"
COMBINE_THREADS = 128

# The Hopper stages (csrc/hopper/), whose block is not built from the fields
# above: a loader warpgroup and two compute warpgroups of 40 (row, head) pairs
# each; a ring of 15 chunks of a 64-key tile (64 keys x 64 dims, 8 KB each);
# each compute warpgroup's Q^T (9 chunks x 40 pairs x 128 B) and P^T (40 x 128 B);
# softmax exchange words; 30 mbarriers; the scheduler's words (a prefix sum's warp
# totals, the share's first unit); 1 KB to align the base to 1024 bytes.
HOPPER_SLICED_PIECES = 32  # the Hopper stages' combine is sliced where a unit can be cut into this many pieces (kSlicedPieces)


def hopper_combine_slices(splits: int, units: int, unit_tiles_bound: int) -> int:
    """Blocks per merged pair in a Hopper stage's combine grid: four (slices of 128 dims) where few units share it
    and a unit can be cut into HOPPER_SLICED_PIECES pieces or more (``unit_tiles_bound``: the block table's tokens
    in 64-key tiles), or where at most two units share it; else one."""
    return 4 if splits >= 16 * units and (units <= 2 or unit_tiles_bound >= HOPPER_SLICED_PIECES) else 1


def hopper_combine_threads(slices: int, units: int) -> int:
    """Threads of a block of a Hopper stage's combine: 128 in a sliced grid of more than two units (320 blocks a unit,
    too many for one wave of 256-thread blocks), else 256."""
    return HOPPER_NARROW_COMBINE_THREADS if slices > 1 and units > 2 else HOPPER_COMBINE_THREADS


def hopper_combine_by_warps(splits: int, units: int) -> bool:
    """Whether a Hopper stage merges each pair of a cut unit with one warp, eight pairs to a block, in its
    merge_by_warps kernel (combine_by_warps; in a grid that is not sliced): where the units are cut into a few
    pieces each, ``splits`` at most three times the units. Else its combine kernel gives a pair a block of its own
    (or four, in a sliced grid)."""
    return splits <= 3 * units


def hopper_groups(q_len: int, heads: int) -> int:
    """The tile on N's pair groups per stream (the Hopper stages): its (row, head) pairs in blocks of at most 80."""
    return -(-(q_len * heads) // HOPPER_PAIRS_PER_BLOCK)


def hopper_fills_rows(pairs: int, eighth: bool = False) -> bool:
    """Whether a stream's (row, head) pairs fill tiles of 64 on wgmma's M (fills_rows_third, fills_rows_eighth):
    padded to whole tiles, at most a third more rows than pairs (so 48 or more); ``eighth``: 64 pairs or more with
    an eighth of padding at most."""
    padded = -(-pairs // HOPPER_ROWS_PAIRS) * HOPPER_ROWS_PAIRS
    if eighth:
        return pairs >= HOPPER_ROWS_PAIRS and 8 * padded <= 9 * pairs
    return 3 * padded <= 4 * pairs


def hopper_tma_pages(page_size: int) -> bool:
    """Pages the tensor copy can read a tile from (tma_pages): 16 keys or more, a multiple or a divisor of 64."""
    return page_size % 16 == 0 and (page_size % HOPPER_KEYS_PER_TILE == 0 or HOPPER_KEYS_PER_TILE % page_size == 0)


def hopper_seesaw_groups(q_len: int, heads: int) -> int:
    """The seesaw's pair groups per stream: its (row, head) pairs in units of 64, on wgmma's M."""
    return -(-(q_len * heads) // HOPPER_ROWS_PAIRS)


def _design(stage) -> "HopperDesign":
    st = stage if isinstance(stage, Stage) else get(stage)
    if st.hopper is None:
        raise ValueError(f"stage {st.id} is not a Hopper stage")
    return st.hopper


def hopper_seesaw_pays(streams: int, q_len: int, heads: int, max_pages: int, page_size: int, splits: int,
                       stage: "str | Stage" = "hopper") -> bool:
    """Whether a call of a Hopper stage (by default the op) runs the seesaw (its stage file's rule, SeesawAnEighth
    or SeesawAThird): where a stream's pairs fill tiles of 64 (an eighth of padding at most in stage 12; a third with
    pages of 64 keys or a multiple in the op), the pages suit the tensor copy, and the block table's width gives each
    of the ``splits`` blocks hopper_see_tiles_per_block(page_size) key tiles or more, in units of 64 pairs (a bound:
    the host cannot see the lengths).  Never in stages 10 and 11, which have no seesaw.  (A cache that gets no tensor
    map is then gathered by the tile on N, in the same units.)"""
    line = _design(stage).seesaw
    if line is None:
        return False
    eighth = line == "eighth" or page_size % HOPPER_KEYS_PER_TILE != 0
    units = streams * hopper_seesaw_groups(q_len, heads)
    return (hopper_fills_rows(q_len * heads, eighth=eighth)
            and hopper_tma_pages(page_size)
            and units * hopper_table_tiles(max_pages, page_size) >= hopper_see_tiles_per_block(page_size) * splits)


def hopper_unit_start_slots(streams: int, q_len: int, heads: int, max_pages: int, page_size: int,
                            splits: int, stage: "str | Stage" = "hopper") -> int:
    """The slots of the plan a unit's start takes before its tiles (unit_start_slots): where the seesaw runs
    (hopper_seesaw_pays), HOPPER_SEE_UNIT_START_TILES, what starting a unit costs it in tiles; elsewhere 0, every
    slot a tile."""
    pays = hopper_seesaw_pays(streams, q_len, heads, max_pages, page_size, splits, stage)
    return HOPPER_SEE_UNIT_START_TILES if pays else 0


def hopper_see_tiles_per_block(page_size: int) -> int:
    """The seesaw's line in tiles a block (see_tiles_per_block): lower with pages of 64 keys or a multiple, where
    the seesaw copies a tile's chunks four at a time, than with pages of 16 or 32, where it copies them one by one."""
    if page_size % HOPPER_KEYS_PER_TILE == 0:
        return HOPPER_SEE_TILES_PER_BLOCK
    return HOPPER_SEE_TILES_PER_BLOCK_SMALL_PAGES


def hopper_units(streams: int, q_len: int, heads: int, max_pages: int, page_size: int, splits: int,
                 stage: "str | Stage" = "hopper") -> int:
    """The units of a call of a Hopper stage (a stream's group of pairs): of up to 80 pairs, or of 64 where the
    seesaw runs (hopper_seesaw_pays)."""
    if hopper_seesaw_pays(streams, q_len, heads, max_pages, page_size, splits, stage):
        return streams * hopper_seesaw_groups(q_len, heads)
    return streams * hopper_groups(q_len, heads)


def hopper_tma_pays(streams: int, q_len: int, heads: int, max_pages: int, page_size: int, splits: int,
                    stage: "str | Stage" = "hopper") -> bool:
    """Whether a call of a Hopper stage copies its key tiles by TMA (its tma_pays) rather than gathering them with
    cp.async: never in stage 10; from stage 11 on, where the pages hold 16 keys or more, a multiple or a divisor of
    64, and the block table's width (``max_pages`` pages of ``page_size``) lets each of the ``splits`` blocks have
    HOPPER_TMA_TILES_PER_BLOCK key tiles or more to load.  The host cannot see the lengths, so this is a bound.  (A
    cache that gets no tensor map is gathered: a base or a stride not a multiple of 16 bytes.)  Where the seesaw
    pays, the stage runs it instead."""
    if not _design(stage).tma:
        return False
    if hopper_seesaw_pays(streams, q_len, heads, max_pages, page_size, splits, stage):
        return False  # the seesaw runs instead
    bound = hopper_tiles_bound(streams, q_len, heads, max_pages, page_size)
    return hopper_tma_pages(page_size) and bound >= HOPPER_TMA_TILES_PER_BLOCK * splits


def hopper_seesaw_kernel_for(page_size: int, stage: "str | Stage" = "hopper") -> str:
    """The seesaw kernel of a stage that reads pages of ``page_size`` keys (seesaw_kernel_for): the one compiled
    for tiles of one box of 64 keys copied four chunks at once, with pages of 64 keys or a multiple; the one that
    asks how a tile's boxes lie, with pages of 16 or 32.  (A stage also runs the second where the driver refuses
    the map of four chunks; with pages of 64 it has not here.)"""
    d = _design(stage)
    if d.seesaw is None:
        raise ValueError("a stage without the seesaw has no seesaw kernel")
    return d.seesaw_kernel if page_size % HOPPER_KEYS_PER_TILE == 0 else d.seesaw_any_pages


def hopper_table_tiles(max_pages: int, page_size: int) -> int:
    """The 64-key tiles of a block table's width: the most a stream (and so a unit) can have."""
    return -(-max_pages * page_size // HOPPER_KEYS_PER_TILE)


def hopper_tiles_bound(streams: int, q_len: int, heads: int, max_pages: int, page_size: int) -> int:
    """The most key tiles a call of the tile on N can have, from what the host sees: every unit (a stream's pair
    group) with the table's width in tiles.  hopper_tma_pays compares it with the blocks."""
    return streams * hopper_groups(q_len, heads) * hopper_table_tiles(max_pages, page_size)


@dataclass(frozen=True)
class HopperDesign:
    """What a Hopper stage's file holds: its kernels, named by what each does, and its choice among them.

    ``gather``: the tile on N, its keys gathered with cp.async; ``tma``: the same fed by the tensor copy;
    ``seesaw_kernel`` and ``seesaw_any_pages``: the seesaw, compiled for whole tiles of 64 keys and for any
    pages; ``combine`` and ``merge_by_warps``: the two merges.  ``seesaw``: the stage's line for a stream's
    pairs (None: no seesaw; "eighth": 64 pairs or more with an eighth of padding at most; "third": a third
    of padding where the pages hold whole tiles, else an eighth).
    """
    gather: str
    combine: str
    merge_by_warps: str
    tma: str | None = None
    seesaw_kernel: str | None = None
    seesaw_any_pages: str | None = None
    seesaw: str | None = None

    @property
    def kernels(self) -> tuple[str, ...]:
        """Every kernel, in the order of the stage file's list: the main kernels, the merges, then the seesaw's
        second kernel."""
        mains = [k for k in (self.gather, self.tma, self.seesaw_kernel) if k]
        tail = [self.seesaw_any_pages] if self.seesaw_any_pages else []
        return (*mains, self.combine, self.merge_by_warps, *tail)


WGMMA = HopperDesign(gather="wgmma_kernel", combine="wgmma_combine_kernel",
                     merge_by_warps="wgmma_merge_by_warps_kernel")
TENSOR_COPY = HopperDesign(gather="tensor_copy_gather_kernel", tma="tensor_copy_kernel",
                           combine="tensor_copy_combine_kernel", merge_by_warps="tensor_copy_merge_by_warps_kernel")
SEESAW = HopperDesign(gather="seesaw_gather_kernel", tma="seesaw_tma_kernel", seesaw_kernel="seesaw_kernel",
                      seesaw_any_pages="seesaw_any_pages_kernel", combine="seesaw_combine_kernel",
                      merge_by_warps="seesaw_merge_by_warps_kernel", seesaw="eighth")
OP = HopperDesign(gather="hopper_kernel", tma="hopper_tma_kernel", seesaw_kernel="hopper_seesaw_kernel",
                  seesaw_any_pages="hopper_seesaw_any_pages_kernel", combine="hopper_combine_kernel",
                  merge_by_warps="hopper_merge_by_warps_kernel", seesaw="third")
# The op's kernels: the main kernels, one of which a call launches (hopper_seesaw_pays and hopper_tma_pays say
# which, and where the seesaw runs, hopper_seesaw_kernel_for), and the two merges, one of which it launches
# (hopper_combine_by_warps says which).
HOPPER_KERNELS = OP.kernels
HOPPER_TMA_TILES_PER_BLOCK = 12  # kTmaTilesPerBlock
HOPPER_SEE_TILES_PER_BLOCK = 15  # kSeeTilesPerBlock: pages of 64 keys or a multiple
HOPPER_SEE_TILES_PER_BLOCK_SMALL_PAGES = 56  # kSeeTilesPerBlockSmallPages: pages of 16 or 32
HOPPER_SEE_UNIT_START_TILES = 5  # kSeeUnitStartTiles: a unit's start in the seesaw's plan, in tiles
HOPPER_ROWS_PAIRS = 64  # kRowsPairs: a seesaw unit's pairs, on wgmma's M
HOPPER_PAIRS_PER_GROUP = 40
HOPPER_THREADS = 384  # a loader warpgroup and two compute warpgroups
HOPPER_PAIRS_PER_BLOCK = 2 * HOPPER_PAIRS_PER_GROUP
HOPPER_KEYS_PER_TILE = 64
HOPPER_RING_CHUNKS = 15
HOPPER_COMBINE_THREADS = 256
HOPPER_NARROW_COMBINE_THREADS = 128
HOPPER_PAIRS_PER_WARP_MERGE_BLOCK = HOPPER_COMBINE_THREADS // 32  # a warp a pair, where hopper_combine_by_warps
HOPPER_MIN_TILES_PER_BLOCK = 1
HOPPER_ALIGNED_SHARE_TILES = 8  # below this many tiles per block, equal units are cut at whole pieces (kAlignedShareTiles)
HOPPER_SMEM_BYTES = (HOPPER_RING_CHUNKS * HOPPER_KEYS_PER_TILE * 128            # the ring
                     + 2 * (D_QK // 64) * HOPPER_PAIRS_PER_GROUP * 128          # Q^T, per warpgroup
                     + 2 * HOPPER_PAIRS_PER_GROUP * 128                         # P^T, per warpgroup
                     + 4 * HOPPER_PAIRS_PER_GROUP * (2 * 4 + 2 + 2 * 2 + 2 * 4)  # maxima, lengths, references, sums
                     + 8 * 2 * HOPPER_PAIRS_PER_GROUP                            # each pair's row in q
                     + 2 * HOPPER_RING_CHUNKS * 8                              # mbarriers
                     + 4 * (HOPPER_THREADS // 32 + 2)                           # the scheduler's words
                     + 1024)                                                    # alignment
HOPPER_TMA_SMEM_BYTES = HOPPER_SMEM_BYTES + 2 * 4  # hopper_tma_kernel's: and the TMA loader's two progress counters
# The seesaw's block (hopper_seesaw_kernel): two compute warpgroups, no loader; two whole key tiles and Q of 64 pairs
# (9 chunks of 64 x 128 B each); the reference, two factors and two sums a pair, lengths and rows in q; a barrier per
# chunk of each tile, the bad-page flags, the page ids fetched ahead, the scheduler's words; 1 KB of alignment.
HOPPER_SEE_THREADS = 256
HOPPER_SEE_SMEM_BYTES = (3 * (D_QK // 64) * HOPPER_KEYS_PER_TILE * 128
                         + HOPPER_ROWS_PAIRS * (4 + 2 * 4 + 2 * 4 + 4 + 8)
                         + 2 * (D_QK // 64) * 8 + 16 + 2 * 4 * 4 * 4
                         + 4 * (HOPPER_THREADS // 32 + 2)
                         + 1024)

STAGES: tuple[Stage, ...] = (
    Stage("triton", 0, "Production baseline: vLLM's split-KV MLA decode kernel (Triton)",
          "00_problem_and_baseline.ipynb",
          "the yardstick: one decode row per draft token, 16 heads per program, tl.dot, 4 KV splits",
          "triton"),
    Stage("naive", 1, "Naive: a block per head and query row", "01_naive.ipynb",
          "one thread per key for the scores, all scores in shared memory, one thread per output dim",
          "cuda", "stage01_naive.cu", "naive_kernel", threads=128, head_tile=1),
    Stage("flash_ht8", 2, "Flash attention over a tile of 8 heads", "02_flash_ht8.ipynb",
          "32-key tiles in shared memory shared by 8 heads, online softmax; ~71 KB of shared memory",
          "cuda", "stage02_flash_ht8.cu", "flash_ht8_kernel", threads=128, head_tile=8, keys_per_tile=32,
          kv_row_stride=D_QK + 2),
    Stage("kv_split", 3, "KV split: many blocks per query row", "03_kv_split.ipynb",
          "keys cut into num_splits ranges, one block each, merged by LSE in a combine kernel",
          "cuda", "stage03_kv_split.cu", "kv_split_kernel", threads=128, head_tile=8, keys_per_tile=32,
          kv_row_stride=D_QK + 2, splits=True),
    Stage("per_head", 4, "Per-head blocks, for occupancy", "04_per_head.ipynb",
          "one head per block, 256 threads, 16-key tiles: ~23 KB of shared memory",
          "cuda", "stage04_per_head.cu", "per_head_kernel", threads=256, head_tile=1, keys_per_tile=16,
          kv_row_stride=D_QK + 2, splits=True),
    Stage("warp_per_key", 5, "A warp per key", "05_warp_per_key.ipynb",
          "each warp computes one key's 576-wide dot product with a shuffle reduction; 8-key tiles",
          "cuda", "stage05_warp_per_key.cu", "warp_per_key_kernel", threads=256, head_tile=1, keys_per_tile=8,
          kv_row_stride=D_QK + 2, splits=True),
    Stage("float4", 6, "16-byte loads", "06_float4.ipynb",
          "every hot global and shared-memory access 16 bytes wide; 16-byte alignment checked at the op",
          "cuda", "stage06_float4.cu", "float4_kernel", threads=256, head_tile=1, keys_per_tile=8,
          kv_row_stride=D_QK, splits=True, align_bytes=16),
    Stage("shared_rows", 8, "The draft's rows share every key tile", "08_shared_rows.ipynb",
          "one block serves up to 16 query rows of a head: each key is staged once for the whole draft",
          "cuda", "stage08_shared_rows.cu", "shared_rows_kernel", threads=256, head_tile=1, keys_per_tile=8,
          kv_row_stride=D_QK, splits=True, align_bytes=16, rows_per_block=16, acc_in_smem=False),
    Stage("tensor_core", 9, "Tensor cores: the draft and the heads as one matrix", "09_tensor_cores.ipynb",
          "16 (row, head) pairs per block as one mma.sync m16 tile, bf16 in, fp32 out; cp.async double buffering",
          "cuda", "stage09_tensor_cores.cu", "tensor_core_kernel", threads=128, head_tile=1, keys_per_tile=32,
          kv_row_stride=D_QK + 8, splits=True, align_bytes=16, acc_in_smem=False, pair_tile=16, min_cc=80),
    Stage("wgmma", 10, "wgmma: the products turned around, a warp-specialised block, a GPU scheduler",
          "10_wgmma.ipynb",
          "keys as the wgmma M side and up to 80 (row, head) pairs as N; a loader warpgroup feeds two compute "
          "warpgroups through mbarriers; one block per SM, each given an equal share of all key tiles by a GPU "
          "scheduler; the units cut between blocks merged after",
          "cuda", "stage10_wgmma.cu", "wgmma_kernel", threads=HOPPER_THREADS, keys_per_tile=HOPPER_KEYS_PER_TILE,
          splits=True, align_bytes=16, acc_in_smem=False, pair_tile=HOPPER_PAIRS_PER_BLOCK, min_cc=90, max_cc=90,
          persistent=True, hopper=WGMMA),
    Stage("tensor_copy", 11, "The tensor-copy loader: whole key tiles by TMA", "11_tensor_copy.ipynb",
          "the loader copies whole 64-key tiles by TMA, one instruction per 8 KB chunk of a page, where each block "
          "has a dozen tiles or more; shorter calls keep stage 10's gather",
          "cuda", "stage11_tensor_copy.cu", "tensor_copy_gather_kernel", threads=HOPPER_THREADS,
          keys_per_tile=HOPPER_KEYS_PER_TILE, splits=True, align_bytes=16, acc_in_smem=False,
          pair_tile=HOPPER_PAIRS_PER_BLOCK, min_cc=90, max_cc=90, persistent=True, hopper=TENSOR_COPY),
    Stage("seesaw", 12, "FlashMLA's seesaw: 64 pairs on M, two warpgroups, no loader", "12_seesaw.ipynb",
          "where a stream's pairs fill tiles of 64 (an eighth of padding at most) and blocks have many tiles: 64 pairs "
          "as wgmma's M, two warpgroups taking even and odd tiles in FlashMLA's seesaw, tiles copied four chunks at "
          "a time, a tile loop compiled for whole tiles",
          "cuda", "stage12_seesaw.cu", "seesaw_gather_kernel", threads=HOPPER_THREADS,
          keys_per_tile=HOPPER_KEYS_PER_TILE, splits=True, align_bytes=16, acc_in_smem=False,
          pair_tile=HOPPER_PAIRS_PER_BLOCK, min_cc=90, max_cc=90, persistent=True, hopper=SEESAW),
    Stage("hopper", 13, "hopper: each call on the tile that pays", "13_hopper.ipynb",
          "the seesaw also for pairs that pad its tiles by up to a third (48 pairs or more) where the pages hold "
          "whole tiles: the op",
          "cuda", "stage13_hopper.cu", "hopper_kernel", threads=HOPPER_THREADS, keys_per_tile=HOPPER_KEYS_PER_TILE,
          splits=True, align_bytes=16, acc_in_smem=False, pair_tile=HOPPER_PAIRS_PER_BLOCK, min_cc=90, max_cc=90,
          persistent=True, hopper=OP),
)

_BY_ID = {s.id: s for s in STAGES}


@dataclass(frozen=True)
class Chapter:
    """A chapter with no kernel stage of its own."""
    number: int
    title: str
    chapter: str
    adds: str


CHAPTERS_WITHOUT_STAGE: tuple[Chapter, ...] = (
    Chapter(7, "CUDA graphs: the verify step, and a whole model step, captured", "07_cuda_graphs.ipynb",
            "no new kernel: any stage's call captured once per bucket and replayed, a 61-layer model step, "
            "acceptance and rollback, KV defragmentation, the cost of an eager launch"),
)
BEYOND_ARTICLE = 8  # chapters from this number on go beyond the article's ladder


def chapter_map() -> list[tuple[int, str | None, str, str]]:
    """Every chapter in order: (number, stage id or None, notebook, what it adds)."""
    rows = [(s.number, s.id, s.chapter, s.adds) for s in STAGES]
    rows += [(c.number, None, c.chapter, c.adds) for c in CHAPTERS_WITHOUT_STAGE]
    return sorted(rows)


def get(stage_id: str) -> Stage:
    try:
        return _BY_ID[stage_id]
    except KeyError:
        raise KeyError(f"no stage {stage_id!r}; stages are {', '.join(_BY_ID)}") from None


def cuda_stages() -> tuple[Stage, ...]:
    return tuple(s for s in STAGES if s.is_cuda)


def kernels_of_call(st: Stage, streams: int, q_len: int, heads: int, max_pages: int, page_size: int,
                    num_splits: int | None, sms: int) -> list[str]:
    """The kernels one call of CUDA stage ``st`` launches on a GPU of ``sms`` SMs, with ``num_splits`` blocks a
    stream (a persistent stage: blocks in all), or where None, the stage's own count.  That count matters only to
    the Hopper stages, whose grid is a block an SM and whose kernels depend on it; the other split stages launch the
    same two kernels at any count.  So the check can say, on the CPU, which kernels its workloads reach."""
    if num_splits is None:
        num_splits = max(1, min(sms, MAX_SPLITS)) if st.persistent else 1
    return [launch.kernel for launch in st.launches(streams, q_len, heads, max_pages, page_size, num_splits)]


def kernels_reached(st: Stage, calls, sms: int) -> list[str]:
    """The kernels of CUDA stage ``st`` that ``calls`` launch, in the order first launched: ``(problem, num_splits)``
    pairs, each with the block table :func:`mla_lab.core.problem.make_workload` makes (:func:`kernels_of_call`)."""
    seen: list[str] = []
    for p, ns in calls:
        for k in kernels_of_call(st, p.streams, p.q_len, p.heads, p.table_width(), p.page_size, ns, sms):
            if k not in seen:
                seen.append(k)
    return seen


def choose_num_splits(stage: Stage, streams: int, q_len: int, heads: int, max_kv_len: int,
                      sms: int, blocks_per_sm: int) -> int:
    """How many key ranges a split stage cuts each stream into.

    Rule: as many as fit the whole grid into one wave of resident blocks
    (``sms * blocks_per_sm`` slots; rounding down, because a second, partial
    wave would cost a whole extra pass), at least one, and no more than there
    are key tiles in the longest stream (an extra split would have no key).
    """
    if not stage.splits:
        return 1
    if stage.persistent:  # one block per resident slot; the scheduler shares the tiles among them
        return max(1, min(sms * blocks_per_sm, MAX_SPLITS))
    base = streams * stage.blocks_per_split(q_len, heads)
    by_slots = max(1, (sms * blocks_per_sm) // base)
    by_length = max(1, -(-max_kv_len // stage.keys_per_tile))
    return max(1, min(by_slots, by_length, MAX_SPLITS))
