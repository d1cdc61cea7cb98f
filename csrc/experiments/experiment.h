// What an experiment file (csrc/experiments/*.cu) gives its binding
// (binding.cpp): its variants, each a launch of a call as the op's launcher
// makes it, and the stamps it keeps, if any.
//
// An experiment is one of the Hopper stages with one piece swapped (a loader,
// a compute loop, the seesaw's order, a scheduler's rule...), built beside the
// extension into a module of its own by the book's list of experiments; none is
// an op.  Plain C++: the binding includes it without CUDA's device headers.
#pragma once

#include <cuda_runtime.h>

#include "mla_params.h"

namespace mla {

struct Experiment {
  const char* const* variants;  // the variants' names, as the book's list of experiments knows them
  int n_variants;
  cudaError_t (*launch)(int variant, const MlaParams& p, cudaStream_t stream);
  // Tile stamps (a compute warpgroup of block 0, tile by tile): [2][64][6] floats, SM clock cycles.
  cudaError_t (*timeline_read)(float* host, int capacity);
  cudaError_t (*timeline_clear)();
  // Global-timer stamps of the main blocks, the merge blocks of the first cut unit and block 0's start.
  cudaError_t (*merge_timeline_read)(unsigned long long* main, int main_capacity, unsigned long long* merge,
                                     int merge_capacity, unsigned long long* block0, int block0_capacity);
  cudaError_t (*merge_timeline_clear)();
};

// Defined by the experiment file the module is built from.
const Experiment& experiment();

}  // namespace mla
