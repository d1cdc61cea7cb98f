// The host side every Hopper stage shares: launches with programmatic
// dependent launch, the cache's tensor maps, the call's scratch, and the merge
// that follows the main kernel.  Each stage file's launcher picks its main
// kernel for a call; everything here is the same for all of them.
#pragma once

#include "hopper/merge.cuh"

namespace mla {
namespace {

// Launch with programmatic dependent launch when asked and the driver allows
// it, else plainly.
template <typename... Args>
cudaError_t launch(void (*kernel)(Args...), const LaunchGeometry& g, cudaStream_t stream, bool pdl, const Args&... args) {
  if (pdl) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g.grid;
    cfg.blockDim = g.block;
    cfg.dynamicSmemBytes = g.dynamic_smem_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, kernel, args...) == cudaSuccess) return cudaSuccess;
    (void)cudaGetLastError();  // not supported here: launch plainly
  }
  kernel<<<g.grid, g.block, g.dynamic_smem_bytes, stream>>>(args...);
  return cudaGetLastError();
}

constexpr LaunchGeometry kNotLaunched = {dim3(0), dim3(0), 0};

// The cache's tensor map for this call, or box_keys = 0 where TMA cannot read
// it.  With four_chunks, also the map that copies four chunks of a tile at
// once (map4), where a tile is one page's 64 keys.  The driver's encoder is
// found once; the last map made on this thread is kept, so a stream of calls
// on one cache encodes it once.
KvTensor kv_tensor(const MlaParams& p, bool four_chunks) {
  KvTensor kv = {};
  const int box_keys = std::min(p.page_size, kKeysPerTile);
  if (!tma_cache(p)) return kv;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return kv;
  struct Key {
    const void* kv;
    int64_t page_size, num_pages, stride_slot, stride_page;
    bool four_chunks;
    bool same(const Key& o) const {
      return kv == o.kv && page_size == o.page_size && num_pages == o.num_pages && stride_slot == o.stride_slot &&
             stride_page == o.stride_page && four_chunks == o.four_chunks;
    }
  };
  thread_local Key last_key = {};
  thread_local KvTensor last = {};
  const Key key = {p.kv, p.page_size, p.num_pages, p.kv_stride_slot, p.kv_stride_page, four_chunks};
  if (last.box_keys != 0 && key.same(last_key)) return last;
  const cuuint64_t dims[3] = {(cuuint64_t)kDimQK, (cuuint64_t)p.page_size, (cuuint64_t)p.num_pages};
  const cuuint64_t strides[2] = {(cuuint64_t)p.kv_stride_slot * 2, (cuuint64_t)p.kv_stride_page * 2};  // bytes
  const cuuint32_t box[3] = {kChunkDims, (cuuint32_t)box_keys, 1}, elem_strides[3] = {1, 1, 1};
  if (encode(&kv.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(p.kv), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return KvTensor{};
  kv.box_keys = box_keys;
  // The four-chunk boxes, where a tile is one page's 64 keys: the chunks are a
  // dimension of their own, 128 bytes apart, between the keys and the pages.
  kv.chunk_boxes = 0;
  if (four_chunks && box_keys == kKeysPerTile) {
    const cuuint64_t dims4[4] = {(cuuint64_t)kChunkDims, (cuuint64_t)p.page_size, (cuuint64_t)kChunks,
                                 (cuuint64_t)p.num_pages};
    const cuuint64_t strides4[3] = {(cuuint64_t)p.kv_stride_slot * 2, (cuuint64_t)kChunkDims * 2,
                                    (cuuint64_t)p.kv_stride_page * 2};
    const cuuint32_t box4[4] = {kChunkDims, (cuuint32_t)kKeysPerTile, 4, 1}, elem_strides4[4] = {1, 1, 1, 1};
    if (encode(&kv.map4, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(p.kv), dims4, strides4, box4,
               elem_strides4, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS)
      kv.chunk_boxes = 1;  // (refused, the groups of four are copied chunk by chunk, on the same barriers)
  }
  last_key = key;
  last = kv;
  return kv;
}

// The call's scratch, from the binding's allocator on the call's stream: two
// partial slots per block (a share cuts at most its first and its last unit)
// and the plan.
template <class Rule>
cudaError_t take_scratch(MlaParams& q) {
  const Shape sh = shape_of<Rule>(q);
  const int64_t slots = (int64_t)q.num_splits * 2 * kPairsPerBlock;
  q.o_partial = static_cast<float*>(q.scratch(q.scratch_ctx, slots * kDimV * 4));
  q.lse_partial = static_cast<float*>(q.scratch(q.scratch_ctx, slots * 4));
  q.plan = static_cast<int*>(q.scratch(q.scratch_ctx, (kPlanHeader + sh.units + 1 + 3 * (int64_t)q.num_splits) * 4));
  return !q.o_partial || !q.lse_partial || !q.plan ? cudaErrorMemoryAllocation : cudaSuccess;
}

// The opt-in to more than 48 KB of dynamic shared memory, made once per
// device for each of a stage's main kernels (it is a per-context attribute).
struct SmemOptIn {
  const void* kernel;
  int bytes;
};
template <int kKernels>
cudaError_t opt_in_once(bool (&opted_in)[64], const SmemOptIn (&kernels)[kKernels]) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess || (device < 64 && opted_in[device])) return err;
  for (const SmemOptIn& k : kernels) {
    err = cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, k.bytes);
    if (err != cudaSuccess) return err;
  }
  if (device < 64) opted_in[device] = true;
  return cudaSuccess;
}

