// Work taken away from the tile on N: a loader that copies nothing (the math
// alone), and compute warpgroups that do no math (the loads alone).  Their
// answers are wrong on purpose.
#pragma once

#include "hopper/tile_n.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// The loader without copies: the same slots and barriers, no reads.
struct NoCopiesLoader {
  static constexpr bool kTma = false;
  template <int kSlots, class Stamps>
  __device__ static void load(const MlaParams& p, const Cursor& cursor, unsigned char* smem, uint64_t* full,
                              uint64_t* empty, const KvTensor&, bool, const int*) {
    Cursor cur = cursor;
    const int tid = threadIdx.x;
    const uint32_t ring = smem_addr(smem + kOffRing);
    int seq = 0;
    int u, t0, t1;
    for (int i = tid; i < kSlots * kChunkBytes / 16; i += 128) st_shared_u128(ring + 16 * i, 0, 0, 0, 0);
    fence_proxy_async();
    while (cur.next(p, u, t0, t1))
      for (int n = (t1 - t0) * kChunks; n > 0; --n, ++seq) {
        if (seq >= kSlots) mbar_wait(&empty[seq % kSlots], ((seq / kSlots) - 1) & 1);
        mbar_arrive(&full[seq % kSlots]);
      }
  }
};

// The compute warpgroups without math: stage 10's compute (csrc/hopper/tile_n.cuh),
// its tile loop replaced by the waits and hand-backs.
template <bool kFewerFences, class Parts>
__device__ void compute_no_math(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem,
                        uint64_t* full, uint64_t* empty, int group, int cta, bool tma_chunks) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = 2 * (lane % 4);  // fragment row (+8) and column (+1) of this lane
  const int bar_id = 1 + group;
  const uint32_t ring = smem_addr(smem + kOffRing);
  const uint32_t q_s = smem_addr(smem + kOffQ + group * kQBytes);
  const uint32_t p_s = smem_addr(smem + kOffP + group * kPBytes);
  // Descriptors of the three operand regions; a chunk or k-step is an offset
  // (in 16-byte units) added to the start-address field.
  const uint64_t ring_desc = sw128_desc(ring, 1024), q_desc = sw128_desc(q_s, 1024), p_desc = sw128_desc(p_s, 1024);
  float* col_max = reinterpret_cast<float*>(smem + kOffMax) + group * 4 * kPairsPerGroup;
  int* vis_s = reinterpret_cast<int*>(smem + kOffVis) + group * kPairsPerGroup;
  // A column's softmax reference is the same in every thread that holds the
  // column: it lives in shared memory (registers are short), read where it is
  // used, and when it moves the new values go to the other copy, which then
  // becomes current.  The column sums of the four warps meet here once, at the end of a unit.
  float* m_s = reinterpret_cast<float*>(smem + kOffM) + group * 2 * kPairsPerGroup;
  int64_t* q_row_s = reinterpret_cast<int64_t*>(smem + kOffQRow) + group * kPairsPerGroup;
  float* l_s = reinterpret_cast<float*>(smem + kOffL) + group * 4 * kPairsPerGroup + warp * kPairsPerGroup;
  const float scale_log2 = p.scale * kLog2e;
  const int first_share_unit = cur.unit;

  int seq = 0;
  // The turns the two warpgroups take at the tensor cores (Parts::Turns):
  // none in the op, where they fall into step by themselves.
  const typename Parts::Turns turns(sh, group);
  if (group == 1) turns.pass();

  using Stamps = typename Parts::Stamps;
  typename Stamps::Tiles stamps(group);
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch, grp = u / p.batch;
    const int kv_len = p.kv_lens[b];
    const int pair0 = grp * sh.per_group + group * kPairsPerGroup;
    const int n_pairs = max(0, min(kPairsPerGroup, min(sh.per_group - group * kPairsPerGroup,
                                                       sh.pairs - pair0)));

    // Q^T of this warpgroup's pairs: row n = pair pair0 + n, in 9 swizzled 64-dim chunks.
    load_unit_q<true, Parts::kCopyQ>(p, b, kv_len, pair0, n_pairs, kPairsPerGroup, q_s, q_row_s, vis_s, m_s, tid,
                                     128, bar_id);
    const float* m_cur = m_s;  // the current copy, the same in every thread
    cp_async_wait<0>();
    fence_proxy_async();
    named_barrier(bar_id, 128);
    Stamps::block0(tid == 0 && group == 0 && seq == 0, 3);

    float o[kVChunks][20];  // O^T: 8 dim tiles of 64 x 40
#pragma unroll
    for (int j = 0; j < kVChunks; ++j)
