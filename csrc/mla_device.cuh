// Device helpers every stage shares: addressing through the block table,
// the defences against bad inputs, and block-wide reductions.
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>

#include <iterator>  // std::size, for each stage's list of kernels

#include "mla_params.h"

namespace mla {

constexpr uint32_t kNanPairBits = 0x7FC07FC0u;  // two bf16 quiet NaNs

// A stream can be computed when the cache holds at least its own draft and no
// more tokens than its block table can address.  A graph replay cannot check
// this on the host, so every kernel checks it and answers NaN otherwise.
__device__ __forceinline__ bool stream_ok(const MlaParams& p, int kv_len) {
  return kv_len >= p.q_len && (int64_t)kv_len <= (int64_t)p.max_pages * p.page_size;
}

// Address of cached token `key` of stream `b`, or nullptr when the block table
// points outside the pool (the caller then produces NaN instead of reading).
__device__ __forceinline__ const bf16* kv_row(const MlaParams& p, int b, int key) {
  const int page_idx = key / p.page_size;
  const int page = p.block_table[(int64_t)b * p.bt_stride_b + page_idx];
  if (page < 0 || page >= p.num_pages) return nullptr;
  const int slot = key - page_idx * p.page_size;
  return p.kv + (int64_t)page * p.kv_stride_page + (int64_t)slot * p.kv_stride_slot;
}

__device__ __forceinline__ const bf16* q_head(const MlaParams& p, int b, int t, int h) {
  return p.q + b * p.q_stride_b + t * p.q_stride_t + h * p.q_stride_h;
}

__device__ __forceinline__ bf16* out_head(const MlaParams& p, int b, int t, int h) {
  return p.out + b * p.o_stride_b + t * p.o_stride_t + h * p.o_stride_h;
}

__device__ __forceinline__ float* lse_at(const MlaParams& p, int b, int t, int h) {
  return p.lse + b * p.lse_stride_b + t * p.lse_stride_t + h * p.lse_stride_h;
}

// Row (b, t, h) of the split scratch buffers.
__device__ __forceinline__ int64_t partial_row(const MlaParams& p, int b, int t, int h) {
  return ((int64_t)(b * p.q_len + t) * p.num_heads + h) * p.num_splits;
}

// Mark one head's output as invalid: NaN everywhere, so a bad input is loud.
__device__ __forceinline__ void write_nan_head(const MlaParams& p, int b, int t, int h,
                                               int tid, int nthreads) {
  bf16* o = out_head(p, b, t, h);
  for (int d = tid; d < kDimV; d += nthreads) o[d] = __float2bfloat16(CUDART_NAN_F);
  if (tid == 0) *lse_at(p, b, t, h) = CUDART_NAN_F;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Block-wide reductions: every thread gets the result.  The leading barrier
// lets the same scratch words serve back-to-back calls.
template <int kThreads>
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_max(lane < kThreads / 32 ? partial[lane] : -CUDART_INF_F);
}

template <int kThreads>
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum(lane < kThreads / 32 ? partial[lane] : 0.f);
}

// Two floats rounded to bf16 and packed in one register, the low one first:
// the operand a bf16 tensor-core instruction takes.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Eight bf16 (one 16-byte chunk, as a uint4) to fp32, and their dot product
// with eight floats: the unit of work of the 16-byte stages (6 onwards).
__device__ __forceinline__ void bf16x8_to_float(uint4 raw, float* dst) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float4* d4 = reinterpret_cast<float4*>(dst);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
  d4[0] = make_float4(a.x, a.y, b.x, b.y);
  d4[1] = make_float4(c.x, c.y, d.x, d.y);
}

__device__ __forceinline__ float dot_bf16x8(uint4 raw, float4 q0, float4 q1) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
  return q0.x * a.x + q0.y * a.y + q0.z * b.x + q0.w * b.y
       + q1.x * c.x + q1.y * c.y + q1.z * d.x + q1.w * d.y;
}

// Launch with more than 48 KB of dynamic shared memory only after opting in.
template <typename Kernel>
cudaError_t launch_with_smem(Kernel kernel, const LaunchGeometry& g, const MlaParams& p,
                             cudaStream_t stream) {
  if (g.dynamic_smem_bytes > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           g.dynamic_smem_bytes);
    if (err != cudaSuccess) return err;
  }
  kernel<<<g.grid, g.block, g.dynamic_smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// The combine kernel of the split-KV stages (combine_splits.cu): its launch,
// and its handle, which each split stage lists after its own kernel.
LaunchGeometry combine_geometry(const MlaParams& p);
cudaError_t combine_launch(const MlaParams& p, cudaStream_t stream);
KernelHandle combine_handle();

}  // namespace mla
