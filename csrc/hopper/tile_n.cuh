// The tile on N (stage 10's block): the products turned around, a loader
// warpgroup feeding two compute warpgroups.
//
// A key tile is the M side of wgmma (M = 64 keys) and a warpgroup's pairs are
// the N side, any multiple of 8 up to 256:
//     S^T[keys, pairs] = K Q^T      and      O^T[dims, pairs] += V^T P^T.
// A draft of 9 rows at 8 heads is 72 pairs: one block, no padding to 128.
// Warpgroup 0 only loads: it gathers each tile's keys through the block table
// with cp.async into a ring of 64-dim chunks (8 KB each) and signals each
// chunk on an mbarrier (load_keys here; hopper/tma_loader.cuh copies whole
// tiles instead).  Warpgroups 1 and 2 only compute (compute), each for its own
// 40 pairs: the two share every key chunk in shared memory and never wait for
// each other.
#pragma once

#include "hopper/scheduler.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// Warpgroup 0: gather the key tiles of the share, chunk by chunk, into the ring.
// A loader thread never waits for its own copies: cp.async arrives on the
// chunk's full barrier by itself once they land, so the loads in flight are
// bounded only by the ring's free slots.  The block table entry of the next
// tile is loaded a tile ahead, so its round trip is hidden too.
template <int kSlots, class Stamps>
__device__ void load_keys(const MlaParams& p, Cursor cur, unsigned char* smem, uint64_t* full, uint64_t* empty) {
  const int tid = threadIdx.x;          // 0..127
  const int my_key = tid / 2;           // two threads per key, 16 bytes each, side by side
  const int half = tid & 1;
  const uint32_t ring = smem_addr(smem + kOffRing);
  int seq = 0;  // chunks issued so far
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    auto page_of = [&](int tile) {  // the page holding this thread's key of the tile (-1 past the stream)
      const int key = tile * kKeysPerTile + my_key;
      return key < kv_len ? table[key / p.page_size] : -1;
    };
    int next_page = page_of(t0);
    Stamps::block0(tid == 0 && seq == 0 && next_page != INT_MIN, 2);  // (the compare waits for the page id)
    for (int tile = t0; tile < t1; ++tile) {
      const int key = tile * kKeysPerTile + my_key;
      const int page = next_page;
      if (tile + 1 < t1) next_page = page_of(tile + 1);  // used a tile from now
      // Keys past the stream are zeros (P is 0 there; 0 * NaN would not be);
      // a key whose page is outside the pool is NaN, so its stream shows it.
      const bool zero = key >= kv_len, poisoned = !zero && (page < 0 || page >= p.num_pages);
      const bf16* row = zero || poisoned ? p.kv
                                         : p.kv + (int64_t)page * p.kv_stride_page +
                                               (int64_t)(key - (key / p.page_size) * p.page_size) * p.kv_stride_slot;
      for (int j = 0; j < kChunks; ++j) {
        const int slot = seq % kSlots;
        if (seq >= kSlots) mbar_wait(&empty[slot], ((seq / kSlots) - 1) & 1);
        const uint32_t base = ring + slot * kChunkBytes + my_key * 128;
        // The two threads of a key copy one 32-byte sector per step; which of
        // the row's four sectors each key takes in step i is turned by the
        // key, so that the 8 lanes of a quarter warp (4 keys) write 8
        // different 16-byte columns of the swizzled rows: no bank conflict.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int c16 = 2 * (i ^ (my_key & 3)) + half;  // 16-byte column of the 128-byte row
          const uint32_t dst = base + ((c16 ^ (my_key & 7)) << 4);
          if (poisoned)
            st_shared_u128(dst, kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
          else
            cp_async16_l2_256(dst, zero ? (const void*)row : (const void*)(row + dims_of(j) * kChunkDims + c16 * 8),
                              zero ? 0 : 16);
        }
        if (poisoned) {  // plain stores: make them visible to the tensor cores, then arrive
          fence_proxy_async();
          mbar_arrive(&full[slot]);
        } else {
          cp_async_arrive(&full[slot]);
        }
        ++seq;
      }
    }
  }
  cp_async_wait<0>();  // leave no copy in flight behind an exiting thread
}

