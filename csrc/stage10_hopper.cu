// Stage 10: a Hopper kernel (sm_90a): wgmma, a warp-specialised pipeline, and
// a scheduler that gives every SM the same number of key tiles.
//
// Stage 9 showed the shape of the work: for one stream, the scores of all
// (draft row, head) pairs are one matrix product and the output another.  Its
// mma.sync tiles were 16 pairs, so at 64 heads every key was read by 36
// blocks, and Q was re-read from shared memory by every warp.  Here:
//
// * The products are turned around.  A key tile is the M side of wgmma
//   (M = 64 keys) and the pairs are the N side, which can be any multiple of 8
//   up to 256:  S^T[keys, pairs] = K Q^T  and  O^T[dims, pairs] += V^T P^T.
//   A draft of 9 rows at 8 heads is 72 pairs: one block, no padding to 128.
// * A block has three warpgroups.  Warpgroup 0 only loads: it gathers each
//   tile's keys through the block table with cp.async into a ring of 64-dim
//   chunks (8 KB each), and signals each chunk on an mbarrier.  (On long
//   calls the op copies whole tiles by TMA instead: see tma_pays.)  Warpgroups 1
//   and 2 only compute, each for its own 40 pairs: the two share every key
//   chunk in shared memory and never wait for each other.
// * A block is persistent: one per SM.  Every block first reads kv_lens (on
//   the GPU, so a CUDA graph replays it with new lengths) and works out the
//   same cut of the key tiles of all streams into one equal share per block;
//   it keeps only its own share, and block 0 also writes the cut down for the
//   combine.  (This was a scheduler kernel of its own, launched before the
//   main one: one more kernel per call, which a short call pays in full.)  A
//   share may span several (stream, pair group) units and part of one.  A unit
//   that one block finishes is written straight to `out`; a unit cut between
//   blocks leaves partials that a combine kernel merges.  Units are numbered
//   group by group, and the blocks are a multiple of the groups wherever that
//   leaves at most a sixteenth of them idle, so every group's keys are cut at
//   the same places: the blocks of all groups of a stream read each key tile
//   at about the same time, and L2 serves all but the first (numbered stream
//   by stream, each group re-read the keys from DRAM).
#include "mla_device.cuh"
#include "sm90_ptx.cuh"

#include <algorithm>

