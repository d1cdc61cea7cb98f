// The next tile's scores issued behind this tile's products, in stage 10.
//
// A compute warpgroup of stage 10 waits for its tile's products to finish
// before it issues the next tile's scores.  Here it issues them right behind
// the products instead, handing each V chunk back as its products finish:
//   early_scores           stage 10 with that order (its answers are stage 10's);
//   early_scores_timeline  with the timeline's stamps (csrc/experiments/tile_stamps.cuh;
//                          its "products done" is the moment the next tile's
//                          scores are all issued).
#include "experiments/common.cuh"
#include "experiments/tile_stamps.cuh"
#include "hopper/tile_n.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// S^T of the next tile (its chunks from
// sequence number next_seq), issued while this tile's products (eight commit
// groups, one per V chunk, the V chunk j in slot slot0 + 1 + j) are in flight.
// Chunk j of the next tile is issued once V chunk j of this tile has been
// handed back; with one commit group per chunk of scores, that V chunk's
// group is then always the eighth newest, so each hand-back waits with 7.
__device__ __forceinline__ void issue_next_scores(float (&s)[20], uint64_t ring_desc, uint64_t q_desc, uint64_t* full,
                                                  uint64_t* empty, int next_seq, int slot0, int lane) {
  const int nslot0 = next_seq % kRing, nphase0 = (next_seq / kRing) & 1;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    if (j < kVChunks) release_after<7>(empty, slot0 + 1 + j, lane);
    const int wrap = nslot0 + j >= kRing, slot = nslot0 + j - (wrap ? kRing : 0);
    mbar_wait(&full[slot], nphase0 ^ wrap);
    fence_proxy_async();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n40k16<0>(s, ring_desc + ((slot * kChunkBytes + 32 * ks) >> 4),
                         q_desc + ((dims_of(j) * kPairsPerGroup * 128 + 32 * ks) >> 4), j | ks);
    wgmma_commit();
  }
}

// A unit's start: for each of its `rows` pairs (pair0 + n, head fastest), its
// row in q and how many keys it may see (draft row t sees the cache and the
// draft up to itself), then Q itself into 9 swizzled 64-dim chunks of `rows`
// rows of 128 bytes, by the `threads` threads that meet at barrier `bar` (t is
// this thread's index among them).  Each pair's row is found once, by one
// thread, not once per 16-byte copy: the copy loop is then a few instructions
// per copy, which at a unit's start is time no tile hides.  The copies are
// committed, not waited for.  With kResetM, m_s gets each pair's softmax

// Stage 10's compute (csrc/hopper/tile_n.cuh) with the next tile's scores issued behind this tile's products.
template <bool kFewerFences, class Parts>
__device__ void compute_early_scores(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem,
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

    float s[20];  // S^T of a tile: its first wgmma overwrites it (scale-d 0)
    for (int tile = t0; tile < t1; ++tile, seq += kChunks) {
      // 1. S^T[64 keys, 40 pairs] = K Q^T over the 9 chunks, 4 k-steps each.
      // Each chunk's four k-steps start as soon as that chunk has landed.  The
      // slot and phase of chunk seq + j follow from those of chunk seq.
      const int slot0 = seq % kRing, phase0 = (seq / kRing) & 1;
      // Only chunks that cp.async wrote need the fence, and the TMA loader's gatherers fence theirs.
      const bool fence_chunks = !kFewerFences || !tma_chunks;
      stamps.at(0);
      if (tile == t0) {  // (a later tile's were issued behind the last tile's products)
        turns.take();
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const int wrap = slot0 + j >= kRing, slot = slot0 + j - (wrap ? kRing : 0);
          mbar_wait(&full[slot], phase0 ^ wrap);
          Stamps::block0(tid == 0 && group == 0 && seq == 0 && (j == 0 || j == kChunks - 1), j == 0 ? 4 : 5);
          // wgmma reads through the async proxy: a chunk that cp.async wrote (the generic proxy) is fenced first.
          if (fence_chunks) fence_proxy_async();
#pragma unroll
          for (int ks = 0; ks < 4; ++ks)
            wgmma_m64n40k16<0>(s, ring_desc + ((slot * kChunkBytes + 32 * ks) >> 4),
                               q_desc + ((dims_of(j) * kPairsPerGroup * 128 + 32 * ks) >> 4), j | ks);
        }
        wgmma_commit();
        turns.pass();
      }
      wgmma_wait<0>();
      fence_accumulators(s);
      // The last tile's products were in flight until the wait: O^T is final only now.
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) fence_accumulators(o[j]);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot0]);  // the RoPE chunk (position 0) is done
      Stamps::block0(tid == 0 && group == 0 && seq == 0, 6);
      stamps.at(1);

      // 2. Online softmax down each column (a pair), over this tile's 64 keys.
      //    The reference m of a column moves only when a score passes it by
      //    more than kRescaleLog2 (a factor 256), so P = exp2(s - m) stays
      //    below 256.  Whether any score of the warpgroup does is one barrier
      //    that ORs a flag; after the first tile it almost never does, and the
      //    exchange of column maxima through shared memory, and the rescale of
      //    O^T and the sums, are skipped.
      const int key_lo = tile * kKeysPerTile + 16 * warp + g;
      const bool edge = (tile + 1) * kKeysPerTile > first_hidden;
      bool need = false;
