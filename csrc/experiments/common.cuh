// What the experiment files share: the host side of a build without the
// op's choice of kernel, which runs one main kernel for every call (the
// experiments are held against stage 10's kernel, or against the seesaw where
// a stream's pairs fill its tiles), and the table each file hands its binding.
#pragma once

#include "experiments/experiment.h"
#include "hopper/launch.cuh"

namespace mla {
namespace {

using MainKernel = void (*)(const MlaParams, const KvTensor);
using MergeKernel = void (*)(const MlaParams);

// One call of a tile-on-N experiment: its scratch, its main kernel on every
// call (fed by the tensor copy where `tma` and the cache has a map, else
// gathering), then `merge` (merge_as_staged below, or another launch).
template <class Rule, class Merge>
cudaError_t launch_tile_n(const MlaParams& p, cudaStream_t stream, MainKernel main, int smem_bytes, bool tma,
                          Merge merge) {
  MlaParams q = p;
  cudaError_t err = take_scratch<Rule>(q);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(main, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const bool pdl = q.pdl != 0;
  err = launch(main, LaunchGeometry{dim3(q.num_splits), dim3(kThreads), smem_bytes}, stream, pdl, q,
               tma ? kv_tensor(q, false) : KvTensor{});
  return err == cudaSuccess ? merge(q, stream, pdl) : err;
}

// The merge as the stages launch it.
template <class Rule>
auto merge_as_staged(MergeKernel combine, MergeKernel by_warps) {
  return [=](const MlaParams& q, cudaStream_t stream, bool pdl) {
    return launch_merge<Rule>(q, stream, pdl, combine, by_warps);
  };
}

// The table of an experiment file without stamps.
template <int kVariants>
const Experiment& experiment_of(const char* const (&names)[kVariants],
                                cudaError_t (*launch)(int, const MlaParams&, cudaStream_t)) {
  static const Experiment e = {names, kVariants, launch, nullptr, nullptr, nullptr, nullptr};
  return e;
}

}  // namespace
}  // namespace mla
