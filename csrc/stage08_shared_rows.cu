// Stage 8: the draft's rows share every key tile.
//
// Stages 4-6 give each (query row, head) a block of its own, so a draft of
// 9 rows reads each cached token 9 times per head, and converts it from bf16
// and multiplies it in 9 different blocks.  But the 9 rows see the same keys
// (all of the prefix; they differ only in the last few draft keys).  Here one
// block serves up to 16 rows of one head: it stages a tile of keys once and
// every row uses it, which divides the cache traffic and the load and
// conversion work by q_len.  The rows take the place the heads had in the
// HT = 8 tile of stage 2; what is new is that rows see different numbers of
// keys, so the last tiles mask each row separately.  The accumulators, which
// only their own thread ever touches, move to registers.
#include "mla_device.cuh"

namespace mla {
namespace {

constexpr int kThreads = 256;
constexpr int kMinBlocksPerSM = 3;  // 16 rows' accumulators need ~80 registers: 3 blocks, no spills
constexpr int kRowTile = 16;       // query rows of one head that share each key tile
constexpr int kKeysPerTile = 8;    // keys staged in shared memory at a time
constexpr int kKvStride = kDimQK;  // no reads down a column any more: no padding
constexpr int kChunks = kDimQK / 8;  // 72 chunks of 16 bytes per cached token

// Shared memory, in the order it is laid out (widest alignment first).
constexpr int kSmemFloats = kRowTile * kDimQK      // q_s: the rows' queries, fp32
                          + kRowTile * kKeysPerTile  // p_s: scores, then probabilities
                          + 3 * kRowTile;          // m_s, l_s, alpha_s: softmax state
constexpr int kSmemBytes = kKeysPerTile * 8            // rows_s: the tile's key addresses
                         + kKeysPerTile * kKvStride * 2  // kv_s: the key tile, bf16
                         + kSmemFloats * 4;

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM) shared_rows_kernel(const MlaParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const bf16** rows_s = reinterpret_cast<const bf16**>(smem);
  bf16* kv_s = reinterpret_cast<bf16*>(rows_s + kKeysPerTile);
  float* q_s = reinterpret_cast<float*>(kv_s + kKeysPerTile * kKvStride);
  float* p_s = q_s + kRowTile * kDimQK;
  float* m_s = p_s + kRowTile * kKeysPerTile;
  float* l_s = m_s + kRowTile;
  float* alpha_s = l_s + kRowTile;

  // x walks heads, y groups of up to 16 rows, z (stream, split), splits slowest.
  const int h = blockIdx.x, t0 = blockIdx.y * kRowTile, tid = threadIdx.x;
  const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
  const int nr = min(kRowTile, p.q_len - t0);  // the last row group may be partial
  const int kv_len = p.kv_lens[b];
  if (!stream_ok(p, kv_len)) return;  // the combine kernel writes NaN for it
  // Row t0 + rr sees keys 0 .. first_keys + rr - 1; the last row sees the most.
  const int first_keys = kv_len - p.q_len + t0 + 1;
  const int n_keys = first_keys + nr - 1;

  // This split's keys: tile-aligned boundaries, the same for every query row.
  const int per_split = ((kv_len + p.num_splits - 1) / p.num_splits + kKeysPerTile - 1)
                        / kKeysPerTile * kKeysPerTile;
  const int key_begin = split * per_split;
  const int key_end = min(n_keys, key_begin + per_split);
  if (key_begin >= key_end) {  // no visible key here for any row: empty partials
    if (tid < nr) p.lse_partial[partial_row(p, b, t0 + tid, h) + split] = -CUDART_INF_F;
    return;
  }

  for (int i = tid; i < kRowTile * kChunks; i += kThreads) {
    const int rr = i / kChunks, c = i % kChunks;
    const uint4 raw = rr < nr ? reinterpret_cast<const uint4*>(q_head(p, b, t0 + rr, h))[c]
                              : make_uint4(0, 0, 0, 0);
    bf16x8_to_float(raw, q_s + rr * kDimQK + 8 * c);
  }
  const int d = 2 * tid;  // this thread's two output dimensions (256 x 2 = 512)
  float2 acc[kRowTile];  // ... accumulated for every row
#pragma unroll
  for (int rr = 0; rr < kRowTile; ++rr) acc[rr] = make_float2(0.f, 0.f);
  if (tid < kRowTile) {
    m_s[tid] = -CUDART_INF_F;
    l_s[tid] = 0.f;
  }

  for (int key0 = key_begin; key0 < key_end; key0 += kKeysPerTile) {
    const int n = min(kKeysPerTile, key_end - key0);

    // 1. Stage the tile: look each key up in the block table once, then copy
    //    its 576 values with 16-byte loads, consecutive threads on consecutive chunks.
    if (tid < n) rows_s[tid] = kv_row(p, b, key0 + tid);
    __syncthreads();
    for (int i = tid; i < kKeysPerTile * kChunks; i += kThreads) {
      const int k = i / kChunks, c = i % kChunks;
      if (k < n) {
        const bf16* row = rows_s[k];
        const uint4 bits = row ? reinterpret_cast<const uint4*>(row)[c]
                               : make_uint4(kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
        reinterpret_cast<uint4*>(kv_s + k * kKvStride)[c] = bits;
      }
    }
    __syncthreads();

    // 2. Scores: a warp per key.  Lane l holds the key's 16-byte chunks l,
    //    l+32 and (lanes 0-7) l+64 in registers and multiplies them with every
    //    row's query; the warp sums each row's 32 partial dot products.
    const int warp = tid / 32, lane = tid % 32;
    for (int k = warp; k < kKeysPerTile; k += kThreads / 32) {
      const bf16* kr = kv_s + k * kKvStride;
      uint4 kc[3];
#pragma unroll
      for (int j = 0; j < 3; ++j)
        kc[j] = lane + 32 * j < kChunks ? reinterpret_cast<const uint4*>(kr)[lane + 32 * j] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int rr = 0; rr < kRowTile; ++rr) {
        if (rr >= nr) break;  // the same for the whole warp
        const float* qr = q_s + rr * kDimQK;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          const int c = lane + 32 * j;
          if (c < kChunks) {
            const float4* q8 = reinterpret_cast<const float4*>(qr + 8 * c);
            dot += dot_bf16x8(kc[j], q8[0], q8[1]);
          }
        }
        dot = warp_sum(dot);
        // Key key0 + k is visible to row rr only below that row's length.
        if (lane == 0) p_s[rr * kKeysPerTile + k] = k < n && key0 + k < first_keys + rr ? dot * p.scale : -CUDART_INF_F;
      }
    }
    __syncthreads();

    // 3. Online softmax, one thread per row.  A row may have seen no key yet
    //    (its keys end before this split, or this tile is past its length):
    //    then its max is still -inf and it must add nothing, not NaN.
    if (tid < kRowTile) {
      float* pr = p_s + tid * kKeysPerTile;
      if (tid < nr) {
        float tile_max = -CUDART_INF_F;
        for (int k = 0; k < n; ++k) tile_max = fmaxf(tile_max, pr[k]);
        const float m_new = fmaxf(m_s[tid], tile_max);
        const float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;
        const float alpha = __expf(m_s[tid] - m_use);
        float sum = 0.f;
        for (int k = 0; k < kKeysPerTile; ++k) {
          const float e = k < n ? __expf(pr[k] - m_use) : 0.f;
          pr[k] = e;
          sum += e;
        }
        l_s[tid] = l_s[tid] * alpha + sum;
        m_s[tid] = m_new;
        alpha_s[tid] = alpha;
      } else {  // padding rows of a partial group contribute nothing
        for (int k = 0; k < kKeysPerTile; ++k) pr[k] = 0.f;
        alpha_s[tid] = 1.f;
      }
    }
    __syncthreads();

    // 4. acc = acc * alpha + P V: each thread owns output dimensions d, d+1
    //    for every row; the tile's V pairs go to registers once and serve all rows.
    float2 v[kKeysPerTile];
#pragma unroll
    for (int k = 0; k < kKeysPerTile; ++k)
      v[k] = k < n ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(kv_s + k * kKvStride + d))
                   : make_float2(0.f, 0.f);
#pragma unroll
    for (int rr = 0; rr < kRowTile; ++rr) {
      if (rr >= nr) break;
      const float4* pr = reinterpret_cast<const float4*>(p_s + rr * kKeysPerTile);
      const float4 pa = pr[0], pb = pr[1];
      const float pk[kKeysPerTile] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
      float2 a = acc[rr];
      a.x *= alpha_s[rr];
      a.y *= alpha_s[rr];
#pragma unroll
      for (int k = 0; k < kKeysPerTile; ++k) {
        a.x += pk[k] * v[k].x;
        a.y += pk[k] * v[k].y;
      }
      acc[rr] = a;
    }
    __syncthreads();  // the next tile overwrites kv_s and p_s
  }

  // 5. Normalise and write each row's partial output, in fp32.  A row that
  //    saw no key in this split leaves an empty partial (lse = -inf); a row
  //    that read a poisoned key has l = NaN and passes the NaN on.