#pragma unroll
      for (int i = 0; i < 5; ++i) {
        const float2 m2 = *reinterpret_cast<const float2*>(m_cur + 8 * i + c);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float lo = s[4 * i + e] * scale_log2, hi = s[4 * i + 2 + e] * scale_log2;
          if (edge) {
            const int vis = vis_s[8 * i + c + e];
            lo = key_lo < vis ? lo : -CUDART_INF_F;
            hi = key_lo + 8 < vis ? hi : -CUDART_INF_F;
          }
          s[4 * i + e] = lo;
          s[4 * i + 2 + e] = hi;
          need |= fmaxf(lo, hi) > (e ? m2.y : m2.x) + kRescaleLog2;  // -inf + 8 is -inf: a first key always moves it
        }
      }
      if (named_barrier_or(bar_id, 128, need)) {
        float* m_next = m_s + (m_cur == m_s ? kPairsPerGroup : 0);
        // The column maxima of the 64 keys: of this warp's 16 by shuffles, of
        // all four warps through shared memory.
#pragma unroll
        for (int i = 0; i < 5; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float mx = fmaxf(s[4 * i + e], s[4 * i + 2 + e]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            if (g == 0) col_max[warp * kPairsPerGroup + 8 * i + c + e] = mx;
          }
        named_barrier(bar_id, 128);
        auto column = [&](int col, float& m_old, float& alpha) {  // a column's new reference
          const float t = fmaxf(fmaxf(col_max[col], col_max[kPairsPerGroup + col]),
                                fmaxf(col_max[2 * kPairsPerGroup + col], col_max[3 * kPairsPerGroup + col]));
          m_old = m_cur[col];
          const bool move = t > m_old + kRescaleLog2;  // false while no key is seen (t = -inf)
          alpha = move ? exp2f(m_old - t) : 1.f;
          return move ? t : m_old;
        };
        bool rescale = false;
#pragma unroll
        for (int i = 0; i < 5; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float m_old, alpha;
            const float m_new = column(8 * i + c + e, m_old, alpha);
            if (warp == 0 && g == 0) m_next[8 * i + c + e] = m_new;
            l_part[2 * i + e] *= alpha;
            rescale |= alpha != 1.f && m_old != -CUDART_INF_F;  // O^T is still 0 while no key was seen
          }
        // The 160 multiplies that rescale O^T, only where a column that had
        // seen keys moved: on a unit's first tile, where every column moves
        // from -inf, they are skipped.
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
          for (int i = 0; i < 5; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float m_old, alpha;
              column(8 * i + c + e, m_old, alpha);
#pragma unroll
              for (int j = 0; j < kVChunks; ++j) {
                o[j][4 * i + e] *= alpha;
                o[j][4 * i + 2 + e] *= alpha;
              }
            }
        }
        named_barrier(bar_id, 128);  // the new references written
        m_cur = m_next;
        // col_max and the old copy are next written after the next OR-barrier,
        // which every thread reaches only after these reads.
      }

      stamps.at(2);
      // 3. P = exp2(s - m) (rounded to bf16 for the tensor cores), this
      //    thread's part of the sums, and P^T to shared memory: row n = pair
      //    n, its 64 keys in one swizzled 128-byte row, written by stmatrix
      //    straight from the fragments.
      {
        const int mat = (lane / 8) % 2, r = lane % 8;
#pragma unroll
        for (int i = 0; i < 5; ++i) {
          float pv[4];
          const float2 m2 = *reinterpret_cast<const float2*>(m_cur + 8 * i + c);
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float m_ref = e ? m2.y : m2.x;
            const float m_use = m_ref == -CUDART_INF_F ? 0.f : m_ref;  // no key seen: keep exp2 finite
            pv[e] = exp2f(s[4 * i + e] - m_use);
            pv[2 + e] = exp2f(s[4 * i + 2 + e] - m_use);
            l_part[2 * i + e] += pv[e] + pv[2 + e];
          }
          const int n = 8 * i + r, chunk = 2 * warp + mat;
          stmatrix_x2_trans(p_s + n * 128 + ((chunk ^ (n & 7)) << 4), pack_bf16x2(pv[0], pv[1]),
                            pack_bf16x2(pv[2], pv[3]));
        }
      }
      fence_proxy_async();
      named_barrier(bar_id, 128);

      // 4. O^T[dims, pairs] += V^T P^T: dims 64j .. 64j+63 of V^T are the chunk at
      //    position j + 1, read MN-major.
      //    (The rescale above must be done before the wgmmas read O: pinning the
      //    accumulators here keeps the compiler from sinking it past the fence.)
      stamps.at(3);
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) fence_accumulators(o[j]);
      turns.take();
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) {
        const int slot = (slot0 + 1 + j) % kRing;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
          wgmma_m64n40k16<1>(o[j], ring_desc + ((slot * kChunkBytes + 2048 * ks) >> 4), p_desc + ((32 * ks) >> 4), 1);
        wgmma_commit();  // one group per dim tile, so its chunk can go back first
      }
      turns.pass();
      stamps.at(4);
      if (tile + 1 < t1) {
        issue_next_scores(s, ring_desc, q_desc, full, empty, seq + kChunks, slot0, lane);
        stamps.at(5);
        stamps.next();
        continue;
      }
      // Hand each chunk back to the loader as soon as its products are done: the
      // next tile's last chunks wait for exactly these slots.
      release_after<7>(empty, slot0 + 1, lane);
      release_after<6>(empty, slot0 + 2, lane);
      release_after<5>(empty, slot0 + 3, lane);
      release_after<4>(empty, slot0 + 4, lane);
      release_after<3>(empty, slot0 + 5, lane);
      release_after<2>(empty, slot0 + 6, lane);
      release_after<1>(empty, slot0 + 7, lane);
      release_after<0>(empty, slot0 + 8, lane);
      stamps.at(5);
      stamps.next();
