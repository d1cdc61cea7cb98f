// The tensor-copy loader's other forms, in stage 11's block (every call on
// the tensor copy where the cache has a map, as a build without the op's
// choice of kernel):
//   tma                the loader with stage 10's fence before every chunk's
//                      products (the tensor copy writes through the async
//                      proxy, which wgmma reads through: only the chunks
//                      gathered with cp.async need it);
//   tma_fewer_fences   the loader as stage 11 runs it, fencing only those;
//   tma_first          the loader as first written: one thread issues every
//                      copy and works out each box's coordinates per chunk and
//                      per box, a page read and a division each time; one warp
//                      gathers a stream's last tile;
//   tma_no_math, tma_first_no_math   the two loaders alone (no math).
// Their answers are right, but for the no_math variants'.
#include "experiments/common.cuh"
#include "experiments/taken_away.cuh"
#include "hopper/tma_loader.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// The TMA loader as first written: one warp, and one thread of it issues every
// copy, working out each box's coordinates per chunk and per box.  A whole
// tile is 9 chunks of 1, 2 or 4 boxes; each chunk's full barrier expects its
// 8 KB and completes when they have landed, with no thread waiting for them.
// A stream's last tile (keys past its end must read as zeros) and a tile with
// a page outside the pool are gathered by the same warp with cp.async.
template <int kSlots>
__device__ void load_keys_tma_first(const MlaParams& p, Cursor cur, unsigned char* smem, uint64_t* full, uint64_t* empty,
                                    const KvTensor& kv) {
  const int lane = threadIdx.x % 32;
  const uint32_t ring = smem_addr(smem + kOffRing);
  const int box_keys = kv.box_keys, boxes = kKeysPerTile / box_keys;
  int seq = 0;
  auto claim_slot = [&]() {
    const int slot = seq % kSlots;
    if (seq >= kSlots) mbar_wait(&empty[slot], ((seq / kSlots) - 1) & 1);
    return slot;
  };
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    for (int tile = t0; tile < t1; ++tile) {
      const int key0 = tile * kKeysPerTile;
      // Lane i < boxes holds the page of box i.
      const int box_key = key0 + lane * box_keys;
      const int page = lane < boxes && box_key < kv_len ? table[box_key / p.page_size] : 0;
      const bool whole = key0 + kKeysPerTile <= kv_len &&
                         __all_sync(0xffffffffu, lane >= boxes || (page >= 0 && page < p.num_pages));
      if (whole) {
        for (int j = 0; j < kChunks; ++j, ++seq) {
          const int slot = claim_slot();
          if (lane == 0) {
            mbar_arrive_expect_tx(&full[slot], kChunkBytes);
#pragma unroll
            for (int i = 0; i < 4; ++i)
              if (i < boxes)  // box i's page: lane 0 holds box 0's (short of registers: the others are read again)
                tma_load_3d(ring + slot * kChunkBytes + i * box_keys * 128, &kv.map, dims_of(j) * kChunkDims,
                            (key0 + i * box_keys) % p.page_size,
                            i == 0 ? page : table[(key0 + i * box_keys) / p.page_size], &full[slot]);
          }
          __syncwarp();
        }
        continue;
      }
      // Gathered: lane l copies keys l and l + 32, all 128 bytes of each chunk.
      // (Rare, and short of registers here: each key's row is found again per chunk,
      // and its 8 copies are a loop; unrolled, ptxas spilled the share's start.)
      for (int j = 0; j < kChunks; ++j, ++seq) {
        const int slot = claim_slot();
#pragma unroll 1
        for (int k = lane; k < kKeysPerTile; k += 32) {
          const int key = key0 + k;
          const bool zero = key >= kv_len;
          const int pg = zero ? -1 : table[key / p.page_size];
          const bool poisoned = !zero && (pg < 0 || pg >= p.num_pages);
          const bf16* row = zero || poisoned ? p.kv
                                             : p.kv + (int64_t)pg * p.kv_stride_page +
                                                   (int64_t)(key % p.page_size) * p.kv_stride_slot + dims_of(j) * kChunkDims;
          const uint32_t base = ring + slot * kChunkBytes + k * 128;
#pragma unroll 1
          for (int c16 = 0; c16 < 8; ++c16) {
            const uint32_t dst = base + ((c16 ^ (k & 7)) << 4);
            if (poisoned)
              st_shared_u128(dst, kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
            else
              cp_async16(dst, zero ? (const void*)row : (const void*)(row + c16 * 8), zero ? 0 : 16);
          }
        }
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();  // the copies and stores, visible to the tensor cores
        __syncwarp();
        if (lane == 0) mbar_arrive(&full[slot]);
      }
    }
  }
}


struct TmaFirstLoader {
  static constexpr bool kTma = true;
  template <int kSlots, class Stamps>
  __device__ static void load(const MlaParams& p, const Cursor& cur, unsigned char* smem, uint64_t* full,
                              uint64_t* empty, const KvTensor& kv, bool tma, const int*) {
    if (!tma)
      load_keys<kSlots, Stamps>(p, cur, smem, full, empty);
    else if (threadIdx.x < 32)
      load_keys_tma_first<kSlots>(p, cur, smem, full, empty, kv);
  }
};

#endif  // MLA_SM90A

__global__ void __launch_bounds__(kThreads, 1) tma_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, TmaLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) tma_fewer_fences_kernel(const MlaParams p,
                                                                       const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, TmaLoader, true>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) tma_first_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, TmaFirstLoader, false>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) tma_no_math_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, TmaLoader, false, NoMathParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) tma_first_no_math_kernel(const MlaParams p,
                                                                        const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, TmaFirstLoader, false, NoMathParts>(p, kv);
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

const char* const kVariants[] = {"tma", "tma_fewer_fences", "tma_first", "tma_no_math", "tma_first_no_math"};
const MainKernel kMain[] = {tma_kernel, tma_fewer_fences_kernel, tma_first_kernel, tma_no_math_kernel,
                            tma_first_no_math_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_tile_n<NoSeesaw>(p, stream, kMain[v], kTmaSmemBytes, true,
                                 merge_as_staged<NoSeesaw>(combine_kernel, merge_by_warps_kernel));
}

}  // namespace

const Experiment& experiment() { return experiment_of(kVariants, launch_variant); }

}  // namespace mla