#pragma unroll
      for (int r = 0; r < 20; ++r) o[j][r] = 0.f;
    // This thread's columns are k = 2i + e, pair 8i + c + e; its part of
    // their sums stays in registers for the whole unit.
    float l_part[10];
#pragma unroll
    for (int k = 0; k < 10; ++k) l_part[k] = 0.f;
    // Only the last tiles of a stream hide keys from some pairs (the causal draft).
    const int first_hidden = kv_len - p.q_len + 1;

    for (int tile = t0; tile < t1; ++tile, seq += kChunks) {
      // No math: wait for the tile's chunks and hand them back.
      for (int j = 0; j < kChunks; ++j) mbar_wait(&full[(seq + j) % kRing], ((seq + j) / kRing) & 1);
      __syncwarp();
      if (lane == 0)
        for (int j = 0; j < kChunks; ++j) mbar_arrive(&empty[(seq + j) % kRing]);
    }

    // 5. A column's sum: of this warp's lanes by shuffles, of the four warps through shared memory.
#pragma unroll
    for (int k = 0; k < 10; ++k) {
      float sum = l_part[k];
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      sum += __shfl_xor_sync(0xffffffffu, sum, 8);
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      if (g == 0) l_s[8 * (k / 2) + c + k % 2] = sum;
    }
    named_barrier(bar_id, 128);
    const float* l_all = l_s - warp * kPairsPerGroup;

    // 6. Write the unit: whole -> out (bf16) and lse; cut -> this block's partial slot (fp32).
    // Each pair's 1 / sum and lse come from one thread a pair, through shared
    // memory (col_max, free until the next unit's first softmax): code that
    // runs once per unit runs far below the rate of a loop that repeats, so it
    // is kept short.
    const bool whole = t0 == 0 && t1 == cur.tiles;
    const int slot = u == first_share_unit ? 0 : 1;  // a share cuts at most its first and its last unit
    const int64_t part_row0 = ((int64_t)cta * 2 + slot) * kPairsPerBlock + group * kPairsPerGroup;
    float* inv_s = col_max;
    if (tid < n_pairs) {
      const int n = tid;
      const float l = (l_all[n] + l_all[kPairsPerGroup + n]) + (l_all[2 * kPairsPerGroup + n] + l_all[3 * kPairsPerGroup + n]);
      inv_s[n] = whole || l != 0.f ? 1.f / l : 0.f;  // 0: a piece no key is visible to (it writes zeros)
      const float lse_nat = (m_cur[n] + log2f(l)) * 0.6931471805599453f;
      const int pr = pair0 + n, t = pr / p.num_heads, h = pr % p.num_heads;
      if (whole)
        *lse_at(p, b, t, h) = lse_nat;
      else
        p.lse_partial[part_row0 + n] = l == 0.f ? -CUDART_INF_F : lse_nat;
    }
    named_barrier(bar_id, 128);
    float inv[10];  // of this thread's column k = 2i + e, pair 8i + c + e
#pragma unroll
    for (int k = 0; k < 10; ++k) inv[k] = inv_s[8 * (k / 2) + c + k % 2];
    if (whole) {
      Parts::Out::whole(p, o, inv, smem, group, warp, lane, bar_id, b, pair0, n_pairs);
    } else {
      // The partials are fp32: a store of 8 dims of a pair is a whole 32-byte sector,
      // four pairs to a store.
#pragma unroll
      for (int k = 0; k < 10; ++k) {
        const int n = 8 * (k / 2) + c + k % 2;
        if (n >= n_pairs) continue;
        float* dst = p.o_partial + (part_row0 + n) * kDimV + 16 * warp + g;
#pragma unroll
        for (int j = 0; j < kVChunks; ++j) {
          dst[64 * j] = inv[k] == 0.f ? 0.f : o[j][4 * (k / 2) + k % 2] * inv[k];
          dst[64 * j + 8] = inv[k] == 0.f ? 0.f : o[j][4 * (k / 2) + 2 + k % 2] * inv[k];
        }
      }
    }
  }
  if (group == 0) turns.take();  // warpgroup 1's last turn, passed after its last products
}

struct NoMathParts : TileNParts {
  template <bool kFewerFences, class Self>
  __device__ static __forceinline__ void compute(const MlaParams& p, const Shape& sh, const Cursor& cur,
                                                 unsigned char* smem, uint64_t* full, uint64_t* empty, int group,
                                                 int cta, bool tma_chunks) {
    compute_no_math<kFewerFences, Self>(p, sh, cur, smem, full, empty, group, cta, tma_chunks);
  }
};
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