#pragma unroll
      for (int j = 0; j < kVChunks; ++j) fence_accumulators(o[j]);
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

struct EarlyScoresParts : TileNParts {
  template <bool kFewerFences, class Self>
  __device__ static __forceinline__ void compute(const MlaParams& p, const Shape& sh, const Cursor& cur,
                                                 unsigned char* smem, uint64_t* full, uint64_t* empty, int group,
                                                 int cta, bool tma_chunks) {
    compute_early_scores<kFewerFences, Self>(p, sh, cur, smem, full, empty, group, cta, tma_chunks);
  }
};
struct EarlyScoresTimelineParts : EarlyScoresParts {
  using Stamps = TileStamps;
};
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kThreads, 1) early_scores_kernel(const MlaParams p,
                                                                   const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, EarlyScoresParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) early_scores_timeline_kernel(const MlaParams p,
                                                                            const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, EarlyScoresTimelineParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<NoSeesaw, NoStamps>(p);
#else
  __trap();
#endif
}

const char* const kVariants[] = {"early_scores", "early_scores_timeline"};
const MainKernel kMain[] = {early_scores_kernel, early_scores_timeline_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_tile_n<NoSeesaw>(p, stream, kMain[v], kSmemBytes, false,
                                 merge_as_staged<NoSeesaw>(combine_kernel, merge_by_warps_kernel));
}

}  // namespace

const Experiment& experiment() {
  static const Experiment e = {kVariants, 2, launch_variant, tile_stamps_read, tile_stamps_clear, nullptr, nullptr};
  return e;
}

}  // namespace mla
