// The tensor-copy loader (stage 11 onwards): whole key tiles copied by TMA,
// the bulk tensor copy, one instruction per 8 KB chunk (or per page within
// one), where gathering them took 4608 16-byte cp.async a tile, each an
// instruction with its own address.
//
// Lane 0 of warp 0 asks for every whole tile: 9 chunks of 1, 2 or 4 boxes,
// each chunk's full barrier expecting its 8 KB and completing when they have
// landed, with no thread waiting for them.  A stream's last tile (keys past its
// end must read as zeros) and a tile with a page outside the pool are gathered
// with cp.async by warps 1 and 2, a thread per key; warp 3 has no work.  Both
// walk the same tiles.  The issuing thread works out a tile's box coordinates
// once and then only issues: worked out per chunk and per box (a page read and
// a division each time), the copies were issued at about half the rate.
#pragma once

#include "hopper/tile_n.cuh"

namespace mla {
namespace {

#if MLA_SM90A
template <int kSlots>
__device__ void load_keys_tma(const MlaParams& p, Cursor cur, unsigned char* smem, uint64_t* full, uint64_t* empty,
                              const KvTensor& kv, const int* progress) {
  const int tid = threadIdx.x, lane = tid % 32, key_in_tile = tid - 32;  // key_in_tile: a gatherer's key
  const bool issuer = tid < 32;
  const uint32_t ring = smem_addr(smem + kOffRing);
  // Tiles of the share the issuing warp has passed, and tiles the gatherers have claimed (zero at the start).
  const uint32_t issued = smem_addr(progress), gathered = issued + 4;
  const int box_keys = kv.box_keys, boxes = kKeysPerTile / box_keys;
  int seq = 0;  // the tile's first chunk, in the order of all chunks of the share
  int u, t0, t1;
  while (cur.next(p, u, t0, t1)) {
    const int b = u % p.batch;
    const int kv_len = p.kv_lens[b];
    const int* table = p.block_table + (int64_t)b * p.bt_stride_b;
    for (int tile = t0; tile < t1; ++tile, seq += kChunks) {
      const int key0 = tile * kKeysPerTile;
      const int k = seq / kChunks;  // the tile's place in the share
      if (issuer) {
        // Lane i < boxes holds the page of box i; lane 0 gets all of them (a box past 1 only with pages < 64 keys).
        const int box_key = key0 + lane * box_keys;
        const int page = lane < boxes && box_key < kv_len ? table[box_key / p.page_size] : -1;
        const bool whole = key0 + kKeysPerTile <= kv_len &&
                           __all_sync(0xffffffffu, lane >= boxes || (page >= 0 && page < p.num_pages));
        const int page1 = __shfl_sync(0xffffffffu, page, 1), page2 = __shfl_sync(0xffffffffu, page, 2),
                  page3 = __shfl_sync(0xffffffffu, page, 3);
        if (!whole && lane == 0) wait_until_at_least(gathered, k + 1);  // the gatherers fill it (see below)
        if (whole && lane == 0) {
          const int in_page = key0 % p.page_size;  // 0 where a page holds fewer keys than a tile
          for (int j = 0; j < kChunks; ++j) {
            const int slot = (seq + j) % kSlots;
            if (seq + j >= kSlots) mbar_wait(&empty[slot], (((seq + j) / kSlots) - 1) & 1);
            mbar_arrive_expect_tx(&full[slot], kChunkBytes);
            const uint32_t dst = ring + slot * kChunkBytes;
            const int dim0 = dims_of(j) * kChunkDims;
            tma_load_3d(dst, &kv.map, dim0, in_page, page, &full[slot]);
            if (boxes > 1) tma_load_3d(dst + box_keys * 128, &kv.map, dim0, 0, page1, &full[slot]);
            if (boxes > 2) {
              tma_load_3d(dst + 2 * box_keys * 128, &kv.map, dim0, 0, page2, &full[slot]);
              tma_load_3d(dst + 3 * box_keys * 128, &kv.map, dim0, 0, page3, &full[slot]);
            }
          }
        }
        if (lane == 0) st_release_shared(issued, k + 1);
        __syncwarp();
        continue;
      }
      // A gatherer: its key's page, and whether any key of the tile is outside the pool.
      const int key = key0 + key_in_tile;
      const int pg = key < kv_len ? table[key / p.page_size] : -1;
      const bool poisoned = key < kv_len && (pg < 0 || pg >= p.num_pages);
      const bool bad_tile = named_barrier_or(kBarGather, 64, poisoned);
      if (key0 + kKeysPerTile <= kv_len && !bad_tile) continue;  // warp 0 asks for this one
      // Each kind of loader warp skips the tiles the other fills, and a parity wait
      // on a slot's empty barrier is right only within one phase of the barrier:
      // two phases behind it passes at once (a slot in use overwritten), two ahead
      // it waits for a phase that may never come (a hang).  So neither kind runs
      // past a tile the other fills until the other has claimed that tile's slots:
      // the gatherers wait here until warp 0 has passed every tile before this one,
      // and warp 0 waits at this tile until the gatherers have claimed it.  Every
      // slot wait below is then within one phase (models.tma_gather_schedule).
      if (key_in_tile == 0) wait_until_at_least(issued, k);
      named_barrier(kBarGather, 64);  // the other 63 wait here
      const bf16* row = pg < 0 || poisoned ? p.kv
                                           : p.kv + (int64_t)pg * p.kv_stride_page + (int64_t)(key % p.page_size) * p.kv_stride_slot;
      // Every chunk's copies first (the ring holds a whole tile and more: no slot
      // waits on an arrival below), then the gatherers wait for their own copies,
      // fence them for wgmma, and one thread arrives on the 9 barriers.  A
      // gatherer does not leave its copies to the barrier (an arrival that counts
      // only once they land): compute-sanitizer's synccheck reports that form as
      // a missing wait.  It costs one wait per stream's last tile.  (Loops kept
      // rolled: unrolled, they spill the loader's 40 registers.)
#pragma unroll 1
      for (int j = 0; j < kChunks; ++j) {
        const int slot = (seq + j) % kSlots;
        if (seq + j >= kSlots) mbar_wait(&empty[slot], (((seq + j) / kSlots) - 1) & 1);
        const uint32_t base = ring + slot * kChunkBytes + key_in_tile * 128;
#pragma unroll 1
        for (int c16 = 0; c16 < 8; ++c16) {
          const uint32_t dst = base + ((c16 ^ (key_in_tile & 7)) << 4);
          if (poisoned)
            st_shared_u128(dst, kNanPairBits, kNanPairBits, kNanPairBits, kNanPairBits);
          else  // a key past the stream reads as zeros (a 0-byte copy fills the 16)
            cp_async16(dst, pg < 0 ? (const void*)row : (const void*)(row + dims_of(j) * kChunkDims + c16 * 8), pg < 0 ? 0 : 16);
        }
      }
      named_barrier(kBarGather, 64);
      // After all 64 passed their slot waits, warp 0 may go on (not after the
      // copies have landed: it would wait for them with nothing in flight).
      if (key_in_tile == 0) st_release_shared(gathered, k + 1);
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async();  // the copies and stores, visible to the tensor cores' reads
      named_barrier(kBarGather, 64);  // all 64 keys written before the arrivals
      if (key_in_tile == 0)
#pragma unroll 1
        for (int j = 0; j < kChunks; ++j) mbar_arrive(&full[(seq + j) % kSlots]);
    }
  }
}


// The loader of the tensor-copy kernel: it copies by TMA where the cache has a
// tensor map, and gathers as CpAsyncLoader does where it has none.
struct TmaLoader {
  static constexpr bool kTma = true;
  template <int kSlots, class Stamps>
  __device__ static void load(const MlaParams& p, const Cursor& cur, unsigned char* smem, uint64_t* full,
                              uint64_t* empty, const KvTensor& kv, bool tma, const int* progress) {
    if (!tma)
      load_keys<kSlots, Stamps>(p, cur, smem, full, empty);
    else if (threadIdx.x < 96)  // warp 0 issues, warps 1 and 2 gather
      load_keys_tma<kSlots>(p, cur, smem, full, empty, kv, progress);
  }
};
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
