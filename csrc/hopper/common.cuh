// What every Hopper stage (10 onwards) shares: the tile's geometry, the two
// shared-memory layouts (the tile on N, stages 10-13; the seesaw, 12-13), a
// call's units, and the test of which units the seesaw takes.
//
// Every piece under csrc/hopper/ sits in an anonymous namespace: each stage's
// file compiles its own copy, with its own rules, and keeps its kernels'
// symbols to itself.
#pragma once

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
constexpr int kBarGather = 6;                    // the TMA loader's gathering warps (compute: 1, 2)
constexpr int kPairsPerBlock = 2 * kPairsPerGroup;
constexpr int kRing = 15;                        // chunk slots: a tile in use and 6 chunks ahead
constexpr int kMinTilesPerBlock = 1;             // a share of one tile still pays: more blocks start at once
constexpr int kThreads = 384;                    // loader warpgroup + two compute warpgroups
constexpr int kLoaderRegs = 40, kComputeRegs = 232;
// setmaxnreg moves registers within the block's launch allocation (65536 / 384,
// rounded down to 8, per thread): a warpgroup's increase waits until the
// others' decreases have made room, so asking for more than there is waits
// forever.
static_assert(128 * kLoaderRegs + 256 * kComputeRegs <= kThreads * ((65536 / kThreads) & ~7),
              "the warpgroups' registers must fit the block's launch allocation");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kRescaleLog2 = 8.f;              // how far a score may pass the softmax reference before it moves

// ---- the tile on N's shared memory, from a 1024-byte aligned base (the swizzle repeats every 1024 bytes) ----
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
constexpr int kSmemBytes = kOffPlan + kPlanWords * 4 + 1024;       // + slack to align the base
constexpr int kTmaSmemBytes = kOffPlan + (kPlanWords + 2) * 4 + 1024;  // and the TMA loader's progress counters

// ---- the seesaw's shared memory: two whole key tiles, K0 and K1, and Q (64 pairs x 9 chunks); then the rows'
// shared softmax reference, each warpgroup's factor of its tile and its sums, the rows' lengths and rows in q, a
// barrier per chunk of each tile, the unit's bad-page flags, the page ids fetched ahead, the scheduler's words ----
constexpr int kRowsPairs = 64;                         // the M of wgmma: a seesaw unit's pairs
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

// A tile's chunks go through the ring RoPE first: position 0 holds dims
// 512..575 (only the scores need them), positions 1..8 hold V's dims 0..511.
// The ring hands slots out in order, and this is the order they come back:
// the RoPE chunk right after the scores, the V chunks one by one during P V.
// So the next tile's last chunks, which wait for this tile's first slots,
// start loading as early as possible.
__host__ __device__ constexpr int dims_of(int position) { return position == 0 ? kChunks - 1 : position - 1; }

// The plan the first idle block writes for the merge (int32 words of p.plan):
//   [0] W, the slots of all units; [1] blocks that get a share;
//   [2] units cut between blocks; [3 .. 3 + units] each unit's first slot in
//   the order of all slots (exclusive prefix sum; the last word is W);
//   then 3 words per cut unit: (unit, first block, last block).
// (A slot is a key tile, or a unit's start: see unit_start_slots.)
constexpr int kPlanHeader = 3;
constexpr int kMaxSplitsHere = 256;  // the op's limit on num_splits: the most pieces a unit can be cut into

// Clock stamps an experiment may take at fixed points of a kernel (see
// csrc/experiments/); the ops take none, and every hook compiles to nothing.
struct NoStamps {
  __device__ static void main(int) {}          // a main block's start (0) and end (1)
  __device__ static void block0(bool, int) {}  // block 0 on its way to its first tile's scores
  __device__ static void merge(int) {}         // a merge block on its way through its pieces
  struct Tiles {                               // a compute warpgroup of block 0, tile by tile
    __device__ explicit Tiles(int /* warpgroup */) {}
    __device__ void at(int /* event */) {}
    __device__ void next() {}
  };
};

// A call's units: a stream's (row, head) pairs, head fastest, cut into groups
// of at most kPairsPerBlock (the tile on N) or kRowsPairs (the seesaw, `rows`)
// of equal size; unit u = group * streams + stream.
struct Shape {
  int pairs;   // q_len * heads: (row, head) pairs of a stream, head fastest
  int groups;  // pair groups per stream
  int per_group;
  int units;   // streams * groups
  bool rows;   // groups of up to 64 pairs, on wgmma's M
};
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

// A call's shape under a stage's `Rule`, the test of whether the call runs the
// seesaw: every kernel of the call asks it, so that all agree on the units.
template <class Rule>
__host__ __device__ inline Shape shape_of(const MlaParams& p) {
  return shape_in(p, Rule::seesaw(p));
}
// The stages without a seesaw.
struct NoSeesaw {
  __host__ __device__ static bool seesaw(const MlaParams&) { return false; }
};

