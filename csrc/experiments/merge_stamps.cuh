// The global timer's stamps of a call's blocks and merge, for the experiment
// that times a short call from inside: the op's NoStamps hooks
// (csrc/hopper/common.cuh) given bodies.  Only these stores are added.
#pragma once

#include "hopper/common.cuh"

namespace mla {
namespace {

// The GPU's global timer (nanoseconds), written by
// thread 128 of each block of the main kernel (the first compute thread) as the
// block starts and once its warpgroup has written its last unit; by thread 0 of
// each merge block of the first cut unit at kMergeEvents points; and at
// kBlock0Events points of block 0's way to its first tile ----
// The merge block's start, past its wait for the main kernel, the cut unit
// read from the plan, the pieces' weights known, and its pieces added.
constexpr int kMergeEvents = 5, kMergeStampBlocks = 4 * 80;  // four slices of 80 pairs: a sliced unit's blocks
// Block 0, before its first unit's first scores: past its wait for the previous
// kernel and the scheduler's cut (thread 0); the loader's first page id read
// back (thread 0); then, in thread 128 (its first unit), Q^T landed, the first
// tile's first chunk landed, all of its chunks landed, and its scores done.
constexpr int kBlock0Events = 7;
__device__ unsigned long long main_stamps[kMaxSplitsHere][2];
__device__ unsigned long long merge_stamps[kMergeStampBlocks][kMergeEvents];
__device__ unsigned long long block0_stamps[kBlock0Events];
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct MergeStamps : NoStamps {
  __device__ static void main(int event) {
    if (threadIdx.x == 128) main_stamps[blockIdx.x][event] = global_ns();
  }
  __device__ static void block0(bool when, int event) {
    if (blockIdx.x == 0 && when) block0_stamps[event] = global_ns();
  }
  __device__ static void merge(int event) {
    if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.x < kMergeStampBlocks) merge_stamps[blockIdx.x][event] = global_ns();
  }
};

cudaError_t merge_stamps_read(unsigned long long* main, int main_capacity, unsigned long long* merge,
                              int merge_capacity, unsigned long long* block0, int block0_capacity) {
  if (main_capacity < kMaxSplitsHere * 2 || merge_capacity < kMergeStampBlocks * kMergeEvents ||
      block0_capacity < kBlock0Events)
    return cudaErrorInvalidValue;
  cudaError_t err = cudaMemcpyFromSymbol(main, main_stamps, sizeof(main_stamps));
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(merge, merge_stamps, sizeof(merge_stamps));
  return err == cudaSuccess ? cudaMemcpyFromSymbol(block0, block0_stamps, sizeof(block0_stamps)) : err;
}
cudaError_t merge_stamps_clear() {
  static const unsigned long long zeros[kMergeStampBlocks * kMergeEvents] = {};
  static_assert(sizeof(zeros) >= sizeof(main_stamps), "one buffer of zeros clears both");
  static_assert(sizeof(zeros) >= sizeof(block0_stamps), "and block 0's");
  cudaError_t err = cudaMemcpyToSymbol(main_stamps, zeros, sizeof(main_stamps));
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(block0_stamps, zeros, sizeof(block0_stamps));
  return err == cudaSuccess ? cudaMemcpyToSymbol(merge_stamps, zeros, sizeof(merge_stamps)) : err;
}

}  // namespace
}  // namespace mla
