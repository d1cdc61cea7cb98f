// Stage 12: FlashMLA's seesaw, the pairs on M (sm_90a).
//
// Stage 11's tile puts 40 pairs on wgmma's N, a shape the tensor cores run at
// well below their peak.  Where a stream has 64 pairs or more and padding them
// to tiles of 64 wastes at most an eighth, the seesaw puts 64 pairs on M:
// two warpgroups, no loader, each holding half of O, one scoring the even
// tiles and the other the odd ones while the first runs its softmax
// (csrc/hopper/seesaw.cuh).  It pays where each block has many tiles: its
// unit's start is dearer than the tile on N's.
//
// A call runs the seesaw where SeesawAnEighth holds: the pairs fill tiles of 64,
// the pages suit the tensor copy, and the block table's width gives each block
// see_tiles_per_block tiles or more.  Then seesaw_kernel, compiled for tiles of
// one page of 64 keys copied four chunks at a time, where the pages hold 64
// keys or a multiple and the driver made the map of four chunks; else
// seesaw_any_pages_kernel, which asks how a tile's boxes lie (and, for a cache
// that gets no tensor map at all, seesaw_gather_kernel in the same units).
// Elsewhere stage 11's choice: seesaw_tma_kernel where tma_pays, else
// seesaw_gather_kernel.  Then the merge, as in stage 10.
#include "hopper/launch.cuh"
#include "hopper/seesaw.cuh"
#include "hopper/tma_loader.cuh"

namespace mla {
namespace {

// Where this stage runs the seesaw.
struct SeesawAnEighth {
  __host__ __device__ static bool seesaw(const MlaParams& p) {
    return fills_rows_eighth(p.q_len * p.num_heads) && tma_pages(p.page_size) && seesaw_pays(p);
  }
};

__global__ void __launch_bounds__(kThreads, 1) seesaw_gather_kernel(const MlaParams p,
                                                                    const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<SeesawAnEighth, CpAsyncLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) seesaw_tma_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<SeesawAnEighth, TmaLoader, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<SeesawParts<true>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kSeeThreads, 1) seesaw_any_pages_kernel(const MlaParams p,
                                                                          const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  seesaw_block<SeesawParts<false>>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) seesaw_combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<SeesawAnEighth, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) seesaw_merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<SeesawAnEighth, NoStamps>(p);
#else
  __trap();
#endif
}

// Whether a call copies its tiles by TMA, where it does not run the seesaw (see stage 11).
constexpr int kTmaTilesPerBlock = 12;
bool tma_pays(const MlaParams& p) {
  const Shape sh = shape_of<SeesawAnEighth>(p);
  const int64_t tiles_bound = (int64_t)sh.units * unit_tiles_bound(p);
  return !sh.rows && tma_pages(p.page_size) && tiles_bound >= (int64_t)kTmaTilesPerBlock * p.num_splits;
}
LaunchGeometry gather_geometry(const MlaParams& p) {
  return {dim3(p.num_splits), dim3(kThreads), kSmemBytes};
}
LaunchGeometry main_geometry(const MlaParams& p) {
  return tma_pays(p) || SeesawAnEighth::seesaw(p) ? kNotLaunched : gather_geometry(p);
}
LaunchGeometry tma_geometry(const MlaParams& p) {
  return tma_pays(p) ? LaunchGeometry{dim3(p.num_splits), dim3(kThreads), kTmaSmemBytes} : kNotLaunched;
}
LaunchGeometry seesaw_geometry(const MlaParams& p) {
  return SeesawAnEighth::seesaw(p) ? LaunchGeometry{dim3(p.num_splits), dim3(kSeeThreads), kSeeSmemBytes}
                                   : kNotLaunched;
}
// The seesaw kernel that reads this cache: the one compiled for whole tiles
// where a tile is one box of 64 keys copied four chunks at once, else the one that asks.
void (*seesaw_kernel_for(const KvTensor& kv))(const MlaParams, const KvTensor) {
  return kv.box_keys == kKeysPerTile && kv.chunk_boxes ? seesaw_kernel : seesaw_any_pages_kernel;
}

// The merges' launches, as the kernel list names them.
LaunchGeometry merge_geometry(const MlaParams& p) { return combine_geometry<SeesawAnEighth>(p); }
LaunchGeometry warps_merge_geometry(const MlaParams& p) { return merge_by_warps_geometry<SeesawAnEighth>(p); }

}  // namespace

// num_splits is the persistent grid: how many blocks share the work (one per SM by default).
cudaError_t seesaw_launch(const MlaParams& p, cudaStream_t stream) {
  MlaParams q = p;  // with this call's scratch filled in
  cudaError_t err = take_scratch<SeesawAnEighth>(q);
  static bool opted_in[64] = {};
  if (err == cudaSuccess)
    err = opt_in_once(opted_in, {{(const void*)seesaw_gather_kernel, kSmemBytes},
                                 {(const void*)seesaw_tma_kernel, kTmaSmemBytes},
                                 {(const void*)seesaw_kernel, kSeeSmemBytes},
                                 {(const void*)seesaw_any_pages_kernel, kSeeSmemBytes}});
  if (err != cudaSuccess) return err;
  const bool pdl = q.pdl != 0;
  if (SeesawAnEighth::seesaw(q)) {
    const KvTensor kv = kv_tensor(q, true);
    if (kv.box_keys != 0)
      err = launch(seesaw_kernel_for(kv), seesaw_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gathered, in the same units of 64 pairs
      err = launch(seesaw_gather_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  } else if (tma_pays(q)) {
    const KvTensor kv = kv_tensor(q, true);
    if (kv.box_keys != 0)
      err = launch(seesaw_tma_kernel, tma_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gather
      err = launch(seesaw_gather_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  } else {
    err = launch(seesaw_gather_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  }
  if (err == cudaSuccess)
    err = launch_merge<SeesawAnEighth>(q, stream, pdl, seesaw_combine_kernel, seesaw_merge_by_warps_kernel);
  return err;
}

int seesaw_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"seesaw_gather_kernel", (const void*)seesaw_gather_kernel, kThreads, main_geometry},
      {"seesaw_tma_kernel", (const void*)seesaw_tma_kernel, kThreads, tma_geometry},
      {"seesaw_kernel", (const void*)seesaw_kernel, kSeeThreads, seesaw_geometry},
      {"seesaw_combine_kernel", (const void*)seesaw_combine_kernel, kCombineThreads, merge_geometry},
      {"seesaw_merge_by_warps_kernel", (const void*)seesaw_merge_by_warps_kernel, kCombineThreads,
       warps_merge_geometry},
      {"seesaw_any_pages_kernel", (const void*)seesaw_any_pages_kernel, kSeeThreads, seesaw_geometry},
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
