// The pairs on M, fed by a loader warpgroup: the layout of FlashMLA's tile in
// stage 10's block, as first tried on the way to the seesaw.
//
// Where a stream's pairs fill tiles of 64 (a third of padding at most), the
// pairs are the M of every product (64 per unit) and the two compute
// warpgroups score alternate tiles and split the 512 output dims, in a ring of
// two whole tiles (rows_kernel); elsewhere stage 10's tile on N runs, in the
// same units.
//   rows              that kernel whole (its answers are right);
//   rows_no_copies    its math alone (the loader copies nothing);
//   rows_no_math      its loads alone;
//   rows_tma          fed by the tensor-copy loader (csrc/hopper/tma_loader.cuh),
//                     which fills the same chunks in the same swizzle;
//   rows_tma_no_math  those loads alone.
#include "experiments/common.cuh"
#include "experiments/taken_away.cuh"
#include "hopper/seesaw_pieces.cuh"
#include "hopper/tma_loader.cuh"

namespace mla {
namespace {

// Units of 64 pairs wherever a stream's pairs fill them (a third of padding at most).
struct RowsWhereTheyFill {
  __host__ __device__ static bool seesaw(const MlaParams& p) { return fills_rows_third(p.q_len * p.num_heads); }
};

// The ring of two whole tiles, Q (64 pairs x 9 chunks, rows of 128 B), the
// references after each warpgroup's tile, a flag, the sums, lengths, rows of q.
// P goes into the RoPE chunk of its own tile, which only the scores read.
constexpr int kRowsRing = 2 * kChunks;  // two whole tiles: one scored by each warpgroup
static_assert(kRowsRing % kChunks == 0, "a tile's chunks never wrap around the rows ring (P V reads four at once)");
constexpr int kROffQ = kRowsRing * kChunkBytes;
constexpr int kROffMa = kROffQ + kChunks * kRowsPairs * 128;
constexpr int kROffMb = kROffMa + kRowsPairs * 4;
constexpr int kROffFlag = kROffMb + kRowsPairs * 4;
constexpr int kROffL = kROffFlag + 16;
constexpr int kROffVis = kROffL + 2 * kRowsPairs * 4;
constexpr int kROffQRow = kROffVis + kRowsPairs * 4;
constexpr int kROffBars = kROffQRow + kRowsPairs * 8;
constexpr int kROffPlan = kROffBars + 2 * kRowsRing * 8;
constexpr int kRowsSmemBytes = kROffPlan + kPlanWords * 4 + 1024;
constexpr int kRowsTmaSmemBytes = kROffPlan + (kPlanWords + 2) * 4 + 1024;
static_assert(kRowsTmaSmemBytes <= 232448, "the rows layout must fit a block's shared memory");

#if MLA_SM90A
// Both compute warpgroups on one unit of up to 64 pairs, the pairs the M of
// every product: S[pairs, keys] = Q K^T with N = 64 keys, and O[pairs, dims]
// += P V with N = 256 dims, a warpgroup's half of them in one product per
// k-step.  O is 64 x 512 floats: each warpgroup holds half of its dims (128
// registers a thread).
// The tiles of a unit go to the warpgroups in turn, A (even) to warpgroup 0 and
// B (odd) to warpgroup 1, so each scores a whole tile, and each needs the
// other's P for its half of the dims.  The softmax reference travels along
// the chain A, B, A', ...: warpgroup 0 scores A with the reference left by B
// before it, writes P_A and its reference to shared memory (P into A's RoPE
// chunk, which only the scores read), and warpgroup 1 takes that reference for
// B.  The reference moves only when a score passes it by 2^8, so a warpgroup
// rarely has to rescale O for the other's tile.
template <bool kDoMath>
__device__ void compute_rows(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem,
                             uint64_t* full, uint64_t* empty, int group, int cta) {
  constexpr int R = kRowsRing;
  constexpr int kBarA = 3, kBarB = 4, kBarBoth = 5;  // P_A ready, P_B ready, both warpgroups
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int t256 = threadIdx.x - 128;             // 0..255 over both compute warpgroups
  const int g = lane / 4, c = 2 * (lane % 4);
  const int row0 = 16 * warp + g;                 // this thread's rows: row0 and row0 + 8
  const uint32_t ring = smem_addr(smem);
  const uint32_t q_s = smem_addr(smem + kROffQ);
  const uint64_t ring_desc = sw128_desc(ring, 1024), q_desc = sw128_desc(q_s, 1024);
  // V as the B operand of N = 256: a warpgroup's four V chunks lie in consecutive
  // slots (a tile's nine never wrap around the ring of two tiles), a slot apart.
  const uint64_t v_desc = sw128_desc(ring, 1024, kChunkBytes);
  float* m_a_s = reinterpret_cast<float*>(smem + kROffMa);
  float* m_b_s = reinterpret_cast<float*>(smem + kROffMb);
  int* flag_s = reinterpret_cast<int*>(smem + kROffFlag);
  float* l_s = reinterpret_cast<float*>(smem + kROffL);
  int* vis_s = reinterpret_cast<int*>(smem + kROffVis);
  int64_t* q_row_s = reinterpret_cast<int64_t*>(smem + kROffQRow);
  const float scale_log2 = p.scale * kLog2e;
  const int first_share_unit = cur.unit;
  const int v_pos0 = 1 + 4 * group;  // the ring positions of this warpgroup's V chunks (dims 256 group ..)

  auto release = [&](int s) {  // one arrival per warp on chunk s's slot
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[s % R]);
  };
  auto slot_of = [&](int s) { return s % R; };
  // S = Q K^T of the tile whose chunks start at s: 9 chunks, 4 k-steps each, one commit.
  auto scores = [&](float (&sc)[32], int s) {
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {  // each chunk's k-steps as soon as it has landed
      mbar_wait(&full[slot_of(s + j)], ((s + j) / R) & 1);
      fence_proxy_async();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wgmma_m64n64k16_ss<0>(sc, q_desc + ((dims_of(j) * kRowsPairs * 128 + 32 * ks) >> 4),
                              ring_desc + ((slot_of(s + j) * kChunkBytes + 32 * ks) >> 4), j | ks);
    }
    wgmma_commit();
  };
  // O[:, this warpgroup's dims] += P V of the tile at s, P in registers.
  // (No fence on O here: a product of the other tile may still be adding to it,
  // and an instruction that seems to write O while a wgmma does makes ptxas
  // serialise every wgmma of the kernel.  A rescale is fenced where it is done.)
  auto pv_regs = [&](float (&o)[4][32], uint32_t (&pk)[16], int s) {
#pragma unroll
    for (int i = 0; i < 16; ++i) asm volatile("" : "+r"(pk[i])::"memory");  // P is final before the fence
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_rs_tb(o, &pk[4 * ks], v_desc + ((slot_of(s + v_pos0) * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };
  // The same with the other warpgroup's P, from its tile's RoPE slot.
  auto pv_smem = [&](float (&o)[4][32], int s) {
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
      wgmma_m64n256k16_ss_tb(o, ring_desc + ((slot_of(s) * kChunkBytes + 32 * ks) >> 4),
                             v_desc + ((slot_of(s + v_pos0) * kChunkBytes + 2048 * ks) >> 4));
    wgmma_commit();
  };

  int seq = 0;
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch, grp = u / p.batch;
    const int kv_len = p.kv_lens[b];
    const int pair0 = grp * sh.per_group;
    const int n_pairs = max(0, min(sh.per_group, sh.pairs - pair0));

    // Q of the unit's pairs, loaded by both warpgroups (the first barrier also
    // waits until the previous unit's sums are read).
    load_unit_q<false>(p, b, kv_len, pair0, n_pairs, kRowsPairs, q_s, q_row_s, vis_s, nullptr, t256, 256, kBarBoth);
    const int vis0 = vis_s[row0], vis1 = vis_s[row0 + 8];
    cp_async_wait<0>();
    fence_proxy_async();
    named_barrier(kBarBoth, 256);

    float o[4][32];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 32; ++r) o[j][r] = 0.f;
    float m0 = -CUDART_INF_F, m1 = -CUDART_INF_F;  // the references of rows row0, row0 + 8
    float l0 = 0.f, l1 = 0.f;  // this thread's part of their sums over this warpgroup's tiles
    const int first_hidden = kv_len - p.q_len + 1;

    // Hide the keys of `tile` a row may not see, move the
    // references where a score passes them by 2^8, and make P (bf16 pairs,
    // as a register A operand) and this thread's part of the sums.
    auto softmax = [&](const float (&acc)[32], int tile, float& a0, float& a1, uint32_t (&pk)[16]) {
      float mx0, mx1;
      float sc[32];  // the scores, hidden keys at -inf (the accumulators are only read: see pv_regs)
      SoftmaxFfma::hide_and_max(acc, sc, tile, first_hidden, vis0, vis1, c, scale_log2, mx0, mx1);
      const float n0 = mx0 > m0 + kRescaleLog2 ? mx0 : m0;  // -inf + 8 is -inf: a first key always moves it
      const float n1 = mx1 > m1 + kRescaleLog2 ? mx1 : m1;
      a0 = n0 == m0 ? 1.f : exp2f(m0 - n0);
      a1 = n1 == m1 ? 1.f : exp2f(m1 - n1);
      m0 = n0;
      m1 = n1;
      float s0, s1;
      rows_exponentiate<SoftmaxFfma>(sc, scale_log2, m0, m1, pk, s0, s1);
      l0 = l0 * a0 + s0;
      l1 = l1 * a1 + s1;
    };
    auto rescale = [&](float a0, float a1) { rows_rescale(o, a0, a1); };  // only where no product adds to O
    // P into the slot of chunk s.
    auto store_p = [&](const uint32_t (&pk)[16], int s) { rows_store_p(pk, ring + slot_of(s) * kChunkBytes, row0, g, lane); };
    auto publish_m = [&](float* m_s) {
      if (c == 0) {
        m_s[row0] = m0;
        m_s[row0 + 8] = m1;
      }
    };
    // The other warpgroup's references: how much this one's O and sums shrink.
    auto take_m = [&](const float* m_s, float& a0, float& a1) {
      const float n0 = m_s[row0], n1 = m_s[row0 + 8];
      a0 = n0 == m0 ? 1.f : exp2f(m0 - n0);
      a1 = n1 == m1 ? 1.f : exp2f(m1 - n1);
      m0 = n0;
      m1 = n1;
      l0 *= a0;
      l1 *= a1;
    };

    int prev = -1;       // the first chunk of the previous pair of tiles, -1 at a unit's start
    bool prev_b = false; // whether it had a tile B
    auto release_prev = [&]() {  // what the previous pair left to hand back, once its products are done
      if (prev < 0) return;
      if (group == 0) {
        if (prev_b)
          for (int k = 0; k <= 4; ++k) release(prev + kChunks + k);  // B's P and V dims 0..255
      } else {
        if (prev_b)
          for (int k = 5; k <= 8; ++k) release(prev + kChunks + k);  // B's V dims 256..511
      }
    };

    if (!kDoMath) {  // no math: wait for each chunk, hand it back
      for (int n = (t1 - t0) * kChunks; n > 0; --n, ++seq) {
        mbar_wait(&full[slot_of(seq)], (seq / R) & 1);
        release(seq);
      }
    }
    const int t_end = kDoMath ? t1 : t0;
    for (int tile = t0; tile < t_end; tile += 2) {
      const bool has_b = tile + 1 < t_end;
      const int sa = seq, sb = seq + kChunks;
      float sc[32];
      uint32_t pk[16];
      float a0, a1;
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
      release_prev();
      if (group == 0) {
        scores(sc, sa);
        wgmma_wait<0>();
        fence_accumulators(sc);
        for (int k = 5; k <= 8; ++k) release(sa + k);  // A's dims 256..575: scores only, here
        softmax(sc, tile, a0, a1, pk);
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);  // nothing in flight reads O
        store_p(pk, sa);
        publish_m(m_a_s);
        fence_proxy_async();
        release(sa);  // A's RoPE slot: this warpgroup is done with it (the other still reads P there)
        named_barrier_arrive(kBarA, 256);
        pv_regs(o, pk, sa);
        // A's dims 0..255 go back as soon as their products are done: the
        // next tile A' loads into them while B is finished.
        wgmma_wait<0>();
        for (int k = 1; k <= 4; ++k) release(sa + k);
        if (has_b) {
          named_barrier(kBarB, 256);
          for (int k = 5; k <= 8; ++k) release(sb + k);  // B's dims 256..511: not read here
          take_m(m_b_s, a0, a1);
          if (flag_s[0]) rescale(a0, a1);  // a reference moved in B: O shrinks before P_B adds to it
          pv_smem(o, sb);
        }
      } else {
        if (has_b) scores(sc, sb);
        named_barrier(kBarA, 256);
        for (int k = 1; k <= 4; ++k) release(sa + k);  // A's dims 0..255: not read here
        // S_B is done before O may change: a write to O while any product is
        // in flight makes ptxas serialise every wgmma of the kernel.
        wgmma_wait<0>();
        fence_accumulators(sc);
        take_m(m_a_s, a0, a1);
        if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) rescale(a0, a1);
        pv_smem(o, sa);
        if (has_b) {
          for (int k = 1; k <= 4; ++k) release(sb + k);  // B's dims 0..255: scores only, here
          softmax(sc, tile + 1, a0, a1, pk);
          const bool moved = named_barrier_or(2, 128, a0 != 1.f || a1 != 1.f);
          if (moved) {
            wgmma_wait<0>();
#pragma unroll
            for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
            rescale(a0, a1);
          }
          store_p(pk, sb);
          publish_m(m_b_s);
          if (tid == 0) flag_s[0] = moved;
          fence_proxy_async();
          release(sb);
          named_barrier_arrive(kBarB, 256);
        }
        // P_A and A's dims 256..511 go back before B's products are issued.
        wgmma_wait<0>();
        release(sa);
        for (int k = 5; k <= 8; ++k) release(sa + k);
        if (has_b) pv_regs(o, pk, sb);
      }
      prev = seq;
      prev_b = has_b;
      seq += has_b ? 2 * kChunks : kChunks;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
    release_prev();

    // The sums: of this thread's quad by shuffles, of the two warpgroups through shared memory.
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (c == 0) {
      l_s[group * kRowsPairs + row0] = l0;
      l_s[group * kRowsPairs + row0 + 8] = l1;
    }
    named_barrier(kBarBoth, 256);

    // Write the unit: whole -> out and lse; cut -> this block's partial slot (dims of this warpgroup).
    const bool whole = t0 == 0 && t1 == unit_tiles(p, u);
    const int slot = u == first_share_unit ? 0 : 1;
    const int64_t part_row0 = ((int64_t)cta * 2 + slot) * kPairsPerBlock;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int n = row0 + 8 * h2;
      if (n >= n_pairs) continue;
      const float l = l_s[n] + l_s[kRowsPairs + n];
      const float m_ref = h2 ? m1 : m0;
      const float inv = 1.f / l;
      const float lse_nat = (m_ref + log2f(l)) * 0.6931471805599453f;
      const int pr = pair0 + n, t = pr / p.num_heads, h = pr % p.num_heads;
      const int dim0 = 256 * group + c;
      if (whole) {
        bf16* dst = out_head(p, b, t, h) + dim0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<uint32_t*>(dst + 64 * j + 8 * i) =
                pack_bf16x2(o[j][4 * i + 2 * h2] * inv, o[j][4 * i + 2 * h2 + 1] * inv);
        if (group == 0 && c == 0) *lse_at(p, b, t, h) = lse_nat;
      } else {
        float* dst = p.o_partial + (part_row0 + n) * kDimV + dim0;
        const bool empty_part = l == 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int i = 0; i < 8; ++i)
            *reinterpret_cast<float2*>(dst + 64 * j + 8 * i) =
                empty_part ? make_float2(0.f, 0.f)
                           : make_float2(o[j][4 * i + 2 * h2] * inv, o[j][4 * i + 2 * h2 + 1] * inv);
        if (group == 0 && c == 0) p.lse_partial[part_row0 + n] = empty_part ? -CUDART_INF_F : lse_nat;
      }
    }
  }
}


