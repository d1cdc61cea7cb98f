// The crossed seesaw (stage 12's order) with its chunks copied one by one: a
// copier's lane arms a chunk's barrier and issues its tensor copy, a few dozen
// instructions, for each of the 18 chunks of a pair of tiles, while the three
// other warps of its warpgroup wait at the next wgmma (stage 12 copies four
// chunks at a time where a tile is one page's 64 keys).
//   seesaw_cross                each tile's pages found by dividing its keys by
//                               the page size;
//   seesaw_cross_steps          with stage 12's page lookups by steps;
//   *_timeline                  with the tile stamps, six points of each pair of tiles.
// Their answers are stage 12's.
#include "experiments/seesaw_chunk_copies.cuh"

namespace mla {
namespace {

#if MLA_SM90A
template <class PagesParts, class StampsParts>
struct ChunkCopiesParts : SeesawParts<false> {
  using Boxes = SeeBoxes<false, false>;
  using Pages = PagesParts;
  using Stamps = StampsParts;
  template <class Self>
  __device__ static __forceinline__ void run(const MlaParams& p, const Shape& sh, const Cursor& cur,
                                             unsigned char* smem, const KvTensor& kv) {
    seesaw_chunk_copies<Self, false>(p, sh, cur, smem, kv);
  }
};
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<ChunkCopiesParts<PagesByDivision, NoStamps>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_timeline_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<ChunkCopiesParts<PagesByDivision, TileStamps>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_steps_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<ChunkCopiesParts<PagesBySteps, NoStamps>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_steps_timeline_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<ChunkCopiesParts<PagesBySteps, TileStamps>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) tile_n_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<SeesawWhereItFits, CpAsyncLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<SeesawWhereItFits, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<SeesawWhereItFits, NoStamps>(p);
#else
  __trap();
#endif
}

const char* const kVariants[] = {"seesaw_cross", "seesaw_cross_timeline", "seesaw_cross_steps",
                                 "seesaw_cross_steps_timeline"};
const MainKernel kSeesaw[] = {seesaw_cross_kernel, seesaw_cross_timeline_kernel, seesaw_cross_steps_kernel,
                              seesaw_cross_steps_timeline_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_seesaw(p, stream, kSeesaw[v], nullptr, false, tile_n_kernel, combine_kernel, merge_by_warps_kernel);
}

}  // namespace

const Experiment& experiment() {
  static const Experiment e = {kVariants, 4, launch_variant, tile_stamps_read, tile_stamps_clear, nullptr, nullptr};
  return e;
}

}  // namespace mla
