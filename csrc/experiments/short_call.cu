// Where a short call's time goes, in stage 10 (every call on the tile on N):
// a call taken apart, and the pieces of its end as first written.
//   launch_only           both kernels launched, each returning as soon as it
//                         may read its inputs;
//   scheduler_only        the main kernel stops once the scheduler has cut the
//                         work; the merge adds whatever the partial slots hold;
//   no_combine            the main kernel whole and no merge launched (right
//                         only where no unit is cut);
//   no_q                  everything but the copies of the units' Q (timing only);
//   direct_out            a whole unit's bf16 rows stored straight from the wgmma
//                         fragments, half a sector at a time, where stage 10
//                         stages them in shared memory and writes whole lines;
//   wide_combine          every merge block of 256 threads, where stage 10
//                         narrows those of a sliced grid of more than two units
//                         to 128, so that it fits in a wave or close to it;
//   block_per_pair_merge  a merge block for each whole pair, where stage 10
//                         has a warp merge each pair when units are cut into a
//                         few pieces each.
// The first four's answers are wrong on purpose; the last three's are right.
#include "experiments/common.cuh"
#include "hopper/tile_n.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// Stage 10's block (tile_n_block) as far as its wait for the previous kernel
// (kPart 1) or the scheduler's cut (kPart 2).
template <int kPart>
__device__ __forceinline__ void tile_n_block_until(const MlaParams& p) {
  constexpr int kSlots = kRing;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars);
  uint64_t* empty = full + kSlots;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      mbar_init(&full[s], 128);
      mbar_init(&empty[s], 8);
    }
  }
  wait_for_previous_grid();
  if (kPart == 1) return;
  const Shape sh = shape_of<NoSeesaw>(p);
  Cursor cur;
  int C;
  plan_share<kThreads, false, false>(p, sh, reinterpret_cast<int*>(smem + kOffPlan), cur, C);
}

// A whole unit's rows stored straight from the fragments: each store writes
// 16 bytes into each of four rows, half of a 32-byte sector.
struct DirectOut {
  __device__ static __forceinline__ void whole(const MlaParams& p, const float (&o)[kVChunks][20], const float (&inv)[10],
                                               unsigned char*, int, int warp, int lane, int, int b, int pair0,
                                               int n_pairs) {
    const int g = lane / 4, c = 2 * (lane % 4);
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
  }
};
struct DirectOutParts : TileNParts {
  using Out = DirectOut;
};
struct NoQParts : TileNParts {
  static constexpr bool kCopyQ = false;
};
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kThreads, 1) launch_only_kernel(const MlaParams p, const __grid_constant__ KvTensor) {
#if MLA_SM90A
  tile_n_block_until<1>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) scheduler_only_kernel(const MlaParams p,
                                                                     const __grid_constant__ KvTensor) {
#if MLA_SM90A
  tile_n_block_until<2>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) main_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) no_q_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, NoQParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) direct_out_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, DirectOutParts>(p, kv);
#else
  __trap();
#endif
}

// The merges of launch_only: their wait, and nothing after it.
__global__ void __launch_bounds__(kCombineThreads) launch_only_combine_kernel(const MlaParams) {
#if MLA_SM90A
  wait_for_previous_grid();
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) launch_only_merge_by_warps_kernel(const MlaParams) {
#if MLA_SM90A
  wait_for_previous_grid();
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

// The merge as first written: blocks of 256 threads however big the grid
// (wide), or a block for each pair wherever pairs are merged whole (block_per_pair).
auto merge_as_first_written(bool wide, bool block_per_pair) {
  return [=](const MlaParams& q, cudaStream_t stream, bool pdl) -> cudaError_t {
    if (!may_cut(q)) return cudaSuccess;
    const int units = shape_of<NoSeesaw>(q).units;
    const int slices = merge_slices<NoSeesaw>(q);
    if (!block_per_pair && slices == 1 && combine_by_warps(q.num_splits, units))
      return launch(merge_by_warps_kernel, merge_by_warps_geometry<NoSeesaw>(q), stream, pdl, q);
    const int threads = wide ? kCombineThreads : combine_threads(slices, units);
    return launch(combine_kernel,
                  LaunchGeometry{dim3(kPairsPerBlock * slices, std::min(q.num_splits, units)), dim3(threads), 0},
                  stream, pdl, q);
  };
}
cudaError_t no_merge(const MlaParams&, cudaStream_t, bool) { return cudaSuccess; }

enum Variant { kLaunchOnly, kSchedulerOnly, kNoCombine, kNoQ, kDirectOut, kWideCombine, kBlockPerPairMerge };
const char* const kVariants[] = {"launch_only", "scheduler_only", "no_combine", "no_q", "direct_out", "wide_combine",
                                 "block_per_pair_merge"};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  const auto staged = merge_as_staged<NoSeesaw>(combine_kernel, merge_by_warps_kernel);
  switch (v) {
    case kLaunchOnly:
      return launch_tile_n<NoSeesaw>(p, stream, launch_only_kernel, kSmemBytes, false,
                                     merge_as_staged<NoSeesaw>(launch_only_combine_kernel,
                                                               launch_only_merge_by_warps_kernel));
    case kSchedulerOnly:
      return launch_tile_n<NoSeesaw>(p, stream, scheduler_only_kernel, kSmemBytes, false, staged);
    case kNoCombine:
      return launch_tile_n<NoSeesaw>(p, stream, main_kernel, kSmemBytes, false, no_merge);
    case kNoQ:
      return launch_tile_n<NoSeesaw>(p, stream, no_q_kernel, kSmemBytes, false, staged);
    case kDirectOut:
      return launch_tile_n<NoSeesaw>(p, stream, direct_out_kernel, kSmemBytes, false, staged);
    case kWideCombine:
      return launch_tile_n<NoSeesaw>(p, stream, main_kernel, kSmemBytes, false, merge_as_first_written(true, false));
    default:
      return launch_tile_n<NoSeesaw>(p, stream, main_kernel, kSmemBytes, false, merge_as_first_written(false, true));
  }
}

}  // namespace

const Experiment& experiment() { return experiment_of(kVariants, launch_variant); }

}  // namespace mla