// A compute warpgroup with no pairs still has to hand every chunk back.
__device__ void pass_chunks(const MlaParams& p, Cursor cur, uint64_t* empty, uint64_t* full) {
  int seq = 0, u, t0, t1;
  while (cur.next(p, u, t0, t1))
    for (int n = (t1 - t0) * kChunks; n > 0; --n, ++seq) {
      mbar_wait(&full[seq % kRing], (seq / kRing) & 1);
      if (threadIdx.x % 32 == 0) mbar_arrive(&empty[seq % kRing]);
    }
}

// Wait until at most kPending wgmma groups are in flight, then (one lane per
// warp) give the ring slot whose products just finished back to the loader.
template <int kPending>
__device__ __forceinline__ void release_after(uint64_t* empty, int slot, int lane) {
  wgmma_wait<kPending>();
  __syncwarp();
  if (lane == 0) mbar_arrive(&empty[slot % kRing]);
}

// A whole unit's rows to out.  out is bf16: the fragments go to shared memory
// first (this warpgroup's Q^T, which the unit no longer reads), transposed by
// stmatrix into a row per pair, and leave as 16-byte vectors, each warp 512
// bytes of one pair's row.  (Stored straight from the fragments, each store
// would write 16 bytes into each of four rows, half of a 32-byte sector.)
struct StagedOut {
  __device__ static __forceinline__ void whole(const MlaParams& p, const float (&o)[kVChunks][20], const float (&inv)[10],
                                               unsigned char* smem, int group, int warp, int lane, int bar_id, int b,
                                               int pair0, int n_pairs) {
    // A stmatrix takes four 8x8 blocks: dims 16 warp + 8 (m % 2) of chunk j + m / 2,
    // pairs 8i .. 8i + 7; lane 8m + r names where pair 8i + r's row of block m goes.
    const int m = lane / 8, r = lane % 8;
    const uint32_t rows = smem_addr(smem + kOffQ + group * kQBytes) + r * kStageRowBytes +
                          2 * (64 * (m / 2) + 16 * warp + 8 * (m % 2));
#pragma unroll
    for (int i = 0; i < 5; ++i)
#pragma unroll
      for (int j = 0; j < kVChunks; j += 2)
        stmatrix_x4_trans(rows + 8 * i * kStageRowBytes + 2 * 64 * j,
                          pack_bf16x2(o[j][4 * i] * inv[2 * i], o[j][4 * i + 1] * inv[2 * i + 1]),
                          pack_bf16x2(o[j][4 * i + 2] * inv[2 * i], o[j][4 * i + 3] * inv[2 * i + 1]),
                          pack_bf16x2(o[j + 1][4 * i] * inv[2 * i], o[j + 1][4 * i + 1] * inv[2 * i + 1]),
                          pack_bf16x2(o[j + 1][4 * i + 2] * inv[2 * i], o[j + 1][4 * i + 3] * inv[2 * i + 1]));
    named_barrier(bar_id, 128);
    // Each warp copies whole pairs' rows, 512 bytes a store instruction: the
    // pair's place in out is worked out once per row, not once per 16 bytes
    // with a division by the heads each time.
    const unsigned char* staged = smem + kOffQ + group * kQBytes;
    for (int n = warp; n < n_pairs; n += 4) {
      const int pr = pair0 + n, t = pr / p.num_heads, h = pr - t * p.num_heads;
      bf16* dst = out_head(p, b, t, h);
      const unsigned char* src = staged + n * kStageRowBytes;
#pragma unroll
      for (int x = lane; x < kDimV / 8; x += 32)
        *reinterpret_cast<uint4*>(dst + 8 * x) = *reinterpret_cast<const uint4*>(src + 16 * x);
    }
    // (The next unit's Q^T load starts with a barrier of this warpgroup: nobody overwrites the rows before they are read.)
  }
};