namespace mla {
namespace {

using namespace sm90;

constexpr int kKeysPerTile = 64;                 // the M of wgmma: one key tile
constexpr int kChunkDims = 64;                   // dims per 128-byte swizzle row
constexpr int kChunks = kDimQK / kChunkDims;     // 9 chunks per key (8 of V, 1 of RoPE)
constexpr int kVChunks = kDimV / kChunkDims;     // 8
constexpr int kChunkBytes = kKeysPerTile * 128;  // one chunk of a key tile: 8 KB
constexpr int kPairsPerGroup = 40;               // N of every wgmma: one warpgroup's pairs
constexpr int kBarGather = 6;                    // the TMA build's gathering warps (compute: 1, 2; rows: 3-5)
constexpr int kPairsPerBlock = 2 * kPairsPerGroup;
constexpr int kRing = 15;                        // chunk slots: a tile in use and 6 chunks ahead
constexpr int kMinTilesPerBlock = 1;             // a share of one tile still pays: more blocks start at once
constexpr int kThreads = 384;                    // loader warpgroup + two compute warpgroups
constexpr int kLoaderRegs = 40, kComputeRegs = 232;
// setmaxnreg moves registers within the block's launch allocation (65536 / 384,
// rounded down to 8, per thread): a warpgroup's increase waits until the
// others' decreases have made room, so asking for more than there is waits
// forever.  (48 for the loader did exactly that: the kernel hung.)
static_assert(128 * kLoaderRegs + 256 * kComputeRegs <= kThreads * ((65536 / kThreads) & ~7),
              "the warpgroups' registers must fit the block's launch allocation");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kRescaleLog2 = 8.f;              // how far a score may pass the softmax reference before it moves

// Taking work away, for chapter 10's budget of a tile (mla_lab/book/experiments.py
// builds these; the op is always built with 0).  MLA_HOPPER_ABLATE = 1: the
// loader reads neither the cache nor the block table, it zeroes the ring once
// and publishes each chunk as soon as its slot is free.  2: the compute
// warpgroups wait for each tile's chunks and hand them straight back, with no
// product and no softmax.  3: both.  The scheduler, the ring's barriers, Q's
// load, the outputs and the combine are kept in every variant.
#ifndef MLA_HOPPER_ABLATE
#define MLA_HOPPER_ABLATE 0
#endif
constexpr bool kCopyKeys = (MLA_HOPPER_ABLATE & 1) == 0;
constexpr bool kDoMath = (MLA_HOPPER_ABLATE & 2) == 0;

// The loader's other way, for chapter 10 (mla_lab/book/experiments.py builds it as
// the variants "tma" and "tma_first"; the op is always built with 0).  With
// MLA_HOPPER_TMA = 1, where the cache's pages hold a multiple or a divisor of
// 64 keys (16 at the least), whole key tiles are copied by TMA (load_keys_tma)
// instead of gathered with cp.async; the rest of the kernel is the same.  With
// 2, the same by the loader as first written (load_keys_tma_first), which was
// slower than cp.async in every shape measured.  Both compute the right answer.
#ifndef MLA_HOPPER_TMA
#define MLA_HOPPER_TMA 0
#endif
constexpr bool kUseTma = MLA_HOPPER_TMA != 0;
constexpr bool kTmaFirst = MLA_HOPPER_TMA == 2;

// The proxy fence, only where it is needed (mla_lab/book/experiments.py builds it with
// the TMA loader as "tma_fewer_fences"; the op is always built with 0).  The
// tensor cores read shared memory through the async proxy; cp.async writes it
// through the generic proxy, so a compute warp fences (fence.proxy.async) after
// each chunk's wait and before its products.  The tensor copy writes through
// the async proxy itself, and the TMA loader's gatherers (a stream's last tile,
// a tile with a page outside the pool) wait for their own copies and fence
// them before they arrive: with MLA_HOPPER_FENCE_GATHERED_ONLY = 1 and the TMA
// loader in use, the compute warps fence no chunk.
#ifndef MLA_HOPPER_FENCE_GATHERED_ONLY
#define MLA_HOPPER_FENCE_GATHERED_ONLY 0
#endif
constexpr bool kFenceGatheredOnly = MLA_HOPPER_FENCE_GATHERED_ONLY != 0;

// The op's choice of kernel.  The op is built with three main kernels:
// hopper_kernel gathers every tile with cp.async, hopper_tma_kernel is the same
// code copying whole tiles by TMA with the fences of the "tma_fewer_fences"
// build, and hopper_seesaw_kernel is the crossed seesaw with its page lookups
// by steps and its chunks copied four at a time (the "seesaw_cross_boxes"
// build).  The host picks one per call from
// what it knows: the seesaw where a stream's pairs fill tiles of 64 and each
// block has many tiles (seesaw_pays), else the tensor copy where each block
// has a dozen tiles or more (tma_pays: it saved up to 8% of such calls, and
// cost up to 5% of a short one), else the gather.  With MLA_HOPPER_DISPATCH = 0
// (mla_lab/book/experiments.py builds it as "cp_async") the op always gathers, as
// chapter 10's builds do: each of them is built without the choice, so that it
// is compared with the op's cp.async kernel.
#ifndef MLA_HOPPER_DISPATCH
#define MLA_HOPPER_DISPATCH 1
#endif

// The parts of a short call, for chapter 10 (mla_lab/book/experiments.py builds them
// as "launch_only", "scheduler_only" and "no_combine"; the op is always built
// with 0).  MLA_HOPPER_CALL_PART = 1: both kernels are launched, and each
// returns as soon as it may read its inputs.  2: the main kernel returns once
// the scheduler has cut the work, and the combine merges whatever the partial
// slots hold.  3: the main kernel does all of its work, and the combine is not
// launched (right only where no unit is cut).  4: everything but the copies of
// the units' Q, which never arrive (its answers are wrong: timing only).
#ifndef MLA_HOPPER_CALL_PART
#define MLA_HOPPER_CALL_PART 0
#endif
constexpr int kCallPart = MLA_HOPPER_CALL_PART;

// A tile's timeline, for chapter 10 (mla_lab/book/experiments.py builds it as the
// variant "timeline"; the op is always built with 0).  With
// MLA_HOPPER_TIMELINE = 1, thread 0 of each compute warpgroup of block 0
// writes the SM's clock at six points of each of its first kStampTiles tiles,
// counted from the warpgroup's start, into tile_stamps; the host reads them with
// hopper_timeline_read.  Only these stores are added.
#ifndef MLA_HOPPER_TIMELINE
#define MLA_HOPPER_TIMELINE 0
#endif
constexpr int kStampTiles = 64, kStampEvents = 6;
#if MLA_HOPPER_TIMELINE
// [warpgroup][tile][event]: tile start, scores done, softmax pass done, P^T
// stored, the products of P V issued, and done.
__device__ float tile_stamps[2][kStampTiles][kStampEvents];
#define MLA_STAMP(event) \
  if (blockIdx.x == 0 && tid == 0 && stamp_tile < kStampTiles) \
    tile_stamps[group][stamp_tile][event] = float(clock64() - stamp_start)
#else
#define MLA_STAMP(event)
#endif

// Early scores, for chapter 10 (mla_lab/book/experiments.py builds it as
// "early_scores"; the op is always built with 0).  With MLA_HOPPER_EARLY_SCORES
// = 1, a compute warpgroup issues the next tile's scores right behind this
// tile's products (issue_next_scores) instead of waiting for the products to
// finish first; the rest of the kernel is the same.  It computes the right
// answer and saved nothing (chapter 10 times it and says why).
#ifndef MLA_HOPPER_EARLY_SCORES
#define MLA_HOPPER_EARLY_SCORES 0
#endif
constexpr bool kEarlyScores = MLA_HOPPER_EARLY_SCORES != 0;

// The output as first written, for chapter 10 (mla_lab/book/experiments.py builds it as
// "direct_out"; the op is always built with 0).  With MLA_HOPPER_DIRECT_OUT = 1,
// a whole unit's bf16 rows are stored straight from the fragments, as they were
// before they went through shared memory; the rest of the kernel is the same.
#ifndef MLA_HOPPER_DIRECT_OUT
#define MLA_HOPPER_DIRECT_OUT 0
#endif
constexpr bool kDirectOut = MLA_HOPPER_DIRECT_OUT != 0;

// Turns at the tensor cores (mla_lab/book/experiments.py builds it as "pingpong").
// Both compute warpgroups wait for the same chunks and so fall into step: both
// issue their scores, both run the softmax while the tensor cores idle, both
// issue their products.  With MLA_HOPPER_PINGPONG = 1, where both warpgroups
// have pairs, they take turns to issue (warpgroup 0's scores, 1's scores, 0's
// products, 1's products, ...), so that one's softmax runs while the other's
// products are on the tensor cores (FlashAttention-3's ping-pong).  Two named
// barriers pass the turn: a warpgroup waits at its own before it issues, and
// arrives at the other's once its products are issued.
#ifndef MLA_HOPPER_PINGPONG
#define MLA_HOPPER_PINGPONG 0
#endif
constexpr bool kPingPong = MLA_HOPPER_PINGPONG != 0;
static_assert(!(kPingPong && kEarlyScores), "early scores issue across a turn");
constexpr int kBarTurn = 7;  // kBarTurn + group: warpgroup `group` may issue


// The rows layout, for chapter 10 (mla_lab/book/experiments.py builds it as "rows";
// the op is always built with 0).  With MLA_HOPPER_ROWS = 1, where a stream's
// pairs fill their tiles (fills_rows: a third of padding at most),
// the pairs are the M side of every product instead (64 pairs per unit, in
// compute_rows and hopper_rows_kernel), and the two compute warpgroups split
// the 512 output dims between them.
#ifndef MLA_HOPPER_ROWS
#define MLA_HOPPER_ROWS 0
#endif
constexpr int kRowsMode = MLA_HOPPER_ROWS;
constexpr int kRowsPairs = 64;                  // the M of wgmma: a unit's pairs
constexpr int kRowsRing = 2 * kChunks;          // two whole tiles: one scored by each warpgroup
static_assert(kRowsRing % kChunks == 0, "a tile's chunks never wrap around the rows ring (P V reads four at once)");

// Shared memory, from a 1024-byte aligned base (the swizzle repeats every 1024 bytes).
constexpr int kQBytes = kChunks * kPairsPerGroup * 128;  // one warpgroup's Q^T: 46080
constexpr int kPBytes = kPairsPerGroup * 128;            // one warpgroup's P^T: 5120
// A whole unit's output leaves through its warpgroup's Q^T region: a row of 512
// bf16 per pair, padded by 16 bytes so that the eight rows a stmatrix block
// writes fall in different banks.
constexpr int kStageRowBytes = kDimV * 2 + 16;
static_assert(kPairsPerGroup * kStageRowBytes <= kQBytes, "a warpgroup's output rows must fit its Q^T region");
constexpr int kOffRing = 0;
constexpr int kOffQ = kOffRing + kRing * kChunkBytes;
constexpr int kOffP = kOffQ + 2 * kQBytes;
constexpr int kOffMax = kOffP + 2 * kPBytes;              // column maxima exchanged between warps
constexpr int kOffVis = kOffMax + 2 * 4 * kPairsPerGroup * 4;
constexpr int kOffM = kOffVis + 2 * kPairsPerGroup * 4;   // the columns' softmax references, two copies
constexpr int kOffL = kOffM + 2 * 2 * kPairsPerGroup * 4; // column sums, one per warp, met at the end of a unit
constexpr int kOffQRow = kOffL + 2 * 4 * kPairsPerGroup * 4;  // each pair's row in q
constexpr int kOffBars = kOffQRow + 2 * kPairsPerGroup * 8;
constexpr int kOffPlan = kOffBars + 2 * kRing * 8;        // the scheduler's words: warp totals, the share's start
constexpr int kPlanWords = kThreads / 32 + 2;
constexpr int kProgressWords = kUseTma ? 2 : 0;  // after the plan's words: the TMA loader's progress counters
constexpr int kSmemBytes = kOffPlan + (kPlanWords + kProgressWords) * 4 + 1024;  // + slack to align the base
constexpr int kTmaSmemBytes = kOffPlan + (kPlanWords + 2) * 4 + 1024;            // hopper_tma_kernel's
// The rows layout: the ring of two tiles, Q (64 pairs x 9 chunks, rows of 128 B),
// the references after each warpgroup's tile, a flag, the sums, lengths, rows of q.
// P goes into the RoPE chunk of its own tile, which only the scores read.
constexpr int kROffQ = kRowsRing * kChunkBytes;
constexpr int kROffMa = kROffQ + kChunks * kRowsPairs * 128;
constexpr int kROffMb = kROffMa + kRowsPairs * 4;
constexpr int kROffFlag = kROffMb + kRowsPairs * 4;
constexpr int kROffL = kROffFlag + 16;
constexpr int kROffVis = kROffL + 2 * kRowsPairs * 4;
constexpr int kROffQRow = kROffVis + kRowsPairs * 4;
constexpr int kROffBars = kROffQRow + kRowsPairs * 8;
constexpr int kROffPlan = kROffBars + 2 * kRowsRing * 8;
constexpr int kRowsSmemBytes = kROffPlan + (kPlanWords + kProgressWords) * 4 + 1024;
static_assert(kRowsSmemBytes <= 232448, "the rows layout must fit a block's shared memory");
// The seesaw kernel's (hopper_seesaw_kernel): two whole key tiles, K0 and K1, and
// Q (64 pairs x 9 chunks); then the rows' shared softmax reference, each
// warpgroup's factor of its tile and its sums, the rows' lengths and rows in q,
// a barrier per chunk of each tile, the unit's bad-page flags, the scheduler's words.
constexpr int kSeeThreads = 256;                       // two warpgroups, no loader
constexpr int kTileBytes = kChunks * kChunkBytes;      // a whole key tile: 72 KB
constexpr int kSOffQ = 2 * kTileBytes;
constexpr int kSOffM = kSOffQ + kChunks * kRowsPairs * 128;
constexpr int kSOffScale = kSOffM + kRowsPairs * 4;
constexpr int kSOffL = kSOffScale + 2 * kRowsPairs * 4;
constexpr int kSOffVis = kSOffL + 2 * kRowsPairs * 4;
constexpr int kSOffQRow = kSOffVis + kRowsPairs * 4;
constexpr int kSOffBars = kSOffQRow + kRowsPairs * 8;
constexpr int kSOffBad = kSOffBars + 2 * kChunks * 8;
constexpr int kSOffPages = kSOffBad + 16;                 // [2 warpgroups][4 tiles][4 boxes]: page ids fetched ahead
constexpr int kSOffPlan = kSOffPages + 2 * 4 * 4 * 4;
constexpr int kSeeSmemBytes = kSOffPlan + kPlanWords * 4 + 1024;
static_assert(kSeeSmemBytes <= 232448, "the seesaw's layout must fit a block's shared memory");
// A whole unit's bf16 rows leave through Q's region, each padded by 16 bytes
// (the eight rows a stmatrix writes then fall in different banks).
constexpr int kSeeOutRowBytes = kDimV * 2 + 16;
static_assert(kRowsPairs * kSeeOutRowBytes <= kChunks * kRowsPairs * 128, "a unit's output rows must fit Q's region");

// A development aid, compiled only with -DMLA_HOPPER_DEBUG: the first warpgroup
// of block 0 copies its first tile's S^T, P and O^T (fragment by fragment, at
// their matrix positions) to p.debug, so a test can check each product alone.
#ifdef MLA_HOPPER_DEBUG
#define MLA_DEBUG_DUMP(offset, value_of)                                                       \
  if (p.debug && blockIdx.x == 0 && group == 0 && tile == t0 && debug_first) {                 \
    for (int r = 0; r < 20; ++r) {                                                             \
      const int row = 16 * warp + g + (r & 2 ? 8 : 0), col = 8 * (r / 4) + c + (r & 1);       \
      value_of                                                                                 \
    }                                                                                          \
  }
#else
#define MLA_DEBUG_DUMP(offset, value_of)
#endif

// A tile's chunks go through the ring RoPE first: position 0 holds dims
// 512..575 (only the scores need them), positions 1..8 hold V's dims 0..511.
// The ring hands slots out in order, and this is the order they come back:
// the RoPE chunk right after the scores, the V chunks one by one during P V.
// So the next tile's last chunks, which wait for this tile's first slots,
// start loading as early as possible.
__host__ __device__ constexpr int dims_of(int position) { return position == 0 ? kChunks - 1 : position - 1; }

// The plan block 0 writes for the combine (int32 words of p.plan):
//   [0] W, the slots of all units; [1] blocks that get a share;
//   [2] units cut between blocks; [3 .. 3 + units] each unit's first slot in
//   the order of all slots (exclusive prefix sum; the last word is W);
//   then 3 words per cut unit: (unit, first block, last block).
// (A slot is a key tile, or a unit's start: see unit_start_slots.)
constexpr int kPlanHeader = 3;
constexpr int kMaxSplitsHere = 256;  // the op's limit on num_splits: the most pieces a unit can be cut into

// The merge's timeline, for chapter 10 (mla_lab/book/experiments.py builds it as the
// variant "merge_timeline"; the op is always built with 0).  With
// MLA_HOPPER_MERGE_TIMELINE = 1, the GPU's global timer (nanoseconds) is
// written into main_stamps by thread 128 of each block of the main kernel (the
// first compute thread) as the block starts and once its warpgroup has written
// its last unit, and into merge_stamps by thread 0 of each combine block of the
// first cut unit at kMergeEvents points, and into block0_stamps at
// kBlock0Events points of block 0's way to its first tile; the host reads them
// with hopper_merge_timeline_read.  Only these stores are added.
#ifndef MLA_HOPPER_MERGE_TIMELINE
#define MLA_HOPPER_MERGE_TIMELINE 0
#endif
// The combine block's start, past its wait for the main kernel, the cut unit
// read from the plan, the pieces' weights known, and its pieces added.
constexpr int kMergeEvents = 5, kMergeStampBlocks = 4 * 80;  // kManySlices * kPairsPerBlock
// Block 0, before its first unit's first scores: past its wait for the previous
// kernel and the scheduler's cut (thread 0); the loader's first page id read
// back (thread 0); then, in thread 128 (its first unit), Q^T landed, the first
// tile's first chunk landed, all of its chunks landed, and its scores done.
constexpr int kBlock0Events = 7;
#if MLA_HOPPER_MERGE_TIMELINE
__device__ unsigned long long main_stamps[kMaxSplitsHere][2];
__device__ unsigned long long merge_stamps[kMergeStampBlocks][kMergeEvents];
__device__ unsigned long long block0_stamps[kBlock0Events];
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define MAIN_STAMP(event) \
  if (threadIdx.x == 128) main_stamps[blockIdx.x][event] = global_ns()
#define MERGE_STAMP(event) \
  if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.x < kMergeStampBlocks) merge_stamps[blockIdx.x][event] = global_ns()
#define BLOCK0_STAMP(when, event) \
  if (blockIdx.x == 0 && (when)) block0_stamps[event] = global_ns()
#else
#define MAIN_STAMP(event)
#define MERGE_STAMP(event)
#define BLOCK0_STAMP(when, event)
#endif

struct Shape {
  int pairs;   // q_len * heads: (row, head) pairs of a stream, head fastest
  int groups;  // pair groups of up to kPairsPerBlock per stream
  int per_group;
  int units;   // streams * groups, numbered u = group * streams + stream
  bool rows;   // the rows layout: groups of up to 64 pairs on wgmma's M
};

// Pairs that fill tiles of 64 on wgmma's M: padded to whole tiles, at most a
// third more rows than pairs (so 48 pairs or more) where the seesaw reads
// whole tiles (pages of 64 keys or a multiple, `whole_tiles`), else at most an
// eighth more and 64 pairs or more.  Per pair and key the seesaw's tile of 64
// pairs on M, compiled for whole tiles, outruns the tile of up to 80 on N by
// more than that padding costs: on the H200, 9 rows x 16 heads (144 pairs,
// three tiles of 48), 5 x 32 (160), 7 x 16 (112), 3 x 32 (96) and 3 x 16 (48)
// took 0.73 to 0.92 of the time of the tile on N, and 72 pairs (two tiles of
// 36) or 80 up to 1.14 of it; with pages of 16, where the seesaw asks how a
// tile's boxes lie, 144 pairs took 1.09 of it.  As first written the line was
// an eighth for every page size (the build fill_eighth, MLA_HOPPER_FILL_EIGHTH;
// chapter 10 times both).
#ifndef MLA_HOPPER_FILL_EIGHTH
#define MLA_HOPPER_FILL_EIGHTH 0
#endif
__host__ __device__ constexpr bool fills_rows(int pairs, bool whole_tiles = true) {
  return MLA_HOPPER_FILL_EIGHTH || !whole_tiles
             ? pairs >= kRowsPairs && 8 * ((pairs + kRowsPairs - 1) / kRowsPairs * kRowsPairs) <= 9 * pairs
             : 3 * ((pairs + kRowsPairs - 1) / kRowsPairs * kRowsPairs) <= 4 * pairs;
}
__host__ __device__ constexpr bool rows_layout(int pairs) { return kRowsMode != 0 && fills_rows(pairs); }

// Pages the tensor copy can read a tile from: one box of 64 keys, or 2 or 4 of 32 or 16.
__host__ __device__ constexpr bool tma_pages(int page_size) {
  return page_size % 16 == 0 && (page_size % kKeysPerTile == 0 || kKeysPerTile % page_size == 0);
}
// A cache the tensor copy can read: such pages, a 16-byte aligned base and strides, whole rows.
__host__ __device__ inline bool tma_cache(const MlaParams& p) {
  return tma_pages(p.page_size) && reinterpret_cast<uintptr_t>(p.kv) % 16 == 0 && (p.kv_stride_slot * 2) % 16 == 0 &&
         (p.kv_stride_page * 2) % 16 == 0 && p.kv_stride_slot >= kDimQK && p.num_pages >= 1;
}

// The seesaw kernel (hopper_seesaw_kernel, below; mla_lab/book/experiments.py builds
// it as "seesaw"; the op builds it with its choice, MLA_HOPPER_DISPATCH), in
// units of 64 pairs: where a stream's pairs fill tiles of 64 on wgmma's M and
// the tensor copy can read tiles from its pages, and, in the op, where it
// pays.  The host decides it, and the other kernels of a call (the merges,
// hopper_kernel where it stands in) work it out alike from the call's shape;
// the seesaw kernel is launched only where it holds, and knows its shape
// without asking (shape_in(p, true)).  (A cache the tensor copy cannot read
// after all, a base or a stride not a multiple of 16 bytes, is gathered by
// hopper_kernel in the same units of 64 pairs, 40 and 24 to its warpgroups.)
// Every other call runs as in the build without it.
#ifndef MLA_HOPPER_SEESAW
#define MLA_HOPPER_SEESAW MLA_HOPPER_DISPATCH
#endif
// The seesaw's crossed order (build seesaw_cross): P_A handed over in A's own reference.
#ifndef MLA_HOPPER_SEESAW_CROSS
#define MLA_HOPPER_SEESAW_CROSS MLA_HOPPER_DISPATCH
#endif
// Four chunks in one copy (build seesaw_cross_boxes, and the op's seesaw: on
// the H200 it took 0.91 to 0.97 of seesaw_cross_steps's time with pages of 64
// keys; crossed order only).  Without it the copier's lane arms a chunk's
// barrier and issues its tensor copy, a few dozen instructions, for each of
// the 18 chunks of a pair of tiles, while the three other warps of its
// warpgroup wait at the next wgmma.  With MLA_HOPPER_COPY_BOXES = 1, where a
// tile is one page's 64 keys (pages of 64 keys or more), chunks 0..3 and 4..7
// of a tile are one copy each, of a four-dimensional box (a second tensor map,
// KvTensor::map4: the chunks are its third dimension, 128 bytes apart),
// counted on the group's first barrier: six arms and six copies a pair of
// tiles, not 18 of each, and a chunk's readers wait for its group.  Elsewhere
// (pages of 16 or 32 keys, or a map the driver refuses) each chunk is copied
// and counted on its own, as without it.  (The builds without the op's choice
// keep 0 unless they ask.)
#ifndef MLA_HOPPER_COPY_BOXES
#define MLA_HOPPER_COPY_BOXES (MLA_HOPPER_DISPATCH && MLA_HOPPER_SEESAW && MLA_HOPPER_SEESAW_CROSS)
#endif
static_assert(!MLA_HOPPER_COPY_BOXES || (MLA_HOPPER_SEESAW && MLA_HOPPER_SEESAW_CROSS),
              "the groups of chunks are the crossed seesaw's");
// A seesaw kernel of its own for whole-tile boxes (build seesaw_whole, and the
// op's seesaw; chapter 10, "A loop that fits").  The seesaw asks at run time
// how a tile's boxes lie (KvTensor::box_keys and chunk_boxes), and its loop
// holds the code of every answer: copies of one, two and four boxes a chunk,
// and of four chunks at once, at each of the loop's six places that ask for
// copies.  With MLA_HOPPER_SEESAW_WHOLE = 1 the seesaw is compiled twice:
// hopper_seesaw_kernel knows that a tile is one box of 64 keys and that its
// chunks come four to a copy (pages of 64 keys or a multiple, where the driver
// makes the four-chunk map), and hopper_seesaw_any_pages_kernel asks, as
// before, for every other cache.  The same instructions run on the same
// values; the first kernel's tile loop is a third shorter (2552 instructions
// against 3883 as compiled by nvcc 13.0: chapter 10 counts them), and on the
// H200 it took 0.87 to 0.92 of the time of the kernel that asks, at eight
// shapes of 64 and 128 heads (a development run, with pages of 64).
#ifndef MLA_HOPPER_SEESAW_WHOLE
#define MLA_HOPPER_SEESAW_WHOLE (MLA_HOPPER_DISPATCH && MLA_HOPPER_COPY_BOXES)
#endif
static_assert(!MLA_HOPPER_SEESAW_WHOLE || MLA_HOPPER_COPY_BOXES, "a whole tile's chunks come four to a copy");

// The cache seen as a 3-d tensor [pages][page_size][576] bf16, for the "tma"
// build's loader (the op's build passes box_keys = 0 and never reads it): a
// box is 64 dims of min(64, page_size) consecutive keys of one page, written
// to shared memory with the 128-byte swizzle wgmma reads.  box_keys is 0 when
// the cache cannot be read this way (pages of fewer than 16 keys, or of a
// count that neither divides 64 nor is a multiple of it; an unaligned stride):
// the loader then gathers with cp.async.
struct KvTensor {  // aligned as CUtensorMap is (128 bytes)
  CUtensorMap map;
  int box_keys;
#if MLA_HOPPER_COPY_BOXES
  int chunk_boxes;    // map4 holds: four chunks of a tile in one copy
  CUtensorMap map4;   // (64 dims, the page's keys, the 9 chunks, pages), boxes of 4 chunks of 64 keys
#endif
};

// Where the op runs the seesaw: where the block table's width gives each block
// see_tiles_per_block tiles or more, in units of 64 pairs (the lengths live on
// the GPU, so this is a bound, as for tma_pays).  The line depends on the
// pages.  With pages of 64 keys or a multiple, where a tile's chunks come four
// to a copy, the crossed seesaw took 0.73 to 1.02 of the time of the op (then
// without it there) at each of 16 shapes on the H200 with 15.5 to 47.6 tiles a
// block, and 0.86 to 1.12 of it at 9 with 3.6 to 9.8.  With pages of 16 or 32
// keys, a copy a chunk, it stays where it was drawn for the seesaw copying
// chunk by chunk (0.83 to 0.95 of the op's time at 11 shapes with 64 to 995
// tiles a block, 0.80 to 1.27 at 21 with fewer than 48); with pages of 16 at
// 31 tiles a block the seesaw took 1.05 of the op's time.
constexpr int kSeeTilesPerBlock = 15;
constexpr int kSeeTilesPerBlockSmallPages = 56;
__host__ __device__ inline int see_tiles_per_block(int page_size) {
  return page_size % kKeysPerTile == 0 ? kSeeTilesPerBlock : kSeeTilesPerBlockSmallPages;
}
// The most tiles a unit can have: the block table's width (the lengths live on the GPU).
__host__ __device__ inline int64_t unit_tiles_bound(const MlaParams& p) {
  return ((int64_t)p.max_pages * p.page_size + kKeysPerTile - 1) / kKeysPerTile;
}
__host__ __device__ inline bool seesaw_pays(const MlaParams& p) {
  const int64_t units = (int64_t)p.batch * ((p.q_len * p.num_heads + kRowsPairs - 1) / kRowsPairs);
  return units * unit_tiles_bound(p) >= (int64_t)see_tiles_per_block(p.page_size) * p.num_splits;
}
__host__ __device__ inline bool seesaw_layout(const MlaParams& p) {
  return MLA_HOPPER_SEESAW && !kRowsMode && fills_rows(p.q_len * p.num_heads, p.page_size % kKeysPerTile == 0) &&
         tma_pages(p.page_size) &&
         (!MLA_HOPPER_DISPATCH || seesaw_pays(p));
}

// A call's shape where its layout is known: `rows`, in units of 64 pairs.
__host__ __device__ inline Shape shape_in(const MlaParams& p, bool rows) {
  Shape s;
  s.pairs = p.q_len * p.num_heads;
  s.rows = rows;
  const int per_block = s.rows ? kRowsPairs : kPairsPerBlock;
  s.groups = (s.pairs + per_block - 1) / per_block;
  s.per_group = (s.pairs + s.groups - 1) / s.groups;  // balanced groups, each <= 80 pairs
  s.units = p.batch * s.groups;
  return s;
}
__host__ __device__ inline Shape shape_of(const MlaParams& p) {
  return shape_in(p, rows_layout(p.q_len * p.num_heads) || seesaw_layout(p));
}

// The slots of all units are numbered in order (unit-major); block c of the
// C that get a share takes slots [start(c), start(c + 1)).
__device__ __forceinline__ int share_start(int c, int W, int C) { return (int)((int64_t)c * W / C); }
// The share whose slots hold slot x.
__device__ __forceinline__ int block_of_tile(int x, int W, int C) {
  return (int)(((int64_t)(x + 1) * C + W - 1) / W) - 1;
}

// Which share block `cta` takes.  Where C is a multiple of the groups, every
// group's slots are cut at the same keys, and shares k, k + C/G, k + 2 C/G, ...
// read the same keys at the same time, each for its own group.  The seesaw
// gives those shares to neighbouring blocks (cta = G k + g takes share
// (C/G) g + k), as FlashMLA's grid does with its query blocks: reads of the same
// lines from neighbouring SMs, close together in time, then reach L2 as
// fewer requests (on the H200 the main kernel's L2 sectors at 8 x 9 x 64 halved;
// chapter 10 measures what that is worth).  With MLA_HOPPER_SHARES_APART = 1
// (the build shares_apart) block c takes share c, as first written: the same
// keys' shares C/G blocks apart.  The other kernels keep share c on block c.
#ifndef MLA_HOPPER_SHARES_APART
#define MLA_HOPPER_SHARES_APART 0
#endif
__device__ __forceinline__ int share_of_block(int cta, int C, int groups) {
  const bool aligned = !MLA_HOPPER_SHARES_APART && groups > 1 && C > groups && C % groups == 0 && cta < C;
  return aligned ? (cta % groups) * (C / groups) + cta / groups : cta;
}

// ---- the scheduler: every block's prologue ---------------------------------------

// A unit's key tiles: its stream's 64-key tiles, none for a stream that cannot be computed.
__device__ __forceinline__ int unit_tiles(const MlaParams& p, int u) {
  const int len = p.kv_lens[u % p.batch];
  return stream_ok(p, len) ? (len + kKeysPerTile - 1) / kKeysPerTile : 0;
}

// What a block pays to start a unit, in tiles: the scheduler numbers each
// unit with tiles as that many slots ahead of its tiles, so a share that
// starts several units gets fewer tiles.  A start is the unit's Q (a tile's
// bytes again in the seesaw's 64 rows), its first tiles' round trip with
// nothing to overlap it, and its output written at the end.  In the seesaw,
// one stream of 65536 keys at 64 heads took 174 us alone on the H200 and 250
// beside seven of 512 keys, whose 63 units fell eight or nine to a share:
// about 7 us a start, 3 tiles of the long stream's shares.  Swept on the H200
// (0, 1, 2, 3, 5, 8 slots; seven mixed batches of 8 to 16 streams at 64 and
// 128 heads, twelve even or random ones), 5 was fastest or within 2% of it
// everywhere but a short call (8 x 300 keys in a wide table: 37.8 us against
// 8 slots' 36.1): the mixed batch above 250 -> 198 us (3 slots: 209), the even one
// of the same keys 197 -> 191.  FlashMLA's scheduler adds 5 blocks of 64 keys
// to each stream's too.  Only the seesaw counts them, and only where the op
// runs it (seesaw_pays: shares of 15 tiles or more, as far as the block
// table's width tells), where a few slots move a share's end by a few tiles;
// the op's other kernels also run calls of a tile or two a block, where a slot
// would be most of a share.  Units without tiles get no slots, so a batch
// padded with empty streams is cut as before.
#ifndef MLA_HOPPER_UNIT_START_TILES
#define MLA_HOPPER_UNIT_START_TILES 5  // 0: every slot a tile, as first written (the build even_starts)
#endif
constexpr int kSeeUnitStartTiles = MLA_HOPPER_UNIT_START_TILES;
__host__ __device__ inline int unit_start_slots(const MlaParams& p, const Shape& sh) {
  return MLA_HOPPER_SEESAW && sh.rows && seesaw_pays(p) ? kSeeUnitStartTiles : 0;
}
__device__ __forceinline__ int slots_of(int tiles, int start_slots) { return tiles > 0 ? tiles + start_slots : 0; }

// How many blocks get a share of W tiles: every group cut at the same keys.
// Where every unit with tiles has the same tiles (`filled` units of
// `tiles_each`; filled is 0 where they differ) and a share is short, a block
// that straddles two units pays a second unit's start (its Q, its output) on
// the call's critical path; a count of blocks that is a multiple of the units
// cuts each unit into the same number of whole pieces, so no share straddles,
// and it is taken if it keeps at least 7/8 of the blocks.  The pieces are then
// as few as keep the longest share as it is: each piece is a unit's start and
// a partial written and merged, and in a short call those cost as much as a
// tile or two (on the H200, 8 streams of 1024 keys at 8 heads: 9 pieces a unit
// in place of 16, the same 2 tiles a block at most, 28.2 -> 26.7 us).  Units
// without tiles do not count: a batch padded to a captured bucket ends with
// streams of length 0, and they must change neither the cut nor any answer.
constexpr int kAlignedShareTiles = 8;  // "short": at most this many tiles per block on average
__device__ __forceinline__ int blocks_with_share(const MlaParams& p, const Shape& sh, int W, int filled,
                                                 int tiles_each) {
  const int most = W == 0 ? 0 : min(p.num_splits, (W + kMinTilesPerBlock - 1) / kMinTilesPerBlock);
  if (filled > 0 && filled <= most && W <= kAlignedShareTiles * most) {
    const int aligned = most - most % filled;
    if (8 * aligned >= 7 * most) {
      const int pieces = aligned / filled;
      const int longest = (tiles_each + pieces - 1) / pieces;
      return filled * ((tiles_each + longest - 1) / longest);
    }
  }
  // A multiple of the groups, unless that leaves more than a sixteenth of the
  // blocks idle (15 groups, 128 heads of a 9-row draft: 120 of 132): then
  // every block, and the groups' blocks read a tile at different times.  (On
  // the H200 the multiple was faster where it idled 2 to 6 of 132 blocks, and
  // slower by 3 to 8% where it idled 12.)
  const int multiple = most - most % sh.groups;
  return most >= sh.groups && 16 * multiple >= 15 * most ? multiple : most;
}

// An exclusive prefix sum of one int per thread over the block of kBlockThreads
// (shuffles within each warp, then the warps' totals); `total` receives the sum of all.
template <int kBlockThreads = kThreads>
__device__ __forceinline__ int block_exclusive_sum(int v, int* warp_totals, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_totals[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kBlockThreads / 32; ++w) {
    const int t = warp_totals[w];
    before += w < warp ? t : 0;
    all += t;
  }
  __syncthreads();  // warp_totals is free again
  total = all;
  return before + x - v;
}

// Where a block's share is, one (unit, tile range) piece at a time.  The
// slots of all units are numbered in order (unit-major): a unit's start
// slots, then its tiles.  The cursor knows the unit of its next slot and
// that unit's first slot, and finds the units after it from kv_lens as it
// goes; a share that ends in a unit's start slots leaves that unit to the
// next.  A whole warp calls next() at once; the counts
// it reads from memory pass through a shuffle from lane 0, so the compiler
// knows they are the same in every lane: the loops over a piece's tiles are
// then not divergent, and their wgmmas are not serialised.
struct Cursor {
  int x, end;       // next slot, end of the share (in the order of all slots)
  int unit;         // unit of slot x
  int start;        // its first slot
  int start_slots;  // a unit's start slots (unit_start_slots)
  int tiles;        // after next(): all the tiles of the unit it returned
  int share;        // the block's share: which of the C it takes (its partial results' slots)
  __device__ bool next(const MlaParams& p, int& u, int& t0, int& t1) {
    if (x >= end) return false;
    int n = __shfl_sync(0xffffffffu, unit_tiles(p, unit), 0);
    while (start + slots_of(n, start_slots) <= x) {
      start += slots_of(n, start_slots);
      n = __shfl_sync(0xffffffffu, unit_tiles(p, ++unit), 0);
    }
    const int first_tile = start + start_slots;  // the slot of the unit's tile 0
    u = unit;
    tiles = n;
    t0 = max(x, first_tile) - first_tile;
    t1 = min(end, first_tile + n) - first_tile;
    if (t1 <= t0) {  // the share ends in this unit's start slots
      x = end;
      return false;
    }
    x = first_tile + t1;
    return true;
  }
};

// Every thread of the block takes a run of consecutive units and counts
// their tiles; one block-wide sum places the runs, and the thread whose run
// holds the block's first tile finds its unit.  Every block does the same
// sums over the same kv_lens, so they agree on the cut without talking.
// (Its first version, one thread walking all units, took 20 us at 64 units:
// a 64-bit division per unit and border, one after another.)
// (kBlockThreads: the block's threads, 384 in the op's kernels, 256 in the
// seesaw's; kStartSlots: whether a unit's start takes slots, only in the
// seesaw's, so that the other kernels' cursors know theirs are 0 and keep no
// register for them; kSameKeysAdjacent: share_of_block's order, the seesaw's.)
template <int kBlockThreads = kThreads, bool kStartSlots = false, bool kSameKeysAdjacent = false>
__device__ void plan_share(const MlaParams& p, const Shape& sh, int* words, Cursor& cur, int& C) {
  const int tid = threadIdx.x, cta = blockIdx.x;
  const int per_thread = (sh.units + kBlockThreads - 1) / kBlockThreads;
  const int u0 = min(sh.units, tid * per_thread), u1 = min(sh.units, u0 + per_thread);
  // The units of one stream (its pair groups) have the same tiles; of several, only if the streams do.
  const bool one_stream = p.batch == 1;
  const int S = kStartSlots ? unit_start_slots(p, sh) : 0;
  const int tiles0 = unit_tiles(p, 0), slots0 = slots_of(tiles0, S);
  int mine = 0;      // my run's slots
  bool same = true;  // every unit of my run has no tiles or as many as unit 0
  for (int u = u0; u < u1; ++u) {
    const int n = unit_tiles(p, u);
    mine += slots_of(n, S);
    same = same && (n == 0 || n == tiles0);
  }
  const bool same_tiles = one_stream || __syncthreads_and(same) != 0;  // (one_stream is the same in every thread)
  // One stream: its units all have its tiles, so the sum needs no trip across the block.
  int W = one_stream ? sh.units * slots0 : 0;
  const int first = one_stream ? u0 * slots0 : block_exclusive_sum<kBlockThreads>(mine, words, W);  // my run's first slot
  // The units with tiles, where they all have unit 0's (so unit 0 has some).
  const int filled = !same_tiles || tiles0 == 0 ? 0 : one_stream ? sh.units : W / slots0;
  C = blocks_with_share(p, sh, W, filled, slots0);
  cur.share = kSameKeysAdjacent ? share_of_block(cta, C, sh.groups) : cta;
  cur.x = share_start(cur.share, W, C);
  cur.end = share_start(cur.share + 1, W, C);
  cur.start_slots = S;
  if (cta < C && first <= cur.x && cur.x < first + mine) {  // my run holds the share's first slot
    int u = u0, a = first;
    for (int n = slots_of(unit_tiles(p, u), S); a + n <= cur.x; n = slots_of(unit_tiles(p, ++u), S)) a += n;
    words[kBlockThreads / 32] = u;
    words[kBlockThreads / 32 + 1] = a;
  }

  // One block writes the whole cut down for the combine: each unit's first
  // tile and the units cut between blocks.  It takes that block over a
  // microsecond (on the H200, block 0's global timer: 1.3 us of a 3 us cut), so
  // it falls to the first block without a share where there is one (a short
  // call: the blocks with work start their tiles that much sooner), else to
  // block 0, whose share is never longer than another's.  (The condition is
  // the same in every thread of the block, so its barriers are safe.)
  if (cta == (C < (int)gridDim.x ? C : 0)) {
    int* off = p.plan + kPlanHeader;
    int* cut = off + sh.units + 1;
    // A unit is cut when its first and last tiles lie in different shares
    // (its tiles: slots a + S .. a + S + n - 1, after its start slots).
    auto is_cut = [&](int a, int n) {
      return n > 0 && block_of_tile(a + S, W, C) != block_of_tile(a + S + n - 1, W, C);
    };
    int n_mine = 0;
    for (int u = u0, a = first; u < u1; ++u) {
      const int n = unit_tiles(p, u);
      off[u] = a;
      n_mine += is_cut(a, n);
      a += slots_of(n, S);
    }
    int n_cut;
    int k = block_exclusive_sum<kBlockThreads>(n_mine, words, n_cut);  // my run's first entry in the list of cut units
    for (int u = u0, a = first; u < u1; ++u) {
      const int n = unit_tiles(p, u);
      if (is_cut(a, n)) {
        cut[3 * k] = u;
        cut[3 * k + 1] = block_of_tile(a + S, W, C);
        cut[3 * k + 2] = block_of_tile(a + S + n - 1, W, C);
        ++k;
      }
      a += slots_of(n, S);
    }
    if (tid == 0) {
      off[sh.units] = W;
      p.plan[0] = W;
      p.plan[1] = C;
      p.plan[2] = n_cut;
    }
  }

  // A stream that cannot be computed gets NaN here, from one block: no block is given its tiles.
  const int lane = tid % 32;
  for (int b = cta; b < p.batch; b += gridDim.x) {
    if (stream_ok(p, p.kv_lens[b])) continue;
    for (int i = tid / 32; i < p.q_len * p.num_heads; i += kBlockThreads / 32) {
      const int t = i / p.num_heads, h = i % p.num_heads;
      for (int d = lane; d < kDimV; d += 32) out_head(p, b, t, h)[d] = __float2bfloat16(CUDART_NAN_F);
      if (lane == 0) *lse_at(p, b, t, h) = CUDART_NAN_F;
    }
  }
  __syncthreads();  // the share's first unit in words[]
  cur.unit = __shfl_sync(0xffffffffu, words[kBlockThreads / 32], 0);
  cur.start = __shfl_sync(0xffffffffu, words[kBlockThreads / 32 + 1], 0);
  cur.x = __shfl_sync(0xffffffffu, cur.x, 0);
  cur.end = __shfl_sync(0xffffffffu, cur.end, 0);
  cur.share = __shfl_sync(0xffffffffu, cur.share, 0);
  C = __shfl_sync(0xffffffffu, C, 0);
}

// ---- the main kernel -------------------------------------------------------------

#if MLA_SM90A
// Warpgroup 0: gather the key tiles of the share, chunk by chunk, into the ring.
// A loader thread never waits for its own copies: cp.async arrives on the
// chunk's full barrier by itself once they land, so the loads in flight are
// bounded only by the ring's free slots.  The block table entry of the next
// tile is loaded a tile ahead, so its round trip is hidden too.
template <int kSlots>
__device__ void load_keys(const MlaParams& p, Cursor cur, unsigned char* smem,
                          uint64_t* full, uint64_t* empty) {
  const int tid = threadIdx.x;          // 0..127
  const int my_key = tid / 2;           // two threads per key, 16 bytes each, side by side
  const int half = tid & 1;
  const uint32_t ring = smem_addr(smem + kOffRing);
  int seq = 0;  // chunks issued so far
  int u, t0, t1;
  if (!kCopyKeys) {  // the ablation without key copies: the same slots and barriers, no reads
    for (int i = tid; i < kSlots * kChunkBytes / 16; i += 128) st_shared_u128(ring + 16 * i, 0, 0, 0, 0);
    fence_proxy_async();
    while (cur.next(p, u, t0, t1))
      for (int n = (t1 - t0) * kChunks; n > 0; --n, ++seq) {
        if (seq >= kSlots) mbar_wait(&empty[seq % kSlots], ((seq / kSlots) - 1) & 1);
        mbar_arrive(&full[seq % kSlots]);
      }
    return;
  }
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    auto page_of = [&](int tile) {  // the page holding this thread's key of the tile (-1 past the stream)
      const int key = tile * kKeysPerTile + my_key;
      return key < kv_len ? table[key / p.page_size] : -1;
    };
    int next_page = page_of(t0);
    BLOCK0_STAMP(tid == 0 && seq == 0 && next_page != INT_MIN, 2);  // (the compare waits for the page id)
    for (int tile = t0; tile < t1; ++tile) {
      const int key = tile * kKeysPerTile + my_key;
      const int page = next_page;
      if (tile + 1 < t1) next_page = page_of(tile + 1);  // used a tile from now
      // Keys past the stream are zeros (P is 0 there; 0 * NaN would not be);
      // a key whose page is outside the pool is NaN, so its stream shows it.
      const bool zero = key >= kv_len, poisoned = !zero && (page < 0 || page >= p.num_pages);
      const bf16* row = zero || poisoned ? p.kv
                                         : p.kv + (int64_t)page * p.kv_stride_page +
                                               (int64_t)(key - (key / p.page_size) * p.page_size) * p.kv_stride_slot;
      for (int j = 0; j < kChunks; ++j) {
        const int slot = seq % kSlots;
        if (seq >= kSlots) mbar_wait(&empty[slot], ((seq / kSlots) - 1) & 1);
        const uint32_t base = ring + slot * kChunkBytes + my_key * 128;
        // The two threads of a key copy one 32-byte sector per step; which of
        // the row's four sectors each key takes in step i is turned by the
        // key, so that the 8 lanes of a quarter warp (4 keys) write 8
        // different 16-byte columns of the swizzled rows: no bank conflict.
        // (All keys on sector i at once wrote each column twice.)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c16 = 2 * (i ^ (my_key & 3)) + half;  // 16-byte column of the 128-byte row
          const uint32_t dst = base + ((c16 ^ (my_key & 7)) << 4);
          if (poisoned)
            st_shared_u128(dst, kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
          else
            cp_async16_l2_256(dst, zero ? (const void*)row : (const void*)(row + dims_of(j) * kChunkDims + c16 * 8),
                              zero ? 0 : 16);
        }
        if (poisoned) {  // plain stores: make them visible to the tensor cores, then arrive
          fence_proxy_async();
          mbar_arrive(&full[slot]);
        } else {
          cp_async_arrive(&full[slot]);
        }
        ++seq;
      }
    }
  }
  cp_async_wait<0>();  // leave no copy in flight behind an exiting thread
}

