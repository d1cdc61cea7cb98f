// Stage 9: tensor cores.
//
// Every stage so far multiplies on the fp32 CUDA cores, one fused multiply-add
// per element per (row, head, key), and converts each bf16 value to fp32 first.
// But all heads of MLA read the same latent key, and so do all rows of a
// draft: for one stream the scores are one matrix product, Q [q_len * H, 576]
// times K^T [576, keys], and the output is another, P [q_len * H, keys] times
// V [keys, 512].  The tensor cores do such products on bf16 directly.
//
// Here a block takes 16 (query row, head) pairs of one stream (one m16 tile
// of mma.sync.m16n8k16; with 8 heads and a draft of 9, five blocks cover the
// 72 pairs) and one split of the keys.  Per 32-key tile:
//   scores  S[16, 32] = Q K^T: warp w takes keys 8w .. 8w+7 over all 576 dims;
//   softmax each warp reads the whole S from shared memory and keeps the
//           online max and sum for its lane's two rows (all warps agree);
//   output  O[16, 512] += P V: warp w owns output dims 128w .. 128w+127.
// Tiles arrive by cp.async into two buffers, so the next tile is in flight
// while this one is multiplied.  Key rows are padded from 1152 to 1168 bytes
// so that the 8 rows an ldmatrix reads fall in 8 different bank groups.
#include "mla_device.cuh"

namespace mla {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerBlock = 16;            // (query row, head) pairs: one MMA m-tile
constexpr int kKeysPerTile = 8 * kWarps;     // each warp scores 8 keys (one MMA n-tile)
constexpr int kDimsPerWarp = kDimV / kWarps; // each warp accumulates 128 output dims
constexpr int kRowStride = kDimQK + 8;       // bf16 per staged row: 1168 bytes
constexpr int kChunks = kDimQK / 8;          // 16-byte chunks per row
constexpr int kScoreStride = kKeysPerTile + 4;
constexpr float kLog2e = 1.4426950408889634f;

constexpr int kSmemBytes = kRowsPerBlock * kRowStride * 2        // q_s
                         + 2 * kKeysPerTile * kRowStride * 2     // kv_s: two key tiles
                         + kRowsPerBlock * kScoreStride * 4;     // s_s: the tile's scores

// ---- the four instructions this stage adds -------------------------------------

// 16 bytes global -> shared without passing through registers; bytes = 0 writes zeros.
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* smem_row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* smem_row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// D[16x8] += A[16x16] B[16x8], bf16 in, fp32 accumulate.  Lane l (g = l / 4, c = 2 * (l % 4))
// holds A rows g and g+8 at columns c, c+1, c+8, c+9; B column g at rows c, c+1, c+8, c+9;
// D rows g and g+8 at columns c, c+1.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kThreads) tensor_core_kernel(const MlaParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // cp.async, ldmatrix and bf16 mma.sync need sm_80 or newer; the op refuses older GPUs first
#else
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* kv_s = q_s + kRowsPerBlock * kRowStride;
  float* s_s = reinterpret_cast<float*>(kv_s + 2 * kKeysPerTile * kRowStride);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = 2 * (lane % 4);  // this lane's MMA rows (g, g+8) and columns (c, c+1)
  const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
  const int pairs = p.q_len * p.num_heads;  // (row, head) pairs of a stream: row-major, head fastest
  const int pair0 = blockIdx.x * kRowsPerBlock;
  const int n_pairs = min(kRowsPerBlock, pairs - pair0);
  const int kv_len = p.kv_lens[b];
  if (!stream_ok(p, kv_len)) return;  // the combine kernel writes NaN for it

  // Pair pair0 + i is query row t = (pair0 + i) / H, which sees keys 0 .. kv_len - q_len + t.
  auto visible = [&](int i) {
    return i < n_pairs ? kv_len - p.q_len + (pair0 + i) / p.num_heads + 1 : 0;
  };
  const int per_split = ((kv_len + p.num_splits - 1) / p.num_splits + kKeysPerTile - 1)
                        / kKeysPerTile * kKeysPerTile;
  const int key_begin = split * per_split;
  const int key_end = min(visible(n_pairs - 1), key_begin + per_split);  // the last pair sees the most
  if (key_begin >= key_end) {  // no visible key here for any pair: empty partials
    if (tid < n_pairs) {
      const int pr = pair0 + tid;
      p.lse_partial[partial_row(p, b, pr / p.num_heads, pr % p.num_heads) + split] = -CUDART_INF_F;
    }
    return;
  }

