// The merge: the partials of each unit that the scheduler cut between blocks,
// weighted by their log-sum-exp and added up, in the same order whatever grid
// the host chose.
//
// Two kernels, launched after the main kernel by programmatic dependent launch
// (they wait for the whole main grid before reading): hopper_combine_kernel
// gives a pair a block (or four, one per slice of 128 dims, where a unit has
// many pieces), and hopper_merge_by_warps_kernel gives a pair one warp, eight
// pairs to a block, where units are cut into a few pieces each.  The host
// picks one per call (the stage files' launchers).
#pragma once

#include "hopper/scheduler.cuh"

namespace mla {
namespace {

// A block merges a slice of the dims of one pair of one cut unit: its threads
// first turn each piece's lse into a weight (one piece per thread), then split
// into rows that each add every so-many-th piece, a thread holding four dims,
// with four loads in flight, and shared memory adds the rows.  A unit cut into
// many pieces (one stream at 8 heads: a piece per block of the grid) is merged
// in four slices of 128 dims, which puts four times as many SMs on its reads;
// units cut into a few pieces are merged whole, so that the grid stays small.
// Only the host chooses (combine_slices), before the pieces are known: the
// block table's width bounds a unit's pieces.  A sliced grid is 320 blocks a
// unit: past two units its blocks are of 128 threads, so that it fits in one
// wave or close to it.
constexpr int kCombineThreads = 256;
constexpr int kNarrowCombineThreads = 128;
constexpr int kManySlices = 4;

constexpr int kSlicedPieces = 32;  // a unit that can be cut into this many pieces gets a grid of slices

// The host's choice of grid: four blocks per pair where few units share it and
// a unit can be cut into many pieces, or where at most two units share it.
__host__ __device__ constexpr int combine_slices(int num_splits, int units, int64_t unit_tiles_bound) {
  return num_splits >= 16 * units && (units <= 2 || unit_tiles_bound >= kSlicedPieces) ? kManySlices : 1;
}
__host__ __device__ constexpr int combine_threads(int slices, int units) {
  return slices > 1 && units > 2 ? kNarrowCombineThreads : kCombineThreads;
}
// Where the units are cut into a few pieces each (num_splits at most three
// times the units), hopper_merge_by_warps_kernel merges them instead: a warp
// each pair, eight pairs to a block, so that a pair's two or three pieces are
// one trip of loads, and the grid is a wave or two where a block per pair
// spent its barriers on a few pieces over several waves.  With fewer units a
// unit has more pieces, which a block per pair loads eight at a time and a
// warp two: there the block per pair stays.
constexpr int kPairsPerWarpMergeBlock = kCombineThreads / 32;
__host__ __device__ constexpr bool combine_by_warps(int num_splits, int units) { return num_splits <= 3 * units; }
static_assert(kPairsPerBlock % kPairsPerWarpMergeBlock == 0, "a unit's pairs fill whole merge blocks");

// A cut unit as the plan lists it, read once by the whole merge block.
struct CutUnit {
  int W, C;        // the plan's tiles and blocks
  int u, c0;       // the unit and the first block of its pieces
  int pieces;
};

// The order of a merge's sums, the same in every merge whatever its grid, so
// that a pair's answer does not depend on which merge ran it (the host picks
// one from the call's shape, which padding a batch to a captured bucket
// changes): the pieces fall into kMergeRows rows, piece i into row i %
// kMergeRows; a row adds its pieces' weighted partials in the order of the
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
template <class Rule>
__device__ __forceinline__ bool merged_pair(const MlaParams& p, int local, int u, int& b, int& t, int& h) {
  const Shape sh = shape_of<Rule>(p);
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

template <class Rule, class Stamps, int kSlices, int kBlockThreads>
__device__ __forceinline__ void combine_slice(const MlaParams& p, int local, int slice, const CutUnit& cu) {
  constexpr int kCols = kDimV / kSlices / 4;          // float4 columns of a slice: 32 or 128
  constexpr int kRows = kBlockThreads / kCols;        // pieces added side by side: 8, 4 or 2
  constexpr int kLsePerThread = (kMaxSplitsHere + kBlockThreads - 1) / kBlockThreads;  // 1 or 2
  const int tid = threadIdx.x, pieces = cu.pieces;
  int b, t, h;
  if (!merged_pair<Rule>(p, local, cu.u, b, t, h)) return;
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
  Stamps::merge(3);

  const int row = tid / kCols, col = tid % kCols;
  const int dim0 = slice * (kDimV / kSlices) + 4 * col;
  // Row `row` of threads adds the order's rows row, row + kRows, ...: piece i
  // of this thread's loop below belongs to the order's row i % kMergeRows.
  float4 acc[kPer] = {};
  float wsum[kPer] = {};
  // kBatch pieces are loaded before any of them is added, so that their trips
  // to L2 overlap.  A piece that weighs nothing is neither read nor added, and
  // the sums are made in the same order as one at a time, so the answer is the
  // same to the bit.  (Eight would take twice the registers, and the merges of
  // many units, several blocks to an SM, would run fewer blocks at once.)
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
  Stamps::merge(4);
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
template <class Rule, class Stamps>
__device__ __forceinline__ void combine_pair_by_warp(const MlaParams& p, int local, const CutUnit& cu,
                                                     float* weight) {
  constexpr int kBatch = 2;
  const int lane = threadIdx.x % 32, pieces = cu.pieces;
  int b, t, h;
  if (!merged_pair<Rule>(p, local, cu.u, b, t, h)) return;  // (the same in the whole warp)
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
  Stamps::merge(3);
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
  Stamps::merge(4);
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
template <class Rule, class Stamps>
__device__ __forceinline__ bool cut_unit_of_block(const MlaParams& p, CutUnit& cu) {
  Stamps::merge(0);
  wait_for_previous_grid();
  Stamps::merge(1);
  const int k = blockIdx.y;  // cut unit
  const int n_cut = p.plan[2];
  if (k >= n_cut) return false;  // (the words past the cut list were not written by this call)
  Stamps::merge(2);
  const int* cut = p.plan + kPlanHeader + shape_of<Rule>(p).units + 1 + 3 * k;
  cu = {p.plan[0], p.plan[1], cut[0], cut[1], cut[2] - cut[1] + 1};
  return true;
}

// The bodies of the two merge kernels (each stage file names its own).
template <class Rule, class Stamps>
__device__ __forceinline__ void combine_block(const MlaParams& p) {
  CutUnit cu;
  if (!cut_unit_of_block<Rule, Stamps>(p, cu)) return;
  if (gridDim.x == kPairsPerBlock)
    combine_slice<Rule, Stamps, 1, kCombineThreads>(p, blockIdx.x, 0, cu);
  else if (blockDim.x == kNarrowCombineThreads)
    combine_slice<Rule, Stamps, kManySlices, kNarrowCombineThreads>(p, blockIdx.x / kManySlices,
                                                                     blockIdx.x % kManySlices, cu);
  else
    combine_slice<Rule, Stamps, kManySlices, kCombineThreads>(p, blockIdx.x / kManySlices, blockIdx.x % kManySlices,
                                                               cu);
}
// The merge by warps is a kernel of its own so that its registers and its
// schedule leave the combine's as they are: with two pieces in flight it wants
// more registers than the combine, and in one kernel ptxas either gave every
// merge the larger count or stopped keeping the combine's four pieces in flight.
// Its launch bounds hold it to three blocks of 256 an SM.
template <class Rule, class Stamps>
__device__ __forceinline__ void merge_by_warps_block(const MlaParams& p) {
  __shared__ float weight[kPairsPerWarpMergeBlock][kMaxSplitsHere];  // each warp's pieces' weights
  CutUnit cu;
  if (!cut_unit_of_block<Rule, Stamps>(p, cu)) return;
  const int warp = threadIdx.x / 32;
  combine_pair_by_warp<Rule, Stamps>(p, blockIdx.x * kPairsPerWarpMergeBlock + warp, cu, weight[warp]);
}
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