// The loader when the cache is read by TMA (only in the "tma" build).  Lane 0
// of warp 0 asks for every whole tile: 9 chunks of 1, 2 or 4 boxes, each
// chunk's full barrier expecting its 8 KB and completing when they have
// landed, with no thread waiting for them.  A stream's last tile (keys past
// its end must read as zeros) and a tile with a page outside the pool are
// gathered with cp.async by warps 1 and 2, a thread per key; warp 3 has no
// work.  Both walk the same tiles.
//
// The issuing thread works out a tile's box coordinates once and then only
// issues.  (Its first version worked them out per chunk and per box, a page
// read and a division each time, and filled shared memory at about half the
// rate of the same copies issued with the coordinates known; chapter 10's
// loaders-alone section tells how that was found.)
template <int kSlots>
__device__ void load_keys_tma(const MlaParams& p, Cursor cur, unsigned char* smem, uint64_t* full, uint64_t* empty,
                              const KvTensor& kv, const int* progress) {
  const int tid = threadIdx.x, lane = tid % 32, key_in_tile = tid - 32;  // key_in_tile: a gatherer's key
  const bool issuer = tid < 32;
  const uint32_t ring = smem_addr(smem + kOffRing);
  // Tiles of the share the issuing warp has passed, and tiles the gatherers have claimed (zero at the start).
  const uint32_t issued = smem_addr(progress), gathered = issued + 4;
  const int box_keys = kv.box_keys, boxes = kKeysPerTile / box_keys;
  int seq = 0;  // the tile's first chunk, in the order of all chunks of the share
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    for (int tile = t0; tile < t1; ++tile, seq += kChunks) {
      const int key0 = tile * kKeysPerTile;
      const int k = seq / kChunks;  // the tile's place in the share
      if (issuer) {
        // Lane i < boxes holds the page of box i; lane 0 gets all of them (a box past 1 only with pages < 64 keys).
        const int box_key = key0 + lane * box_keys;
        const int page = lane < boxes && box_key < kv_len ? table[box_key / p.page_size] : -1;
        const bool whole = key0 + kKeysPerTile <= kv_len &&
                           __all_sync(0xffffffffu, lane >= boxes || (page >= 0 && page < p.num_pages));
        const int page1 = __shfl_sync(0xffffffffu, page, 1), page2 = __shfl_sync(0xffffffffu, page, 2),
                  page3 = __shfl_sync(0xffffffffu, page, 3);
        if (!whole && lane == 0) wait_until_at_least(gathered, k + 1);  // the gatherers fill it (see below)
        if (whole && lane == 0) {
          const int in_page = key0 % p.page_size;  // 0 where a page holds fewer keys than a tile
          for (int j = 0; j < kChunks; ++j) {
            const int slot = (seq + j) % kSlots;
            if (seq + j >= kSlots) mbar_wait(&empty[slot], (((seq + j) / kSlots) - 1) & 1);
            mbar_arrive_expect_tx(&full[slot], kChunkBytes);
            const uint32_t dst = ring + slot * kChunkBytes;
            const int dim0 = dims_of(j) * kChunkDims;
            tma_load_3d(dst, &kv.map, dim0, in_page, page, &full[slot]);
            if (boxes > 1) tma_load_3d(dst + box_keys * 128, &kv.map, dim0, 0, page1, &full[slot]);
            if (boxes > 2) {
              tma_load_3d(dst + 2 * box_keys * 128, &kv.map, dim0, 0, page2, &full[slot]);
              tma_load_3d(dst + 3 * box_keys * 128, &kv.map, dim0, 0, page3, &full[slot]);
            }
          }
        }
        if (lane == 0) st_release_shared(issued, k + 1);
        __syncwarp();
        continue;
      }
      // A gatherer: its key's page, and whether any key of the tile is outside the pool.
      const int key = key0 + key_in_tile;
      const int pg = key < kv_len ? table[key / p.page_size] : -1;
      const bool poisoned = key < kv_len && (pg < 0 || pg >= p.num_pages);
      const bool bad_tile = named_barrier_or(kBarGather, 64, poisoned);
      if (key0 + kKeysPerTile <= kv_len && !bad_tile) continue;  // warp 0 asks for this one
      // Each kind of loader warp skips the tiles the other fills, and a parity wait
      // on a slot's empty barrier is right only within one phase of the barrier:
      // two phases behind it passes at once (a slot in use overwritten), two ahead
      // it waits for a phase that may never come (a hang).  So neither kind runs
      // past a tile the other fills until the other has claimed that tile's slots:
      // the gatherers wait here until warp 0 has passed every tile before this one,
      // and warp 0 waits at this tile until the gatherers have claimed it.  Every
      // slot wait below is then within one phase (models.tma_gather_schedule).
      if (key_in_tile == 0) wait_until_at_least(issued, k);
      named_barrier(kBarGather, 64);  // the other 63 wait here
      const bf16* row = pg < 0 || poisoned ? p.kv
                                           : p.kv + (int64_t)pg * p.kv_stride_page + (int64_t)(key % p.page_size) * p.kv_stride_slot;
      // Every chunk's copies first (the ring holds a whole tile and more: no slot
      // waits on an arrival below), then the gatherers wait for their own copies,
      // fence them for wgmma, and one thread arrives on the 9 barriers.  A
      // gatherer does not leave its copies to the barrier (an arrival that counts
      // only once they land): compute-sanitizer's synccheck reports that form as
      // a missing wait.  It costs one wait per stream's last tile.  (Loops kept
      // rolled: unrolled, they spill the loader's 40 registers.)
#pragma unroll 1
      for (int j = 0; j < kChunks; ++j) {
        const int slot = (seq + j) % kSlots;
        if (seq + j >= kSlots) mbar_wait(&empty[slot], (((seq + j) / kSlots) - 1) & 1);
        const uint32_t base = ring + slot * kChunkBytes + key_in_tile * 128;
#pragma unroll 1
        for (int c16 = 0; c16 < 8; ++c16) {
          const uint32_t dst = base + ((c16 ^ (key_in_tile & 7)) << 4);
          if (poisoned)
            st_shared_u128(dst, kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
          else  // a key past the stream reads as zeros (a 0-byte copy fills the 16)
            cp_async16(dst, pg < 0 ? (const void*)row : (const void*)(row + dims_of(j) * kChunkDims + c16 * 8), pg < 0 ? 0 : 16);
        }
      }
      named_barrier(kBarGather, 64);
      // After all 64 passed their slot waits, warp 0 may go on (not after the
      // copies have landed: it would wait for them with nothing in flight).
      if (key_in_tile == 0) st_release_shared(gathered, k + 1);
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async();  // the copies and stores, visible to the tensor cores' reads
      named_barrier(kBarGather, 64);  // all 64 keys written before the arrivals
      if (key_in_tile == 0)
#pragma unroll 1
        for (int j = 0; j < kChunks; ++j) mbar_arrive(&full[(seq + j) % kSlots]);
    }
  }
}

// The TMA loader as first written (only in the "tma_first" build, kept for
// chapter 10, which times it against the one above): one warp, and one thread
// of it issues every copy, working out each box's coordinates per chunk and
// per box.  A whole tile is 9 chunks of 1, 2 or 4 boxes; each chunk's full
// barrier expects its 8 KB and completes when they have landed, with no
// thread waiting for them.  A stream's last tile (keys past its end must read
// as zeros) and a tile with a page outside the pool are gathered by the same
// warp with cp.async.  Gathering every tile with
// cp.async reached about 60% of HBM bandwidth: 4608 16-byte copies per tile,
// each an instruction with its own address.
template <int kSlots>
__device__ void load_keys_tma_first(const MlaParams& p, Cursor cur, unsigned char* smem, uint64_t* full, uint64_t* empty,
                                    const KvTensor& kv) {
  const int lane = threadIdx.x % 32;
  const uint32_t ring = smem_addr(smem + kOffRing);
  const int box_keys = kv.box_keys, boxes = kKeysPerTile / box_keys;
  int seq = 0;
  auto claim_slot = [&]() {
    const int slot = seq % kSlots;
    if (seq >= kSlots) mbar_wait(&empty[slot], ((seq / kSlots) - 1) & 1);
    return slot;
  };
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    for (int tile = t0; tile < t1; ++tile) {
      const int key0 = tile * kKeysPerTile;
      // Lane i < boxes holds the page of box i.
      const int box_key = key0 + lane * box_keys;
      const int page = lane < boxes && box_key < kv_len ? table[box_key / p.page_size] : 0;
      const bool whole = key0 + kKeysPerTile <= kv_len &&
                         __all_sync(0xffffffffu, lane >= boxes || (page >= 0 && page < p.num_pages));
      if (whole) {
        for (int j = 0; j < kChunks; ++j, ++seq) {
          const int slot = claim_slot();
          if (lane == 0) {
            mbar_arrive_expect_tx(&full[slot], kChunkBytes);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              if (i < boxes)  // box i's page: lane 0 holds box 0's (short of registers: the others are read again)
                tma_load_3d(ring + slot * kChunkBytes + i * box_keys * 128, &kv.map, dims_of(j) * kChunkDims,
                            (key0 + i * box_keys) % p.page_size,
                            i == 0 ? page : table[(key0 + i * box_keys) / p.page_size], &full[slot]);
          }
          __syncwarp();
        }
        continue;
      }
      // Gathered: lane l copies keys l and l + 32, all 128 bytes of each chunk.
      // (Rare, and short of registers here: each key's row is found again per chunk,
      // and its 8 copies are a loop; unrolled, ptxas spilled the share's start.)
      for (int j = 0; j < kChunks; ++j, ++seq) {
        const int slot = claim_slot();
#pragma unroll 1
        for (int k = lane; k < kKeysPerTile; k += 32) {
          const int key = key0 + k;
          const bool zero = key >= kv_len;
          const int pg = zero ? -1 : table[key / p.page_size];
          const bool poisoned = !zero && (pg < 0 || pg >= p.num_pages);
          const bf16* row = zero || poisoned ? p.kv
                                             : p.kv + (int64_t)pg * p.kv_stride_page +
                                                   (int64_t)(key % p.page_size) * p.kv_stride_slot + dims_of(j) * kChunkDims;
          const uint32_t base = ring + slot * kChunkBytes + k * 128;
#pragma unroll 1
          for (int c16 = 0; c16 < 8; ++c16) {
            const uint32_t dst = base + ((c16 ^ (k & 7)) << 4);
            if (poisoned)
              st_shared_u128(dst, kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
            else
              cp_async16(dst, zero ? (const void*)row : (const void*)(row + c16 * 8), zero ? 0 : 16);
          }
        }
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();  // the copies and stores, visible to the tensor cores
        __syncwarp();
        if (lane == 0) mbar_arrive(&full[slot]);
      }
    }
  }
}

// A compute warpgroup with no pairs still has to hand every chunk back.
__device__ void pass_chunks(const MlaParams& p, Cursor cur, uint64_t* empty, uint64_t* full) {
  int seq = 0, u, t0, t1;
  while (cur.next(p, u, t0, t1))
    for (int n = (t1 - t0) * kChunks; n > 0; --n, ++seq) {
      mbar_wait(&full[seq % kRing], (seq / kRing) & 1);
      if (threadIdx.x % 32 == 0) mbar_arrive(&empty[seq % kRing]);
    }
}

// Wait until at most kPending wgmma groups are in flight, then (one lane per
// warp) give the ring slot whose products just finished back to the loader.
template <int kPending>
__device__ __forceinline__ void release_after(uint64_t* empty, int slot, int lane) {
  wgmma_wait<kPending>();
  __syncwarp();
  if (lane == 0) mbar_arrive(&empty[slot % kRing]);
}

// Only in the "early_scores" build: S^T of the next tile (its chunks from
// sequence number next_seq), issued while this tile's products (eight commit
// groups, one per V chunk, the V chunk j in slot slot0 + 1 + j) are in flight.
// Chunk j of the next tile is issued once V chunk j of this tile has been
// handed back; with one commit group per chunk of scores, that V chunk's
// group is then always the eighth newest, so each hand-back waits with 7.
__device__ __forceinline__ void issue_next_scores(float (&s)[20], uint64_t ring_desc, uint64_t q_desc, uint64_t* full,
                                                  uint64_t* empty, int next_seq, int slot0, int lane) {
  const int nslot0 = next_seq % kRing, nphase0 = (next_seq / kRing) & 1;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (j < kVChunks) release_after<7>(empty, slot0 + 1 + j, lane);
    const int wrap = nslot0 + j >= kRing, slot = nslot0 + j - (wrap ? kRing : 0);
    mbar_wait(&full[slot], nphase0 ^ wrap);
    fence_proxy_async();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n40k16<0>(s, ring_desc + ((slot * kChunkBytes + 32 * ks) >> 4),
                         q_desc + ((dims_of(j) * kPairsPerGroup * 128 + 32 * ks) >> 4), j | ks);
    wgmma_commit();
  }
}

// A unit's start: for each of its `rows` pairs (pair0 + n, head fastest), its
// row in q and how many keys it may see (draft row t sees the cache and the
// draft up to itself), then Q itself into 9 swizzled 64-dim chunks of `rows`
// rows of 128 bytes, by the `threads` threads that meet at barrier `bar` (t is
// this thread's index among them).  Each pair's row is found once, by one
// thread, not once per 16-byte copy: the copy loop is then a few instructions
// per copy, which at a unit's start is time no tile hides.  The copies are
// committed, not waited for.  With kResetM, m_s gets each pair's softmax
// reference reset to -inf.
template <bool kResetM>
__device__ __forceinline__ void load_unit_q(const MlaParams& p, int b, int kv_len, int pair0, int n_pairs, int rows,
                                            uint32_t q_s, int64_t* q_row_s, int* vis_s, float* m_s, int t, int threads,
                                            int bar) {
  named_barrier(bar, threads);  // nobody still reads the previous unit's Q, rows or lengths
  if (t < rows) {
    const int pr = pair0 + t, row = pr / p.num_heads, h = pr - row * p.num_heads;
    const bool real = t < n_pairs;
    vis_s[t] = real ? kv_len - p.q_len + row + 1 : 0;
    q_row_s[t] = real ? (int64_t)b * p.q_stride_b + (int64_t)row * p.q_stride_t + (int64_t)h * p.q_stride_h : -1;
    if (kResetM) m_s[t] = -CUDART_INF_F;
  }
  named_barrier(bar, threads);
#pragma unroll 1  // unrolled, its addresses would take registers the accumulators need (and spill)
  for (int i = t; i < (kCallPart == 4 ? 0 : rows * (kDimQK / 8)); i += threads) {
    const int n = i / (kDimQK / 8), c16 = i % (kDimQK / 8), j = c16 / 8, col = c16 % 8;
    const uint32_t dst = q_s + j * (rows * 128) + n * 128 + ((col ^ (n & 7)) << 4);
    const int64_t row = q_row_s[n];
    cp_async16(dst, row >= 0 ? (const void*)(p.q + row + 8 * c16) : (const void*)p.q, row >= 0 ? 16 : 0);
  }
  cp_async_commit();
}

// Warpgroups 1 and 2: scores, online softmax and output for up to 40 pairs each.
// kFewerFences: fence no chunk when the TMA loader filled them (tma_chunks),
// since its gatherers fence the chunks cp.async wrote.
template <bool kFewerFences>
__device__ void compute(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem,
                        uint64_t* full, uint64_t* empty, int group, int cta, bool tma_chunks) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = 2 * (lane % 4);  // fragment row (+8) and column (+1) of this lane
  const int bar_id = 1 + group;
  const uint32_t ring = smem_addr(smem + kOffRing);
  const uint32_t q_s = smem_addr(smem + kOffQ + group * kQBytes);
  const uint32_t p_s = smem_addr(smem + kOffP + group * kPBytes);
  // Descriptors of the three operand regions; a chunk or k-step is an offset
  // (in 16-byte units) added to the start-address field.
  const uint64_t ring_desc = sw128_desc(ring, 1024), q_desc = sw128_desc(q_s, 1024), p_desc = sw128_desc(p_s, 1024);
  float* col_max = reinterpret_cast<float*>(smem + kOffMax) + group * 4 * kPairsPerGroup;
  int* vis_s = reinterpret_cast<int*>(smem + kOffVis) + group * kPairsPerGroup;
  // A column's softmax reference is the same in every thread that holds the
  // column: it lives in shared memory (registers are short), read where it is
  // used, and when it moves the new values go to the other copy, which then
  // becomes current.  The column sums of the four warps meet here once, at the end of a unit.
  float* m_s = reinterpret_cast<float*>(smem + kOffM) + group * 2 * kPairsPerGroup;
  int64_t* q_row_s = reinterpret_cast<int64_t*>(smem + kOffQRow) + group * kPairsPerGroup;
  float* l_s = reinterpret_cast<float*>(smem + kOffL) + group * 4 * kPairsPerGroup + warp * kPairsPerGroup;
  const float scale_log2 = p.scale * kLog2e;
  const int first_share_unit = cur.unit;

  // The turns (kPingPong): warpgroup 0 goes first, so warpgroup 1 gives it the
  // first turn here, and warpgroup 0 takes the last one back after the loop:
  // every arrival at a turn's barrier is then matched by a wait.
  const bool pingpong = kPingPong && sh.per_group > kPairsPerGroup;  // else warpgroup 1 only passes chunks
  auto take_turn = [&]() {
    if (pingpong) named_barrier(kBarTurn + group, 256);
  };
  auto pass_turn = [&]() {
    if (pingpong) named_barrier_arrive(kBarTurn + 1 - group, 256);
  };
  if (group == 1) pass_turn();

  int seq = 0;
#if MLA_HOPPER_TIMELINE
  const long long stamp_start = clock64();
  int stamp_tile = 0;
#endif
#ifdef MLA_HOPPER_DEBUG
  bool debug_first = true;
#endif
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch, grp = u / p.batch;
    const int kv_len = p.kv_lens[b];
    const int pair0 = grp * sh.per_group + group * kPairsPerGroup;
    const int n_pairs = max(0, min(kPairsPerGroup, min(sh.per_group - group * kPairsPerGroup,
                                                       sh.pairs - pair0)));

    // Q^T of this warpgroup's pairs: row n = pair pair0 + n, in 9 swizzled 64-dim chunks.
    load_unit_q<true>(p, b, kv_len, pair0, n_pairs, kPairsPerGroup, q_s, q_row_s, vis_s, m_s, tid, 128, bar_id);
    const float* m_cur = m_s;  // the current copy, the same in every thread
    cp_async_wait<0>();
    fence_proxy_async();
    named_barrier(bar_id, 128);
    BLOCK0_STAMP(tid == 0 && group == 0 && seq == 0, 3);

    float o[kVChunks][20];  // O^T: 8 dim tiles of 64 x 40
#pragma unroll
    for (int j = 0; j < kVChunks; ++j)
#pragma unroll
      for (int r = 0; r < 20; ++r) o[j][r] = 0.f;
    // This thread's columns are k = 2i + e, pair 8i + c + e; its part of
    // their sums stays in registers for the whole unit.
    float l_part[10];
