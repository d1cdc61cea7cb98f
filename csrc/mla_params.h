// The one parameter block every kernel stage takes, and the launcher interface.
//
// Plain C++ with no torch headers: the binding (bindings.cpp) fills it from
// tensors, the kernels (stageNN_*.cu) read it.  Strides are in elements.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
using bf16 = __nv_bfloat16;
#else
struct __nv_bfloat16;  // the host side only passes pointers around
using bf16 = __nv_bfloat16;
#endif

namespace mla {

constexpr int kDimQK = 576;  // 512 latent + 64 RoPE: width of q and of a cached token
constexpr int kDimV = 512;   // V is the first 512 values of the cached token

struct MlaParams {
  int batch;      // streams
  int q_len;      // query rows per stream (draft tokens + 1)
  int num_heads;  // query heads; all share one latent KV head
  int num_pages;  // pages in the pool
  int page_size;  // tokens per page
  int max_pages;  // block-table columns
  float scale;    // softmax scale applied to q.k

  const bf16* q;  // [batch, q_len, heads, 576]
  int64_t q_stride_b, q_stride_t, q_stride_h;

  const bf16* kv;  // [num_pages, page_size, 576]
  int64_t kv_stride_page, kv_stride_slot;

  const int* block_table;  // [batch, max_pages]
  int64_t bt_stride_b;
  const int* kv_lens;  // [batch]: tokens in the cache, the draft's included

  bf16* out;  // [batch, q_len, heads, 512]
  int64_t o_stride_b, o_stride_t, o_stride_h;
  float* lse;  // [batch, q_len, heads], natural log
  int64_t lse_stride_b, lse_stride_t, lse_stride_h;

  // Split-KV stages only: each split writes a normalised partial output and
  // its log-sum-exp; a combine kernel merges them.  Both are contiguous
  // scratch buffers the binding allocates: [batch, q_len, heads, num_splits, 512]
  // and [batch, q_len, heads, num_splits].
  int num_splits;
  float* o_partial;
  float* lse_partial;

  // Scratch a stage asks for itself (the Hopper stages: their plan and
  // partials, whose sizes only they know).  The binding hands out memory from torch's caching
  // allocator on the call's stream, so a CUDA graph can capture the call; it
  // stays valid until the op returns, after every launch is queued.
  void* (*scratch)(void* ctx, int64_t bytes);
  void* scratch_ctx;
  int* plan;  // the Hopper stages: the scheduler's plan (see csrc/hopper/common.cuh)
  int pdl;    // the Hopper stages: 1 to overlap each launch with the previous one (programmatic dependent launch)
};

// What a launcher would launch, so Python can check its own arithmetic.
struct LaunchGeometry {
  dim3 grid;
  dim3 block;
  int dynamic_smem_bytes;
};

// One kernel a stage launches: its name and entry point (for the attribute and
// occupancy queries), its block size, and its launch for a call's shape.
struct KernelHandle {
  const char* name;
  const void* func;
  int block_threads;
  LaunchGeometry (*geometry)(const MlaParams&);
};

// Every stage file provides these two (stage_list.h names the stages):
//   cudaError_t <stage>_launch(const MlaParams&, cudaStream_t);
//       launches everything one call needs, in order, on the stream;
//   int <stage>_kernels(const KernelHandle** handles);
//       points *handles at the kernels that launch makes, in the same order
//       (split stages end with the combine kernel, combine_splits.cu), and
//       returns how many there are.

}  // namespace mla
