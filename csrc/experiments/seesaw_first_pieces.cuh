// The seesaw's pieces as first written, for the experiments that time what
// each change to them was worth.
#pragma once

#include "hopper/seesaw_pieces.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// The softmax as first written: every score multiplied by the scale and tested
// against its row's end in every tile (ptxas makes that test a select), where
// stage 12 tests only a stream's edge tiles, behind a branch, and folds the
// scale into the exponent's one fused multiply-add.  Not the stages' bits.
struct SoftmaxFmul {
__device__ static __forceinline__ void hide_and_max(const float (&acc)[32], float (&sc)[32], int tile, int first_hidden,
                                                   int vis0, int vis1, int c, float scale_log2, float& mx0,
                                                   float& mx1) {
  const bool edge = (tile + 1) * kKeysPerTile > first_hidden;
  const int key0 = tile * kKeysPerTile + c;
  mx0 = -CUDART_INF_F, mx1 = -CUDART_INF_F;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float lo = acc[4 * i + e] * scale_log2, hi = acc[4 * i + 2 + e] * scale_log2;
      if (edge) {
        const int key = key0 + 8 * i + e;
        lo = key < vis0 ? lo : -CUDART_INF_F;
        hi = key < vis1 ? hi : -CUDART_INF_F;
      }
      sc[4 * i + e] = lo;
      sc[4 * i + 2 + e] = hi;
      mx0 = fmaxf(mx0, lo);
      mx1 = fmaxf(mx1, hi);
    }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// A score's exponent against its row's reference u: the score was scaled already, in hide_and_max.
__device__ static __forceinline__ float exponent(float s, float /* scale: applied */, float u) { return s - u; }
};

// A tile's pages as first written: each box of a tile that holds keys divides
// its first key by the page size, and the tile's first key within its page
// takes one more division, where stage 12 steps.
struct PagesByDivision {
__device__ static __forceinline__ TilePages tile_pages(const MlaParams& p, const PageSteps&, const int* table, int kv_len,
                                                int tile, int box_keys) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  t.in_page = box_keys == kKeysPerTile ? key0 % p.page_size : 0;
  t.boxes = 0;
  t.bad = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = key0 + i * box_keys;
    const bool used = i * box_keys < kKeysPerTile && key < kv_len;
    const int pg = used ? table[key / p.page_size] : 0;
    const bool outside = used && (pg < 0 || pg >= p.num_pages);
    t.bad |= outside;
    t.page[i] = outside ? 0 : pg;
    t.boxes += used;
  }
  return t;
}

__device__ static __forceinline__ void fetch_pages(const MlaParams& p, const PageSteps&, const int* table, int kv_len,
                                            int tile, int box_keys, int* ring) {
  const int key0 = tile * kKeysPerTile;
  int* slot = ring + 4 * (tile & 3);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i * box_keys < kKeysPerTile && key0 + i * box_keys < kv_len)
      cp_async4(smem_addr(slot + i), table + (key0 + i * box_keys) / p.page_size);
}
__device__ static __forceinline__ TilePages ring_pages(const MlaParams& p, const PageSteps& s, int kv_len, int tile,
                                                int box_keys, const int* ring) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  t.in_page = box_keys == kKeysPerTile ? key0 % p.page_size : 0;
  read_boxes(p, s.boxes, key0, kv_len, box_keys, ring + 4 * (tile & 3), t);  // s.boxes: 64 / box_keys
  return t;
}

};
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