#pragma unroll
    for (int k = 0; k < 10; ++k) l_part[k] = 0.f;
    // Only the last tiles of a stream hide keys from some pairs (the causal draft).
    const int first_hidden = kv_len - p.q_len + 1;

    float s[20];  // S^T of a tile: its first wgmma overwrites it (scale-d 0)
    for (int tile = t0; tile < t1; ++tile, seq += kChunks) {
      if (!kDoMath) {  // the ablation without math: wait for the tile's chunks, hand them back
        for (int j = 0; j < kChunks; ++j) mbar_wait(&full[(seq + j) % kRing], ((seq + j) / kRing) & 1);
        __syncwarp();
        if (lane == 0)
          for (int j = 0; j < kChunks; ++j) mbar_arrive(&empty[(seq + j) % kRing]);
        continue;
      }
      // 1. S^T[64 keys, 40 pairs] = K Q^T over the 9 chunks, 4 k-steps each.
      // Each chunk's four k-steps start as soon as that chunk has landed.  The
      // slot and phase of chunk seq + j follow from those of chunk seq.
      const int slot0 = seq % kRing, phase0 = (seq / kRing) & 1;
      // Only chunks that cp.async wrote need the fence, and the TMA loader's gatherers fence theirs (see
      // kFenceGatheredOnly).
      const bool fence_chunks = !kFewerFences || !tma_chunks;
      MLA_STAMP(0);
      if (!kEarlyScores || tile == t0) {  // (early_scores: a later tile's were issued behind the last products)
        take_turn();
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const int wrap = slot0 + j >= kRing, slot = slot0 + j - (wrap ? kRing : 0);
          mbar_wait(&full[slot], phase0 ^ wrap);
          BLOCK0_STAMP(tid == 0 && group == 0 && seq == 0 && (j == 0 || j == kChunks - 1), j == 0 ? 4 : 5);
          // wgmma reads through the async proxy: a chunk that cp.async wrote (the generic proxy) is fenced first.
          if (fence_chunks) fence_proxy_async();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wgmma_m64n40k16<0>(s, ring_desc + ((slot * kChunkBytes + 32 * ks) >> 4),
                               q_desc + ((dims_of(j) * kPairsPerGroup * 128 + 32 * ks) >> 4), j | ks);
        }
        wgmma_commit();
        pass_turn();
      }
      wgmma_wait<0>();
      fence_accumulators(s);
      if (kEarlyScores)  // the last tile's products were in flight until the wait: O^T is final only now
#pragma unroll
        for (int j = 0; j < kVChunks; ++j) fence_accumulators(o[j]);
      MLA_DEBUG_DUMP(0, p.debug[row * kPairsPerGroup + col] = s[r];)
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot0]);  // the RoPE chunk (position 0) is done
      BLOCK0_STAMP(tid == 0 && group == 0 && seq == 0, 6);
      MLA_STAMP(1);

      // 2. Online softmax down each column (a pair), over this tile's 64 keys.
      //    The reference m of a column moves only when a score passes it by
      //    more than kRescaleLog2 (a factor 256), so P = exp2(s - m) stays
      //    below 256.  Whether any score of the warpgroup does is one barrier
      //    that ORs a flag; after the first tile it almost never does, and the
      //    exchange of column maxima through shared memory, and the rescale of
      //    O^T and the sums, are skipped.
      const int key_lo = tile * kKeysPerTile + 16 * warp + g;
      const bool edge = (tile + 1) * kKeysPerTile > first_hidden;
      bool need = false;
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        const float2 m2 = *reinterpret_cast<const float2*>(m_cur + 8 * i + c);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float lo = s[4 * i + e] * scale_log2, hi = s[4 * i + 2 + e] * scale_log2;
          if (edge) {
            const int vis = vis_s[8 * i + c + e];
            lo = key_lo < vis ? lo : -CUDART_INF_F;
            hi = key_lo + 8 < vis ? hi : -CUDART_INF_F;
          }
          s[4 * i + e] = lo;
          s[4 * i + 2 + e] = hi;
          need |= fmaxf(lo, hi) > (e ? m2.y : m2.x) + kRescaleLog2;  // -inf + 8 is -inf: a first key always moves it
        }
      }
      if (named_barrier_or(bar_id, 128, need)) {
        float* m_next = m_s + (m_cur == m_s ? kPairsPerGroup : 0);
        // The column maxima of the 64 keys: of this warp's 16 by shuffles, of
        // all four warps through shared memory.
#pragma unroll
        for (int i = 0; i < 5; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float mx = fmaxf(s[4 * i + e], s[4 * i + 2 + e]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            if (g == 0) col_max[warp * kPairsPerGroup + 8 * i + c + e] = mx;
          }
        named_barrier(bar_id, 128);
        auto column = [&](int col, float& m_old, float& alpha) {  // a column's new reference
          const float t = fmaxf(fmaxf(col_max[col], col_max[kPairsPerGroup + col]),
                                fmaxf(col_max[2 * kPairsPerGroup + col], col_max[3 * kPairsPerGroup + col]));
          m_old = m_cur[col];
          const bool move = t > m_old + kRescaleLog2;  // false while no key is seen (t = -inf)
          alpha = move ? exp2f(m_old - t) : 1.f;
          return move ? t : m_old;
        };
        bool rescale = false;
#pragma unroll
        for (int i = 0; i < 5; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float m_old, alpha;
            const float m_new = column(8 * i + c + e, m_old, alpha);
            if (warp == 0 && g == 0) m_next[8 * i + c + e] = m_new;
            l_part[2 * i + e] *= alpha;
            rescale |= alpha != 1.f && m_old != -CUDART_INF_F;  // O^T is still 0 while no key was seen
          }
        // The 160 multiplies that rescale O^T, only where a column that had
        // seen keys moved: on a unit's first tile, where every column moves
        // from -inf, they are skipped.
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
          for (int i = 0; i < 5; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float m_old, alpha;
              column(8 * i + c + e, m_old, alpha);
#pragma unroll
              for (int j = 0; j < kVChunks; ++j) {
                o[j][4 * i + e] *= alpha;
                o[j][4 * i + 2 + e] *= alpha;
              }
            }
        }
        named_barrier(bar_id, 128);  // the new references written
        m_cur = m_next;
        // col_max and the old copy are next written after the next OR-barrier,
        // which every thread reaches only after these reads.
      }

      MLA_STAMP(2);
      // 3. P = exp2(s - m) (rounded to bf16 for the tensor cores), this
      //    thread's part of the sums, and P^T to shared memory: row n = pair
      //    n, its 64 keys in one swizzled 128-byte row, written by stmatrix
      //    straight from the fragments.
      {
        const int mat = (lane / 8) % 2, r = lane % 8;
#pragma unroll
        for (int i = 0; i < 5; ++i) {
          float pv[4];
          const float2 m2 = *reinterpret_cast<const float2*>(m_cur + 8 * i + c);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float m_ref = e ? m2.y : m2.x;
            const float m_use = m_ref == -CUDART_INF_F ? 0.f : m_ref;  // no key seen: keep exp2 finite
            pv[e] = exp2f(s[4 * i + e] - m_use);
            pv[2 + e] = exp2f(s[4 * i + 2 + e] - m_use);
            l_part[2 * i + e] += pv[e] + pv[2 + e];
          }
          const int n = 8 * i + r, chunk = 2 * warp + mat;
          stmatrix_x2_trans(p_s + n * 128 + ((chunk ^ (n & 7)) << 4), pack_bf16x2(pv[0], pv[1]),
                            pack_bf16x2(pv[2], pv[3]));
        }
      }
      fence_proxy_async();
      named_barrier(bar_id, 128);
#ifdef MLA_HOPPER_DEBUG
      if (p.debug && blockIdx.x == 0 && group == 0 && tile == t0 && debug_first)  // P^T as stored, unswizzled
        for (int i = tid; i < kPairsPerGroup * 64; i += 128) {
          const int n = i / 64, key = i % 64;
          const unsigned char* row = smem + kOffP + n * 128;
          const bf16 v = *reinterpret_cast<const bf16*>(row + ((((key / 8) ^ (n & 7)) << 4) | ((key % 8) * 2)));
          p.debug[64 * kPairsPerGroup + key * kPairsPerGroup + n] = __bfloat162float(v);
        }
#endif

      // 4. O^T[dims, pairs] += V^T P^T: dims 64j .. 64j+63 of V^T are the chunk at
      //    position j + 1, read MN-major.
      //    (The rescale above must be done before the wgmmas read O: pinning the
      //    accumulators here keeps the compiler from sinking it past the fence.)
      MLA_STAMP(3);
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) fence_accumulators(o[j]);
      take_turn();
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) {
        const int slot = (slot0 + 1 + j) % kRing;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_m64n40k16<1>(o[j], ring_desc + ((slot * kChunkBytes + 2048 * ks) >> 4), p_desc + ((32 * ks) >> 4), 1);
        wgmma_commit();  // one group per dim tile, so its chunk can go back first
      }
      pass_turn();
      MLA_STAMP(4);
      if (kEarlyScores && tile + 1 < t1) {
        issue_next_scores(s, ring_desc, q_desc, full, empty, seq + kChunks, slot0, lane);
        MLA_STAMP(5);
#if MLA_HOPPER_TIMELINE
        ++stamp_tile;
#endif
        continue;
      }
      // Hand each chunk back to the loader as soon as its products are done: the
      // next tile's last chunks wait for exactly these slots.
      release_after<7>(empty, slot0 + 1, lane);
      release_after<6>(empty, slot0 + 2, lane);
      release_after<5>(empty, slot0 + 3, lane);
      release_after<4>(empty, slot0 + 4, lane);
      release_after<3>(empty, slot0 + 5, lane);
      release_after<2>(empty, slot0 + 6, lane);
      release_after<1>(empty, slot0 + 7, lane);
      release_after<0>(empty, slot0 + 8, lane);
      MLA_STAMP(5);
#if MLA_HOPPER_TIMELINE
      ++stamp_tile;
#endif
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) fence_accumulators(o[j]);
      MLA_DEBUG_DUMP(0, for (int j = 0; j < kVChunks; ++j)
                            p.debug[2 * 64 * kPairsPerGroup + (64 * j + row) * kPairsPerGroup + col] = o[j][r];)
#ifdef MLA_HOPPER_DEBUG
      debug_first = false;
#endif
    }

    // 5. A column's sum: of this warp's lanes by shuffles, of the four warps through shared memory.
#pragma unroll
    for (int k = 0; k < 10; ++k) {
      float sum = l_part[k];
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      sum += __shfl_xor_sync(0xffffffffu, sum, 8);
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      if (g == 0) l_s[8 * (k / 2) + c + k % 2] = sum;
    }
    named_barrier(bar_id, 128);
    const float* l_all = l_s - warp * kPairsPerGroup;

    // 6. Write the unit: whole -> out (bf16) and lse; cut -> this block's partial slot (fp32).
    // Each pair's 1 / sum and lse come from one thread a pair, through shared
    // memory (col_max, free until the next unit's first softmax).  Written out in
    // each thread for each of its ten columns, they took 1.5 to 2.7 us of a call
    // of one tile on the H200, with L2 flushed or not; this takes a few tenths.
    // Code that runs once per unit runs far below the rate of a loop that repeats
    // (most likely its instructions are fetched as it goes): keep it short.
    const bool whole = t0 == 0 && t1 == cur.tiles;
    const int slot = u == first_share_unit ? 0 : 1;  // a share cuts at most its first and its last unit
    const int64_t part_row0 = ((int64_t)cta * 2 + slot) * kPairsPerBlock + group * kPairsPerGroup;
    float* inv_s = col_max;
    if (tid < n_pairs) {
      const int n = tid;
      const float l = (l_all[n] + l_all[kPairsPerGroup + n]) + (l_all[2 * kPairsPerGroup + n] + l_all[3 * kPairsPerGroup + n]);
      inv_s[n] = whole || l != 0.f ? 1.f / l : 0.f;  // 0: a piece no key is visible to (it writes zeros)
      const float lse_nat = (m_cur[n] + log2f(l)) * 0.6931471805599453f;
      const int pr = pair0 + n, t = pr / p.num_heads, h = pr % p.num_heads;
      if (whole)
        *lse_at(p, b, t, h) = lse_nat;
      else
        p.lse_partial[part_row0 + n] = l == 0.f ? -CUDART_INF_F : lse_nat;
    }
    named_barrier(bar_id, 128);
    float inv[10];  // of this thread's column k = 2i + e, pair 8i + c + e
#pragma unroll
    for (int k = 0; k < 10; ++k) inv[k] = inv_s[8 * (k / 2) + c + k % 2];
    if (whole && kDirectOut) {
#pragma unroll
      for (int k = 0; k < 10; ++k) {
        const int n = 8 * (k / 2) + c + k % 2;
        if (n >= n_pairs) continue;
        const int pr = pair0 + n, t = pr / p.num_heads, h = pr % p.num_heads;
        bf16* dst = out_head(p, b, t, h) + 16 * warp + g;
#pragma unroll
        for (int j = 0; j < kVChunks; ++j) {
          dst[64 * j] = __float2bfloat16(o[j][4 * (k / 2) + k % 2] * inv[k]);
          dst[64 * j + 8] = __float2bfloat16(o[j][4 * (k / 2) + 2 + k % 2] * inv[k]);
        }
      }
    } else if (whole) {
      // out is bf16: the fragments go to shared memory first (this warpgroup's Q^T,
      // which the unit no longer reads), transposed by stmatrix into a row per
      // pair, and leave as 16-byte vectors, each warp 512 bytes of one pair's row.
      // (Stored straight from the fragments, each store wrote 16 bytes into each of
      // four rows, half of a 32-byte sector: on the H200, after the flush, a call
      // of one tile took about 12 us to write its 72 rows, twice its tile's time;
      // chapter 10 times both ways, the other as the build direct_out.)
      // A stmatrix takes four 8x8 blocks: dims 16 warp + 8 (m % 2) of chunk j + m / 2,
      // pairs 8i .. 8i + 7; lane 8m + r names where pair 8i + r's row of block m goes.
      const int m = lane / 8, r = lane % 8;
      const uint32_t rows = smem_addr(smem + kOffQ + group * kQBytes) + r * kStageRowBytes +
                            2 * (64 * (m / 2) + 16 * warp + 8 * (m % 2));
#pragma unroll
      for (int i = 0; i < 5; ++i)
#pragma unroll
        for (int j = 0; j < kVChunks; j += 2)
          stmatrix_x4_trans(rows + 8 * i * kStageRowBytes + 2 * 64 * j,
                            pack_bf16x2(o[j][4 * i] * inv[2 * i], o[j][4 * i + 1] * inv[2 * i + 1]),
                            pack_bf16x2(o[j][4 * i + 2] * inv[2 * i], o[j][4 * i + 3] * inv[2 * i + 1]),
                            pack_bf16x2(o[j + 1][4 * i] * inv[2 * i], o[j + 1][4 * i + 1] * inv[2 * i + 1]),
                            pack_bf16x2(o[j + 1][4 * i + 2] * inv[2 * i], o[j + 1][4 * i + 3] * inv[2 * i + 1]));
      named_barrier(bar_id, 128);
      // Each warp copies whole pairs' rows, 512 bytes a store instruction: the
      // pair's place in out is worked out once per row, not once per 16 bytes
      // with a division by the heads each time.
      const unsigned char* staged = smem + kOffQ + group * kQBytes;
      for (int n = warp; n < n_pairs; n += 4) {
        const int pr = pair0 + n, t = pr / p.num_heads, h = pr - t * p.num_heads;
        bf16* dst = out_head(p, b, t, h);
        const unsigned char* src = staged + n * kStageRowBytes;
#pragma unroll
        for (int x = lane; x < kDimV / 8; x += 32)
          *reinterpret_cast<uint4*>(dst + 8 * x) = *reinterpret_cast<const uint4*>(src + 16 * x);
      }
      // (The next unit's Q^T load starts with a barrier of this warpgroup: nobody overwrites the rows before they are read.)
    } else {
      // The partials are fp32: a store of 8 dims of a pair is a whole 32-byte sector,
      // four pairs to a store, and going through shared memory saved nothing.
#pragma unroll
      for (int k = 0; k < 10; ++k) {
        const int n = 8 * (k / 2) + c + k % 2;
        if (n >= n_pairs) continue;
        float* dst = p.o_partial + (part_row0 + n) * kDimV + 16 * warp + g;
#pragma unroll
        for (int j = 0; j < kVChunks; ++j) {
          dst[64 * j] = inv[k] == 0.f ? 0.f : o[j][4 * (k / 2) + k % 2] * inv[k];
          dst[64 * j + 8] = inv[k] == 0.f ? 0.f : o[j][4 * (k / 2) + 2 + k % 2] * inv[k];
        }
      }
    }
  }
  if (group == 0) take_turn();  // warpgroup 1's last turn, passed after its last products
}

// ---- the rows layout's pieces, shared by compute_rows and the seesaw -----------------
//
// A thread of a warpgroup holds two rows of a 64 x 64 fragment of scores (or
// of P): row0 = 16 warp + g and row0 + 8, s[4i + e] at column 8i + c + e of
// row0 and s[4i + 2 + e] of row0 + 8 (c = 2 (lane % 4), e = 0, 1).

// The keys a row may not see hidden in sc (only in a stream's last tiles:
// the causal draft and its end), and each row's maximum over the quad that
// holds it, scaled to base 2.  The scores stay as the products left them: the
// scale is positive, so the largest scaled score is the largest score scaled,
// and rows_exponentiate folds the scale into one fused multiply-add a score.
// (As first written, MLA_HOPPER_SOFTMAX_FMUL = 1, every score was multiplied
// by the scale here and tested against its row's end in every tile; ptxas
// made that test a select, not a branch, so a tile in the middle of a stream
// paid for it too.  Chapter 10 measures the difference.)
#ifndef MLA_HOPPER_SOFTMAX_FMUL
#define MLA_HOPPER_SOFTMAX_FMUL 0
#endif
#if !MLA_HOPPER_SOFTMAX_FMUL
__device__ __forceinline__ void rows_hide_and_max(const float (&acc)[32], float (&sc)[32], int tile, int first_hidden,
                                                  int vis0, int vis1, int c, float scale_log2, float& mx0, float& mx1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) sc[i] = acc[i];
  if ((tile + 1) * kKeysPerTile > first_hidden) {  // an edge tile: some row may not see some of its keys
    const int key0 = tile * kKeysPerTile + c;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * i + e;
        sc[4 * i + e] = key < vis0 ? sc[4 * i + e] : -CUDART_INF_F;
        sc[4 * i + 2 + e] = key < vis1 ? sc[4 * i + 2 + e] : -CUDART_INF_F;
      }
  }
  // A tree, four levels deep where a chain would be sixteen (fmaxf is exact: any order gives the same).
  float t0[8], t1[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    t0[i] = fmaxf(sc[4 * i], sc[4 * i + 1]);
    t1[i] = fmaxf(sc[4 * i + 2], sc[4 * i + 3]);
  }
#pragma unroll
  for (int w = 4; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) {
      t0[i] = fmaxf(t0[i], t0[i + w]);
      t1[i] = fmaxf(t1[i], t1[i + w]);
    }
  mx0 = fmaxf(t0[0], __shfl_xor_sync(0xffffffffu, t0[0], 1));
  mx1 = fmaxf(t1[0], __shfl_xor_sync(0xffffffffu, t1[0], 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2)) * scale_log2;
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2)) * scale_log2;
}

// A score's exponent, base 2, against its row's reference u: one FFMA.
__device__ __forceinline__ float rows_exponent(float s, float scale_log2, float u) { return fmaf(s, scale_log2, -u); }
#else  // as first written (the build softmax_fmul): the scores scaled into sc, base 2, and hidden in every tile
__device__ __forceinline__ void rows_hide_and_max(const float (&acc)[32], float (&sc)[32], int tile, int first_hidden,
                                                   int vis0, int vis1, int c, float scale_log2, float& mx0,
                                                   float& mx1) {
  const bool edge = (tile + 1) * kKeysPerTile > first_hidden;
  const int key0 = tile * kKeysPerTile + c;
  mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float lo = acc[4 * i + e] * scale_log2, hi = acc[4 * i + 2 + e] * scale_log2;
      if (edge) {
        const int key = key0 + 8 * i + e;
        lo = key < vis0 ? lo : -CUDART_INF_F;
        hi = key < vis1 ? hi : -CUDART_INF_F;
      }
      sc[4 * i + e] = lo;
      sc[4 * i + 2 + e] = hi;
      mx0 = fmaxf(mx0, lo);
      mx1 = fmaxf(mx1, hi);
    }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// A score's exponent against its row's reference u: the score was scaled already, in rows_hide_and_max.
__device__ __forceinline__ float rows_exponent(float s, float /* scale: applied */, float u) { return s - u; }
#endif  // MLA_HOPPER_SOFTMAX_FMUL

// P = 2^(each score's exponent) as bf16 pairs (a register A operand of
// P V), and this thread's part of its rows' sums (s0, s1).  A reference of
// -inf (no key seen yet) subtracts nothing: those scores are -inf too, and P is 0.
__device__ __forceinline__ void rows_exponentiate(const float (&sc)[32], float scale_log2, float n0, float n1,
                                                  uint32_t (&pk)[16], float& s0, float& s1) {
  const float u0 = n0 == -CUDART_INF_F ? 0.f : n0, u1 = n1 == -CUDART_INF_F ? 0.f : n1;
  s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float p0 = exp2f(rows_exponent(sc[4 * i], scale_log2, u0));
    const float p1 = exp2f(rows_exponent(sc[4 * i + 1], scale_log2, u0));
    const float p2 = exp2f(rows_exponent(sc[4 * i + 2], scale_log2, u1));
    const float p3 = exp2f(rows_exponent(sc[4 * i + 3], scale_log2, u1));
    pk[2 * i] = pack_bf16x2(p0, p1);
    pk[2 * i + 1] = pack_bf16x2(p2, p3);
    s0 += p0 + p1;
    s1 += p2 + p3;
  }
}

// O (a warpgroup's 256 dims of its 64 rows) times f0 on row0, f1 on row0 + 8:
// only where no product of the warpgroup is in flight, and fenced, so that no
// later product reads O before the multiplies.
__device__ __forceinline__ void rows_rescale(float (&o)[4][32], float f0, float f1) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      o[j][4 * i] *= f0;
      o[j][4 * i + 1] *= f0;
      o[j][4 * i + 2] *= f1;
      o[j][4 * i + 3] *= f1;
    }
#pragma unroll
  for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
}

// P (row n = pair, its 64 keys in one swizzled 128-byte row) into the chunk at p_s.
__device__ __forceinline__ void rows_store_p(const uint32_t (&pk)[16], uint32_t p_s, int row0, int g, int lane) {
  const int mat = lane / 8, n = row0 - g + 8 * (mat % 2) + lane % 8;
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const int col = i + mat / 2;  // the 16-byte column of keys 8 col .. 8 col + 7
    stmatrix_x4(p_s + n * 128 + ((col ^ (n & 7)) << 4), pk[2 * i], pk[2 * i + 1], pk[2 * i + 2], pk[2 * i + 3]);
  }
}

