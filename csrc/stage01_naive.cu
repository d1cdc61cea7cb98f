// Stage 1: naive.
//
// One block per (head, query row, stream).  Each thread takes every 128th
// visible key and computes its 576-wide dot product alone; every score of the
// row waits in shared memory; one softmax over them; then each thread owns 4
// of the 512 output dimensions and walks every key again for the weighted sum
// of V.  Simple and correct, but it reads the cache twice per head and per
// query row, and the scores need 4 bytes of shared memory per key of the block
// table: the longer the cache, the fewer blocks fit on an SM, until none does.
#include "mla_device.cuh"

namespace mla {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) naive_kernel(const MlaParams p) {
  extern __shared__ float smem[];
  float* q_s = smem;              // [576] this head's query, in fp32
  float* scores = smem + kDimQK;  // [max_pages * page_size] one score per key

  const int h = blockIdx.x, t = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int kv_len = p.kv_lens[b];
  if (!stream_ok(p, kv_len)) {
    write_nan_head(p, b, t, h, tid, kThreads);
    return;
  }
  const int n_keys = kv_len - p.q_len + t + 1;  // keys 0 .. prefix + t

  const bf16* q = q_head(p, b, t, h);
  for (int d = tid; d < kDimQK; d += kThreads) q_s[d] = __bfloat162float(q[d]);
  __syncthreads();

  // 1. Scores: a whole dot product per thread, one element at a time.
  float m = -CUDART_INF_F;
  for (int j = tid; j < n_keys; j += kThreads) {
    const bf16* k = kv_row(p, b, j);
    float s = CUDART_NAN_F;
    if (k != nullptr) {
      float dot = 0.f;
      for (int d = 0; d < kDimQK; ++d) dot += q_s[d] * __bfloat162float(k[d]);
      s = dot * p.scale;
    }
    scores[j] = s;
    m = fmaxf(m, s);
  }
  m = block_max<kThreads>(m);

  // 2. Softmax numerators, and their sum.
  float l = 0.f;
  for (int j = tid; j < n_keys; j += kThreads) {
    const float e = __expf(scores[j] - m);
    scores[j] = e;
    l += e;
  }
  l = block_sum<kThreads>(l);  // its barriers also publish every thread's scores

  // 3. Weighted sum of V: this thread's output dimensions, over every key.
  bf16* o = out_head(p, b, t, h);
  for (int d = tid; d < kDimV; d += kThreads) {
    float acc = 0.f;
    for (int j = 0; j < n_keys; ++j) {
      const bf16* v = kv_row(p, b, j);
      acc += scores[j] * (v != nullptr ? __bfloat162float(v[d]) : CUDART_NAN_F);
    }
    o[d] = __float2bfloat16(acc / l);
  }
  if (tid == 0) *lse_at(p, b, t, h) = m + logf(l);
}

}  // namespace

LaunchGeometry naive_geometry(const MlaParams& p) {
  // The score array is sized for the longest stream the block table allows.
  const int64_t capacity = (int64_t)p.max_pages * p.page_size;
  const int64_t smem = (kDimQK + capacity) * (int64_t)sizeof(float);
  return {dim3(p.num_heads, p.q_len, p.batch), dim3(kThreads),
          (int)(smem > INT32_MAX ? INT32_MAX : smem)};
}

cudaError_t naive_launch(const MlaParams& p, cudaStream_t stream) {
  return launch_with_smem(naive_kernel, naive_geometry(p), p, stream);
}

int naive_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"naive_kernel", (const void*)naive_kernel, kThreads, naive_geometry},
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
