// What the seesaw experiments share: the seesaw wherever a stream's pairs fill
// its tiles and the pages suit the tensor copy (a build without the op's
// choice of kernel: no line for the block table's width), stage 10's tile on
// N in the same units elsewhere, and the launch of a call.
#pragma once

#include "experiments/common.cuh"
#include "experiments/seesaw_first_pieces.cuh"
#include "experiments/tile_stamps.cuh"
#include "hopper/seesaw.cuh"
#include "hopper/tile_n.cuh"

namespace mla {
namespace {

// The seesaw wherever it fits: a third of padding with whole tiles, else an eighth.
struct SeesawWhereItFits {
  __host__ __device__ static bool seesaw(const MlaParams& p) {
    const int pairs = p.q_len * p.num_heads;
    const bool whole_tiles = p.page_size % kKeysPerTile == 0;
    return (!whole_tiles ? fills_rows_eighth(pairs) : fills_rows_third(pairs)) && tma_pages(p.page_size);
  }
};

// One call: the seesaw (`seesaw`, or `whole` where a tile is one box of 64 keys
// copied four chunks at once and `whole` is given) where it fits and the cache
// gets a tensor map, else `tile_n`; then the merge.
inline cudaError_t launch_seesaw(const MlaParams& p, cudaStream_t stream, MainKernel seesaw, MainKernel whole,
                                 bool four_chunk_map, MainKernel tile_n, MergeKernel combine, MergeKernel by_warps) {
  MlaParams q = p;
  cudaError_t err = take_scratch<SeesawWhereItFits>(q);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(tile_n, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  for (MainKernel k : {seesaw, whole})
    if (err == cudaSuccess && k) err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSeeSmemBytes);
  if (err != cudaSuccess) return err;
  const bool pdl = q.pdl != 0;
  const LaunchGeometry tile_n_geometry = {dim3(q.num_splits), dim3(kThreads), kSmemBytes};
  if (SeesawWhereItFits::seesaw(q)) {
    const KvTensor kv = kv_tensor(q, four_chunk_map);
    MainKernel k = whole && kv.box_keys == kKeysPerTile && kv.chunk_boxes ? whole : seesaw;
    err = kv.box_keys != 0 ? launch(k, LaunchGeometry{dim3(q.num_splits), dim3(kSeeThreads), kSeeSmemBytes}, stream, pdl, q, kv)
                           : launch(tile_n, tile_n_geometry, stream, pdl, q, KvTensor{});
  } else {
    err = launch(tile_n, tile_n_geometry, stream, pdl, q, KvTensor{});
  }
  return err == cudaSuccess ? launch_merge<SeesawWhereItFits>(q, stream, pdl, combine, by_warps) : err;
}

}  // namespace
}  // namespace mla