// ---- the rows layout: both compute warpgroups on one unit of up to 64 pairs ----
//
// The pairs are the M of every product: S[pairs, keys] = Q K^T with N = 64
// keys, and O[pairs, dims] += P V with N = 256 dims, a warpgroup's half of
// them in one product per k-step (as first written, four products of N = 64
// re-read P from shared memory four times, and were slower at every shape
// measured).  O is 64 x 512 floats: each warpgroup holds half of its dims (128
// registers a thread).
// The tiles of a unit go to the warpgroups in turn, A (even) to warpgroup 0 and
// B (odd) to warpgroup 1, so each scores a whole tile, and each needs the
// other's P for its half of the dims.  The softmax reference travels along
// the chain A, B, A', ...: warpgroup 0 scores A with the reference left by B
// before it, writes P_A and its reference to shared memory (P into A's RoPE
// chunk, which only the scores read), and warpgroup 1 takes that reference for
// B.  The reference moves only when a score passes it by 2^8, so a warpgroup
// rarely has to rescale O for the other's tile.
__device__ void compute_rows(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem,
                             uint64_t* full, uint64_t* empty, int group, int cta) {
  constexpr int R = kRowsRing;
  constexpr int kBarA = 3, kBarB = 4, kBarBoth = 5;  // P_A ready, P_B ready, both warpgroups
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int t256 = threadIdx.x - 128;             // 0..255 over both compute warpgroups
  const int g = lane / 4, c = 2 * (lane % 4);
  const int row0 = 16 * warp + g;                 // this thread's rows: row0 and row0 + 8
  const uint32_t ring = smem_addr(smem);
  const uint32_t q_s = smem_addr(smem + kROffQ);
  const uint64_t ring_desc = sw128_desc(ring, 1024), q_desc = sw128_desc(q_s, 1024);
  // V as the B operand of N = 256: a warpgroup's four V chunks lie in consecutive
  // slots (a tile's nine never wrap around the ring of two tiles), a slot apart.
  const uint64_t v_desc = sw128_desc(ring, 1024, kChunkBytes);
  float* m_a_s = reinterpret_cast<float*>(smem + kROffMa);
  float* m_b_s = reinterpret_cast<float*>(smem + kROffMb);
  int* flag_s = reinterpret_cast<int*>(smem + kROffFlag);
  float* l_s = reinterpret_cast<float*>(smem + kROffL);
  int* vis_s = reinterpret_cast<int*>(smem + kROffVis);
  int64_t* q_row_s = reinterpret_cast<int64_t*>(smem + kROffQRow);
  const float scale_log2 = p.scale * kLog2e;
  const int first_share_unit = cur.unit;
  const int v_pos0 = 1 + 4 * group;  // the ring positions of this warpgroup's V chunks (dims 256 group ..)

  auto release = [&](int s) {  // one arrival per warp on chunk s's slot
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s % R]);
  };
  auto slot_of = [&](int s) { return s % R; };
  // S = Q K^T of the tile whose chunks start at s: 9 chunks, 4 k-steps each, one commit.
  auto scores = [&](float (&sc)[32], int s) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {  // each chunk's k-steps as soon as it has landed
      mbar_wait(&full[slot_of(s + j)], ((s + j) / R) & 1);
      fence_proxy_async();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n64k16_ss<0>(sc, q_desc + ((dims_of(j) * kRowsPairs * 128 + 32 * ks) >> 4),
                              ring_desc + ((slot_of(s + j) * kChunkBytes + 32 * ks) >> 4), j | ks);
    }
    wgmma_commit();
  };
  // O[:, this warpgroup's dims] += P V of the tile at s, P in registers.
  // (No fence on O here: a product of the other tile may still be adding to it,
  // and an instruction that seems to write O while a wgmma does makes ptxas
  // serialise every wgmma of the kernel.  A rescale is fenced where it is done.)
  auto pv_regs = [&](float (&o)[4][32], uint32_t (&pk)[16], int s) {
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(pk[i])::"memory");  // P is final before the fence
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_rs_tb(o, &pk[4 * ks], v_desc + ((slot_of(s + v_pos0) * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };
  // The same with the other warpgroup's P, from its tile's RoPE slot.
  auto pv_smem = [&](float (&o)[4][32], int s) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_ss_tb(o, ring_desc + ((slot_of(s) * kChunkBytes + 32 * ks) >> 4),
                             v_desc + ((slot_of(s + v_pos0) * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };

  int seq = 0;
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch, grp = u / p.batch;
    const int kv_len = p.kv_lens[b];
    const int pair0 = grp * sh.per_group;
    const int n_pairs = max(0, min(sh.per_group, sh.pairs - pair0));

    // Q of the unit's pairs, loaded by both warpgroups (the first barrier also
    // waits until the previous unit's sums are read).
    load_unit_q<false>(p, b, kv_len, pair0, n_pairs, kRowsPairs, q_s, q_row_s, vis_s, nullptr, t256, 256, kBarBoth);
    const int vis0 = vis_s[row0], vis1 = vis_s[row0 + 8];
    cp_async_wait<0>();
    fence_proxy_async();
    named_barrier(kBarBoth, 256);

    float o[4][32];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 32; ++r) o[j][r] = 0.f;
    float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F;  // the references of rows row0, row0 + 8
    float l0 = 0.f, l1 = 0.f;  // this thread's part of their sums over this warpgroup's tiles
    const int first_hidden = kv_len - p.q_len + 1;

    // Hide the keys of `tile` a row may not see, move the
    // references where a score passes them by 2^8, and make P (bf16 pairs,
    // as a register A operand) and this thread's part of the sums.
    auto softmax = [&](const float (&acc)[32], int tile, float& a0, float& a1, uint32_t (&pk)[16]) {
      float mx0, mx1;
      float sc[32];  // the scores, hidden keys at -inf (the accumulators are only read: see pv_regs)
      rows_hide_and_max(acc, sc, tile, first_hidden, vis0, vis1, c, scale_log2, mx0, mx1);
      const float n0 = mx0 > m0 + kRescaleLog2 ? mx0 : m0;  // -inf + 8 is -inf: a first key always moves it
      const float n1 = mx1 > m1 + kRescaleLog2 ? mx1 : m1;
      a0 = n0 == m0 ? 1.f : exp2f(m0 - n0);
      a1 = n1 == m1 ? 1.f : exp2f(m1 - n1);
      m0 = n0;
      m1 = n1;
      float s0, s1;
      rows_exponentiate(sc, scale_log2, m0, m1, pk, s0, s1);
      l0 = l0 * a0 + s0;
      l1 = l1 * a1 + s1;
    };
    auto rescale = [&](float a0, float a1) { rows_rescale(o, a0, a1); };  // only where no product adds to O
    // P into the slot of chunk s.
    auto store_p = [&](const uint32_t (&pk)[16], int s) { rows_store_p(pk, ring + slot_of(s) * kChunkBytes, row0, g, lane); };
    auto publish_m = [&](float* m_s) {
      if (c == 0) {
        m_s[row0] = m0;
        m_s[row0 + 8] = m1;
      }
    };
    // The other warpgroup's references: how much this one's O and sums shrink.
    auto take_m = [&](const float* m_s, float& a0, float& a1) {
      const float n0 = m_s[row0], n1 = m_s[row0 + 8];
      a0 = n0 == m0 ? 1.f : exp2f(m0 - n0);
      a1 = n1 == m1 ? 1.f : exp2f(m1 - n1);
      m0 = n0;
      m1 = n1;
      l0 *= a0;
      l1 *= a1;
    };

    int prev = -1;       // the first chunk of the previous pair of tiles, -1 at a unit's start
    bool prev_b = false; // whether it had a tile B
    auto release_prev = [&]() {  // what the previous pair left to hand back, once its products are done
      if (prev < 0) return;
      if (group == 0) {
        if (prev_b)
          for (int k = 0; k <= 4; ++k) release(prev + kChunks + k);  // B's P and V dims 0..255
      } else {
        if (prev_b)
          for (int k = 5; k <= 8; ++k) release(prev + kChunks + k);  // B's V dims 256..511
      }
    };

    if (!kDoMath) {  // the ablation without math: wait for each chunk, hand it back
      for (int n = (t1 - t0) * kChunks; n > 0; --n, ++seq) {
        mbar_wait(&full[slot_of(seq)], (seq / R) & 1);
        release(seq);
      }
    }
    const int t_end = kDoMath ? t1 : t0;
    for (int tile = t0; tile < t_end; tile += 2) {
      const bool has_b = tile + 1 < t_end;
      const int sa = seq, sb = seq + kChunks;
      float sc[32];
      uint32_t pk[16];
      float a0, a1;
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
      release_prev();
      if (group == 0) {
        scores(sc, sa);
        wgmma_wait<0>();
        fence_accumulators(sc);
        for (int k = 5; k <= 8; ++k) release(sa + k);  // A's dims 256..575: scores only, here
        softmax(sc, tile, a0, a1, pk);
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);  // nothing in flight reads O
        store_p(pk, sa);
        publish_m(m_a_s);
        fence_proxy_async();
        release(sa);  // A's RoPE slot: this warpgroup is done with it (the other still reads P there)
        named_barrier_arrive(kBarA, 256);
        pv_regs(o, pk, sa);
        // A's dims 0..255 go back as soon as their products are done: the
        // next tile A' loads into them while B is finished.
        wgmma_wait<0>();
        for (int k = 1; k <= 4; ++k) release(sa + k);
        if (has_b) {
          named_barrier(kBarB, 256);
          for (int k = 5; k <= 8; ++k) release(sb + k);  // B's dims 256..511: not read here
          take_m(m_b_s, a0, a1);
          if (flag_s[0]) rescale(a0, a1);  // a reference moved in B: O shrinks before P_B adds to it
          pv_smem(o, sb);
        }
      } else {
        if (has_b) scores(sc, sb);
        named_barrier(kBarA, 256);
        for (int k = 1; k <= 4; ++k) release(sa + k);  // A's dims 0..255: not read here
        // S_B is done before O may change: a write to O while any product is
        // in flight makes ptxas serialise every wgmma of the kernel.
        wgmma_wait<0>();
        fence_accumulators(sc);
        take_m(m_a_s, a0, a1);
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);
        pv_smem(o, sa);
        if (has_b) {
          for (int k = 1; k <= 4; ++k) release(sb + k);  // B's dims 0..255: scores only, here
          softmax(sc, tile + 1, a0, a1, pk);
          const bool moved = named_barrier_or(2, 128, a0 != 1.f || a1 != 1.f);
          if (moved) {
            wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
            rescale(a0, a1);
          }
          store_p(pk, sb);
          publish_m(m_b_s);
          if (tid == 0) flag_s[0] = moved;
          fence_proxy_async();
          release(sb);
          named_barrier_arrive(kBarB, 256);
        }
        // P_A and A's dims 256..511 go back before B's products are issued.
        wgmma_wait<0>();
        release(sa);
        for (int k = 5; k <= 8; ++k) release(sa + k);
        if (has_b) pv_regs(o, pk, sb);
      }
      prev = seq;
      prev_b = has_b;
      seq += has_b ? 2 * kChunks : kChunks;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
    release_prev();

    // The sums: of this thread's quad by shuffles, of the two warpgroups through shared memory.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (c == 0) {
      l_s[group * kRowsPairs + row0] = l0;
      l_s[group * kRowsPairs + row0 + 8] = l1;
    }
    named_barrier(kBarBoth, 256);

    // Write the unit: whole -> out and lse; cut -> this block's partial slot (dims of this warpgroup).
    const bool whole = t0 == 0 && t1 == unit_tiles(p, u);
    const int slot = u == first_share_unit ? 0 : 1;
    const int64_t part_row0 = ((int64_t)cta * 2 + slot) * kPairsPerBlock;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int n = row0 + 8 * h2;
      if (n >= n_pairs) continue;
      const float l = l_s[n] + l_s[kRowsPairs + n];
      const float m_ref = h2 ? m1 : m0;
      const float inv = 1.f / l;
      const float lse_nat = (m_ref + log2f(l)) * 0.6931471805599453f;
      const int pr = pair0 + n, t = pr / p.num_heads, h = pr % p.num_heads;
      const int dim0 = 256 * group + c;
      if (whole) {
        bf16* dst = out_head(p, b, t, h) + dim0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<uint32_t*>(dst + 64 * j + 8 * i) =
                pack_bf16x2(o[j][4 * i + 2 * h2] * inv, o[j][4 * i + 2 * h2 + 1] * inv);
        if (group == 0 && c == 0) *lse_at(p, b, t, h) = lse_nat;
      } else {
        float* dst = p.o_partial + (part_row0 + n) * kDimV + dim0;
        const bool empty_part = l == 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<float2*>(dst + 64 * j + 8 * i) =
                empty_part ? make_float2(0.f, 0.f)
                           : make_float2(o[j][4 * i + 2 * h2] * inv, o[j][4 * i + 2 * h2 + 1] * inv);
        if (group == 0 && c == 0) p.lse_partial[part_row0 + n] = empty_part ? -CUDART_INF_F : lse_nat;
      }
    }
  }
}


// ---- the seesaw: 64 pairs on M, two key tiles at a time, no loader warpgroup ----
//
// The rows layout above multiplies in the right shape (S = Q K^T with N = 64,
// O += P V with N = 256) but runs at about three quarters of the tensor cores'
// rate even with nothing to load, and its loads barely overlap: both
// warpgroups score their tiles at once, then both stop for the softmax, and a
// loader warpgroup refills a ring of exactly two tiles only as chunks come
// back.  This kernel keeps the shape and changes the schedule, as FlashMLA's
// deep-dive describes it (its "seesaw"): each warpgroup holds half of O's dims
// for all 64 pairs, warpgroup 0 scores the even tiles (A, in K0) and
// warpgroup 1 the odd ones (B, in K1), and one shared softmax reference is
// passed from A to B to the next A, so that while one warpgroup runs its
// softmax the other's products keep the tensor cores busy:
//
//   [0] m_A = max(m, rowmax S_A), P_A = 2^(S_A - m_A), O_L *= 2^(m - m_A), O_L += P_A V_A,L
//   [1] m_B = max(m_A, rowmax S_B), P_B = 2^(S_B - m_B), O_R *= 2^(m - m_B), O_R += P_B V_B,R
//   [0] P_A *= 2^(m_A - m_B) into shared memory;  [1] O_R += P_A V_A,R
//   [0] O_L *= 2^(m_A - m_B), O_L += P_B V_B,L;  then the next pair's scores.
//
// There is no loader: the thread 0 of each warpgroup asks the tensor copy for
// a chunk of the next pair's tiles at the moment its last reader is done (a
// chunk is 64 keys x 64 dims; a tile's 9 chunks each have an mbarrier), so no
// chunk waits for a hand-back through a barrier and a loader's turn.  P goes
// into its tile's RoPE chunk, which only the scores read.  The softmax
// reference moves lazily, as in the op (by more than 2^8), so the rescales of
// O and of P_A are rare and skipped when no row of a warp needs them.
//
// The edges, without gathers: a tile that runs past its stream's end is copied
// whole from its pages (or, with pages of 16 or 32 keys, without the boxes past
// the end); its scores there are hidden and its V rows past the end are zeroed
// in shared memory before the products read them (P is 0 there, and 0 x NaN
// would not be).  A page outside the pool is not copied (page 0 is, in its
// place) and its unit's answers are NaN.

// The pages of one key tile's boxes (64, 32 or 16 keys each, as the tensor map
// reads the cache), looked up once per tile by the thread that copies it.
struct TilePages {
  int page[4];  // the page of each box (page 0 stands in for one outside the pool)
  int boxes;    // boxes that hold keys of the stream (the others are not copied)
  int in_page;  // the tile's first key within its page (pages of more than 64 keys)
  int bad;      // a box's page lies outside the pool
};

// Where a tile's boxes sit in its stream's block table.  Pages of 16 or 32
// keys: a tile's `boxes` boxes are consecutive entries.  Pages of 64 keys or
// more: a page holds `tiles` whole tiles.  Set once per kernel.
struct PageSteps {
  int boxes;  // boxes of a tile: 1, 2 or 4
  int tiles;  // tiles of a page (1 where a page holds fewer keys than a tile)
  int shift;  // log2(tiles), or -1 where tiles is not a power of two
};
__device__ __forceinline__ PageSteps page_steps(const MlaParams& p, int box_keys) {
  PageSteps s;
  s.boxes = kKeysPerTile / box_keys;
  s.tiles = box_keys == kKeysPerTile ? p.page_size / kKeysPerTile : 1;
  s.shift = (s.tiles & (s.tiles - 1)) == 0 ? __ffs(s.tiles) - 1 : -1;
  return s;
}

// tile_pages: the pages of a tile's boxes, from the block table (a unit's
// first two tiles).  fetch_pages: the block table's entries of a tile's
// boxes, copied by cp.async into `ring` (a slot of 4 ints per tile, 4 tiles)
// a pair of tiles before the copies need them.  (A load used when the copies
// are issued stalls the copier's warp, and with it its warpgroup's products
// and barriers, for a trip to L2: about 1500 cycles, twice a pair of tiles in
// each warpgroup at 8 streams of 64 heads, when the pages were loaded there.)
// ring_pages: the pages of a tile whose entries fetch_pages copied (after the
// copier's cp.async wait).
//
// By steps (builds seesaw_steps and seesaw_cross_steps): a tile's first entry
// once, from the steps, and its boxes the entries after it.  As first written,
// each box of a tile that holds keys divides its first key by the page size,
// and the tile's first key within its page takes one more division: a 32-bit
// division by a value known only at run time is some 25 dependent
// instructions, in the one lane that asks for the copies, while its warp holds
// its warpgroup's barriers.
#ifndef MLA_HOPPER_PAGE_STEPS
#define MLA_HOPPER_PAGE_STEPS MLA_HOPPER_DISPATCH  // the op's seesaw: by steps
#endif
// Copies behind the products (build seesaw_cross_behind, for chapter 10; the
// op is always built with 0; crossed order only).  A copier is one lane of its
// warpgroup's first warp, and a product is issued by all four warps together:
// while the copier asks for a tile's chunks, the other three warps wait at the
// next wgmma.  Warpgroup 1 asks for the next A's last five chunks just before
// P_B V_B, and warpgroup 0 for the next B's first chunks between two halves of
// the next A's scores.  With MLA_HOPPER_COPY_BEHIND = 1 both are asked for
// right after those products are issued.  The warps then wait less at the
// products, but the chunks land later and their readers wait for them: the
// call was slower (chapter 10 measures it).  (Between a product and its wait
// the copies must not sit across a branch: ptxas then serialises every wgmma
// of the kernel.)
#ifndef MLA_HOPPER_COPY_BEHIND
#define MLA_HOPPER_COPY_BEHIND 0
#endif

// A tile's pages from the block-table entries of its first `boxes` boxes
// (`entries`: the table's, or the copies of them in the ring): a box holds
// keys of the stream or is not copied, and a page outside the pool stands as 0.
__device__ __forceinline__ void read_boxes(const MlaParams& p, int boxes, int key0, int kv_len, int box_keys,
                                           const int* entries, TilePages& t) {
  t.boxes = 0;
  t.bad = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool used = i < boxes && key0 + i * box_keys < kv_len;
    const int pg = used ? entries[i] : 0;
    const bool outside = used && (pg < 0 || pg >= p.num_pages);
    t.bad |= outside;
    t.page[i] = outside ? 0 : pg;
    t.boxes += used;
  }
}

#if MLA_HOPPER_PAGE_STEPS
// The block-table entry of a tile's first box, and the tile's first key within its page.
__device__ __forceinline__ int tile_entry(const PageSteps& s, int tile, int& in_page) {
  const int page = s.shift >= 0 ? tile >> s.shift : tile / s.tiles;  // its page's place in the stream
  in_page = (tile - page * s.tiles) * kKeysPerTile;
  return page * s.boxes;
}

__device__ __forceinline__ TilePages tile_pages(const MlaParams& p, const PageSteps& s, const int* table, int kv_len,
                                                int tile, int box_keys) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  const int entry = tile_entry(s, tile, t.in_page);
  read_boxes(p, s.boxes, key0, kv_len, box_keys, table + entry, t);
  return t;
}
__device__ __forceinline__ void fetch_pages(const MlaParams&, const PageSteps& s, const int* table, int kv_len,
                                            int tile, int box_keys, int* ring) {
  const int key0 = tile * kKeysPerTile;
  int in_page;
  const int entry = tile_entry(s, tile, in_page);
  int* slot = ring + 4 * (tile & 3);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i < s.boxes && key0 + i * box_keys < kv_len) cp_async4(smem_addr(slot + i), table + entry + i);
}
__device__ __forceinline__ TilePages ring_pages(const MlaParams& p, const PageSteps& s, int kv_len, int tile,
                                                int box_keys, const int* ring) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  tile_entry(s, tile, t.in_page);
  read_boxes(p, s.boxes, key0, kv_len, box_keys, ring + 4 * (tile & 3), t);
  return t;
}
#else  // as first written
__device__ __forceinline__ TilePages tile_pages(const MlaParams& p, const PageSteps&, const int* table, int kv_len,
                                                int tile, int box_keys) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  t.in_page = box_keys == kKeysPerTile ? key0 % p.page_size : 0;
  t.boxes = 0;
  t.bad = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = key0 + i * box_keys;
    const bool used = i * box_keys < kKeysPerTile && key < kv_len;
    const int pg = used ? table[key / p.page_size] : 0;
    const bool outside = used && (pg < 0 || pg >= p.num_pages);
    t.bad |= outside;
    t.page[i] = outside ? 0 : pg;
    t.boxes += used;
  }
  return t;
}

__device__ __forceinline__ void fetch_pages(const MlaParams& p, const PageSteps&, const int* table, int kv_len,
                                            int tile, int box_keys, int* ring) {
  const int key0 = tile * kKeysPerTile;
  int* slot = ring + 4 * (tile & 3);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i * box_keys < kKeysPerTile && key0 + i * box_keys < kv_len)
      cp_async4(smem_addr(slot + i), table + (key0 + i * box_keys) / p.page_size);
}
__device__ __forceinline__ TilePages ring_pages(const MlaParams& p, const PageSteps& s, int kv_len, int tile,
                                                int box_keys, const int* ring) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  t.in_page = box_keys == kKeysPerTile ? key0 % p.page_size : 0;
  read_boxes(p, s.boxes, key0, kv_len, box_keys, ring + 4 * (tile & 3), t);  // s.boxes: 64 / box_keys
  return t;
}
#endif  // MLA_HOPPER_PAGE_STEPS

// How a tile's boxes lie in the tensor map: known when the kernel is compiled
// (kWholeTiles: hopper_seesaw_kernel, where MLA_HOPPER_SEESAW_WHOLE), or read
// from the KvTensor at each use, as a kernel parameter (held in a register
// instead, the kernel that asks spilled).
template <bool kWholeTiles>
struct SeeBoxes {
  const KvTensor& kv;
  __device__ __forceinline__ int keys() const { return kWholeTiles ? kKeysPerTile : kv.box_keys; }  // 64, 32 or 16
  // Whether a tile's chunks 0..3 and 4..7 are one copy each (KvTensor::chunk_boxes).
  __device__ __forceinline__ bool four_at_once() const {
#if MLA_HOPPER_COPY_BOXES
    return kWholeTiles || kv.chunk_boxes != 0;
#else
    return false;
#endif
  }
};

// Chunk j of a tile (dims 64j .. 64j + 63 of its keys) into `tile_s`, counted on bar.
template <class Boxes>
__device__ __forceinline__ void copy_chunk(const KvTensor& kv, const Boxes& bx, uint32_t tile_s, uint64_t* bar,
                                           const TilePages& t, int j) {
  const int box_keys = bx.keys();
  mbar_arrive_expect_tx(bar, t.boxes * box_keys * 128);
  const uint32_t dst = tile_s + j * kChunkBytes;
  tma_load_3d(dst, &kv.map, j * kChunkDims, t.in_page, t.page[0], bar);
  if (t.boxes > 1) tma_load_3d(dst + box_keys * 128, &kv.map, j * kChunkDims, 0, t.page[1], bar);
  if (t.boxes > 2) tma_load_3d(dst + 2 * box_keys * 128, &kv.map, j * kChunkDims, 0, t.page[2], bar);
  if (t.boxes > 3) tma_load_3d(dst + 3 * box_keys * 128, &kv.map, j * kChunkDims, 0, t.page[3], bar);
}

