// Stage 12's seesaw with one of its pieces as first written: what each change
// that made it was worth.  The seesaw runs wherever a stream's pairs fill its
// tiles (see seesaw_common.cuh):
//   seesaw_cross_boxes         stage 12's seesaw kernel for any pages (four chunks
//                              in one copy where a tile is one page's 64 keys);
//   seesaw_whole               and compiled twice, for whole tiles of 64 keys and
//                              for any pages: stage 12's two seesaw kernels;
//   even_starts                seesaw_cross_boxes with every slot of the plan a
//                              tile (a unit's start takes no slots);
//   softmax_fmul               seesaw_cross_boxes with its softmax as first
//                              written (csrc/experiments/seesaw_first_pieces.cuh);
//   shares_apart               seesaw_cross_boxes with block c taking share c, so
//                              that the shares that read the same keys sit apart;
//   *_timeline                 with the tile stamps, six points of each pair of tiles.
// Their answers are right; softmax_fmul's are not the stages' bits.
#include "experiments/seesaw_common.cuh"

namespace mla {
namespace {

#if MLA_SM90A
template <class SoftmaxParts, class StampsParts, bool kWholeTiles = false>
struct CrossedParts : SeesawParts<kWholeTiles> {
  using Softmax = SoftmaxParts;
  using Stamps = StampsParts;
};
using Boxes = CrossedParts<SoftmaxFfma, NoStamps>;
using BoxesTimeline = CrossedParts<SoftmaxFfma, TileStamps>;
using Fmul = CrossedParts<SoftmaxFmul, NoStamps>;
using FmulTimeline = CrossedParts<SoftmaxFmul, TileStamps>;
using Whole = CrossedParts<SoftmaxFfma, NoStamps, true>;
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_boxes_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<Boxes, true, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_cross_boxes_timeline_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<BoxesTimeline, true, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_whole_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<Whole, true, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) even_starts_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<Boxes, false, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) softmax_fmul_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<Fmul, true, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) softmax_fmul_timeline_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<FmulTimeline, true, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) shares_apart_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<Boxes, true, false>(p, kv);
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

const char* const kVariants[] = {"seesaw_cross_boxes", "seesaw_cross_boxes_timeline", "seesaw_whole", "even_starts",
                                 "softmax_fmul", "softmax_fmul_timeline", "shares_apart"};
const MainKernel kSeesaw[] = {seesaw_cross_boxes_kernel, seesaw_cross_boxes_timeline_kernel, seesaw_cross_boxes_kernel,
                              even_starts_kernel, softmax_fmul_kernel, softmax_fmul_timeline_kernel,
                              shares_apart_kernel};
constexpr int kWhole = 2;

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_seesaw(p, stream, kSeesaw[v], v == kWhole ? seesaw_whole_kernel : nullptr, true, tile_n_kernel,
                       combine_kernel, merge_by_warps_kernel);
}

}  // namespace

const Experiment& experiment() {
  static const Experiment e = {kVariants, 7, launch_variant, tile_stamps_read, tile_stamps_clear, nullptr, nullptr};
  return e;
}

}  // namespace mla