// A block of the rows layout: stage 10's block (tile_n_block) with its ring of
// two tiles and compute_rows.
template <class Loader, bool kDoMath>
__device__ __forceinline__ void rows_block(const MlaParams& p, const KvTensor& kv) {
  constexpr int kSlots = kRowsRing;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kROffBars);
  uint64_t* empty = full + kSlots;
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);

  const bool tma = Loader::kTma && kv.box_keys != 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      mbar_init(&full[s], tma ? 1 : 128);
      mbar_init(&empty[s], 8);
    }
    if (tma) {
      int* progress = reinterpret_cast<int*>(smem + kROffPlan) + kPlanWords;
      progress[0] = progress[1] = 0;
    }
    if (tma) fence_proxy_async();
  }
  wait_for_previous_grid();
  const Shape sh = shape_of<RowsWhereTheyFill>(p);
  Cursor cur;
  int C;
  plan_share<kThreads, false, false>(p, sh, reinterpret_cast<int*>(smem + kROffPlan), cur, C);
  if (blockIdx.x >= C) return;

  if (wg == 0) {
    release_registers<kLoaderRegs>();
    Loader::template load<kSlots, NoStamps>(p, cur, smem, full, empty, kv, tma,
                                            reinterpret_cast<const int*>(smem + kROffPlan) + kPlanWords);
  } else {
    claim_registers<kComputeRegs>();
    compute_rows<kDoMath>(p, sh, cur, smem, full, empty, wg - 1, blockIdx.x);
  }
  launch_dependents();
}
#endif  // MLA_SM90A