// The barrier that counts chunk j of a tile: its group's first where one
// copy brings the group (KvTensor::chunk_boxes), else its own, so that where
// a group comes box by box (pages of 16 or 32 keys) the scores of its first
// chunk wait for that chunk's copies only.  (Counted on its first barrier, such
// a group took 1.00 and 1.05 of the time of this rule in two runs: no gain.)
template <class Boxes>
__device__ __forceinline__ int chunk_bar(const Boxes& bx, int j) {
  if (bx.four_at_once()) return j < 4 ? 0 : j < 8 ? 4 : 8;
  return j;
}
// Chunks j0 .. j0 + n - 1 of a tile into `tile_s`, counted on tile_bars as
// chunk_bar says (n = 4 from chunk 0 or 4, or 1: chunk 8).
template <class Boxes>
__device__ __forceinline__ void copy_chunks(const KvTensor& kv, const Boxes& bx, uint32_t tile_s,
                                            uint64_t* tile_bars, const TilePages& t, int j0, int n) {
#if MLA_HOPPER_COPY_BOXES
  if (n == 4 && bx.four_at_once()) {
    mbar_arrive_expect_tx(&tile_bars[j0], 4 * kChunkBytes);
    tma_load_4d(tile_s + j0 * kChunkBytes, &kv.map4, 0, t.in_page, j0, t.page[0], &tile_bars[j0]);
    return;
  }
#endif
  for (int j = j0; j < j0 + n; ++j) copy_chunk(kv, bx, tile_s, &tile_bars[j], t, j);
}

constexpr int kBarScaleA = 1, kBarScaleB = 2, kBarPA = 3, kBarPB = 4;  // the seesaw's handshakes (256 threads)
constexpr int kBarSeeBoth = 5, kBarSeeOwn = 6;                         // both warpgroups; one (6 + warpgroup)

template <bool kWholeTiles>
__device__ void seesaw(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem, const KvTensor& kv) {
  // The warpgroup, through a shuffle so the compiler knows it is the same in
  // every lane: a branch on it is then not divergent, and wgmma stays unserialised.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int row0 = 16 * warp + g;  // this thread's rows: row0 and row0 + 8
  const bool copier = tid == 0;    // asks for this warpgroup's copies
  const uint32_t k0_s = smem_addr(smem), k1_s = k0_s + kTileBytes;
  const uint32_t q_s = smem_addr(smem + kSOffQ);
  const uint64_t q_desc = sw128_desc(q_s, 1024);
  // V as the B operand of N = 256: four chunks side by side, a chunk apart.
  const uint64_t v0_desc = sw128_desc(k0_s, 1024, kChunkBytes), v1_desc = sw128_desc(k1_s, 1024, kChunkBytes);
  const uint64_t k0_desc = sw128_desc(k0_s, 1024), k1_desc = sw128_desc(k1_s, 1024);
  float* m_s = reinterpret_cast<float*>(smem + kSOffM);
  float* scale_s = reinterpret_cast<float*>(smem + kSOffScale);  // [0]: tile A's factor, [1]: tile B's
  float* l_s = reinterpret_cast<float*>(smem + kSOffL);
  int* vis_s = reinterpret_cast<int*>(smem + kSOffVis);
  int64_t* q_row_s = reinterpret_cast<int64_t*>(smem + kSOffQRow);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kSOffBars);  // K0's 9 chunks, then K1's
  int* bad_s = reinterpret_cast<int*>(smem + kSOffBad);            // by unit parity
  int* ring = reinterpret_cast<int*>(smem + kSOffPages) + 16 * wg;  // this copier's page ids, fetched ahead
  const SeeBoxes<kWholeTiles> bx{kv};  // how a tile's boxes lie: known here, or read from kv
  const PageSteps steps = page_steps(p, bx.keys());
  const float scale_log2 = p.scale * kLog2e;
  const int first_share_unit = cur.unit;
  const int dim_half = 4 * wg;  // this warpgroup's V chunks: dims 256 wg .. 256 wg + 255
  int phase = 0;                // parity of the next fill of this warpgroup's tile (K0 or K1)
  int unit_count = 0;
#if MLA_HOPPER_TIMELINE
  // Thread 0 of each warpgroup of block 0 stamps six points of each of its
  // first pairs of tiles (warpgroup 0: its start, A's softmax done, A's products
  // done, B's reference known, P_B known, the next A's scores done; warpgroup
  // 1: its start, A's reference known, B's softmax done, P_A known, its products
  // done, the next B's scores done).
  const long long stamp_start = clock64();
  int stamp_tile = 0;
#define SEE_STAMP(event) \
  if (blockIdx.x == 0 && tid == 0 && stamp_tile < kStampTiles) \
    tile_stamps[wg][stamp_tile][event] = float(clock64() - stamp_start)
#else
#define SEE_STAMP(event)
#endif

  // S = Q K^T of a tile over its chunks start, start + 1, ... (n of them, from
  // 8 back to 0), each chunk's four k-steps as soon as it has landed, one commit.
  auto scores = [&](float (&sc)[32], uint64_t k_desc, uint64_t* tile_bars, int start, int n, bool first) {
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const int j = (start + i) % kChunks;
      mbar_wait(&tile_bars[chunk_bar(bx, j)], phase);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n64k16_ss<0>(sc, q_desc + ((j * kRowsPairs * 128 + 32 * ks) >> 4),
                              k_desc + ((j * kChunkBytes + 32 * ks) >> 4), !(first && i == 0 && ks == 0));
    }
    wgmma_commit();
  };
  // O[:, this warpgroup's dims] += P V, P in registers or (p_s) in shared memory.
  // (No fence on O here: an instruction that seems to write O while a wgmma
  // does makes ptxas serialise every wgmma of the kernel.)
  auto pv_regs = [&](float (&o)[4][32], uint32_t (&pk)[16], uint64_t v_desc) {
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(pk[i])::"memory");  // P is final before the fence
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_rs_tb(o, &pk[4 * ks], v_desc + ((dim_half * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };
  auto pv_smem = [&](float (&o)[4][32], uint32_t p_s, uint64_t v_desc) {
    const uint64_t p_desc = sw128_desc(p_s, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_ss_tb(o, p_desc + ((32 * ks) >> 4), v_desc + ((dim_half * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };
  auto store_p = [&](const uint32_t (&pk)[16], uint32_t p_s) { rows_store_p(pk, p_s, row0, g, lane); };
  // Zeros in rows `valid` .. 63 of this warpgroup's V chunks of the tile at
  // tile_s (its keys past the stream's end), visible to the tensor cores and to
  // the whole warpgroup before its products read them.
  auto zero_tail = [&](uint32_t tile_s, int valid) {
    for (int i = tid; i < (kKeysPerTile - valid) * 32; i += 128) {
      const int r = valid + i / 32, k = (i / 8) % 4, col = i % 8;
      st_shared_u128(tile_s + (dim_half + k) * kChunkBytes + r * 128 + col * 16, 0, 0, 0, 0);
    }
    fence_proxy_async();
    named_barrier(kBarSeeOwn + wg, 128);
  };

  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch, grp = u / p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    const int pair0 = grp * sh.per_group;
    const int n_pairs = max(0, min(sh.per_group, sh.pairs - pair0));
    int* bad_flag = bad_s + (unit_count++ & 1);
    int bad_pages = 0;  // this copier's: a page outside the pool among the tiles it copied

    // The unit's first two tiles, before its Q, so that they land while Q
    // does.  (Every product of the previous unit is done: its end passed a
    // barrier of both warpgroups after their last waits.)
    if (threadIdx.x == 0) {
      const TilePages ta = tile_pages(p, steps, table, kv_len, t0, bx.keys());
#if MLA_HOPPER_COPY_BOXES
      for (int j0 = 0; j0 < kChunks; j0 += 4) copy_chunks(kv, bx, k0_s, bars, ta, j0, j0 < 8 ? 4 : 1);
#else
      for (int j = 0; j < kChunks; ++j) copy_chunk(kv, bx, k0_s, &bars[j], ta, j);
#endif
      int bad = ta.bad;
      if (t0 + 1 < t1) {
        const TilePages tb = tile_pages(p, steps, table, kv_len, t0 + 1, bx.keys());
#if MLA_HOPPER_COPY_BOXES
        for (int j0 = 0; j0 < kChunks; j0 += 4) copy_chunks(kv, bx, k1_s, bars + kChunks, tb, j0, j0 < 8 ? 4 : 1);
#else
        for (int j = 0; j < kChunks; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], tb, j);
#endif
        bad |= tb.bad;
      }
      *bad_flag = bad;  // (the flag of the unit before last: read before this unit's first barrier)
    }
    if (copier) {  // the next pair's page ids, waited for with the unit's Q below
      if (t0 + 2 < t1) fetch_pages(p, steps, table, kv_len, t0 + 2, bx.keys(), ring);
      if (t0 + 3 < t1) fetch_pages(p, steps, table, kv_len, t0 + 3, bx.keys(), ring);
    }
    load_unit_q<true>(p, b, kv_len, pair0, n_pairs, kRowsPairs, q_s, q_row_s, vis_s, m_s, threadIdx.x, kSeeThreads,
                      kBarSeeBoth);
    const int vis0 = vis_s[row0], vis1 = vis_s[row0 + 8];
    cp_async_wait<0>();
    fence_proxy_async();
    named_barrier(kBarSeeBoth, kSeeThreads);

    float o[4][32];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 32; ++r) o[j][r] = 0.f;
    float l0 = 0.f, l1 = 0.f;  // this thread's part of its rows' sums over this warpgroup's tiles
    const int first_hidden = kv_len - p.q_len + 1;  // the first key some row may not see (the causal draft)

    // The scores of `tile` hidden where a row may not see them, and each row's maximum (scaled).
    auto row_max = [&](float (&sc)[32], int tile, float& mx0, float& mx1) {
      rows_hide_and_max(sc, sc, tile, first_hidden, vis0, vis1, c, scale_log2, mx0, mx1);
    };
    auto exponentiate = [&](const float (&sc)[32], float n0, float n1, uint32_t (&pk)[16], float& s0, float& s1) {
      rows_exponentiate(sc, scale_log2, n0, n1, pk, s0, s1);
    };
    // The reference moves only where a score passes it by 2^8 (-inf + 8 is -inf: a first key always moves it).
    auto moved = [](float mx, float m) { return mx > m + kRescaleLog2 ? mx : m; };
    auto factor = [](float m_old, float m_new) { return m_new == m_old ? 1.f : exp2f(m_old - m_new); };
    auto rescale = [&](float f0, float f1) { rows_rescale(o, f0, f1); };  // only where no product is in flight

    float sc[32];
    uint32_t pk[16];
    // The unit's first scores: A's by warpgroup 0, B's by warpgroup 1.
    if (wg == 0 || t0 + 1 < t1) {
      scores(sc, wg == 0 ? k0_desc : k1_desc, bars + wg * kChunks, 0, kChunks, true);
      wgmma_wait<0>();
      fence_accumulators(sc);
      phase ^= 1;
    }

    for (int tile = t0; tile < t1; tile += 2) {
      const bool has_b = tile + 1 < t1, has_a2 = tile + 2 < t1, has_b2 = tile + 3 < t1;
      // The page ids of the pair after next, fetched now; those of the next pair
      // were fetched a pair ago (or with the unit's Q): only they are waited for.
      if (copier) {
        if (tile + 4 < t1) fetch_pages(p, steps, table, kv_len, tile + 4, bx.keys(), ring);
        if (tile + 5 < t1) fetch_pages(p, steps, table, kv_len, tile + 5, bx.keys(), ring);
        cp_async_commit();
      }
      bool fetched = false;
      auto pages_of = [&](int t) {
        if (!fetched) cp_async_wait<1>();  // all but this pair's fetch
        fetched = true;
        return ring_pages(p, steps, kv_len, t, bx.keys(), ring);
      };
      const int valid_a = kv_len - tile * kKeysPerTile, valid_b = valid_a - kKeysPerTile;  // keys of the stream in A, B
      SEE_STAMP(0);
#if MLA_HOPPER_SEESAW_CROSS
      // The crossed order (build seesaw_cross): P_A goes to warpgroup 1 in A's
      // own reference, as soon as A's softmax is done, and warpgroup 1 adds
      // P_A V_A,R while it runs B's softmax; where B moves the reference (rarely,
      // with a lazy one), each warpgroup rescales its O before it adds P_B V_B.
      // No P is rescaled, and nothing waits for B's softmax but P_B's products.
      // Warpgroup 1 scores the next B only once the next A's scores are done, so
      // that they run while warpgroup 0 is at A's softmax.
      if (wg == 0) {
        // ---- warpgroup 0: tile A, dims 0..255 ----
        float mx0, mx1;
        row_max(sc, tile, mx0, mx1);
        const float m0 = m_s[row0], m1 = m_s[row0 + 8];  // the reference the last tile left
        const float n0 = moved(mx0, m0), n1 = moved(mx1, m1);
        const float a0 = factor(m0, n0), a1 = factor(m1, n1);
        float s0 = 0.f, s1 = 0.f;
        exponentiate(sc, n0, n1, pk, s0, s1);
        l0 = l0 * a0 + s0;
        l1 = l1 * a1 + s1;
        __syncwarp();  // the quad's reads of m_s before its write
        if (c == 0) {
          m_s[row0] = n0;
          m_s[row0 + 8] = n1;
          scale_s[row0] = a0;
          scale_s[row0 + 8] = a1;
        }
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);
        // P_A for warpgroup 1, in A's RoPE chunk (its scores are done), before this warpgroup's products.
        store_p(pk, k0_s + (kChunks - 1) * kChunkBytes);
        fence_proxy_async();
        named_barrier_arrive(kBarPA, kSeeThreads);
        SEE_STAMP(1);
        if (valid_a < kKeysPerTile) zero_tail(k0_s, valid_a);
        pv_regs(o, pk, v0_desc);
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        SEE_STAMP(2);
        // A's chunks 0..3: read by its scores and by these products, both done.
        if (copier && has_a2) {
          const TilePages na = pages_of(tile + 2);
#if MLA_HOPPER_COPY_BOXES
          copy_chunks(kv, bx, k0_s, bars, na, 0, 4);
#else
          for (int j = 0; j < 4; ++j) copy_chunk(kv, bx, k0_s, &bars[j], na, j);
#endif
          bad_pages |= na.bad;
        }
        named_barrier(kBarPB, kSeeThreads);  // P_B is in B's RoPE chunk, B's reference is known
        SEE_STAMP(3);
        // (Only now: B's chunks have landed, since warpgroup 1 has its scores.)
        if (has_b && valid_b < kKeysPerTile) zero_tail(k1_s, valid_b);
        const float b0 = scale_s[kRowsPairs + row0], b1 = scale_s[kRowsPairs + row0 + 8];
        l0 *= b0;
        l1 *= b1;
        if (__any_sync(0xffffffffu, b0 != 1.f || b1 != 1.f)) rescale(b0, b1);  // O_L into B's reference
        if (has_b) pv_smem(o, k1_s + (kChunks - 1) * kChunkBytes, v1_desc);
        if (has_a2) {
          auto copy_next_b = [&] {
            if (copier && has_b2) {
              const TilePages nb = pages_of(tile + 3);
#if MLA_HOPPER_COPY_BOXES
              copy_chunks(kv, bx, k1_s, bars + kChunks, nb, 0, 4);
              copy_chunks(kv, bx, k1_s, bars + kChunks, nb, 8, 1);
#else
              for (int j = 0; j < 4; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], nb, j);
              copy_chunk(kv, bx, k1_s, &bars[kChunks + 8], nb, 8);
#endif
            }
          };
          scores(sc, k0_desc, bars, 0, 4, true);
#if MLA_HOPPER_COPY_BEHIND
          scores(sc, k0_desc, bars, 4, 5, false);
          wgmma_wait<2>();  // B's products are done: its chunks 0..3 and P_B (chunk 8) are free
          copy_next_b();    // while the scores run
#else
          wgmma_wait<1>();  // B's products are done: its chunks 0..3 and P_B (chunk 8) are free
          copy_next_b();
          scores(sc, k0_desc, bars, 4, 5, false);
#endif
          SEE_STAMP(4);
          wgmma_wait<0>();
          fence_accumulators(sc);
          phase ^= 1;
          named_barrier_arrive(kBarScaleA, kSeeThreads);  // the next A's scores are done: B's may start
        } else {
          SEE_STAMP(4);
          wgmma_wait<0>();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        SEE_STAMP(5);
      } else {
        // ---- warpgroup 1: tile B, dims 256..511 ----
        named_barrier(kBarPA, kSeeThreads);  // P_A is in A's RoPE chunk, A's reference is known
        SEE_STAMP(1);
        const float m0 = m_s[row0], m1 = m_s[row0 + 8];
        const float a0 = scale_s[row0], a1 = scale_s[row0 + 8];
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);  // O_R into A's reference
        if (valid_a < kKeysPerTile) zero_tail(k0_s, valid_a);
        pv_smem(o, k0_s + (kChunks - 1) * kChunkBytes, v0_desc);  // P_A V_A,R, while B's softmax runs
        float n0 = m0, n1 = m1, s0 = 0.f, s1 = 0.f;
        if (has_b) {
          float mx0, mx1;
          row_max(sc, tile + 1, mx0, mx1);
          n0 = moved(mx0, m0);
          n1 = moved(mx1, m1);
          exponentiate(sc, n0, n1, pk, s0, s1);
        }
        const float b0 = factor(m0, n0), b1 = factor(m1, n1);
        __syncwarp();
        if (c == 0) {
          m_s[row0] = n0;
          m_s[row0 + 8] = n1;
          scale_s[kRowsPairs + row0] = b0;
          scale_s[kRowsPairs + row0 + 8] = b1;
        }
        l0 = l0 * a0 * b0 + s0;
        l1 = l1 * a1 * b1 + s1;
        if (has_b) {
          store_p(pk, k1_s + (kChunks - 1) * kChunkBytes);  // B's RoPE chunk: its scores are done
          if (valid_b < kKeysPerTile) zero_tail(k1_s, valid_b);  // (its fence covers P_B too)
          else fence_proxy_async();
        }
        named_barrier_arrive(kBarPB, kSeeThreads);
        SEE_STAMP(2);
        wgmma_wait<0>();  // A's products are done: its chunks 4..8 are free
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        SEE_STAMP(3);
        auto copy_next_a = [&] {
          if (copier && has_a2) {
            const TilePages na = pages_of(tile + 2);
#if MLA_HOPPER_COPY_BOXES
            copy_chunks(kv, bx, k0_s, bars, na, 4, 4);
            copy_chunks(kv, bx, k0_s, bars, na, 8, 1);
#else
            for (int j = 4; j < kChunks; ++j) copy_chunk(kv, bx, k0_s, &bars[j], na, j);
#endif
          }
        };
#if !MLA_HOPPER_COPY_BEHIND
        copy_next_a();
#endif
        if (__any_sync(0xffffffffu, b0 != 1.f || b1 != 1.f)) rescale(b0, b1);  // O_R into B's reference
        if (has_b) {
          pv_regs(o, pk, v1_desc);
#if MLA_HOPPER_COPY_BEHIND
          copy_next_a();  // while the products run (with no B there is no next A)
#endif
          wgmma_wait<0>();  // B's products are done: its chunks 4..7 are free
#pragma unroll
          for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
          if (copier && has_b2) {
            const TilePages nb = pages_of(tile + 3);
#if MLA_HOPPER_COPY_BOXES
            copy_chunks(kv, bx, k1_s, bars + kChunks, nb, 4, 4);
#else
            for (int j = 4; j < 8; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], nb, j);
#endif
            bad_pages |= nb.bad;
          }
        }
        if (has_a2) {
          named_barrier(kBarScaleA, kSeeThreads);  // the next A's scores are done
          SEE_STAMP(4);
          if (has_b2) {
            scores(sc, k1_desc, bars + kChunks, 4, kChunks, true);  // its own copies (4..7) first
            wgmma_wait<0>();
            fence_accumulators(sc);
            phase ^= 1;
          }
        } else {
          SEE_STAMP(4);
        }
        SEE_STAMP(5);
      }
#else
      if (wg == 0) {
        // ---- warpgroup 0: tile A, dims 0..255 ----
        float mx0, mx1;
        row_max(sc, tile, mx0, mx1);
        const float m0 = m_s[row0], m1 = m_s[row0 + 8];  // the reference the last tile left
        const float n0 = moved(mx0, m0), n1 = moved(mx1, m1);
        const float a0 = factor(m0, n0), a1 = factor(m1, n1);
        float s0 = 0.f, s1 = 0.f;
        exponentiate(sc, n0, n1, pk, s0, s1);
        l0 = l0 * a0 + s0;
        l1 = l1 * a1 + s1;
        __syncwarp();  // the quad's reads of m_s before its write
        if (c == 0) {
          m_s[row0] = n0;
          m_s[row0 + 8] = n1;
          scale_s[row0] = a0;
          scale_s[row0 + 8] = a1;
        }
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);
        named_barrier_arrive(kBarScaleA, kSeeThreads);
        SEE_STAMP(1);
        if (valid_a < kKeysPerTile) zero_tail(k0_s, valid_a);
        pv_regs(o, pk, v0_desc);
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        SEE_STAMP(2);
        // A's chunks 0..3: read by its scores and by these products, both done.
        if (copier && has_a2) {
          const TilePages na = pages_of(tile + 2);
          for (int j = 0; j < 4; ++j) copy_chunk(kv, bx, k0_s, &bars[j], na, j);
          bad_pages |= na.bad;
        }
        named_barrier(kBarScaleB, kSeeThreads);  // B's reference and factor are known
        SEE_STAMP(3);
        const float b0 = scale_s[kRowsPairs + row0], b1 = scale_s[kRowsPairs + row0 + 8];
        const bool b_moved = __any_sync(0xffffffffu, b0 != 1.f || b1 != 1.f);
        if (b_moved) {  // P_A for warpgroup 1, in B's reference
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            const float f = i % 2 ? b1 : b0;
            const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pk[i]));
            pk[i] = pack_bf16x2(v.x * f, v.y * f);
          }
        }
        store_p(pk, k0_s + (kChunks - 1) * kChunkBytes);  // A's RoPE chunk: its scores are done
        fence_proxy_async();
        named_barrier_arrive(kBarPA, kSeeThreads);
        if (has_b && valid_b < kKeysPerTile) zero_tail(k1_s, valid_b);
        named_barrier(kBarPB, kSeeThreads);  // P_B is in B's RoPE chunk
        SEE_STAMP(4);
        l0 *= b0;
        l1 *= b1;
        if (b_moved) rescale(b0, b1);
        if (has_b) pv_smem(o, k1_s + (kChunks - 1) * kChunkBytes, v1_desc);
        if (has_a2) {
          scores(sc, k0_desc, bars, 0, 4, true);
          wgmma_wait<1>();  // B's products are done: its chunks 0..3 and P_B (chunk 8) are free
          if (copier && has_b2) {
            const TilePages nb = pages_of(tile + 3);
            for (int j = 0; j < 4; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], nb, j);
            copy_chunk(kv, bx, k1_s, &bars[kChunks + 8], nb, 8);
          }
          scores(sc, k0_desc, bars, 4, 5, false);
          wgmma_wait<0>();
          fence_accumulators(sc);
          phase ^= 1;
        } else {
          wgmma_wait<0>();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        SEE_STAMP(5);
      } else {
        // ---- warpgroup 1: tile B, dims 256..511 ----
        named_barrier(kBarScaleA, kSeeThreads);  // A's reference and factor are known
        SEE_STAMP(1);
        const float m0 = m_s[row0], m1 = m_s[row0 + 8];
        const float a0 = scale_s[row0], a1 = scale_s[row0 + 8];
        float n0 = m0, n1 = m1, s0 = 0.f, s1 = 0.f;
        if (has_b) {
          float mx0, mx1;
          row_max(sc, tile + 1, mx0, mx1);
          n0 = moved(mx0, m0);
          n1 = moved(mx1, m1);
          exponentiate(sc, n0, n1, pk, s0, s1);
        }
        const float b0 = factor(m0, n0), b1 = factor(m1, n1);
        __syncwarp();
        if (c == 0) {
          m_s[row0] = n0;
          m_s[row0 + 8] = n1;
          scale_s[kRowsPairs + row0] = b0;
          scale_s[kRowsPairs + row0 + 8] = b1;
        }
        const float f0 = a0 * b0, f1 = a1 * b1;
        l0 = l0 * f0 + s0;
        l1 = l1 * f1 + s1;
        if (__any_sync(0xffffffffu, f0 != 1.f || f1 != 1.f)) rescale(f0, f1);
        named_barrier_arrive(kBarScaleB, kSeeThreads);
        SEE_STAMP(2);
        if (has_b) {
          store_p(pk, k1_s + (kChunks - 1) * kChunkBytes);  // B's RoPE chunk: its scores are done
          if (valid_b < kKeysPerTile) zero_tail(k1_s, valid_b);  // (its fence covers P_B too)
          else fence_proxy_async();
          pv_regs(o, pk, v1_desc);
        }
        named_barrier(kBarPA, kSeeThreads);  // P_A is in A's RoPE chunk
        SEE_STAMP(3);
        if (valid_a < kKeysPerTile) zero_tail(k0_s, valid_a);
        pv_smem(o, k0_s + (kChunks - 1) * kChunkBytes, v0_desc);
        named_barrier_arrive(kBarPB, kSeeThreads);
        if (has_b) {
          wgmma_wait<1>();  // B's products are done: its chunks 4..7 are free
          if (copier && has_b2) {
            const TilePages nb = pages_of(tile + 3);
            for (int j = 4; j < 8; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], nb, j);
            bad_pages |= nb.bad;
          }
        }
        wgmma_wait<0>();  // A's products are done: its chunks 4..8 are free
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        SEE_STAMP(4);
        if (copier && has_a2) {
          const TilePages na = pages_of(tile + 2);
          for (int j = 4; j < kChunks; ++j) copy_chunk(kv, bx, k0_s, &bars[j], na, j);
        }
        if (has_b2) {
          scores(sc, k1_desc, bars + kChunks, 4, kChunks, true);  // its own copies (4..7) first
          wgmma_wait<0>();
          fence_accumulators(sc);
          phase ^= 1;
        }
        SEE_STAMP(5);
      }
