// Stage 5: a warp per key for the scores.
//
// In stage 4, 16 threads of 256 compute the tile's 16 scores, each walking
// 576 products alone while 240 threads wait at the barrier.  Here each warp
// takes one key: lane l multiplies elements l, l+32, ... (18 products), and
// five shuffles add the 32 partial sums.  With 8 warps, a tile of 8 keys
// keeps every thread busy, and the smaller tile halves the key buffer again
// (about 13 KB of shared memory per block).
#include "mla_device.cuh"

namespace mla {
namespace {

constexpr int kThreads = 256;
constexpr int kMinBlocksPerSM = 8;  // 8 x 256 threads fill an sm_90 SM (2048; sm_120 has 1536):
                                    // 65536 registers / 2048 threads = at most 32 each
constexpr int kHeadTile = 1;       // heads that share each key tile
constexpr int kKeysPerTile = 8;    // keys staged in shared memory at a time
constexpr int kKvStride = kDimQK + 2;  // 289 words a row: a column of 32 rows hits 32 banks

// Shared memory, in the order it is laid out (widest alignment first).
constexpr int kSmemFloats = kHeadTile * kDimQK     // q_s: the tile's queries, fp32
                          + kHeadTile * kDimV      // acc_s: output accumulators
                          + kHeadTile * kKeysPerTile  // p_s: scores, then probabilities
                          + 3 * kHeadTile;         // m_s, l_s, alpha_s: softmax state
constexpr int kSmemBytes = kKeysPerTile * 8            // rows_s: the tile's key addresses
                         + kKeysPerTile * kKvStride * 2  // kv_s: the key tile, bf16
                         + kSmemFloats * 4;

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM) warp_per_key_kernel(const MlaParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const bf16** rows_s = reinterpret_cast<const bf16**>(smem);
  bf16* kv_s = reinterpret_cast<bf16*>(rows_s + kKeysPerTile);
  float* q_s = reinterpret_cast<float*>(kv_s + kKeysPerTile * kKvStride);
  float* acc_s = q_s + kHeadTile * kDimQK;
  float* p_s = acc_s + kHeadTile * kDimV;
  float* m_s = p_s + kHeadTile * kKeysPerTile;
  float* l_s = m_s + kHeadTile;
  float* alpha_s = l_s + kHeadTile;

  // z walks splits slowest within a stream; x and y (head tiles, query rows)
  // fastest, so the blocks that read one key range run side by side and
  // share it through L2.
  const int h0 = blockIdx.x * kHeadTile, t = blockIdx.y, tid = threadIdx.x;
  const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
  const int nh = min(kHeadTile, p.num_heads - h0);  // the last tile may be partial
  const int kv_len = p.kv_lens[b];
  if (!stream_ok(p, kv_len)) return;  // the combine kernel writes NaN for it
  const int n_keys = kv_len - p.q_len + t + 1;

  // This split's keys: tile-aligned boundaries, the same for every query row.
  const int per_split = ((kv_len + p.num_splits - 1) / p.num_splits + kKeysPerTile - 1)
                        / kKeysPerTile * kKeysPerTile;
  const int key_begin = split * per_split;
  const int key_end = min(n_keys, key_begin + per_split);
  if (key_begin >= key_end) {  // no visible key here: an empty partial
    if (tid < nh) p.lse_partial[partial_row(p, b, t, h0 + tid) + split] = -CUDART_INF_F;
    return;
  }

  for (int i = tid; i < kHeadTile * kDimQK; i += kThreads) {
    const int hh = i / kDimQK, d = i % kDimQK;
    q_s[i] = hh < nh ? __bfloat162float(q_head(p, b, t, h0 + hh)[d]) : 0.f;
  }
  for (int i = tid; i < kHeadTile * kDimV; i += kThreads) acc_s[i] = 0.f;
  if (tid < kHeadTile) {
    m_s[tid] = -CUDART_INF_F;
    l_s[tid] = 0.f;
  }

  for (int key0 = key_begin; key0 < key_end; key0 += kKeysPerTile) {
    const int n = min(kKeysPerTile, key_end - key0);

    // 1. Stage the tile: look each key up in the block table once, then copy
    //    its 576 values with 4-byte loads, consecutive threads on consecutive words.
    if (tid < n) rows_s[tid] = kv_row(p, b, key0 + tid);
    __syncthreads();
    constexpr int kWords = kDimQK / 2;
    for (int i = tid; i < kKeysPerTile * kWords; i += kThreads) {
      const int k = i / kWords, w = i % kWords;
      if (k < n) {
        const bf16* row = rows_s[k];
        const uint32_t bits = row ? reinterpret_cast<const uint32_t*>(row)[w] : kNanPairBits;
        reinterpret_cast<uint32_t*>(kv_s + k * kKvStride)[w] = bits;
      }
    }
    __syncthreads();

    // 2. Scores: a warp per (head, key) pair.  Lane l takes elements l, l+32,
    //    ... (18 of them); the warp then sums its 32 partial dot products.
    const int warp = tid / 32, lane = tid % 32;
    for (int i = warp; i < kHeadTile * kKeysPerTile; i += kThreads / 32) {
      const int hh = i / kKeysPerTile, k = i % kKeysPerTile;
      float s = -CUDART_INF_F;
      if (hh < nh && k < n) {  // the same for the whole warp
        const float* qh = q_s + hh * kDimQK;
        const bf16* kr = kv_s + k * kKvStride;
        float dot = 0.f;
#pragma unroll
        for (int d = lane; d < kDimQK; d += 32) dot += qh[d] * __bfloat162float(kr[d]);
        s = warp_sum(dot) * p.scale;
      }
      if (lane == 0) p_s[i] = s;
    }
    __syncthreads();

    // 3. Online softmax, one thread per head: new running max, the factor
    //    that rescales what was accumulated so far, probabilities of the tile.
    if (tid < kHeadTile) {
      float* ph = p_s + tid * kKeysPerTile;
      if (tid < nh) {
        float tile_max = -CUDART_INF_F;
        for (int k = 0; k < n; ++k) tile_max = fmaxf(tile_max, ph[k]);
        const float m_new = fmaxf(m_s[tid], tile_max);
        const float alpha = __expf(m_s[tid] - m_new);
        float sum = 0.f;
        for (int k = 0; k < kKeysPerTile; ++k) {
          const float e = k < n ? __expf(ph[k] - m_new) : 0.f;
          ph[k] = e;
          sum += e;
        }
        l_s[tid] = l_s[tid] * alpha + sum;
        m_s[tid] = m_new;
        alpha_s[tid] = alpha;
      } else {  // padding heads of a partial tile contribute nothing
        for (int k = 0; k < kKeysPerTile; ++k) ph[k] = 0.f;
        alpha_s[tid] = 1.f;
      }
    }
    __syncthreads();

    // 4. acc = acc * alpha + P V: each thread owns output dimensions d for the tile's one head.
    for (int d = tid; d < kDimV; d += kThreads) {
      float a[kHeadTile];
#pragma unroll
      for (int hh = 0; hh < kHeadTile; ++hh) a[hh] = acc_s[hh * kDimV + d] * alpha_s[hh];
      for (int k = 0; k < n; ++k) {
        const float v = __bfloat162float(kv_s[k * kKvStride + d]);
#pragma unroll
        for (int hh = 0; hh < kHeadTile; ++hh) a[hh] += p_s[hh * kKeysPerTile + k] * v;
      }
#pragma unroll
      for (int hh = 0; hh < kHeadTile; ++hh) acc_s[hh * kDimV + d] = a[hh];
    }
    __syncthreads();  // the next tile overwrites kv_s and p_s
  }

  // 5. Normalise and write this split's partial output, in fp32.
  for (int i = tid; i < nh * kDimV; i += kThreads) {
    const int hh = i / kDimV, d = i % kDimV;
    p.o_partial[(partial_row(p, b, t, h0 + hh) + split) * kDimV + d] = acc_s[i] / l_s[hh];
  }
  if (tid < nh) p.lse_partial[partial_row(p, b, t, h0 + tid) + split] = m_s[tid] + logf(l_s[tid]);
}

}  // namespace

LaunchGeometry warp_per_key_geometry(const MlaParams& p) {
  const int head_tiles = (p.num_heads + kHeadTile - 1) / kHeadTile;
  return {dim3(head_tiles, p.q_len, p.batch * p.num_splits), dim3(kThreads), kSmemBytes};
}

cudaError_t warp_per_key_launch(const MlaParams& p, cudaStream_t stream) {
  const cudaError_t err = launch_with_smem(warp_per_key_kernel, warp_per_key_geometry(p), p, stream);
  return err != cudaSuccess ? err : combine_launch(p, stream);
}

int warp_per_key_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"warp_per_key_kernel", (const void*)warp_per_key_kernel, kThreads, warp_per_key_geometry},
      combine_handle(),
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
