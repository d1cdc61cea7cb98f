// Stage 10: wgmma, a warp-specialised block, and a GPU scheduler (sm_90a).
//
// Stage 9's tile was 16 pairs, so at 64 heads every key was read by 36 blocks
// and Q was re-read from shared memory by every warp.  Here the products are
// turned around: a 64-key tile is wgmma's M and up to 40 of a stream's (row,
// head) pairs its N, in a block of three warpgroups, one that only loads and
// two that only compute (csrc/hopper/tile_n.cuh).  A block is persistent, one
// per SM: every block cuts the key tiles of all streams into equal shares and
// keeps its own (csrc/hopper/scheduler.cuh), and a unit cut between blocks is
// merged after the main kernel (csrc/hopper/merge.cuh).
//
// Every call runs wgmma_kernel (grid: num_splits blocks, one per SM by
// default), then, where the block table is wide enough to cut a unit, one of
// the two merges: wgmma_merge_by_warps_kernel where the units are cut into a
// few pieces each, else wgmma_combine_kernel.
#include "hopper/launch.cuh"
#include "hopper/tile_n.cuh"

namespace mla {
namespace {

__global__ void __launch_bounds__(kThreads, 1) wgmma_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) wgmma_combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) wgmma_merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

LaunchGeometry main_geometry(const MlaParams& p) { return {dim3(p.num_splits), dim3(kThreads), kSmemBytes}; }

// The merges' launches, as the kernel list names them.
LaunchGeometry merge_geometry(const MlaParams& p) { return combine_geometry<NoSeesaw>(p); }
LaunchGeometry warps_merge_geometry(const MlaParams& p) { return merge_by_warps_geometry<NoSeesaw>(p); }

}  // namespace

// num_splits is the persistent grid: how many blocks share the work (one per SM by default).
cudaError_t wgmma_launch(const MlaParams& p, cudaStream_t stream) {
  MlaParams q = p;  // with this call's scratch filled in
  cudaError_t err = take_scratch<NoSeesaw>(q);
  static bool opted_in[64] = {};
  if (err == cudaSuccess) err = opt_in_once(opted_in, {{(const void*)wgmma_kernel, kSmemBytes}});
  if (err != cudaSuccess) return err;
  const bool pdl = q.pdl != 0;
  err = launch(wgmma_kernel, main_geometry(q), stream, pdl, q, KvTensor{});
  if (err == cudaSuccess) err = launch_merge<NoSeesaw>(q, stream, pdl, wgmma_combine_kernel, wgmma_merge_by_warps_kernel);
  return err;
}

int wgmma_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"wgmma_kernel", (const void*)wgmma_kernel, kThreads, main_geometry},
      {"wgmma_combine_kernel", (const void*)wgmma_combine_kernel, kCombineThreads, merge_geometry},
      {"wgmma_merge_by_warps_kernel", (const void*)wgmma_merge_by_warps_kernel, kCombineThreads,
       warps_merge_geometry},
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