// Warpgroups 1 and 2: scores, online softmax and output for up to 40 pairs each.
// kFewerFences: fence no chunk when the TMA loader filled them (tma_chunks),
// since its gatherers fence the chunks cp.async wrote.  Parts: the pieces an
// experiment may swap (TileNParts, below, are the op's).
template <bool kFewerFences, class Parts>
__device__ void compute(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem,
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
      wgmma_wait<0>();
      fence_accumulators(s);
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

// The pieces of the tile on N that an experiment may swap (csrc/experiments/):
// the op's.  compute: the compute warpgroups' loop; Out: how a whole unit's
// rows reach out; kCopyQ: whether a unit's Q is copied; Turns: no turns at the
// tensor cores; Stamps: no clock stamps.
struct NoTurns {
  __device__ NoTurns(const Shape&, int) {}
  __device__ void take() const {}
  __device__ void pass() const {}
};
struct TileNParts {
  using Stamps = NoStamps;
  using Turns = NoTurns;
  using Out = StagedOut;
  static constexpr bool kCopyQ = true;
  template <bool kFewerFences, class Self>
  __device__ static __forceinline__ void compute(const MlaParams& p, const Shape& sh, const Cursor& cur,
                                                 unsigned char* smem, uint64_t* full, uint64_t* empty, int group,
                                                 int cta, bool tma_chunks) {
    mla::compute<kFewerFences, Self>(p, sh, cur, smem, full, empty, group, cta, tma_chunks);
  }
};

// The loader that gathers every tile with cp.async (stages 10 onwards); the
// tensor-copy loader is hopper/tma_loader.cuh's.
struct CpAsyncLoader {
  static constexpr bool kTma = false;
  template <int kSlots, class Stamps>
  __device__ static void load(const MlaParams& p, const Cursor& cur, unsigned char* smem, uint64_t* full,
                              uint64_t* empty, const KvTensor&, bool, const int*) {
    load_keys<kSlots, Stamps>(p, cur, smem, full, empty);
  }
};

// A block of the tile on N: its barriers, the scheduler's cut, then the
// loader warpgroup and the two compute warpgroups on their share.
// Loader::kTma: whether the loader copies whole tiles by TMA where the cache
// allows it (kv.box_keys != 0); kFewerFences: the compute warps leave the fence
// of the chunks gathered with cp.async to the gatherers.
template <class Rule, class Loader, bool kFewerFences, class Parts = TileNParts>
__device__ __forceinline__ void tile_n_block(const MlaParams& p, const KvTensor& kv) {
  using Stamps = typename Parts::Stamps;
  Stamps::main(0);
  constexpr int kSlots = kRing;
  extern __shared__ unsigned char smem_raw[];
  // Align to 1024 by pointer arithmetic on smem_raw itself, so the compiler still
  // knows every pointer below is shared memory (LDS/STS, not generic loads).
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kOffBars);
  uint64_t* empty = full + kSlots;
  // The warpgroup, read through a shuffle so the compiler knows it is the same
  // in every lane: a branch on it is then not divergent, and wgmma stays unserialised.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);

  const bool tma = Loader::kTma && kv.box_keys != 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      // TMA: one arrival (with the bytes to expect); cp.async: every loader thread, once its copies have landed.
      mbar_init(&full[s], tma ? 1 : 128);
      mbar_init(&empty[s], 8);    // every compute warp arrives once its wgmmas are done
    }
    if (tma) {  // the TMA loader's progress counters
      int* progress = reinterpret_cast<int*>(smem + kOffPlan) + kPlanWords;
      progress[0] = progress[1] = 0;
    }
    if (tma) fence_proxy_async();  // the barriers' initial state, visible to the bulk copies that complete on them
  }
  // Launched early behind the stream's previous kernel, which may still be
  // writing q, the cache or kv_lens: wait for it before reading any of them.
  wait_for_previous_grid();
  Stamps::block0(threadIdx.x == 0, 0);
  const Shape sh = shape_of<Rule>(p);
  Cursor cur;
  int C;
  plan_share<kThreads, false, false>(p, sh, reinterpret_cast<int*>(smem + kOffPlan), cur, C);  // its last barrier publishes the mbarriers too
  Stamps::block0(threadIdx.x == 0, 1);
  if (blockIdx.x >= C) return;  // no share for this block (the whole block leaves together)

  if (wg == 0) {
    release_registers<kLoaderRegs>();
    Loader::template load<kSlots, Stamps>(p, cur, smem, full, empty, kv, tma,
                                          reinterpret_cast<const int*>(smem + kOffPlan) + kPlanWords);
  } else {
    claim_registers<kComputeRegs>();
    if (wg == 2 && sh.per_group <= kPairsPerGroup)
      pass_chunks(p, cur, empty, full);  // a stream of <= 40 pairs: the second warpgroup has none
    else
      Parts::template compute<kFewerFences, Parts>(p, sh, cur, smem, full, empty, wg - 1, blockIdx.x, tma);
  }
  Stamps::main(1);
  // This thread's writes are done: the merge may be launched once every
  // block is here (it still waits for the whole grid before reading).
  launch_dependents();
}
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