// The merge of a call: the slices of its grid (the block table's width bounds
// a unit's tiles), whether any unit may be cut at all (not where the table is
// too narrow for a stream to hold more than one tile: such a call launches no
// merge), and which of the two merges runs.
template <class Rule>
int merge_slices(const MlaParams& p) {
  return combine_slices(p.num_splits, shape_of<Rule>(p).units, unit_tiles_bound(p));
}
inline bool may_cut(const MlaParams& p) { return unit_tiles_bound(p) > 1; }
template <class Rule>
bool merges_by_warps(const MlaParams& p) {
  return merge_slices<Rule>(p) == 1 && combine_by_warps(p.num_splits, shape_of<Rule>(p).units);
}
// One block per (dim slice of a pair of a unit, cut unit).  At most one unit per
// block boundary is cut, and no more units than there are.
template <class Rule>
LaunchGeometry combine_geometry(const MlaParams& p) {
  if (!may_cut(p) || merges_by_warps<Rule>(p)) return kNotLaunched;
  const int units = shape_of<Rule>(p).units;
  const int slices = merge_slices<Rule>(p);
  return {dim3(kPairsPerBlock * slices, std::min(p.num_splits, units)), dim3(combine_threads(slices, units)), 0};
}
template <class Rule>
LaunchGeometry merge_by_warps_geometry(const MlaParams& p) {
  if (!may_cut(p) || !merges_by_warps<Rule>(p)) return kNotLaunched;
  return {dim3(kPairsPerBlock / kPairsPerWarpMergeBlock, std::min(p.num_splits, shape_of<Rule>(p).units)),
          dim3(kCombineThreads), 0};
}
// The merge after the main kernel.  The main kernel lets it launch only as
// its blocks finish: let go at their start, the merge's blocks would wait on
// the few SMs the main kernel leaves free, crowded there, and start the merge
// from those.
template <class Rule>
cudaError_t launch_merge(const MlaParams& q, cudaStream_t stream, bool pdl, void (*combine)(const MlaParams),
                         void (*by_warps)(const MlaParams)) {
  if (!may_cut(q)) return cudaSuccess;
  return merges_by_warps<Rule>(q) ? launch(by_warps, merge_by_warps_geometry<Rule>(q), stream, pdl, q)
                                  : launch(combine, combine_geometry<Rule>(q), stream, pdl, q);
}

}  // namespace
}  // namespace mla
