// How fast one SM can fill its shared memory with key tiles of the paged
// cache: a probe of the hardware for chapter 10, not a stage.
//
// Stage 10's loader moves key tiles (64 keys x 576 dims, 72 KB, one page of 64
// keys) into a ring of 64-dim chunks (8 KB each) that the compute warpgroups
// read.  Timed alone (chapter 10's "no math" build) it fills shared memory
// more slowly than HBM delivers, while FlashMLA, which reads the same tiles,
// goes faster.  This probe keeps only the loading: every block (one per SM,
// the stage's persistent grid) runs one loader warpgroup and two warpgroups of
// consumers that wait for each tile and hand it straight back, as the "no
// math" build's do.  What changes is how the loader asks for the bytes:
//
//   kCpAsync    the stage's loader: two threads per key, 16-byte cp.async
//               copies, each thread arriving on a chunk's barrier when its own
//               copies have landed (a ring of any number of chunks);
//   kTmaChunk   the tensor copy (TMA), one box of 64 keys x 64 dims per chunk,
//               each asked for by one thread once the chunk's slot is free;
//   kTmaTile    the tensor copy of a whole tile in one instruction: a
//               4-d view of the cache (dims of a chunk, key, chunk, page) whose
//               box is the page, landing in the ring as 9 chunks at once; the
//               ring is then counted in whole tiles.
//
// The blocks are cut as the stage cuts them: `groups` blocks read each tile at
// about the same time (stage 10 at 64 heads has 8 pair groups per stream, so
// L2 serves all but the first read), and each group's blocks share its tiles
// in equal runs.  run() below checks its arguments, builds the tensor maps and
// launches; load_rate_binding.cpp checks the tensors, and the book's load-rate probe
// times the kernel and turns the time into bytes per second.
#include <cstdint>

#include "sm90_ptx.cuh"  // the stage's own wrappers: mbarriers, cp.async, the 3-d tensor copy, the map encoder

#define LOAD_RATE_SM90A MLA_SM90A

namespace load_rate {

using namespace mla::sm90;

constexpr int kKeys = 64, kDims = 576, kChunks = 9, kChunkBytes = kKeys * 128, kTileBytes = kChunks * kChunkBytes;
constexpr int kThreads = 384;  // a loader warpgroup and two of consumers, as in stage 10
constexpr int kMaxRing = 27;   // three tiles: 216 KB
enum Mode { kCpAsync = 0, kTmaChunk = 1, kTmaTile = 2 };

struct Maps {  // aligned as CUtensorMap is
  CUtensorMap chunk;  // (64 dims, 64 keys, page): one chunk's box
  CUtensorMap tile;   // (64 dims, 64 keys, 9 chunks, page): a whole page's box
};

struct Args {
  const uint16_t* kv;  // [pages][64 keys][576] bf16 bits
  int64_t page_stride;  // elements
  const int* pages;     // the page of each unique tile
  int tiles;            // unique tiles (each group reads all of them)
  int groups;           // blocks that read each tile
  int mode, ring;       // ring: chunk slots (a multiple of 9 for kTmaTile)
  uint16_t* first_tile; // if not null: block 0 writes its first tile here as it landed, unswizzled [9][64][64]
};

#if LOAD_RATE_SM90A
__device__ __forceinline__ void tma_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// The loader, one chunk slot at a time (kCpAsync, kTmaChunk), or one tile of
// 9 slots at a time (kTmaTile, whose barriers are one pair per tile).
__device__ void load(const Args& a, const Maps& maps, int t0, int t1, unsigned char* ring, uint64_t* full,
                     uint64_t* empty) {
  const int tid = threadIdx.x;  // 0..127
  const uint32_t base = smem_addr(ring);
  if (a.mode == kTmaTile) {
    if (tid != 0) return;
    const int slots = a.ring / kChunks;
    for (int t = t0, seq = 0; t < t1; ++t, ++seq) {
      const int s = seq % slots;
      if (seq >= slots) mbar_wait(&empty[s], ((seq / slots) - 1) & 1);
      mbar_arrive_expect_tx(&full[s], kTileBytes);
      tma_4d(base + s * kTileBytes, &maps.tile, 0, 0, 0, a.pages[t], &full[s]);
    }
    return;
  }
  if (a.mode == kTmaChunk) {
    if (tid != 0) return;
    int seq = 0;
    for (int t = t0; t < t1; ++t) {
      const int page = a.pages[t];
      for (int j = 0; j < kChunks; ++j, ++seq) {
        const int s = seq % a.ring;
        if (seq >= a.ring) mbar_wait(&empty[s], ((seq / a.ring) - 1) & 1);
        mbar_arrive_expect_tx(&full[s], kChunkBytes);
        tma_load_3d(base + s * kChunkBytes, &maps.chunk, 64 * j, 0, page, &full[s]);
      }
    }
    return;
  }
  // kCpAsync: the stage's own gather (csrc/hopper/tile_n.cuh, load_keys), all keys valid.
  const int my_key = tid / 2, half = tid & 1;
  int seq = 0;
  for (int t = t0; t < t1; ++t) {
    const uint16_t* row = a.kv + (int64_t)a.pages[t] * a.page_stride + (int64_t)my_key * kDims;
    for (int j = 0; j < kChunks; ++j, ++seq) {
      const int s = seq % a.ring;
      if (seq >= a.ring) mbar_wait(&empty[s], ((seq / a.ring) - 1) & 1);
      const uint32_t dst0 = base + s * kChunkBytes + my_key * 128;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c16 = 2 * (i ^ (my_key & 3)) + half;
        cp_async16_l2_256(dst0 + ((c16 ^ (my_key & 7)) << 4), row + 64 * j + 8 * c16, 16);
      }
      cp_async_arrive(&full[s]);
    }
  }
  cp_async_wait<0>();  // leave no copy in flight behind an exiting thread
}

