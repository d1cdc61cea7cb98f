// Where a short call's time goes, from inside: stage 10 (every call on the
// tile on N) with the GPU's global timer read at the start and end of each
// block of the main kernel, at five points of each merge block of the first cut
// unit (its start, past its wait, its unit read, its weights known, its pieces
// added) and at seven points of block 0's way to its first tile's scores
// (MergeStamps, csrc/experiments/merge_stamps.cuh).  Only the timer's reads and stores
// are added: its answers are stage 10's.
#include "experiments/common.cuh"
#include "experiments/merge_stamps.cuh"
#include "hopper/tile_n.cuh"

namespace mla {
namespace {

#if MLA_SM90A
struct MergeTimelineParts : TileNParts {
  using Stamps = MergeStamps;
};
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kThreads, 1) merge_timeline_kernel(const MlaParams p,
                                                                     const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, MergeTimelineParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<NoSeesaw, MergeStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<NoSeesaw, MergeStamps>(p);
#else
  __trap();
#endif
}

const char* const kVariants[] = {"merge_timeline"};

cudaError_t launch_variant(int, const MlaParams& p, cudaStream_t stream) {
  return launch_tile_n<NoSeesaw>(p, stream, merge_timeline_kernel, kSmemBytes, false,
                                 merge_as_staged<NoSeesaw>(combine_kernel, merge_by_warps_kernel));
}

}  // namespace

const Experiment& experiment() {
  static const Experiment e = {kVariants, 1, launch_variant, nullptr, nullptr, merge_stamps_read, merge_stamps_clear};
  return e;
}

}  // namespace mla