  // Queries: 16 rows of 72 chunks; rows past the last pair are zeros.
  for (int i = tid; i < kRowsPerBlock * kChunks; i += kThreads) {
    const int r = i / kChunks, ch = i % kChunks, pr = pair0 + r;
    const bf16* src = r < n_pairs ? q_head(p, b, pr / p.num_heads, pr % p.num_heads) + 8 * ch : p.q;
    cp_async16(q_s + r * kRowStride + 8 * ch, src, r < n_pairs ? 16 : 0);
  }
  // A key tile: each key is copied by 4 threads, a chunk each in turn.
  // Keys past key_end are zeros (P is 0 there, and 0 * garbage could be NaN);
  // a key whose page is out of range is NaN, so the answer shows it.  The
  // block-table read that finds a key is made one tile ahead of its copy: a
  // copy that first had to wait for its own address would stall the warp
  // (in-order issue) for a whole memory round trip on every tile.
  constexpr int kPerKey = kThreads / kKeysPerTile;
  const int my_key = tid / kPerKey;  // this thread's key in every tile
  auto lookup = [&](int key0) {
    const int key = key0 + my_key;
    return key < key_end ? kv_row(p, b, key) : p.kv;
  };
  auto copy_tile = [&](int key0, const bf16* row, bf16* dst) {
    const int bytes = key0 + my_key < key_end ? 16 : 0;
    bf16* drow = dst + my_key * kRowStride;
    for (int ch = tid % kPerKey; ch < kChunks; ch += kPerKey) {
      if (row)
        cp_async16(drow + 8 * ch, row + 8 * ch, bytes);
      else
        *reinterpret_cast<uint4*>(drow + 8 * ch) = make_uint4(kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
    }
  };
  copy_tile(key_begin, lookup(key_begin), kv_s);
  cp_async_commit();
  const bf16* next_row = lookup(key_begin + kKeysPerTile);

  // The scores of this lane's two rows, in log2 units (exp2 is one instruction).
  const float scale_log2 = p.scale * kLog2e;
  const int len_lo = min(visible(g), key_end), len_hi = min(visible(g + 8), key_end);
  float m_lo = -CUDART_INF_F, m_hi = -CUDART_INF_F;  // running maxima
  float l_lo = 0.f, l_hi = 0.f;                      // this lane's share of the running sums
  float acc[kDimsPerWarp / 8][4];                    // O[16, 128w .. 128w+127], 16 MMA n-tiles
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  const int n_tiles = (key_end - key_begin + kKeysPerTile - 1) / kKeysPerTile;
  for (int it = 0; it < n_tiles; ++it) {
    const int key0 = key_begin + it * kKeysPerTile;
    const bf16* tile = kv_s + (it % 2) * kKeysPerTile * kRowStride;
    cp_async_wait_all();
    __syncthreads();  // tile `it` has landed for every thread; the other buffer is free
    if (it + 1 < n_tiles) {
      copy_tile(key0 + kKeysPerTile, next_row, kv_s + ((it + 1) % 2) * kKeysPerTile * kRowStride);
      cp_async_commit();
      next_row = lookup(key0 + 2 * kKeysPerTile);
    }

    // 1. S[:, 8w .. 8w+7] = Q K^T over 576 dims: 36 MMAs, two k-steps per K load.
    //    An MMA must wait for the one before it when both add into the same
    //    accumulators, so four sets take turns: four chains of 9, not one of 36.
    {
      float part[4][4] = {};
      const bf16* q_lane = q_s + (lane % 8 + 8 * ((lane / 8) % 2)) * kRowStride + 8 * (lane / 16);
      const bf16* k_lane = tile + (8 * warp + lane % 8) * kRowStride + 8 * (lane / 8);
#pragma unroll
      for (int k0 = 0; k0 < kDimQK; k0 += 32) {
        uint32_t kb[4], qa[4], qb[4];
        ldmatrix_x4(kb, k_lane + k0);
        ldmatrix_x4(qa, q_lane + k0);
        ldmatrix_x4(qb, q_lane + k0 + 16);
        const int set = (k0 / 32) % 2 * 2;
        mma_bf16(part[set], qa, kb[0], kb[1]);
        mma_bf16(part[set + 1], qb, kb[2], kb[3]);
      }
      float s[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) s[i] = (part[0][i] + part[1][i]) + (part[2][i] + part[3][i]);
      // Mask keys a row must not see (its causal end, or past this split) with -inf.
      const int key = key0 + 8 * warp + c;
      float* s_lo = s_s + g * kScoreStride + 8 * warp + c;
      float* s_hi = s_lo + 8 * kScoreStride;
      s_lo[0] = key < len_lo ? s[0] * scale_log2 : -CUDART_INF_F;
      s_lo[1] = key + 1 < len_lo ? s[1] * scale_log2 : -CUDART_INF_F;
      s_hi[0] = key < len_hi ? s[2] * scale_log2 : -CUDART_INF_F;
      s_hi[1] = key + 1 < len_hi ? s[3] * scale_log2 : -CUDART_INF_F;
    }
    __syncthreads();  // the whole S is in shared memory

    // 2. Online softmax for rows g and g+8 over the tile's 32 keys.  A lane reads
    //    exactly the 8 scores per row it needs for its P fragments; the 4 lanes
    //    of a quad together cover the row.
    uint32_t pa[2][4];  // P as the A operand of two k-steps (keys 0-15, 16-31)
    {
      float lo[8], hi[8];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int col = 16 * j + 8 * half + c;
          const float2 a = *reinterpret_cast<const float2*>(s_s + g * kScoreStride + col);
          const float2 z = *reinterpret_cast<const float2*>(s_s + (g + 8) * kScoreStride + col);
          lo[4 * j + 2 * half] = a.x;
          lo[4 * j + 2 * half + 1] = a.y;
          hi[4 * j + 2 * half] = z.x;
          hi[4 * j + 2 * half + 1] = z.y;
        }
      float t_lo = lo[0], t_hi = hi[0];
#pragma unroll
      for (int i = 1; i < 8; ++i) {
        t_lo = fmaxf(t_lo, lo[i]);
        t_hi = fmaxf(t_hi, hi[i]);
      }
#pragma unroll
      for (int off = 1; off < 4; off <<= 1) {
        t_lo = fmaxf(t_lo, __shfl_xor_sync(0xffffffffu, t_lo, off));
        t_hi = fmaxf(t_hi, __shfl_xor_sync(0xffffffffu, t_hi, off));
      }
      const float new_lo = fmaxf(m_lo, t_lo), new_hi = fmaxf(m_hi, t_hi);
      // A row that has seen no key yet keeps max -inf: subtract 0 then, not -inf.
      const float use_lo = new_lo == -CUDART_INF_F ? 0.f : new_lo;
      const float use_hi = new_hi == -CUDART_INF_F ? 0.f : new_hi;
      const float alpha_lo = exp2f(m_lo - use_lo), alpha_hi = exp2f(m_hi - use_hi);
      m_lo = new_lo;
      m_hi = new_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        lo[i] = exp2f(lo[i] - use_lo);
        hi[i] = exp2f(hi[i] - use_hi);
        sum_lo += lo[i];
        sum_hi += hi[i];
      }
      l_lo = l_lo * alpha_lo + sum_lo;
      l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        pa[j][0] = pack_bf16x2(lo[4 * j], lo[4 * j + 1]);
        pa[j][1] = pack_bf16x2(hi[4 * j], hi[4 * j + 1]);
        pa[j][2] = pack_bf16x2(lo[4 * j + 2], lo[4 * j + 3]);
        pa[j][3] = pack_bf16x2(hi[4 * j + 2], hi[4 * j + 3]);
      }
#pragma unroll
      for (int n = 0; n < kDimsPerWarp / 8; ++n) {
        acc[n][0] *= alpha_lo;
        acc[n][1] *= alpha_lo;
        acc[n][2] *= alpha_hi;
        acc[n][3] *= alpha_hi;
      }
    }

    // 3. O[:, 128w ..] += P V: V is the tile's first 512 dims, read transposed by ldmatrix.
    {
      const bf16* v_lane = tile + (lane % 8 + 8 * ((lane / 8) % 2)) * kRowStride
                         + kDimsPerWarp * warp + 8 * (lane / 16);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int n = 0; n < kDimsPerWarp / 8; n += 2) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_lane + 16 * j * kRowStride + 8 * n);
          mma_bf16(acc[n], pa[j], vb[0], vb[1]);
          mma_bf16(acc[n + 1], pa[j], vb[2], vb[3]);
        }
    }
  }

  // 4. Each row's sum lives in pieces across its quad; add them, normalise, and
  //    write the partials.  A row that saw no key leaves an empty partial; a row
  //    that read a poisoned key has a NaN sum and passes the NaN on.
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = g + 8 * half;
    if (i >= n_pairs) continue;
    const float l = half ? l_hi : l_lo, m = half ? m_hi : m_lo;
    const int pr = pair0 + i;
    const int64_t row = partial_row(p, b, pr / p.num_heads, pr % p.num_heads) + split;
    if (l == 0.f) {
      if (warp == 0 && c == 0) p.lse_partial[row] = -CUDART_INF_F;
      continue;
    }
    const float inv = 1.f / l;
    float* o = p.o_partial + row * kDimV + kDimsPerWarp * warp + c;
