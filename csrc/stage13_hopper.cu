// Stage 13: hopper, the op, which picks its tile per call (sm_90a).
//
// Stage 12 runs the seesaw only where a stream's pairs pad its tiles of 64 by
// an eighth at most.  Per pair and key the seesaw's tile, compiled for whole
// tiles, outruns the tile on N by more than a third of padding costs: so with
// pages of 64 keys or a multiple it takes the pairs that pad by up to a third
// (48 pairs or more: 16 heads of a 9-row draft, 144 pairs, in three units of
// 48).  With pages of 16 or 32, where the seesaw asks how a tile's boxes lie,
// the line stays at an eighth.
//
// A call runs the seesaw where SeesawAThird holds: the pairs fill tiles of 64
// (a third of padding with whole tiles, else an eighth), the pages suit the
// tensor copy, and the block table's width gives each block
// see_tiles_per_block tiles or more.  Then hopper_seesaw_kernel, compiled for
// tiles of one page of 64 keys copied four chunks at a time, where the pages
// hold 64 keys or a multiple and the driver made the map of four chunks; else
// hopper_seesaw_any_pages_kernel, which asks how a tile's boxes lie (and, for a
// cache that gets no tensor map at all, hopper_kernel in the same units).
// Elsewhere stage 11's choice: hopper_tma_kernel where tma_pays, else
// hopper_kernel.  Then the merge, as in stage 10.
#include "hopper/launch.cuh"
#include "hopper/seesaw.cuh"
#include "hopper/tma_loader.cuh"

namespace mla {
namespace {

// Where the op runs the seesaw.
struct SeesawAThird {
  __host__ __device__ static bool seesaw(const MlaParams& p) {
    const int pairs = p.q_len * p.num_heads;
    const bool whole_tiles = p.page_size % kKeysPerTile == 0;
    return (!whole_tiles ? fills_rows_eighth(pairs) : fills_rows_third(pairs)) && tma_pages(p.page_size) &&
           seesaw_pays(p);
  }
};

__global__ void __launch_bounds__(kThreads, 1) hopper_kernel(const MlaParams p,
                                                                    const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<SeesawAThird, CpAsyncLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) hopper_tma_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<SeesawAThird, TmaLoader, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) hopper_seesaw_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<SeesawParts<true>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) hopper_seesaw_any_pages_kernel(const MlaParams p,
                                                                          const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<SeesawParts<false>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) hopper_combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<SeesawAThird, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) hopper_merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<SeesawAThird, NoStamps>(p);
#else
  __trap();
#endif
}

// Whether a call copies its tiles by TMA, where it does not run the seesaw (see stage 11).
constexpr int kTmaTilesPerBlock = 12;
bool tma_pays(const MlaParams& p) {
  const Shape sh = shape_of<SeesawAThird>(p);
  const int64_t tiles_bound = (int64_t)sh.units * unit_tiles_bound(p);
  return !sh.rows && tma_pages(p.page_size) && tiles_bound >= (int64_t)kTmaTilesPerBlock * p.num_splits;
}
LaunchGeometry gather_geometry(const MlaParams& p) {
  return {dim3(p.num_splits), dim3(kThreads), kSmemBytes};
}
LaunchGeometry main_geometry(const MlaParams& p) {
  return tma_pays(p) || SeesawAThird::seesaw(p) ? kNotLaunched : gather_geometry(p);
}
LaunchGeometry tma_geometry(const MlaParams& p) {
  return tma_pays(p) ? LaunchGeometry{dim3(p.num_splits), dim3(kThreads), kTmaSmemBytes} : kNotLaunched;
}
LaunchGeometry seesaw_geometry(const MlaParams& p) {
  return SeesawAThird::seesaw(p) ? LaunchGeometry{dim3(p.num_splits), dim3(kSeeThreads), kSeeSmemBytes}
                                   : kNotLaunched;
}
// The seesaw kernel that reads this cache: the one compiled for whole tiles
// where a tile is one box of 64 keys copied four chunks at once, else the one that asks.
void (*seesaw_kernel_for(const KvTensor& kv))(const MlaParams, const KvTensor) {
  return kv.box_keys == kKeysPerTile && kv.chunk_boxes ? hopper_seesaw_kernel : hopper_seesaw_any_pages_kernel;
}

// The merges' launches, as the kernel list names them.
LaunchGeometry merge_geometry(const MlaParams& p) { return combine_geometry<SeesawAThird>(p); }
LaunchGeometry warps_merge_geometry(const MlaParams& p) { return merge_by_warps_geometry<SeesawAThird>(p); }

}  // namespace

// num_splits is the persistent grid: how many blocks share the work (one per SM by default).
cudaError_t hopper_launch(const MlaParams& p, cudaStream_t stream) {
  MlaParams q = p;  // with this call's scratch filled in
  cudaError_t err = take_scratch<SeesawAThird>(q);
  static bool opted_in[64] = {};
  if (err == cudaSuccess)
    err = opt_in_once(opted_in, {{(const void*)hopper_kernel, kSmemBytes},
                                 {(const void*)hopper_tma_kernel, kTmaSmemBytes},
                                 {(const void*)hopper_seesaw_kernel, kSeeSmemBytes},
                                 {(const void*)hopper_seesaw_any_pages_kernel, kSeeSmemBytes}});
  if (err != cudaSuccess) return err;
  const bool pdl = q.pdl != 0;
  if (SeesawAThird::seesaw(q)) {
    const KvTensor kv = kv_tensor(q, true);
    if (kv.box_keys != 0)
      err = launch(seesaw_kernel_for(kv), seesaw_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gathered, in the same units of 64 pairs
      err = launch(hopper_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  } else if (tma_pays(q)) {
    const KvTensor kv = kv_tensor(q, true);
    if (kv.box_keys != 0)
      err = launch(hopper_tma_kernel, tma_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gather
      err = launch(hopper_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  } else {
    err = launch(hopper_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  }
  if (err == cudaSuccess)
    err = launch_merge<SeesawAThird>(q, stream, pdl, hopper_combine_kernel, hopper_merge_by_warps_kernel);
  return err;
}

int hopper_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"hopper_kernel", (const void*)hopper_kernel, kThreads, main_geometry},
      {"hopper_tma_kernel", (const void*)hopper_tma_kernel, kThreads, tma_geometry},
      {"hopper_seesaw_kernel", (const void*)hopper_seesaw_kernel, kSeeThreads, seesaw_geometry},
      {"hopper_combine_kernel", (const void*)hopper_combine_kernel, kCombineThreads, merge_geometry},
      {"hopper_merge_by_warps_kernel", (const void*)hopper_merge_by_warps_kernel, kCombineThreads,
       warps_merge_geometry},
      {"hopper_seesaw_any_pages_kernel", (const void*)hopper_seesaw_any_pages_kernel, kSeeThreads, seesaw_geometry},
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
