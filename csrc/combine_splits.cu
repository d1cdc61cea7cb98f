// The combine kernel of the split-KV stages (3 onwards).
//
// Split s of a head saw keys K_s and left o_s = softmax-weighted mean of their
// V and lse_s = log(sum_{j in K_s} exp(score_j)).  The whole row's answer is
//   lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) * o_s,
// computed with the largest lse_s subtracted first so no exp overflows.
// Splits that saw no key wrote lse_s = -inf and are skipped unread.
#include "mla_device.cuh"

namespace mla {
namespace {

constexpr int kThreads = 128;  // 128 threads x 4 dims = the 512 of V

__global__ void __launch_bounds__(kThreads) combine_splits_kernel(const MlaParams p) {
  const int h = blockIdx.x, t = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  if (!stream_ok(p, p.kv_lens[b])) {
    write_nan_head(p, b, t, h, tid, kThreads);
    return;
  }
  const int64_t row = partial_row(p, b, t, h);
  const float* lse_s = p.lse_partial + row;
  const float4* o_s = reinterpret_cast<const float4*>(p.o_partial + row * kDimV);

  float m = -CUDART_INF_F;
  for (int s = 0; s < p.num_splits; ++s) m = fmaxf(m, lse_s[s]);

  float weight_sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < p.num_splits; ++s) {
    const float ls = lse_s[s];
    if (ls == -CUDART_INF_F) continue;
    const float w = __expf(ls - m);
    const float4 o = o_s[s * (kDimV / 4) + tid];
    weight_sum += w;
    acc.x += w * o.x;
    acc.y += w * o.y;
    acc.z += w * o.z;
    acc.w += w * o.w;
  }
  const float inv = 1.f / weight_sum;
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(out_head(p, b, t, h) + 4 * tid);
  out[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  out[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  if (tid == 0) *lse_at(p, b, t, h) = m + logf(weight_sum);
}

}  // namespace

LaunchGeometry combine_geometry(const MlaParams& p) {
  return {dim3(p.num_heads, p.q_len, p.batch), dim3(kThreads), 0};
}

cudaError_t combine_launch(const MlaParams& p, cudaStream_t stream) {
  return launch_with_smem(combine_splits_kernel, combine_geometry(p), p, stream);
}

KernelHandle combine_handle() {
  return {"combine_splits_kernel", (const void*)combine_splits_kernel, kThreads, combine_geometry};
}

}  // namespace mla