// Pairs that fill tiles of 64 on wgmma's M, padded to whole tiles: at most an
// eighth more rows than pairs, and 64 pairs or more; or, with a third, 48 or more.
__host__ __device__ constexpr bool fills_rows_eighth(int pairs) {
  return pairs >= kRowsPairs && 8 * ((pairs + kRowsPairs - 1) / kRowsPairs * kRowsPairs) <= 9 * pairs;
}
__host__ __device__ constexpr bool fills_rows_third(int pairs) {
  return 3 * ((pairs + kRowsPairs - 1) / kRowsPairs * kRowsPairs) <= 4 * pairs;
}

// Pages the tensor copy can read a tile from: one box of 64 keys, or 2 or 4 of 32 or 16.
__host__ __device__ constexpr bool tma_pages(int page_size) {
  return page_size % 16 == 0 && (page_size % kKeysPerTile == 0 || kKeysPerTile % page_size == 0);
}
// A cache the tensor copy can read: such pages, a 16-byte aligned base and strides, whole rows.
__host__ __device__ inline bool tma_cache(const MlaParams& p) {
  return tma_pages(p.page_size) && reinterpret_cast<uintptr_t>(p.kv) % 16 == 0 && (p.kv_stride_slot * 2) % 16 == 0 &&
         (p.kv_stride_page * 2) % 16 == 0 && p.kv_stride_slot >= kDimQK && p.num_pages >= 1;
}

// The cache seen as a tensor [pages][page_size][576] bf16 for the tensor copy
// (a kernel that gathers is passed box_keys = 0 and never reads it): a box is
// 64 dims of min(64, page_size) consecutive keys of one page, written to shared
// memory with the 128-byte swizzle wgmma reads.  box_keys is 0 where the cache
// cannot be read this way.  map4 sees the chunks of a key as a dimension of
// their own, so that one copy brings four chunks of a tile (chunk_boxes: where a
// tile is one page's 64 keys and the driver made the map).
struct KvTensor {  // aligned as CUtensorMap is (128 bytes)
  CUtensorMap map;
  int box_keys;
  int chunk_boxes;
  CUtensorMap map4;  // (64 dims, the page's keys, the 9 chunks, pages), boxes of 4 chunks of 64 keys
};

// The most tiles a unit can have: the block table's width (the lengths live on the GPU).
__host__ __device__ inline int64_t unit_tiles_bound(const MlaParams& p) {
  return ((int64_t)p.max_pages * p.page_size + kKeysPerTile - 1) / kKeysPerTile;
}

// Where the seesaw pays for its start: where the block table's width gives
// each block see_tiles_per_block tiles or more, in units of 64 pairs (the
// lengths live on the GPU, so this is a bound).  Pages of 64 keys or a
// multiple, whose tiles come four chunks to a copy, pay sooner than pages of
// 16 or 32, copied chunk by chunk.
constexpr int kSeeTilesPerBlock = 15;
constexpr int kSeeTilesPerBlockSmallPages = 56;
__host__ __device__ inline int see_tiles_per_block(int page_size) {
  return page_size % kKeysPerTile == 0 ? kSeeTilesPerBlock : kSeeTilesPerBlockSmallPages;
}
__host__ __device__ inline bool seesaw_pays(const MlaParams& p) {
  const int64_t units = (int64_t)p.batch * ((p.q_len * p.num_heads + kRowsPairs - 1) / kRowsPairs);
  return units * unit_tiles_bound(p) >= (int64_t)see_tiles_per_block(p.page_size) * p.num_splits;
}

#if MLA_SM90A
// A unit's start: for each of its `rows` pairs (pair0 + n, head fastest), its
// row in q and how many keys it may see (draft row t sees the cache and the
// draft up to itself), then Q itself into 9 swizzled 64-dim chunks of `rows`
// rows of 128 bytes, by the `threads` threads that meet at barrier `bar` (t is
// this thread's index among them).  Each pair's row is found once, by one
// thread, not once per 16-byte copy: at a unit's start no tile hides that
// time.  The copies are committed, not waited for.  With kResetM, m_s gets each
// pair's softmax reference reset to -inf.  (kCopies: false only in an
// experiment that times a call without its Q.)
template <bool kResetM, bool kCopies = true>
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
  for (int i = t; i < (kCopies ? rows * (kDimQK / 8) : 0); i += threads) {
    const int n = i / (kDimQK / 8), c16 = i % (kDimQK / 8), j = c16 / 8, col = c16 % 8;
    const uint32_t dst = q_s + j * (rows * 128) + n * 128 + ((col ^ (n & 7)) << 4);
    const int64_t row = q_row_s[n];
    cp_async16(dst, row >= 0 ? (const void*)(p.q + row + 8 * c16) : (const void*)p.q, row >= 0 ? 16 : 0);
  }
  cp_async_commit();
}
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