// Block 0's first tile as it landed, unswizzled, by one warp (the check that
// every loader puts the right bytes in the right place).
__device__ void dump_first_tile(const Args& a, const unsigned char* ring) {
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < kChunks * kKeys * 8; i += 32) {  // 16-byte pieces: chunk, key, column
    const int j = i / (kKeys * 8), k = i / 8 % kKeys, c16 = i % 8;
    const uint4 v = *reinterpret_cast<const uint4*>(ring + j * kChunkBytes + k * 128 + ((c16 ^ (k & 7)) << 4));
    *reinterpret_cast<uint4*>(a.first_tile + (j * kKeys + k) * 64 + 8 * c16) = v;
  }
}

// A consumer warp: wait for a whole tile, then hand its slots back (one lane per warp).
__device__ void consume(const Args& a, int t0, int t1, const unsigned char* ring, uint64_t* full, uint64_t* empty) {
  const int lane = threadIdx.x % 32;
  const bool dump = a.first_tile != nullptr && blockIdx.x == 0 && threadIdx.x / 32 == 4;
  if (a.mode == kTmaTile) {
    const int slots = a.ring / kChunks;
    for (int t = t0, seq = 0; t < t1; ++t, ++seq) {
      mbar_wait(&full[seq % slots], (seq / slots) & 1);
      if (dump && t == t0) dump_first_tile(a, ring);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[seq % slots]);
    }
    return;
  }
  for (int t = t0, seq = 0; t < t1; ++t, seq += kChunks) {
    for (int j = 0; j < kChunks; ++j) mbar_wait(&full[(seq + j) % a.ring], ((seq + j) / a.ring) & 1);
    if (dump && t == t0) dump_first_tile(a, ring);
    __syncwarp();
    if (lane == 0)
      for (int j = 0; j < kChunks; ++j) mbar_arrive(&empty[(seq + j) % a.ring]);
  }
}
#endif

