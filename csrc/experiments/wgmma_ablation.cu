// Where a tile's time goes, in stage 10: its work taken away.
//
// A block that overlaps two kinds of work (the loader's copies and the
// compute warpgroups' products and softmax) runs at the speed of the slower
// only if the overlap is perfect.  Taking one away and timing what is left
// says how long the other takes alone:
//   no_copies  the loader reads neither the cache nor the block table; it
//              zeroes its ring once and publishes each chunk as soon as its
//              slot is free: the math, fed as fast as the ring turns;
//   no_math    the compute warpgroups wait for each tile's chunks and hand
//              them straight back: the loading;
//   neither    the skeleton: scheduler, barriers, Q's load, outputs, merge.
// Every variant keeps stage 10's scheduler, ring, Q loads, outputs and merge;
// their answers are wrong on purpose.
#include "experiments/common.cuh"
#include "experiments/taken_away.cuh"

namespace mla {
namespace {

__global__ void __launch_bounds__(kThreads, 1) no_copies_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, NoCopiesLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) no_math_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, NoMathParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) neither_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, NoCopiesLoader, false, NoMathParts>(p, kv);
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

const char* const kVariants[] = {"no_copies", "no_math", "neither"};
const MainKernel kMain[] = {no_copies_kernel, no_math_kernel, neither_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_tile_n<NoSeesaw>(p, stream, kMain[v], kSmemBytes, false,
                                 merge_as_staged<NoSeesaw>(combine_kernel, merge_by_warps_kernel));
}

}  // namespace

const Experiment& experiment() { return experiment_of(kVariants, launch_variant); }

}  // namespace mla
