// The crossed seesaw (stage 12's order) with its chunks copied one by one: a
// copier lane arms a chunk's barrier and issues its tensor copy for each of the
// 18 chunks of a pair of tiles, while the three other warps of its warpgroup
// wait at the next wgmma.  The loop of two experiments: seesaw_chunk_copies.cu
// asks for a tile's copies before the products that follow; with kCopiesBehind
// (seesaw_copies_behind.cu) each warpgroup asks for them behind the products
// it has just issued.
#pragma once

#include "experiments/seesaw_common.cuh"

namespace mla {
namespace {

#if MLA_SM90A
template <class Parts, bool kCopiesBehind>
__device__ void seesaw_chunk_copies(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem, const KvTensor& kv) {
  // The warpgroup, through a shuffle so the compiler knows it is the same in
  // every lane: a branch on it is then not divergent, and wgmma stays unserialised.
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, c = 2 * (lane % 4);
  const int row0 = 16 * warp + g;  // this thread's rows: row0 and row0 + 8
  const bool copier = tid == 0;    // asks for this warpgroup's copies
  const uint32_t k0_s = smem_addr(smem), k1_s = k0_s + kTileBytes;
  const uint32_t q_s = smem_addr(smem + kSOffQ);
  const uint64_t q_desc = sw128_desc(q_s, 1024);
  // V as the B operand of N = 256: four chunks side by side, a chunk apart.
  const uint64_t v0_desc = sw128_desc(k0_s, 1024, kChunkBytes), v1_desc = sw128_desc(k1_s, 1024, kChunkBytes);
  const uint64_t k0_desc = sw128_desc(k0_s, 1024), k1_desc = sw128_desc(k1_s, 1024);
  float* m_s = reinterpret_cast<float*>(smem + kSOffM);
  float* scale_s = reinterpret_cast<float*>(smem + kSOffScale);  // [0]: tile A's factor, [1]: tile B's
  float* l_s = reinterpret_cast<float*>(smem + kSOffL);
  int* vis_s = reinterpret_cast<int*>(smem + kSOffVis);
  int64_t* q_row_s = reinterpret_cast<int64_t*>(smem + kSOffQRow);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kSOffBars);  // K0's 9 chunks, then K1's
  int* bad_s = reinterpret_cast<int*>(smem + kSOffBad);            // by unit parity
  int* ring = reinterpret_cast<int*>(smem + kSOffPages) + 16 * wg;  // this copier's page ids, fetched ahead
  using Pages = typename Parts::Pages;
  using Softmax = typename Parts::Softmax;
  const typename Parts::Boxes bx{kv};  // how a tile's boxes lie: known here, or read from kv
  const PageSteps steps = page_steps(p, bx.keys());
  const float scale_log2 = p.scale * kLog2e;
  const int first_share_unit = cur.unit;
  const int dim_half = 4 * wg;  // this warpgroup's V chunks: dims 256 wg .. 256 wg + 255
  int phase = 0;                // parity of the next fill of this warpgroup's tile (K0 or K1)
  int unit_count = 0;
  typename Parts::Stamps::Tiles stamps(wg);