#endif  // MLA_HOPPER_SEESAW_CROSS
#if MLA_HOPPER_TIMELINE
      ++stamp_tile;
#endif
    }

    if (bad_pages) atomicOr(bad_flag, 1);
    // The sums: of this thread's quad by shuffles, of the two warpgroups through shared memory.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (c == 0) {
      l_s[wg * kRowsPairs + row0] = l0;
      l_s[wg * kRowsPairs + row0 + 8] = l1;
    }
    named_barrier(kBarSeeBoth, kSeeThreads);  // both halves' sums, the last reference, the unit's flag
    const bool bad = *bad_flag != 0;

    // Write the unit: whole -> out and lse (its rows staged in Q's region, then
    // whole lines); cut -> this block's partial slot (its dims, 32-byte sectors).
    const bool whole = t0 == 0 && t1 == unit_tiles(p, u);
    const int slot = u == first_share_unit ? 0 : 1;
    const int64_t part_row0 = ((int64_t)cur.share * 2 + slot) * kPairsPerBlock;
    const int dim0 = 256 * wg + c;
    if (whole) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int n = row0 + 8 * h2;
        const float inv = bad ? CUDART_NAN_F : 1.f / (l_s[n] + l_s[kRowsPairs + n]);
        if (h2 == 0) l0 = inv;
        else l1 = inv;
      }
      const int mat = lane / 8, n = row0 - g + 8 * (mat % 2) + lane % 8;
      const uint32_t row_s = q_s + n * kSeeOutRowBytes + 2 * 256 * wg;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 8; i += 2)
          stmatrix_x4(row_s + 2 * (64 * j + 8 * (i + mat / 2)), pack_bf16x2(o[j][4 * i] * l0, o[j][4 * i + 1] * l0),
                      pack_bf16x2(o[j][4 * i + 2] * l1, o[j][4 * i + 3] * l1),
                      pack_bf16x2(o[j][4 * i + 4] * l0, o[j][4 * i + 5] * l0),
                      pack_bf16x2(o[j][4 * i + 6] * l1, o[j][4 * i + 7] * l1));
      named_barrier(kBarSeeBoth, kSeeThreads);
      // Each warp copies whole rows, 512 bytes a store instruction.
      for (int n2 = threadIdx.x / 32; n2 < n_pairs; n2 += kSeeThreads / 32) {
        const int pr = pair0 + n2, t = pr / p.num_heads, h = pr % p.num_heads;
        bf16* dst = out_head(p, b, t, h);
        const unsigned char* src = smem + kSOffQ + n2 * kSeeOutRowBytes;
#pragma unroll
        for (int k = 0; k < 2; ++k)
          *reinterpret_cast<uint4*>(dst + 8 * (lane + 32 * k)) = *reinterpret_cast<const uint4*>(src + 16 * (lane + 32 * k));
      }
      if (threadIdx.x < n_pairs) {
        const int n2 = threadIdx.x, pr = pair0 + n2, t = pr / p.num_heads, h = pr % p.num_heads;
        const float l = l_s[n2] + l_s[kRowsPairs + n2];
        *lse_at(p, b, t, h) = bad ? CUDART_NAN_F : (m_s[n2] + log2f(l)) * 0.6931471805599453f;
      }
    } else {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int n = row0 + 8 * h2;
        if (n >= n_pairs) continue;
        const float l = l_s[n] + l_s[kRowsPairs + n];
        const bool empty_part = l == 0.f;
        const float inv = bad ? CUDART_NAN_F : 1.f / l;
        float* dst = p.o_partial + (part_row0 + n) * kDimV + dim0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<float2*>(dst + 64 * j + 8 * i) =
                empty_part && !bad ? make_float2(0.f, 0.f)
                                   : make_float2(o[j][4 * i + 2 * h2] * inv, o[j][4 * i + 2 * h2 + 1] * inv);
        if (wg == 0 && c == 0)
          p.lse_partial[part_row0 + n] = bad ? CUDART_NAN_F
                                         : empty_part ? -CUDART_INF_F
                                                      : (m_s[n] + log2f(l)) * 0.6931471805599453f;
      }
    }
    // (The next unit's Q load begins with a barrier of both warpgroups: nobody
    // overwrites the staged rows, the sums or the reference before they are read.)
  }
#undef SEE_STAMP
}

#endif  // MLA_SM90A

#if MLA_SM90A
// The main kernel's body in either layout.
// kTma: the loader copies whole tiles by TMA where the cache allows it
// (kv.box_keys != 0); kFewerFences: the compute warps leave the fence of the
// chunks gathered with cp.async to the gatherers.
template <bool kRows, bool kTma, bool kFewerFences>
__device__ __forceinline__ void hopper_main(const MlaParams& p, const KvTensor& kv) {
  constexpr int kSlots = kRows ? kRowsRing : kRing;
  extern __shared__ unsigned char smem_raw[];
  // Align to 1024 by pointer arithmetic on smem_raw itself, so the compiler still
  // knows every pointer below is shared memory (LDS/STS, not generic loads).
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + (kRows ? kROffBars : kOffBars));
  uint64_t* empty = full + kSlots;
  // The warpgroup, read through a shuffle so the compiler knows it is the same
  // in every lane: a branch on it is then not divergent, and wgmma stays unserialised.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);

  const bool tma = kTma && kCopyKeys && kv.box_keys != 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      // TMA: one arrival (with the bytes to expect); cp.async: every loader thread, once its copies have landed.
      mbar_init(&full[s], tma ? 1 : 128);
      mbar_init(&empty[s], 8);    // every compute warp arrives once its wgmmas are done
    }
    if (tma) {  // the TMA loader's progress counters
      int* progress = reinterpret_cast<int*>(smem + (kRows ? kROffPlan : kOffPlan)) + kPlanWords;
      progress[0] = progress[1] = 0;
    }
    if (tma) fence_proxy_async();  // the barriers' initial state, visible to the bulk copies that complete on them
  }
  // Launched early behind the stream's previous kernel, which may still be
  // writing q, the cache or kv_lens: wait for it before reading any of them.
  wait_for_previous_grid();
  BLOCK0_STAMP(threadIdx.x == 0, 0);
  if (kCallPart == 1) return;
  const Shape sh = shape_of(p);
  Cursor cur;
  int C;
  plan_share(p, sh, reinterpret_cast<int*>(smem + (kRows ? kROffPlan : kOffPlan)), cur, C);  // its last barrier publishes the mbarriers too
  BLOCK0_STAMP(threadIdx.x == 0, 1);
  if (blockIdx.x >= C || kCallPart == 2) return;  // no share for this block (the whole block leaves together)

  if (wg == 0) {
    release_registers<kLoaderRegs>();
    if (!tma)
      load_keys<kSlots>(p, cur, smem, full, empty);
    else if (kTmaFirst && threadIdx.x < 32)
      load_keys_tma_first<kSlots>(p, cur, smem, full, empty, kv);
    else if (!kTmaFirst && threadIdx.x < 96)  // warp 0 issues, warps 1 and 2 gather
      load_keys_tma<kSlots>(p, cur, smem, full, empty, kv,
                            reinterpret_cast<const int*>(smem + (kRows ? kROffPlan : kOffPlan)) + kPlanWords);
  } else {
    claim_registers<kComputeRegs>();
    if (kRows)
      compute_rows(p, sh, cur, smem, full, empty, wg - 1, blockIdx.x);
    else if (wg == 2 && sh.per_group <= kPairsPerGroup)
      pass_chunks(p, cur, empty, full);  // a stream of <= 40 pairs: the second warpgroup has none
    else
      compute<kFewerFences>(p, sh, cur, smem, full, empty, wg - 1, blockIdx.x, tma);
  }
  MAIN_STAMP(1);
  // This thread's writes are done: the combine may be launched once every
  // block is here (it still waits for the whole grid before reading).
  launch_dependents();
}
#endif

__global__ void __launch_bounds__(kThreads, 1) hopper_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  MAIN_STAMP(0);
  hopper_main<false, kUseTma, kFenceGatheredOnly>(p, kv);
#else
  __trap();
#endif
}

#if MLA_HOPPER_DISPATCH
// The op's kernel for long calls (tma_pays): the same, fed by the tensor copy.
__global__ void __launch_bounds__(kThreads, 1) hopper_tma_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  MAIN_STAMP(0);
  hopper_main<false, true, true>(p, kv);
#else
  __trap();
#endif
}
#endif

#if MLA_HOPPER_ROWS
// The same kernel in the rows layout (built only with MLA_HOPPER_ROWS).
__global__ void __launch_bounds__(kThreads, 1) hopper_rows_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  hopper_main<true, kUseTma, kFenceGatheredOnly>(p, kv);
#else
  __trap();
#endif
}
#endif

#if MLA_HOPPER_SEESAW
// The op's kernel where a stream's pairs fill tiles of 64 and the tensor copy
// reads the cache (seesaw_layout): two warpgroups and no loader, the same
// scheduler, partials and merges as hopper_kernel.  kWholeTiles: compiled for
// tiles of one box whose chunks come four to a copy (see_whole_tiles).
template <bool kWholeTiles>
__device__ __forceinline__ void seesaw_kernel(const MlaParams& p, const KvTensor& kv) {
#if MLA_SM90A
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kSOffBars);
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2 * kChunks; ++s) mbar_init(&bars[s], 1);  // one arrival: the copier's, with its bytes
    fence_proxy_async();  // the barriers' initial state, visible to the copies that complete on them
  }
  wait_for_previous_grid();  // (launched early behind the stream's previous kernel: see hopper_main)
  // Launched only where seesaw_layout holds, so its shape is known and the
  // rule is not asked again here: the op's kernel is then the build's, the
  // same instructions (as first written it asked, and ptxas scheduled the rest
  // of the kernel a little differently from the build's, see chapter 10).
  const Shape sh = shape_in(p, true);
  Cursor cur;
  int C;
  plan_share<kSeeThreads, true, true>(p, sh, reinterpret_cast<int*>(smem + kSOffPlan), cur, C);  // its barriers publish the mbarriers
  if (blockIdx.x >= C) return;
  seesaw<kWholeTiles>(p, sh, cur, smem, kv);
  launch_dependents();
#else
  __trap();
#endif
}
// With MLA_HOPPER_SEESAW_WHOLE, the kernel of whole tiles; else the only one, which asks.
__global__ void __launch_bounds__(kSeeThreads, 1) hopper_seesaw_kernel(const MlaParams p,
                                                                      const __grid_constant__ KvTensor kv) {
  seesaw_kernel<MLA_HOPPER_SEESAW_WHOLE != 0>(p, kv);
}
#if MLA_HOPPER_SEESAW_WHOLE
// Every other cache the seesaw reads: pages of 16 or 32 keys, or a four-chunk map the driver refused.
__global__ void __launch_bounds__(kSeeThreads, 1) hopper_seesaw_any_pages_kernel(const MlaParams p,
                                                                                const __grid_constant__ KvTensor kv) {
  seesaw_kernel<false>(p, kv);
}
#endif
#endif

// ---- the combine kernel: merge the partials of each cut unit --------------------------

// A block merges a slice of the dims of one pair of one cut unit: its 256
// threads first turn each piece's lse into a weight (one piece per thread),
// then split into rows that each add every so-many-th piece, a thread holding
// four dims, with four loads in flight, and shared memory adds the rows (in the
// merges' one order, kMergeRows, whatever the rows of threads).
// A unit cut into many pieces (one stream at 8 heads: a piece per block of
// the grid, up to 256) is merged in four slices of 128 dims, which puts four
// times as many SMs on its reads (12 -> 8.5 us at 129 pieces); units cut into
// a few pieces are merged whole, so that the grid stays small.  Only the host
// chooses (combine_slices), before the pieces are known: four slices of 8 units
// of 16 or 17 pieces (8 streams of 1024 keys at 8 heads) made a grid of 2560
// blocks, 5 to 7 us slower on the H200 than merging whole pairs in 640, and the
// block table's width bounds a unit's pieces, which is how the host sees that
// case.  (Choosing again in the kernel, per cut unit, was tried: a branch that a
// call with nothing cut never took still cost one-stream calls 1 to 3 us.)
// A sliced grid is 320 blocks a unit.  ptxas gave this kernel 48 registers, so
// five blocks of 256 threads fit on an SM: past two units (960 blocks) the grid
// needs a second wave on the H200's 132 SMs.  There its blocks are of 128
// threads, ten to an SM, each adding its pieces in four rows instead of eight:
// on the H200, 8 streams of 4096 keys at 8 heads 45.0 -> 41.1 us, 4 streams of
// 2000 at 16 heads 34.2 -> 30.0, one stream of 4096 at 64 heads 41.7 -> 37.6.
// One stream keeps 256 (a unit of up to 132 pieces: 128 threads cost 12% at
// 16384 keys), and so does the grid of one block a pair.  (Since every merge
// sums in one order, kMergeRows, the kernel takes 58 registers and four blocks
// of 256 an SM: the narrow blocks were chosen at 48.)
constexpr int kCombineThreads = 256;
constexpr int kNarrowCombineThreads = 128;
constexpr int kManySlices = 4;

constexpr int kSlicedPieces = 32;  // a unit that can be cut into this many pieces gets a grid of slices

// The host's choice of grid: four blocks per pair where few units share it and
// a unit can be cut into many pieces (the block table's width bounds a unit's
// tiles, and so its pieces), or where at most two units share it.
__host__ __device__ constexpr int combine_slices(int num_splits, int units, int64_t unit_tiles_bound) {
  return num_splits >= 16 * units && (units <= 2 || unit_tiles_bound >= kSlicedPieces) ? kManySlices : 1;
}
#ifndef MLA_HOPPER_WIDE_COMBINE
#define MLA_HOPPER_WIDE_COMBINE 0  // 1: every merge block of 256 threads, as first written (the build wide_combine)
#endif
__host__ __device__ constexpr int combine_threads(int slices, int units) {
  return slices > 1 && units > 2 && !MLA_HOPPER_WIDE_COMBINE ? kNarrowCombineThreads : kCombineThreads;
}
// Where the units are cut into a few pieces each (num_splits at most three
// times the units), hopper_merge_by_warps_kernel merges them instead: a warp
// each pair, eight pairs to a block, so that a pair's two or three pieces are
// one trip of loads.  A block of 256 threads per pair spent its barriers on
// those few pieces, and with many units its grid took several waves (8 streams
// of 64 heads: 64 cut units, 5120 blocks at 5 an SM, about 8).  With fewer
// units a unit has more pieces, which a block per pair loads eight at a time
// and a warp two, and its grid is a wave or two: there the block per pair is
// kept (on the H200, the warp per pair was 3 to 16% slower at 8 to 16 units).
#ifndef MLA_HOPPER_BLOCK_PER_PAIR_MERGE
#define MLA_HOPPER_BLOCK_PER_PAIR_MERGE 0  // 1: a block per pair everywhere (the build block_per_pair_merge)
#endif
constexpr int kPairsPerWarpMergeBlock = kCombineThreads / 32;
__host__ __device__ constexpr bool combine_by_warps(int num_splits, int units) {
  return !MLA_HOPPER_BLOCK_PER_PAIR_MERGE && num_splits <= 3 * units;
}
static_assert(kPairsPerBlock % kPairsPerWarpMergeBlock == 0, "a unit's pairs fill whole merge blocks");

// A cut unit as the plan lists it, read once by the whole combine block.
struct CutUnit {
  int W, C;        // the plan's tiles and blocks
  int u, c0;       // the unit and the first block of its pieces
  int pieces;
};

// The order of a merge's sums, the same in every merge of this file whatever
// its grid, so that a pair's answer does not depend on which merge ran it (the
// host picks one from the call's shape, which padding a batch to a captured
// bucket changes): the pieces fall into kMergeRows rows, piece i into row
// i % kMergeRows; a row adds its pieces' weighted partials in the order of the
// pieces, a fused multiply-add each, from zero; the rows are then added one
// after another, row 0 first.  The weights are summed the same way.
constexpr int kMergeRows = 8;
__device__ __forceinline__ void merge_add(float4& acc, float w, const float4& a) {
  acc.x = fmaf(w, a.x, acc.x); acc.y = fmaf(w, a.y, acc.y); acc.z = fmaf(w, a.z, acc.z); acc.w = fmaf(w, a.w, acc.w);
}
__device__ __forceinline__ float4 merge_rows(const float4& s, const float4& a) {
  return make_float4(__fadd_rn(s.x, a.x), __fadd_rn(s.y, a.y), __fadd_rn(s.z, a.z), __fadd_rn(s.w, a.w));
}

// Which pair a merge's place `local` among cut unit u's pairs stands for: its
// stream b, draft row t and head h; false past the unit's pairs.
__device__ __forceinline__ bool merged_pair(const MlaParams& p, int local, int u, int& b, int& t, int& h) {
  const Shape sh = shape_of(p);
  const int grp = u / p.batch;
  const int group = local / kPairsPerGroup, in_group = local % kPairsPerGroup;
  const int pair0 = grp * sh.per_group + group * kPairsPerGroup;
  const int n_group = max(0, min(kPairsPerGroup, min(sh.per_group - group * kPairsPerGroup, sh.pairs - pair0)));
  if (in_group >= n_group) return false;
  const int pr = pair0 + in_group;
  b = u % p.batch, t = pr / p.num_heads, h = pr % p.num_heads;
  return true;
}

// The partial row of each piece of that pair.  Piece i came from block c0 + i,
// which wrote it to slot 1 if the unit was not the first of its share (only
// the first block can be in that case).
struct PieceRows {
  int c0, local;
  bool first_in_slot1;
  __device__ __forceinline__ PieceRows(const MlaParams& p, const CutUnit& cu, int local)
      : c0(cu.c0), local(local), first_in_slot1(share_start(cu.c0, cu.W, cu.C) < p.plan[kPlanHeader + cu.u]) {}
  __device__ __forceinline__ int64_t operator()(int i) const {
    return ((int64_t)(c0 + i) * 2 + (i == 0 && first_in_slot1)) * kPairsPerBlock + local;
  }
};

template <int kSlices, int kBlockThreads>
__device__ __forceinline__ void combine_slice(const MlaParams& p, int local, int slice, const CutUnit& cu) {
  constexpr int kCols = kDimV / kSlices / 4;          // float4 columns of a slice: 32 or 128
  constexpr int kRows = kBlockThreads / kCols;        // pieces added side by side: 8, 4 or 2
  constexpr int kLsePerThread = (kMaxSplitsHere + kBlockThreads - 1) / kBlockThreads;  // 1 or 2
  const int tid = threadIdx.x, pieces = cu.pieces;
  int b, t, h;
  if (!merged_pair(p, local, cu.u, b, t, h)) return;
  const PieceRows row_of(p, cu, local);

  constexpr int kPer = kMergeRows / kRows;           // the order's rows each row of threads adds: 1, 2 or 4
  __shared__ float weight[kMaxSplitsHere];
  __shared__ float4 part[kMergeRows - kPer][kCols];  // the order's rows that row 0 of threads does not hold
  __shared__ float part_weight[kMergeRows];
  float ls[kLsePerThread];
  float ls_max = -CUDART_INF_F;
#pragma unroll
  for (int j = 0; j < kLsePerThread; ++j) {
    const int i = tid + j * kBlockThreads;
    ls[j] = i < pieces ? p.lse_partial[row_of(i)] : -CUDART_INF_F;
    ls_max = fmaxf(ls_max, ls[j]);
  }
  const float mx = block_max<kBlockThreads>(ls_max);  // (a maximum is the same in any order)
#pragma unroll
  for (int j = 0; j < kLsePerThread; ++j) {
    const int i = tid + j * kBlockThreads;
    if (i < pieces) weight[i] = ls[j] == -CUDART_INF_F ? 0.f : __expf(ls[j] - mx);  // an empty piece weighs nothing
  }
  __syncthreads();  // weight[] published
  MERGE_STAMP(3);

  const int row = tid / kCols, col = tid % kCols;
  const int dim0 = slice * (kDimV / kSlices) + 4 * col;
  // Row `row` of threads adds the order's rows row, row + kRows, ...: piece i
  // of this thread's loop below belongs to the order's row i % kMergeRows.
  float4 acc[kPer] = {};
  float wsum[kPer] = {};
  // kBatch pieces are loaded before any of them is added, so that their trips
  // to L2 overlap.  (Loaded and added one at a time, behind a branch on the
  // weight, each load waited for the one before: at 132 pieces, 17 round trips
  // in a row were a large part of the merge.)  A piece that weighs nothing is
  // neither read nor added, and the sums are made in the same order as one at
  // a time, so the answer is the same to the bit.  Measured on the H200 against
  // one at a time: 4 saves 3 to 6% of a call of one stream at 8 heads and
  // loses nothing elsewhere; 8 saves twice that at one stream but takes twice
  // the registers (66), so the merges of many units, several blocks to an SM,
  // run fewer blocks at once and lose 4 to 8%; a prefetch of every piece into
  // L1 before the loop was slower everywhere.
  constexpr int kBatch = 4;
  static_assert(kBatch % kPer == 0 && kBatch * kRows % kMergeRows == 0, "a batch keeps every piece in its order's row");
  for (int i0 = row; i0 < pieces; i0 += kBatch * kRows) {
    float wk[kBatch];
    float4 a[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kRows;
      wk[k] = i < pieces ? weight[i] : 0.f;
      a[k] = wk[k] != 0.f ? *reinterpret_cast<const float4*>(p.o_partial + row_of(i) * kDimV + dim0)
                          : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (wk[k] != 0.f) {
        merge_add(acc[k % kPer], wk[k], a[k]);
        wsum[k % kPer] += wk[k];
      }
  }
  // Row 0 of threads holds the order's rows 0, kRows, ...; the others go through shared memory.
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    if (row > 0) part[(row - 1) * kPer + q][col] = acc[q];
    if (col == 0) part_weight[row + q * kRows] = wsum[q];
  }
  __syncthreads();
  MERGE_STAMP(4);
  if (row == 0) {
    float4 sum = acc[0];
    float weight_sum = part_weight[0];
#pragma unroll
    for (int r = 1; r < kMergeRows; ++r) {  // the order's rows, one after another
      const float4 a = r % kRows == 0 ? acc[r / kRows] : part[(r % kRows - 1) * kPer + r / kRows][col];
      sum = merge_rows(sum, a);
      weight_sum = __fadd_rn(weight_sum, part_weight[r]);
    }
    const float inv = 1.f / weight_sum;
    uint2 packed;
    packed.x = pack_bf16x2(sum.x * inv, sum.y * inv);
    packed.y = pack_bf16x2(sum.z * inv, sum.w * inv);
    *reinterpret_cast<uint2*>(out_head(p, b, t, h) + dim0) = packed;
    if (slice == 0 && col == 0) *lse_at(p, b, t, h) = mx + logf(weight_sum);
  }
}