// Each variant's two main kernels: the rows layout where the pairs fill it, and
// stage 10's tile on N elsewhere (with the same loader and work taken away).
#if MLA_SM90A
#define ROWS_BODY(Loader, kDoMath) rows_block<Loader, kDoMath>(p, kv)
#define TILE_N_BODY(Loader, kFences, Parts) tile_n_block<RowsWhereTheyFill, Loader, kFences, Parts>(p, kv)
#else
#define ROWS_BODY(Loader, kDoMath) __trap()
#define TILE_N_BODY(Loader, kFences, Parts) __trap()
#endif
__global__ void __launch_bounds__(kThreads, 1) rows_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
  ROWS_BODY(CpAsyncLoader, true);
}
__global__ void __launch_bounds__(kThreads, 1) rows_tile_n_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
  TILE_N_BODY(CpAsyncLoader, false, TileNParts);
}
__global__ void __launch_bounds__(kThreads, 1) rows_no_copies_kernel(const MlaParams p,
                                                                     const __grid_constant__ KvTensor kv) {
  ROWS_BODY(NoCopiesLoader, true);
}
__global__ void __launch_bounds__(kThreads, 1) rows_no_copies_tile_n_kernel(const MlaParams p,
                                                                            const __grid_constant__ KvTensor kv) {
  TILE_N_BODY(NoCopiesLoader, false, TileNParts);
}
__global__ void __launch_bounds__(kThreads, 1) rows_no_math_kernel(const MlaParams p,
                                                                   const __grid_constant__ KvTensor kv) {
  ROWS_BODY(CpAsyncLoader, false);
}
__global__ void __launch_bounds__(kThreads, 1) rows_no_math_tile_n_kernel(const MlaParams p,
                                                                          const __grid_constant__ KvTensor kv) {
  TILE_N_BODY(CpAsyncLoader, false, NoMathParts);
}
__global__ void __launch_bounds__(kThreads, 1) rows_tma_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
  ROWS_BODY(TmaLoader, true);
}
__global__ void __launch_bounds__(kThreads, 1) rows_tma_tile_n_kernel(const MlaParams p,
                                                                      const __grid_constant__ KvTensor kv) {
  TILE_N_BODY(TmaLoader, false, TileNParts);
}
__global__ void __launch_bounds__(kThreads, 1) rows_tma_no_math_kernel(const MlaParams p,
                                                                       const __grid_constant__ KvTensor kv) {
  ROWS_BODY(TmaLoader, false);
}
__global__ void __launch_bounds__(kThreads, 1) rows_tma_no_math_tile_n_kernel(const MlaParams p,
                                                                              const __grid_constant__ KvTensor kv) {
  TILE_N_BODY(TmaLoader, false, NoMathParts);
}
#undef ROWS_BODY
#undef TILE_N_BODY

