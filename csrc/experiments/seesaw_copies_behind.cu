// The crossed seesaw (stage 12's order) with each warpgroup's copies asked for
// behind the products it has just issued: a copier is one lane of its
// warpgroup's first warp, and a product is issued by all four warps together,
// so while the copier asks for a tile's chunks the other three warps wait at
// the next wgmma.  Here warpgroup 1 asks for the next A's last five chunks
// right after P_B V_B is issued, and warpgroup 0 for the next B's first chunks
// after the next A's scores.  The warps then wait less at the products, but
// the chunks land later and their readers wait for them.  (Between a product
// and its wait the copies must not sit across a branch: ptxas then serialises
// every wgmma of the kernel.)
//   seesaw_cross_behind           that order, page lookups by steps, chunks one by one;
//   seesaw_cross_behind_timeline  with the tile stamps.
// Their answers are stage 12's.
#include "experiments/seesaw_chunk_copies.cuh"

namespace mla {
namespace {

#if MLA_SM90A
template <class StampsParts>
struct CopiesBehindParts : SeesawParts<false> {
  using Boxes = SeeBoxes<false, false>;
  using Stamps = StampsParts;
  template <class Self>
  __device__ static __forceinline__ void run(const MlaParams& p, const Shape& sh, const Cursor& cur,
                                             unsigned char* smem, const KvTensor& kv) {
    seesaw_chunk_copies<Self, true>(p, sh, cur, smem, kv);
  }
};
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_behind_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<CopiesBehindParts<NoStamps>, true, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_behind_timeline_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<CopiesBehindParts<TileStamps>, true, true>(p, kv);
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

const char* const kVariants[] = {"seesaw_cross_behind", "seesaw_cross_behind_timeline"};
const MainKernel kSeesaw[] = {seesaw_cross_behind_kernel, seesaw_cross_behind_timeline_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_seesaw(p, stream, kSeesaw[v], nullptr, false, tile_n_kernel, combine_kernel, merge_by_warps_kernel);
}

}  // namespace

const Experiment& experiment() {
  static const Experiment e = {kVariants, 2, launch_variant, tile_stamps_read, tile_stamps_clear, nullptr, nullptr};
  return e;
}

}  // namespace mla