  // S = Q K^T of a tile over its chunks start, start + 1, ... (n of them, from
  // 8 back to 0), each chunk's four k-steps as soon as it has landed, one commit.
  auto scores = [&](float (&sc)[32], uint64_t k_desc, uint64_t* tile_bars, int start, int n, bool first) {
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const int j = (start + i) % kChunks;
      mbar_wait(&tile_bars[chunk_bar(bx, j)], phase);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n64k16_ss<0>(sc, q_desc + ((j * kRowsPairs * 128 + 32 * ks) >> 4),
                              k_desc + ((j * kChunkBytes + 32 * ks) >> 4), !(first && i == 0 && ks == 0));
    }
    wgmma_commit();
  };
  // O[:, this warpgroup's dims] += P V, P in registers or (p_s) in shared memory.
  // (No fence on O here: an instruction that seems to write O while a wgmma
  // does makes ptxas serialise every wgmma of the kernel.)
  auto pv_regs = [&](float (&o)[4][32], uint32_t (&pk)[16], uint64_t v_desc) {
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(pk[i])::"memory");  // P is final before the fence
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_rs_tb(o, &pk[4 * ks], v_desc + ((dim_half * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };
  auto pv_smem = [&](float (&o)[4][32], uint32_t p_s, uint64_t v_desc) {
    const uint64_t p_desc = sw128_desc(p_s, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_ss_tb(o, p_desc + ((32 * ks) >> 4), v_desc + ((dim_half * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };
  auto store_p = [&](const uint32_t (&pk)[16], uint32_t p_s) { rows_store_p(pk, p_s, row0, g, lane); };
  // Zeros in rows `valid` .. 63 of this warpgroup's V chunks of the tile at
  // tile_s (its keys past the stream's end), visible to the tensor cores and to
  // the whole warpgroup before its products read them.
  auto zero_tail = [&](uint32_t tile_s, int valid) {
    for (int i = tid; i < (kKeysPerTile - valid) * 32; i += 128) {
      const int r = valid + i / 32, k = (i / 8) % 4, col = i % 8;
      st_shared_u128(tile_s + (dim_half + k) * kChunkBytes + r * 128 + col * 16, 0, 0, 0, 0);
    }
    fence_proxy_async();
    named_barrier(kBarSeeOwn + wg, 128);
  };

  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch, grp = u / p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    const int pair0 = grp * sh.per_group;
    const int n_pairs = max(0, min(sh.per_group, sh.pairs - pair0));
    int* bad_flag = bad_s + (unit_count++ & 1);
    int bad_pages = 0;  // this copier's: a page outside the pool among the tiles it copied

    // The unit's first two tiles, before its Q, so that they land while Q
    // does.  (Every product of the previous unit is done: its end passed a
    // barrier of both warpgroups after their last waits.)
    if (threadIdx.x == 0) {
      const TilePages ta = Pages::tile_pages(p, steps, table, kv_len, t0, bx.keys());
      for (int j = 0; j < kChunks; ++j) copy_chunk(kv, bx, k0_s, &bars[j], ta, j);
      int bad = ta.bad;
      if (t0 + 1 < t1) {
        const TilePages tb = Pages::tile_pages(p, steps, table, kv_len, t0 + 1, bx.keys());
        for (int j = 0; j < kChunks; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], tb, j);
        bad |= tb.bad;
      }
      *bad_flag = bad;  // (the flag of the unit before last: read before this unit's first barrier)
    }
    if (copier) {  // the next pair's page ids, waited for with the unit's Q below
      if (t0 + 2 < t1) Pages::fetch_pages(p, steps, table, kv_len, t0 + 2, bx.keys(), ring);
      if (t0 + 3 < t1) Pages::fetch_pages(p, steps, table, kv_len, t0 + 3, bx.keys(), ring);
    }
    load_unit_q<true>(p, b, kv_len, pair0, n_pairs, kRowsPairs, q_s, q_row_s, vis_s, m_s, threadIdx.x, kSeeThreads,
                      kBarSeeBoth);
    const int vis0 = vis_s[row0], vis1 = vis_s[row0 + 8];
    cp_async_wait<0>();
    fence_proxy_async();
    named_barrier(kBarSeeBoth, kSeeThreads);

    float o[4][32];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 32; ++r) o[j][r] = 0.f;
    float l0 = 0.f, l1 = 0.f;  // this thread's part of its rows' sums over this warpgroup's tiles
    const int first_hidden = kv_len - p.q_len + 1;  // the first key some row may not see (the causal draft)

    // The scores of `tile` hidden where a row may not see them, and each row's maximum (scaled).
    auto row_max = [&](float (&sc)[32], int tile, float& mx0, float& mx1) {
      Softmax::hide_and_max(sc, sc, tile, first_hidden, vis0, vis1, c, scale_log2, mx0, mx1);
    };
    auto exponentiate = [&](const float (&sc)[32], float n0, float n1, uint32_t (&pk)[16], float& s0, float& s1) {
      rows_exponentiate<Softmax>(sc, scale_log2, n0, n1, pk, s0, s1);
    };
    // The reference moves only where a score passes it by 2^8 (-inf + 8 is -inf: a first key always moves it).
    auto moved = [](float mx, float m) { return mx > m + kRescaleLog2 ? mx : m; };
    auto factor = [](float m_old, float m_new) { return m_new == m_old ? 1.f : exp2f(m_old - m_new); };
    auto rescale = [&](float f0, float f1) { rows_rescale(o, f0, f1); };  // only where no product is in flight

    float sc[32];
    uint32_t pk[16];
    // The unit's first scores: A's by warpgroup 0, B's by warpgroup 1.
    if (wg == 0 || t0 + 1 < t1) {
      scores(sc, wg == 0 ? k0_desc : k1_desc, bars + wg * kChunks, 0, kChunks, true);
      wgmma_wait<0>();
      fence_accumulators(sc);
      phase ^= 1;
    }

    for (int tile = t0; tile < t1; tile += 2) {
      const bool has_b = tile + 1 < t1, has_a2 = tile + 2 < t1, has_b2 = tile + 3 < t1;
      // The page ids of the pair after next, fetched now; those of the next pair
      // were fetched a pair ago (or with the unit's Q): only they are waited for.
      if (copier) {
        if (tile + 4 < t1) Pages::fetch_pages(p, steps, table, kv_len, tile + 4, bx.keys(), ring);
        if (tile + 5 < t1) Pages::fetch_pages(p, steps, table, kv_len, tile + 5, bx.keys(), ring);
        cp_async_commit();
      }
      bool fetched = false;
      auto pages_of = [&](int t) {
        if (!fetched) cp_async_wait<1>();  // all but this pair's fetch
        fetched = true;
        return Pages::ring_pages(p, steps, kv_len, t, bx.keys(), ring);
      };
      const int valid_a = kv_len - tile * kKeysPerTile, valid_b = valid_a - kKeysPerTile;  // keys of the stream in A, B
      stamps.at(0);
      // The crossed order: P_A goes to warpgroup 1 in A's
      // own reference, as soon as A's softmax is done, and warpgroup 1 adds
      // P_A V_A,R while it runs B's softmax; where B moves the reference (rarely,
      // with a lazy one), each warpgroup rescales its O before it adds P_B V_B.
      // No P is rescaled, and nothing waits for B's softmax but P_B's products.
      // Warpgroup 1 scores the next B only once the next A's scores are done, so
      // that they run while warpgroup 0 is at A's softmax.
      if (wg == 0) {
        // ---- warpgroup 0: tile A, dims 0..255 ----
        float mx0, mx1;
        row_max(sc, tile, mx0, mx1);
        const float m0 = m_s[row0], m1 = m_s[row0 + 8];  // the reference the last tile left
        const float n0 = moved(mx0, m0), n1 = moved(mx1, m1);
        const float a0 = factor(m0, n0), a1 = factor(m1, n1);
        float s0 = 0.f, s1 = 0.f;
        exponentiate(sc, n0, n1, pk, s0, s1);
        l0 = l0 * a0 + s0;
        l1 = l1 * a1 + s1;
        __syncwarp();  // the quad's reads of m_s before its write
        if (c == 0) {
          m_s[row0] = n0;
          m_s[row0 + 8] = n1;
          scale_s[row0] = a0;
          scale_s[row0 + 8] = a1;
        }
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);
        // P_A for warpgroup 1, in A's RoPE chunk (its scores are done), before this warpgroup's products.
        store_p(pk, k0_s + (kChunks - 1) * kChunkBytes);
        fence_proxy_async();
        named_barrier_arrive(kBarPA, kSeeThreads);
        stamps.at(1);
        if (valid_a < kKeysPerTile) zero_tail(k0_s, valid_a);
        pv_regs(o, pk, v0_desc);
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        stamps.at(2);
        // A's chunks 0..3: read by its scores and by these products, both done.
        if (copier && has_a2) {
          const TilePages na = pages_of(tile + 2);
          for (int j = 0; j < 4; ++j) copy_chunk(kv, bx, k0_s, &bars[j], na, j);
          bad_pages |= na.bad;
        }
        named_barrier(kBarPB, kSeeThreads);  // P_B is in B's RoPE chunk, B's reference is known
        stamps.at(3);
        // (Only now: B's chunks have landed, since warpgroup 1 has its scores.)
        if (has_b && valid_b < kKeysPerTile) zero_tail(k1_s, valid_b);
        const float b0 = scale_s[kRowsPairs + row0], b1 = scale_s[kRowsPairs + row0 + 8];
        l0 *= b0;
        l1 *= b1;
        if (__any_sync(0xffffffffu, b0 != 1.f || b1 != 1.f)) rescale(b0, b1);  // O_L into B's reference
        if (has_b) pv_smem(o, k1_s + (kChunks - 1) * kChunkBytes, v1_desc);
        if (has_a2) {
          auto copy_next_b = [&] {
            if (copier && has_b2) {
              const TilePages nb = pages_of(tile + 3);
              for (int j = 0; j < 4; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], nb, j);
              copy_chunk(kv, bx, k1_s, &bars[kChunks + 8], nb, 8);
            }
          };
          scores(sc, k0_desc, bars, 0, 4, true);
          if constexpr (!kCopiesBehind) {
            wgmma_wait<1>();  // B's products are done: its chunks 0..3 and P_B (chunk 8) are free
            copy_next_b();
          }
          scores(sc, k0_desc, bars, 4, 5, false);
          if constexpr (kCopiesBehind) {
            wgmma_wait<2>();  // B's products are done: its chunks 0..3 and P_B (chunk 8) are free
            copy_next_b();    // while the scores run
          }
          stamps.at(4);
          wgmma_wait<0>();
          fence_accumulators(sc);
          phase ^= 1;
          named_barrier_arrive(kBarScaleA, kSeeThreads);  // the next A's scores are done: B's may start
        } else {
          stamps.at(4);
          wgmma_wait<0>();
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        stamps.at(5);
      } else {
        // ---- warpgroup 1: tile B, dims 256..511 ----
        named_barrier(kBarPA, kSeeThreads);  // P_A is in A's RoPE chunk, A's reference is known
        stamps.at(1);
        const float m0 = m_s[row0], m1 = m_s[row0 + 8];
        const float a0 = scale_s[row0], a1 = scale_s[row0 + 8];
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);  // O_R into A's reference
        if (valid_a < kKeysPerTile) zero_tail(k0_s, valid_a);
        pv_smem(o, k0_s + (kChunks - 1) * kChunkBytes, v0_desc);  // P_A V_A,R, while B's softmax runs
        float n0 = m0, n1 = m1, s0 = 0.f, s1 = 0.f;
        if (has_b) {
          float mx0, mx1;
          row_max(sc, tile + 1, mx0, mx1);
          n0 = moved(mx0, m0);
          n1 = moved(mx1, m1);
          exponentiate(sc, n0, n1, pk, s0, s1);
        }
        const float b0 = factor(m0, n0), b1 = factor(m1, n1);
        __syncwarp();
        if (c == 0) {
          m_s[row0] = n0;
          m_s[row0 + 8] = n1;
          scale_s[kRowsPairs + row0] = b0;
          scale_s[kRowsPairs + row0 + 8] = b1;
        }
        l0 = l0 * a0 * b0 + s0;
        l1 = l1 * a1 * b1 + s1;
        if (has_b) {
          store_p(pk, k1_s + (kChunks - 1) * kChunkBytes);  // B's RoPE chunk: its scores are done
          if (valid_b < kKeysPerTile) zero_tail(k1_s, valid_b);  // (its fence covers P_B too)
          else fence_proxy_async();
        }
        named_barrier_arrive(kBarPB, kSeeThreads);
        stamps.at(2);
        wgmma_wait<0>();  // A's products are done: its chunks 4..8 are free
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
        stamps.at(3);
        auto copy_next_a = [&] {
          if (copier && has_a2) {
            const TilePages na = pages_of(tile + 2);
            for (int j = 4; j < kChunks; ++j) copy_chunk(kv, bx, k0_s, &bars[j], na, j);
          }
        };
        if constexpr (!kCopiesBehind) copy_next_a();
        if (__any_sync(0xffffffffu, b0 != 1.f || b1 != 1.f)) rescale(b0, b1);  // O_R into B's reference
        if (has_b) {
          pv_regs(o, pk, v1_desc);
          if constexpr (kCopiesBehind) copy_next_a();  // while the products run (with no B there is no next A)
          wgmma_wait<0>();  // B's products are done: its chunks 4..7 are free
#pragma unroll
          for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
          if (copier && has_b2) {
            const TilePages nb = pages_of(tile + 3);
            for (int j = 4; j < 8; ++j) copy_chunk(kv, bx, k1_s, &bars[kChunks + j], nb, j);
            bad_pages |= nb.bad;
          }
        }
        if (has_a2) {
          named_barrier(kBarScaleA, kSeeThreads);  // the next A's scores are done
          stamps.at(4);
          if (has_b2) {
            scores(sc, k1_desc, bars + kChunks, 4, kChunks, true);  // its own copies (4..7) first
            wgmma_wait<0>();
            fence_accumulators(sc);
            phase ^= 1;
          }
        } else {
          stamps.at(4);
        }
        stamps.at(5);
      }
      stamps.next();
    }

    if (bad_pages) atomicOr(bad_flag, 1);
    // The sums: of this thread's quad by shuffles, of the two warpgroups through shared memory.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (c == 0) {
      l_s[wg * kRowsPairs + row0] = l0;
      l_s[wg * kRowsPairs + row0 + 8] = l1;
    }
    named_barrier(kBarSeeBoth, kSeeThreads);  // both halves' sums, the last reference, the unit's flag
    const bool bad = *bad_flag != 0;

    // Write the unit: whole -> out and lse (its rows staged in Q's region, then
    // whole lines); cut -> this block's partial slot (its dims, 32-byte sectors).
    const bool whole = t0 == 0 && t1 == unit_tiles(p, u);
    const int slot = u == first_share_unit ? 0 : 1;
    const int64_t part_row0 = ((int64_t)cur.share * 2 + slot) * kPairsPerBlock;
    const int dim0 = 256 * wg + c;
    if (whole) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int n = row0 + 8 * h2;
        const float inv = bad ? CUDART_NAN_F : 1.f / (l_s[n] + l_s[kRowsPairs + n]);
        if (h2 == 0) l0 = inv;
        else l1 = inv;
      }
      const int mat = lane / 8, n = row0 - g + 8 * (mat % 2) + lane % 8;
      const uint32_t row_s = q_s + n * kSeeOutRowBytes + 2 * 256 * wg;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int i = 0; i < 8; i += 2)
          stmatrix_x4(row_s + 2 * (64 * j + 8 * (i + mat / 2)), pack_bf16x2(o[j][4 * i] * l0, o[j][4 * i + 1] * l0),
                      pack_bf16x2(o[j][4 * i + 2] * l1, o[j][4 * i + 3] * l1),
                      pack_bf16x2(o[j][4 * i + 4] * l0, o[j][4 * i + 5] * l0),
                      pack_bf16x2(o[j][4 * i + 6] * l1, o[j][4 * i + 7] * l1));
      named_barrier(kBarSeeBoth, kSeeThreads);
      // Each warp copies whole rows, 512 bytes a store instruction.
      for (int n2 = threadIdx.x / 32; n2 < n_pairs; n2 += kSeeThreads / 32) {
        const int pr = pair0 + n2, t = pr / p.num_heads, h = pr % p.num_heads;
        bf16* dst = out_head(p, b, t, h);
        const unsigned char* src = smem + kSOffQ + n2 * kSeeOutRowBytes;
#pragma unroll
        for (int k = 0; k < 2; ++k)
          *reinterpret_cast<uint4*>(dst + 8 * (lane + 32 * k)) = *reinterpret_cast<const uint4*>(src + 16 * (lane + 32 * k));
      }
      if (threadIdx.x < n_pairs) {
        const int n2 = threadIdx.x, pr = pair0 + n2, t = pr / p.num_heads, h = pr % p.num_heads;
        const float l = l_s[n2] + l_s[kRowsPairs + n2];
        *lse_at(p, b, t, h) = bad ? CUDART_NAN_F : (m_s[n2] + log2f(l)) * 0.6931471805599453f;
      }
    } else {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int n = row0 + 8 * h2;
        if (n >= n_pairs) continue;
        const float l = l_s[n] + l_s[kRowsPairs + n];
        const bool empty_part = l == 0.f;
        const float inv = bad ? CUDART_NAN_F : 1.f / l;
        float* dst = p.o_partial + (part_row0 + n) * kDimV + dim0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<float2*>(dst + 64 * j + 8 * i) =
                empty_part && !bad ? make_float2(0.f, 0.f)
                                   : make_float2(o[j][4 * i + 2 * h2] * inv, o[j][4 * i + 2 * h2 + 1] * inv);
        if (wg == 0 && c == 0)
          p.lse_partial[part_row0 + n] = bad ? CUDART_NAN_F
                                         : empty_part ? -CUDART_INF_F
                                                      : (m_s[n] + log2f(l)) * 0.6931471805599453f;
      }
    }
    // (The next unit's Q load begins with a barrier of both warpgroups: nobody
    // overwrites the staged rows, the sums or the reference before they are read.)
  }
}
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