__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const MlaParams p) {
#if MLA_SM90A
  combine_block<RowsWhereTheyFill, NoStamps>(p);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kCombineThreads, 3) merge_by_warps_kernel(const MlaParams p) {
#if MLA_SM90A
  merge_by_warps_block<RowsWhereTheyFill, NoStamps>(p);
#else
  __trap();
#endif
}

const char* const kVariants[] = {"rows", "rows_no_copies", "rows_no_math", "rows_tma", "rows_tma_no_math"};
const MainKernel kRows[] = {rows_kernel, rows_no_copies_kernel, rows_no_math_kernel, rows_tma_kernel,
                            rows_tma_no_math_kernel};
const MainKernel kTileN[] = {rows_tile_n_kernel, rows_no_copies_tile_n_kernel, rows_no_math_tile_n_kernel,
                             rows_tma_tile_n_kernel, rows_tma_no_math_tile_n_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  const bool tma = v >= 3;
  const bool rows = RowsWhereTheyFill::seesaw(p);
  const int smem = rows ? (tma ? kRowsTmaSmemBytes : kRowsSmemBytes) : (tma ? kTmaSmemBytes : kSmemBytes);
  return launch_tile_n<RowsWhereTheyFill>(p, stream, rows ? kRows[v] : kTileN[v], smem, tma,
                                          merge_as_staged<RowsWhereTheyFill>(combine_kernel, merge_by_warps_kernel));
}

}  // namespace

const Experiment& experiment() { return experiment_of(kVariants, launch_variant); }

}  // namespace mla