// One warp merges one pair of a cut unit (`local`, its place among the unit's
// pairs), the whole 512 dims: a lane holds 16 of them, in four float4 128 dims
// apart, so that each load of the warp reads 512 contiguous bytes of a piece.
// A lane first takes the lse of pieces lane, lane + 32, ...; their weights go
// to the warp's own row of `weight` in shared memory, which every lane then
// reads as it adds the pieces in the merges' one order.  No block barrier.
__device__ __forceinline__ void combine_pair_by_warp(const MlaParams& p, int local, const CutUnit& cu,
                                                     float* weight) {
  constexpr int kBatch = 2;
  const int lane = threadIdx.x % 32, pieces = cu.pieces;
  int b, t, h;
  if (!merged_pair(p, local, cu.u, b, t, h)) return;  // (the same in the whole warp)
  const PieceRows row_of(p, cu, local);

  const float lse0 = lane < pieces ? p.lse_partial[row_of(lane)] : -CUDART_INF_F;
  float mx = lse0;
  for (int i = lane + 32; i < pieces; i += 32) mx = fmaxf(mx, p.lse_partial[row_of(i)]);
  mx = warp_max(mx);
  for (int i = lane; i < pieces; i += 32) {  // (lse0 again for the first 32: the same value)
    const float l = i == lane ? lse0 : p.lse_partial[row_of(i)];
    weight[i] = l == -CUDART_INF_F ? 0.f : __expf(l - mx);  // an empty piece weighs nothing
  }
  __syncwarp();
  MERGE_STAMP(3);
  // In the order of the merges (kMergeRows): with at most kMergeRows pieces a
  // row holds one piece, and the order is piece after piece, each product
  // rounded and then added, two pieces' loads in flight before either is
  // added; with more, row after row.
  const float4* base = reinterpret_cast<const float4*>(p.o_partial) + lane;
  float4 sum[4] = {};
  float weight_sum = 0.f;
  if (pieces <= kMergeRows) {
    for (int j = 0; j < pieces; j += kBatch) {
      float wk[kBatch];
      float4 a[kBatch][4];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        wk[k] = j + k < pieces ? weight[j + k] : 0.f;
        const float4* src = base + row_of(j + k) * (kDimV / 4);
#pragma unroll
        for (int c = 0; c < 4; ++c) a[k][c] = wk[k] != 0.f ? src[32 * c] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (wk[k] != 0.f) {
#pragma unroll
          for (int c = 0; c < 4; ++c)  // a row of one piece is its product, rounded
            sum[c] = merge_rows(sum[c], make_float4(__fmul_rn(wk[k], a[k][c].x), __fmul_rn(wk[k], a[k][c].y),
                                                    __fmul_rn(wk[k], a[k][c].z), __fmul_rn(wk[k], a[k][c].w)));
          weight_sum += wk[k];
        }
    }
  } else {  // (rare here: this merge runs where units are cut into a few pieces each)
    // A float4 of the lane's dims at a time, one piece's load at a time: few registers.
#pragma unroll
    for (int c = 0; c < 4; ++c)
      for (int r = 0; r < kMergeRows; ++r) {
        float4 acc = {};
        float wrow = 0.f;
        for (int i = r; i < pieces; i += kMergeRows) {
          const float wi = weight[i];
          if (wi == 0.f) continue;
          merge_add(acc, wi, base[row_of(i) * (kDimV / 4) + 32 * c]);
          wrow += wi;
        }
        sum[c] = merge_rows(sum[c], acc);
        if (c == 0) weight_sum = __fadd_rn(weight_sum, wrow);
      }
  }
  MERGE_STAMP(4);
  const float inv = 1.f / weight_sum;
  bf16* dst = out_head(p, b, t, h) + 4 * lane;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint2 packed;
    packed.x = pack_bf16x2(sum[c].x * inv, sum[c].y * inv);
    packed.y = pack_bf16x2(sum[c].z * inv, sum[c].w * inv);
    *reinterpret_cast<uint2*>(dst + 128 * c) = packed;
  }
  if (lane == 0) *lse_at(p, b, t, h) = mx + logf(weight_sum);
}

#if MLA_SM90A
// Both merge kernels begin alike: wait for the main kernel, then read their
// cut unit (blockIdx.y) from the plan.  False where the block has none.
__device__ __forceinline__ bool cut_unit_of_block(const MlaParams& p, CutUnit& cu) {
  MERGE_STAMP(0);
  wait_for_previous_grid();
  MERGE_STAMP(1);
  if (kCallPart == 1) return false;
  const int k = blockIdx.y;  // cut unit
  const int n_cut = p.plan[2];
  if (k >= n_cut) return false;  // (the words past the cut list were not written by this call)
  MERGE_STAMP(2);
  const int* cut = p.plan + kPlanHeader + shape_of(p).units + 1 + 3 * k;
  cu = {p.plan[0], p.plan[1], cut[0], cut[1], cut[2] - cut[1] + 1};
  return true;
}
#endif

__global__ void __launch_bounds__(kCombineThreads) hopper_combine_kernel(const MlaParams p) {
#if MLA_SM90A
  CutUnit cu;
  if (!cut_unit_of_block(p, cu)) return;
  if (gridDim.x == kPairsPerBlock)
    combine_slice<1, kCombineThreads>(p, blockIdx.x, 0, cu);
  else if (blockDim.x == kNarrowCombineThreads)
    combine_slice<kManySlices, kNarrowCombineThreads>(p, blockIdx.x / kManySlices, blockIdx.x % kManySlices, cu);
  else
    combine_slice<kManySlices, kCombineThreads>(p, blockIdx.x / kManySlices, blockIdx.x % kManySlices, cu);
#else
  __trap();
#endif
}

// The merge of whole pairs by warps, a kernel of its own so that its registers
// and its schedule leave hopper_combine_kernel's as they were: with two pieces
// in flight (eight float4 a lane) it wants more than the combine's 48, and in
// one kernel ptxas either gave every merge the larger count or, held to 48,
// stopped keeping the combine's four pieces in flight.  Held to three blocks
// of 256 an SM (at most 80 registers: at 64, the sums in the merges' one order
// spilled), 64 units take two waves.
__global__ void __launch_bounds__(kCombineThreads, 3) hopper_merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  __shared__ float weight[kPairsPerWarpMergeBlock][kMaxSplitsHere];  // each warp's pieces' weights
  CutUnit cu;
  if (!cut_unit_of_block(p, cu)) return;
  const int warp = threadIdx.x / 32;
  combine_pair_by_warp(p, blockIdx.x * kPairsPerWarpMergeBlock + warp, cu, weight[warp]);
#else
  __trap();
#endif
}

// Launch with programmatic dependent launch when asked and the driver allows
// it, else plainly.
template <typename... Args>
cudaError_t launch(void (*kernel)(Args...), const LaunchGeometry& g, cudaStream_t stream, bool pdl, const Args&... args) {
  if (pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g.grid;
    cfg.blockDim = g.block;
    cfg.dynamicSmemBytes = g.dynamic_smem_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kernel, args...) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();  // not supported here: launch plainly
  }
  kernel<<<g.grid, g.block, g.dynamic_smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

// Whether a call of the op copies its tiles by TMA (hopper_tma_kernel): where
// the pages hold a multiple or a divisor of 64 keys, 16 at the least, and the
// block table's width lets each block have kTmaTilesPerBlock tiles or more.
// The lengths, which live on the GPU, cannot be asked: a batch with one long
// stream and short others counts as long.  (On the H200 the tensor copy with
// fewer fences took 0.92 to 0.97 of the cp.async kernel's time from about 30
// tiles a block, 0.97 to 1.0 from 12 to 20, 0.98 to 0.99 at 4 to 8, and 1.02 to
// 1.05 of it at one or two.)  The host also needs a tensor map of the cache
// (kv_tensor), which an unaligned cache does not get.
constexpr int kTmaTilesPerBlock = 12;
bool tma_pays(const MlaParams& p) {
  const Shape sh = shape_of(p);
  const int64_t tiles_bound = (int64_t)sh.units * unit_tiles_bound(p);
  return MLA_HOPPER_DISPATCH && !kUseTma && !sh.rows && tma_pages(p.page_size) &&
         tiles_bound >= (int64_t)kTmaTilesPerBlock * p.num_splits;
}
// The launch of hopper_kernel (hopper_rows_kernel in the rows layout).
LaunchGeometry cp_async_geometry(const MlaParams& p) {
  return {dim3(p.num_splits), dim3(kThreads), rows_layout(p.q_len * p.num_heads) ? kRowsSmemBytes : kSmemBytes};
}
LaunchGeometry main_geometry(const MlaParams& p) {
  if (tma_pays(p)) return {dim3(0), dim3(0), 0};      // not launched: hopper_tma_kernel is
  if (seesaw_layout(p)) return {dim3(0), dim3(0), 0};  // not launched: hopper_seesaw_kernel is
  return cp_async_geometry(p);
}
LaunchGeometry seesaw_geometry(const MlaParams& p) {
  if (!seesaw_layout(p)) return {dim3(0), dim3(0), 0};  // not launched: hopper_kernel or hopper_tma_kernel is
  return {dim3(p.num_splits), dim3(kSeeThreads), kSeeSmemBytes};
}
LaunchGeometry tma_geometry(const MlaParams& p) {
  if (!tma_pays(p)) return {dim3(0), dim3(0), 0};  // not launched: hopper_kernel is
  return {dim3(p.num_splits), dim3(kThreads), kTmaSmemBytes};
}
// The merge's slices for a call: the block table's width bounds a unit's tiles.
int call_slices_10(const MlaParams& p) {
  return combine_slices(p.num_splits, shape_of(p).units, unit_tiles_bound(p));
}
// Whether any unit may be cut between blocks: not where the block table is too
// narrow for any stream to hold more than one tile.  Such a call launches no
// merge at all (each of its units is one block's, written straight to out).
bool may_cut_10(const MlaParams& p) { return unit_tiles_bound(p) > 1; }
// Which of the two merge kernels a call launches: the merge by warps only in
// an unsliced grid where the units are cut into a few pieces each.
bool merge_by_warps_10(const MlaParams& p) {
  return call_slices_10(p) == 1 && combine_by_warps(p.num_splits, shape_of(p).units);
}
// One block per (dim slice of a pair of a unit, cut unit).  At most one unit per
// block boundary is cut, and no more units than there are: for one stream, one row of blocks.
LaunchGeometry combine_geometry_10(const MlaParams& p) {
  if (!may_cut_10(p)) return {dim3(0), dim3(0), 0};        // not launched: nothing to merge
  if (merge_by_warps_10(p)) return {dim3(0), dim3(0), 0};  // not launched: the merge by warps is
  const int units = shape_of(p).units;
  const int slices = call_slices_10(p);
  return {dim3(kPairsPerBlock * slices, std::min(p.num_splits, units)), dim3(combine_threads(slices, units)), 0};
}
LaunchGeometry merge_by_warps_geometry_10(const MlaParams& p) {
  if (!may_cut_10(p)) return {dim3(0), dim3(0), 0};        // not launched: nothing to merge
  if (!merge_by_warps_10(p)) return {dim3(0), dim3(0), 0};  // not launched: hopper_combine_kernel is
  return {dim3(kPairsPerBlock / kPairsPerWarpMergeBlock, std::min(p.num_splits, shape_of(p).units)),
          dim3(kCombineThreads), 0};
}

// The cache's tensor map for this call, or box_keys = 0 where TMA cannot read
// it.  The driver's encoder is found once; the last map made on this thread is
// kept, so a stream of calls on one cache encodes it once.
KvTensor kv_tensor(const MlaParams& p) {
  KvTensor kv = {};
  const int box_keys = std::min(p.page_size, kKeysPerTile);
  if (!tma_cache(p)) return kv;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return kv;
  struct Key {
    const void* kv;
    int64_t page_size, num_pages, stride_slot, stride_page;
    bool same(const Key& o) const {
      return kv == o.kv && page_size == o.page_size && num_pages == o.num_pages && stride_slot == o.stride_slot &&
             stride_page == o.stride_page;
    }
  };
  thread_local Key last_key = {};
  thread_local KvTensor last = {};
  const Key key = {p.kv, p.page_size, p.num_pages, p.kv_stride_slot, p.kv_stride_page};
  if (last.box_keys != 0 && key.same(last_key)) return last;
  const cuuint64_t dims[3] = {(cuuint64_t)kDimQK, (cuuint64_t)p.page_size, (cuuint64_t)p.num_pages};
  const cuuint64_t strides[2] = {(cuuint64_t)p.kv_stride_slot * 2, (cuuint64_t)p.kv_stride_page * 2};  // bytes
  const cuuint32_t box[3] = {kChunkDims, (cuuint32_t)box_keys, 1}, elem_strides[3] = {1, 1, 1};
  if (encode(&kv.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(p.kv), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return KvTensor{};
  kv.box_keys = box_keys;
#if MLA_HOPPER_COPY_BOXES
  // The four-chunk boxes, where a tile is one page's 64 keys: the chunks are a
  // dimension of their own, 128 bytes apart, between the keys and the pages.
  kv.chunk_boxes = 0;
  if (box_keys == kKeysPerTile) {
    const cuuint64_t dims4[4] = {(cuuint64_t)kChunkDims, (cuuint64_t)p.page_size, (cuuint64_t)kChunks,
                                 (cuuint64_t)p.num_pages};
    const cuuint64_t strides4[3] = {(cuuint64_t)p.kv_stride_slot * 2, (cuuint64_t)kChunkDims * 2,
                                    (cuuint64_t)p.kv_stride_page * 2};
    const cuuint32_t box4[4] = {kChunkDims, (cuuint32_t)kKeysPerTile, 4, 1}, elem_strides4[4] = {1, 1, 1, 1};
    if (encode(&kv.map4, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(p.kv), dims4, strides4, box4,
               elem_strides4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS)
      kv.chunk_boxes = 1;  // (refused, the groups of four are copied chunk by chunk, on the same barriers)
  }
#endif
  last_key = key;
  last = kv;
  return kv;
}

#if MLA_HOPPER_SEESAW
// The seesaw kernel that reads this cache: with MLA_HOPPER_SEESAW_WHOLE, the
// one compiled for whole tiles wherever a tile is one box of 64 keys copied
// four chunks at once, else the one that asks.
void (*seesaw_kernel_for(const KvTensor& kv))(const MlaParams, const KvTensor) {
#if MLA_HOPPER_SEESAW_WHOLE
  if (kv.box_keys != kKeysPerTile || !kv.chunk_boxes) return hopper_seesaw_any_pages_kernel;
#endif
  (void)kv;
  return hopper_seesaw_kernel;
}
#endif

}  // namespace

// num_splits is the persistent grid: how many blocks share the work (one per SM by default).
cudaError_t hopper_launch(const MlaParams& p, cudaStream_t stream) {
  MlaParams q = p;  // with this call's scratch filled in
  const Shape sh = shape_of(q);
  const int64_t slots = (int64_t)q.num_splits * 2 * kPairsPerBlock;
  q.o_partial = static_cast<float*>(q.scratch(q.scratch_ctx, slots * kDimV * 4));
  q.lse_partial = static_cast<float*>(q.scratch(q.scratch_ctx, slots * 4));
  q.plan = static_cast<int*>(q.scratch(q.scratch_ctx, (kPlanHeader + sh.units + 1 + 3 * (int64_t)q.num_splits) * 4));
  if (!q.o_partial || !q.lse_partial || !q.plan) return cudaErrorMemoryAllocation;
  static bool opted_in[64] = {};  // the opt-in is made once per device (it is a per-context attribute)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= 64 || !opted_in[device]) {
    err = cudaFuncSetAttribute(hopper_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
#if MLA_HOPPER_DISPATCH
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(hopper_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTmaSmemBytes);
#endif
#if MLA_HOPPER_ROWS
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(hopper_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRowsSmemBytes);
#endif
#if MLA_HOPPER_SEESAW
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(hopper_seesaw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSeeSmemBytes);
#if MLA_HOPPER_SEESAW_WHOLE
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(hopper_seesaw_any_pages_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 kSeeSmemBytes);
#endif
#endif
    if (err != cudaSuccess) return err;
    if (device < 64) opted_in[device] = true;
  }
  const bool pdl = q.pdl != 0;
#if MLA_HOPPER_ROWS
  auto* main_kernel = sh.rows ? hopper_rows_kernel : hopper_kernel;
#else
  auto* main_kernel = hopper_kernel;
#endif
#if MLA_HOPPER_SEESAW
  if (seesaw_layout(q)) {
    const KvTensor kv = kv_tensor(q);
    if (kv.box_keys != 0)
      err = launch(seesaw_kernel_for(kv), seesaw_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gathered, in the same units of 64 pairs
      err = launch(hopper_kernel, LaunchGeometry{dim3(q.num_splits), dim3(kThreads), kSmemBytes}, stream, pdl, q,
                   KvTensor{});
  } else
#endif
#if MLA_HOPPER_DISPATCH
  if (tma_pays(q)) {
    const KvTensor kv = kv_tensor(q);
    if (kv.box_keys != 0)
      err = launch(hopper_tma_kernel, tma_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gather
      err = launch(hopper_kernel, cp_async_geometry(q), stream, pdl, q, KvTensor{});
  } else
#endif
    err = launch(main_kernel, main_geometry(q), stream, pdl, q, kUseTma ? kv_tensor(q) : KvTensor{});
  // The main kernel lets the combine launch only as its blocks finish: let go
  // at their start, the combine's blocks waited on the few SMs the main
  // kernel leaves free, crowded there eight to an SM, and started the merge
  // from those (this cost 5 us at one stream of 16384 keys).
  if (err == cudaSuccess && kCallPart != 3 && may_cut_10(q))
    err = merge_by_warps_10(q) ? launch(hopper_merge_by_warps_kernel, merge_by_warps_geometry_10(q), stream, pdl, q)
                               : launch(hopper_combine_kernel, combine_geometry_10(q), stream, pdl, q);
  return err;
}

#if MLA_HOPPER_TIMELINE
// The stamps of the last call, [2][kStampTiles][kStampEvents] floats (0 where
// no tile), into `host`, which holds `capacity` floats.
cudaError_t hopper_timeline_read(float* host, int capacity) {
  if (capacity < int(sizeof(tile_stamps) / sizeof(float))) return cudaErrorInvalidValue;
  return cudaMemcpyFromSymbol(host, tile_stamps, sizeof(tile_stamps));
}
cudaError_t hopper_timeline_clear() {
  static const float zeros[2][kStampTiles][kStampEvents] = {};
  return cudaMemcpyToSymbol(tile_stamps, zeros, sizeof(zeros));
}
#endif

#if MLA_HOPPER_MERGE_TIMELINE
// The stamps of the last call (0 where none was written): main_stamps into
// `main` ([kMaxSplitsHere][2]), merge_stamps into `merge` ([kMergeStampBlocks][kMergeEvents])
// and block0_stamps into `block0` ([kBlock0Events]).
cudaError_t hopper_merge_timeline_read(unsigned long long* main, int main_capacity, unsigned long long* merge,
                                       int merge_capacity, unsigned long long* block0, int block0_capacity) {
  if (main_capacity < kMaxSplitsHere * 2 || merge_capacity < kMergeStampBlocks * kMergeEvents ||
      block0_capacity < kBlock0Events)
    return cudaErrorInvalidValue;
  cudaError_t err = cudaMemcpyFromSymbol(main, main_stamps, sizeof(main_stamps));
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(merge, merge_stamps, sizeof(merge_stamps));
  return err == cudaSuccess ? cudaMemcpyFromSymbol(block0, block0_stamps, sizeof(block0_stamps)) : err;
}
cudaError_t hopper_merge_timeline_clear() {
  static const unsigned long long zeros[kMergeStampBlocks * kMergeEvents] = {};
  static_assert(sizeof(zeros) >= sizeof(main_stamps), "one buffer of zeros clears both");
  static_assert(sizeof(zeros) >= sizeof(block0_stamps), "and block 0's");
  cudaError_t err = cudaMemcpyToSymbol(main_stamps, zeros, sizeof(main_stamps));
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(block0_stamps, zeros, sizeof(block0_stamps));
  return err == cudaSuccess ? cudaMemcpyToSymbol(merge_stamps, zeros, sizeof(merge_stamps)) : err;
}
#endif

int hopper_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"hopper_kernel", (const void*)hopper_kernel, kThreads, main_geometry},
#if MLA_HOPPER_DISPATCH
      {"hopper_tma_kernel", (const void*)hopper_tma_kernel, kThreads, tma_geometry},
#endif
#if MLA_HOPPER_SEESAW
      {"hopper_seesaw_kernel", (const void*)hopper_seesaw_kernel, kSeeThreads, seesaw_geometry},
#endif
#if MLA_HOPPER_ROWS
      {"hopper_rows_kernel", (const void*)hopper_rows_kernel, kThreads, main_geometry},
#endif
      {"hopper_combine_kernel", (const void*)hopper_combine_kernel, kCombineThreads, combine_geometry_10},
      {"hopper_merge_by_warps_kernel", (const void*)hopper_merge_by_warps_kernel, kCombineThreads,
       merge_by_warps_geometry_10},
#if MLA_HOPPER_SEESAW && MLA_HOPPER_SEESAW_WHOLE
      {"hopper_seesaw_any_pages_kernel", (const void*)hopper_seesaw_any_pages_kernel, kSeeThreads, seesaw_geometry},
#endif
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
