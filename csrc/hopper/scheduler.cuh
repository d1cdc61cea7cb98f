// The GPU scheduler: every block's prologue cuts the key tiles of all units
// into equal shares, one per block, and keeps its own.
//
// Every block reads kv_lens on the GPU (so a CUDA graph replays the call with
// new lengths) and makes the same sums, so the blocks agree on the cut without
// talking; the first block without a share (else block 0) writes the cut down
// for the merge.  A share may span several (unit, tile range) pieces and part
// of one; a unit that one block finishes is written straight to `out`, a unit
// cut between blocks leaves partials that a merge kernel adds up.  Units are
// numbered group by group, and the blocks are a multiple of the groups wherever
// that idles few of them, so every group's keys are cut at the same places:
// the blocks of all groups of a stream then read each key tile at about the
// same time, and L2 serves all but the first.
#pragma once

#include "hopper/common.cuh"

namespace mla {
namespace {

// A unit's key tiles: its stream's 64-key tiles, none for a stream that cannot be computed.
__device__ __forceinline__ int unit_tiles(const MlaParams& p, int u) {
  const int len = p.kv_lens[u % p.batch];
  return stream_ok(p, len) ? (len + kKeysPerTile - 1) / kKeysPerTile : 0;
}

// What the seesaw pays to start a unit, in tiles: its scheduler numbers each
// unit with tiles as that many slots ahead of its tiles, so a share that
// starts several units gets fewer tiles.  A start is the unit's Q (a tile's
// bytes again in the seesaw's 64 rows), its first tiles' round trip with
// nothing to overlap it, and its output written at the end.  (FlashMLA's
// scheduler adds five blocks of 64 keys to each stream's too.)  Only the seesaw
// counts them, where it runs: the tile on N also runs calls of a tile or two a
// block, where a slot would be most of a share.  Units without tiles get no
// slots, so a batch padded with empty streams is cut as the batch alone.
constexpr int kSeeUnitStartTiles = 5;
__host__ __device__ inline int unit_start_slots(const MlaParams& p, const Shape& sh) {
  return sh.rows && seesaw_pays(p) ? kSeeUnitStartTiles : 0;
}
__device__ __forceinline__ int slots_of(int tiles, int start_slots) { return tiles > 0 ? tiles + start_slots : 0; }

// The slots of all units are numbered in order (unit-major); block c of the
// C that get a share takes slots [start(c), start(c + 1)).
__device__ __forceinline__ int share_start(int c, int W, int C) { return (int)((int64_t)c * W / C); }
// The share whose slots hold slot x.
__device__ __forceinline__ int block_of_tile(int x, int W, int C) {
  return (int)(((int64_t)(x + 1) * C + W - 1) / W) - 1;
}

// Which share block `cta` takes, where the shares that read the same keys sit
// side by side.  Where C is a multiple of the groups, every group's slots are
// cut at the same keys, and shares k, k + C/G, k + 2 C/G, ... read the same
// keys at the same time, each for its own group; block G k + g takes share
// (C/G) g + k, as FlashMLA's grid orders its query blocks: reads of the same
// lines from neighbouring SMs, close together in time, reach L2 as fewer
// requests.
__device__ __forceinline__ int share_of_block(int cta, int C, int groups) {
  const bool aligned = groups > 1 && C > groups && C % groups == 0 && cta < C;
  return aligned ? (cta % groups) * (C / groups) + cta / groups : cta;
}

// How many blocks get a share of W slots.  Where every unit with tiles has
// the same tiles (`filled` units of `tiles_each`; filled is 0 where they
// differ) and a share is short, a block that straddles two units pays a second
// unit's start on the call's critical path; a count of blocks that is a
// multiple of the units cuts each unit into the same number of whole pieces,
// and it is taken if it keeps at least 7/8 of the blocks.  The pieces are then
// as few as keep the longest share as it is: each piece is a unit's start and
// a partial written and merged, which in a short call cost as much as a tile or
// two.  Units without tiles do not count: a batch padded to a captured bucket
// must change neither the cut nor any answer.
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
  // every block, and the groups' blocks read a tile at different times.
  const int multiple = most - most % sh.groups;
  return most >= sh.groups && 16 * multiple >= 15 * most ? multiple : most;
}

// An exclusive prefix sum of one int per thread over the block of kBlockThreads
// (shuffles within each warp, then the warps' totals); `total` receives the sum of all.
template <int kBlockThreads>
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
// next.  A whole warp calls next() at once; the counts it reads from memory
// pass through a shuffle from lane 0, so the compiler knows they are the same
// in every lane: the loops over a piece's tiles are then not divergent, and
// their wgmmas are not serialised.
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
// holds the block's first tile finds its unit.  (kBlockThreads: the block's
// threads, 384 for the tile on N, 256 for the seesaw; kStartSlots: whether a
// unit's start takes slots, the seesaw's way, so that the other kernels'
// cursors know theirs are 0 and keep no register for them; kSameKeysAdjacent:
// share_of_block's order, the seesaw's.)
template <int kBlockThreads, bool kStartSlots, bool kSameKeysAdjacent>
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

  // One block writes the whole cut down for the merge: each unit's first slot
  // and the units cut between blocks.  It takes that block over a microsecond,
  // so it falls to the first block without a share where there is one (in a
  // short call the blocks with work start their tiles that much sooner), else
  // to block 0, whose share is never longer than another's.  (The condition is
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

}  // namespace
}  // namespace mla