__global__ void __launch_bounds__(kThreads, 1) load_rate_kernel(const Args a, const __grid_constant__ Maps maps) {
#if LOAD_RATE_SM90A
  extern __shared__ unsigned char smem_raw[];
  unsigned char* ring = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);  // the swizzle wants 1024-aligned rows
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + a.ring * kChunkBytes);
  uint64_t* empty = full + kMaxRing;
  const int slots = a.mode == kTmaTile ? a.ring / kChunks : a.ring;
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      mbar_init(&full[s], a.mode == kCpAsync ? 128 : 1);
      mbar_init(&empty[s], 8);
    }
    fence_proxy_async();  // the barriers, visible to the bulk copies
  }
  __syncthreads();
  // This block's run of tiles: the group's blocks cut its tiles into equal runs.
  const int per_group = gridDim.x / a.groups, in_group = blockIdx.x % per_group;
  const int t0 = (int)((int64_t)in_group * a.tiles / per_group), t1 = (int)((int64_t)(in_group + 1) * a.tiles / per_group);
  if (threadIdx.x < 128)
    load(a, maps, t0, t1, ring, full, empty);
  else
    consume(a, t0, t1, ring, full, empty);
#else
  __trap();
#endif
}

cudaError_t fail(const char** why, const char* what, cudaError_t err) {
  *why = what;
  return err;
}

int shared_bytes(int ring) { return ring * kChunkBytes + 2 * kMaxRing * 8 + 1024; }

// Checks the arguments, encodes the maps and launches on `stream`.
cudaError_t run(const uint16_t* kv, int64_t num_pages, int64_t page_stride, const int* pages, int tiles, int groups,
                int blocks, int mode, int ring, uint16_t* first_tile, cudaStream_t stream, const char** why) {
  *why = nullptr;
  if (mode < kCpAsync || mode > kTmaTile) return fail(why, "mode must be 0 (cp.async), 1 (TMA per chunk) or 2 (TMA per tile)", cudaErrorInvalidValue);
  if (ring < kChunks || ring > kMaxRing || (mode == kTmaTile && ring % kChunks != 0))
    return fail(why, "ring must hold 9 to 27 chunks (a multiple of 9 for whole-tile copies)", cudaErrorInvalidValue);
  if (groups < 1 || blocks < groups || blocks % groups != 0) return fail(why, "blocks must be a positive multiple of groups", cudaErrorInvalidValue);
  if (tiles < 1) return fail(why, "no tiles", cudaErrorInvalidValue);
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return fail(why, "the driver has no cuTensorMapEncodeTiled", cudaErrorNotSupported);
  Maps maps = {};
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  {
    const cuuint64_t dims[3] = {(cuuint64_t)kDims, (cuuint64_t)kKeys, (cuuint64_t)num_pages};
    const cuuint64_t strides[2] = {(cuuint64_t)kDims * 2, (cuuint64_t)page_stride * 2};
    const cuuint32_t box[3] = {64, (cuuint32_t)kKeys, 1};
    if (encode(&maps.chunk, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(kv), dims, strides, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return fail(why, "cuTensorMapEncodeTiled refused the per-chunk map", cudaErrorInvalidValue);
  }
  {
    // (dims of a chunk, key, chunk, page): the box's chunks land one after another, 8 KB apart,
    // as the ring's slots are laid out; the key stride (1152 bytes) is larger than the chunk's (128).
    const cuuint64_t dims[4] = {64, (cuuint64_t)kKeys, (cuuint64_t)kChunks, (cuuint64_t)num_pages};
    const cuuint64_t strides[3] = {(cuuint64_t)kDims * 2, 128, (cuuint64_t)page_stride * 2};
    const cuuint32_t box[4] = {64, (cuuint32_t)kKeys, (cuuint32_t)kChunks, 1};
    if (encode(&maps.tile, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t*>(kv), dims, strides, box, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      if (mode == kTmaTile) return fail(why, "cuTensorMapEncodeTiled refused the whole-tile map", cudaErrorInvalidValue);
    }
  }
  const int smem = shared_bytes(ring);
  cudaError_t err = cudaFuncSetAttribute(load_rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const Args a = {kv, page_stride, pages, tiles, groups, mode, ring, first_tile};
  load_rate_kernel<<<blocks, kThreads, smem, stream>>>(a, maps);
  return cudaGetLastError();
}

}  // namespace load_rate