#pragma unroll
  for (int rr = 0; rr < kRowTile; ++rr) {
    if (rr >= nr) break;
    const float l = l_s[rr];
    const int64_t row = partial_row(p, b, t0 + rr, h) + split;
    if (l == 0.f) {
      if (tid == 0) p.lse_partial[row] = -CUDART_INF_F;
      continue;
    }
    *reinterpret_cast<float2*>(p.o_partial + row * kDimV + d) = make_float2(acc[rr].x / l, acc[rr].y / l);
    if (tid == 0) p.lse_partial[row] = m_s[rr] + logf(l);
  }
}

}  // namespace

LaunchGeometry shared_rows_geometry(const MlaParams& p) {
  const int row_groups = (p.q_len + kRowTile - 1) / kRowTile;
  return {dim3(p.num_heads, row_groups, p.batch * p.num_splits), dim3(kThreads), kSmemBytes};
}

cudaError_t shared_rows_launch(const MlaParams& p, cudaStream_t stream) {
  const cudaError_t err = launch_with_smem(shared_rows_kernel, shared_rows_geometry(p), p, stream);
  return err != cudaSuccess ? err : combine_launch(p, stream);
}

int shared_rows_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"shared_rows_kernel", (const void*)shared_rows_kernel, kThreads, shared_rows_geometry},
      combine_handle(),
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
