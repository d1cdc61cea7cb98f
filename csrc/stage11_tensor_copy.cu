// Stage 11: the tensor-copy loader (sm_90a).
//
// Stage 10's loader gathers a tile with 4608 16-byte cp.async, each an
// instruction with its own address.  Here the loader asks the tensor copy
// (TMA) for whole tiles, one instruction per 8 KB chunk of a page
// (csrc/hopper/tma_loader.cuh); the compute warpgroups are stage 10's, and
// fence only the chunks cp.async wrote.  Copying by TMA pays where a block has
// many tiles to load; a call of a tile or two a block is faster gathered.
//
// A call runs tensor_copy_kernel where the pages suit the tensor copy (16 keys
// or more, a multiple or a divisor of 64), the cache gets a tensor map, and the
// block table's width gives each block kTmaTilesPerBlock tiles or more
// (tma_pays); else tensor_copy_gather_kernel, stage 10's kernel.  Then the
// merge, as in stage 10.
#include "hopper/launch.cuh"
#include "hopper/tma_loader.cuh"

namespace mla {
namespace {

__global__ void __launch_bounds__(kThreads, 1) tensor_copy_gather_kernel(const MlaParams p,
                                                                         const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) tensor_copy_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, TmaLoader, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) tensor_copy_combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) tensor_copy_merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

// Whether a call copies its tiles by TMA: the lengths, which live on the GPU,
// cannot be asked, so the block table's width bounds each unit's tiles (a
// batch with one long stream and short others counts as long).
constexpr int kTmaTilesPerBlock = 12;
bool tma_pays(const MlaParams& p) {
  const Shape sh = shape_of<NoSeesaw>(p);
  const int64_t tiles_bound = (int64_t)sh.units * unit_tiles_bound(p);
  return tma_pages(p.page_size) && tiles_bound >= (int64_t)kTmaTilesPerBlock * p.num_splits;
}
LaunchGeometry gather_geometry(const MlaParams& p) {
  return {dim3(p.num_splits), dim3(kThreads), kSmemBytes};
}
LaunchGeometry main_geometry(const MlaParams& p) { return tma_pays(p) ? kNotLaunched : gather_geometry(p); }
LaunchGeometry tma_geometry(const MlaParams& p) {
  return tma_pays(p) ? LaunchGeometry{dim3(p.num_splits), dim3(kThreads), kTmaSmemBytes} : kNotLaunched;
}

// The merges' launches, as the kernel list names them.
LaunchGeometry merge_geometry(const MlaParams& p) { return combine_geometry<NoSeesaw>(p); }
LaunchGeometry warps_merge_geometry(const MlaParams& p) { return merge_by_warps_geometry<NoSeesaw>(p); }

}  // namespace

// num_splits is the persistent grid: how many blocks share the work (one per SM by default).
cudaError_t tensor_copy_launch(const MlaParams& p, cudaStream_t stream) {
  MlaParams q = p;  // with this call's scratch filled in
  cudaError_t err = take_scratch<NoSeesaw>(q);
  static bool opted_in[64] = {};
  if (err == cudaSuccess)
    err = opt_in_once(opted_in, {{(const void*)tensor_copy_gather_kernel, kSmemBytes},
                                 {(const void*)tensor_copy_kernel, kTmaSmemBytes}});
  if (err != cudaSuccess) return err;
  const bool pdl = q.pdl != 0;
  if (tma_pays(q)) {
    const KvTensor kv = kv_tensor(q, false);
    if (kv.box_keys != 0)
      err = launch(tensor_copy_kernel, tma_geometry(q), stream, pdl, q, kv);
    else  // no tensor map for this cache: gather
      err = launch(tensor_copy_gather_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  } else {
    err = launch(tensor_copy_gather_kernel, gather_geometry(q), stream, pdl, q, KvTensor{});
  }
  if (err == cudaSuccess)
    err = launch_merge<NoSeesaw>(q, stream, pdl, tensor_copy_combine_kernel, tensor_copy_merge_by_warps_kernel);
  return err;
}

int tensor_copy_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"tensor_copy_gather_kernel", (const void*)tensor_copy_gather_kernel, kThreads, main_geometry},
      {"tensor_copy_kernel", (const void*)tensor_copy_kernel, kThreads, tma_geometry},
      {"tensor_copy_combine_kernel", (const void*)tensor_copy_combine_kernel, kCombineThreads,
       merge_geometry},
      {"tensor_copy_merge_by_warps_kernel", (const void*)tensor_copy_merge_by_warps_kernel, kCombineThreads,
       warps_merge_geometry},
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