#pragma unroll
    for (int n = 0; n < kDimsPerWarp / 8; ++n)
      *reinterpret_cast<float2*>(o + 8 * n) = make_float2(acc[n][2 * half] * inv, acc[n][2 * half + 1] * inv);
    if (warp == 0 && c == 0) p.lse_partial[row] = (m + log2f(l)) * 0.6931471805599453f;  // back to natural log
  }
#endif
}

}  // namespace

LaunchGeometry tensor_core_geometry(const MlaParams& p) {
  const int row_tiles = (p.q_len * p.num_heads + kRowsPerBlock - 1) / kRowsPerBlock;
  return {dim3(row_tiles, 1, p.batch * p.num_splits), dim3(kThreads), kSmemBytes};
}

cudaError_t tensor_core_launch(const MlaParams& p, cudaStream_t stream) {
  const cudaError_t err = launch_with_smem(tensor_core_kernel, tensor_core_geometry(p), p, stream);
  return err != cudaSuccess ? err : combine_launch(p, stream);
}

int tensor_core_kernels(const KernelHandle** handles) {
  static const KernelHandle kernels[] = {
      {"tensor_core_kernel", (const void*)tensor_core_kernel, kThreads, tensor_core_geometry},
      combine_handle(),
  };
  *handles = kernels;
  return int(std::size(kernels));
}

}  // namespace mla
