// The seesaw's pieces (stage 12 onwards): the softmax of a tile with the pairs
// on M, and how a tile's chunks are found in the paged cache and copied.
//
// With the pairs on M a thread of a warpgroup holds two rows of a 64 x 64
// fragment of scores (or of P): row0 = 16 warp + g and row0 + 8, s[4i + e] at
// column 8i + c + e of row0 and s[4i + 2 + e] of row0 + 8 (c = 2 (lane % 4),
// e = 0, 1).
#pragma once

#include "hopper/scheduler.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// ---- the softmax of a tile, a row per pair ----

// The keys a row may not see hidden in sc (only in a stream's last tiles: the
// causal draft and its end), and each row's maximum over the quad that holds
// it, scaled to base 2.  The scores stay as the products left them: the scale
// is positive, so the largest scaled score is the largest score scaled, and
// rows_exponentiate folds the scale into one fused multiply-add a score.  (A
// test of every score against its row's end in every tile becomes a select,
// not a branch, and a tile in the middle of a stream pays for it too.)
struct SoftmaxFfma {
__device__ static __forceinline__ void hide_and_max(const float (&acc)[32], float (&sc)[32], int tile, int first_hidden,
                                                   int vis0, int vis1, int c, float scale_log2, float& mx0, float& mx1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) sc[i] = acc[i];
  if ((tile + 1) * kKeysPerTile > first_hidden) {  // an edge tile: some row may not see some of its keys
    const int key0 = tile * kKeysPerTile + c;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * i + e;
        sc[4 * i + e] = key < vis0 ? sc[4 * i + e] : -CUDART_INF_F;
        sc[4 * i + 2 + e] = key < vis1 ? sc[4 * i + 2 + e] : -CUDART_INF_F;
      }
  }
  // A tree, four levels deep where a chain would be sixteen (fmaxf is exact: any order gives the same).
  float t0[8], t1[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    t0[i] = fmaxf(sc[4 * i], sc[4 * i + 1]);
    t1[i] = fmaxf(sc[4 * i + 2], sc[4 * i + 3]);
  }
#pragma unroll
  for (int w = 4; w >= 1; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) {
      t0[i] = fmaxf(t0[i], t0[i + w]);
      t1[i] = fmaxf(t1[i], t1[i + w]);
    }
  mx0 = fmaxf(t0[0], __shfl_xor_sync(0xffffffffu, t0[0], 1));
  mx1 = fmaxf(t1[0], __shfl_xor_sync(0xffffffffu, t1[0], 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2)) * scale_log2;
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2)) * scale_log2;
}

// A score's exponent, base 2, against its row's reference u: one FFMA.
__device__ static __forceinline__ float exponent(float s, float scale_log2, float u) { return fmaf(s, scale_log2, -u); }
};

// P = 2^(each score's exponent) as bf16 pairs (a register A operand of
// P V), and this thread's part of its rows' sums (s0, s1).  A reference of
// -inf (no key seen yet) subtracts nothing: those scores are -inf too, and P is 0.
template <class Softmax>
__device__ __forceinline__ void rows_exponentiate(const float (&sc)[32], float scale_log2, float n0, float n1,
                                                  uint32_t (&pk)[16], float& s0, float& s1) {
  const float u0 = n0 == -CUDART_INF_F ? 0.f : n0, u1 = n1 == -CUDART_INF_F ? 0.f : n1;
  s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float p0 = exp2f(Softmax::exponent(sc[4 * i], scale_log2, u0));
    const float p1 = exp2f(Softmax::exponent(sc[4 * i + 1], scale_log2, u0));
    const float p2 = exp2f(Softmax::exponent(sc[4 * i + 2], scale_log2, u1));
    const float p3 = exp2f(Softmax::exponent(sc[4 * i + 3], scale_log2, u1));
    pk[2 * i] = pack_bf16x2(p0, p1);
    pk[2 * i + 1] = pack_bf16x2(p2, p3);
    s0 += p0 + p1;
    s1 += p2 + p3;
  }
}

// O (a warpgroup's 256 dims of its 64 rows) times f0 on row0, f1 on row0 + 8:
// only where no product of the warpgroup is in flight, and fenced, so that no
// later product reads O before the multiplies.
__device__ __forceinline__ void rows_rescale(float (&o)[4][32], float f0, float f1) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      o[j][4 * i] *= f0;
      o[j][4 * i + 1] *= f0;
      o[j][4 * i + 2] *= f1;
      o[j][4 * i + 3] *= f1;
    }
#pragma unroll
  for (int j = 0; j < 4; ++j) fence_accumulators(o[j]);
}

// P (row n = pair, its 64 keys in one swizzled 128-byte row) into the chunk at p_s.
__device__ __forceinline__ void rows_store_p(const uint32_t (&pk)[16], uint32_t p_s, int row0, int g, int lane) {
  const int mat = lane / 8, n = row0 - g + 8 * (mat % 2) + lane % 8;
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const int col = i + mat / 2;  // the 16-byte column of keys 8 col .. 8 col + 7
    stmatrix_x4(p_s + n * 128 + ((col ^ (n & 7)) << 4), pk[2 * i], pk[2 * i + 1], pk[2 * i + 2], pk[2 * i + 3]);
  }
}

// ---- where a tile's chunks are, and their copies ----

// The pages of one key tile's boxes (64, 32 or 16 keys each, as the tensor map
// reads the cache), looked up once per tile by the thread that copies it.
struct TilePages {
  int page[4];  // the page of each box (page 0 stands in for one outside the pool)
  int boxes;    // boxes that hold keys of the stream (the others are not copied)
  int in_page;  // the tile's first key within its page (pages of more than 64 keys)
  int bad;      // a box's page lies outside the pool
};

// Where a tile's boxes sit in its stream's block table.  Pages of 16 or 32
// keys: a tile's `boxes` boxes are consecutive entries.  Pages of 64 keys or
// more: a page holds `tiles` whole tiles.  Set once per kernel, so that a tile
// finds its first entry by steps (a shift where a page holds a power of two of
// tiles), not by dividing its first key by the page size: a 32-bit division by
// a value known only at run time is some 25 dependent instructions, in the one
// lane that asks for the copies, while its warp holds its warpgroup's barriers.
struct PageSteps {
  int boxes;  // boxes of a tile: 1, 2 or 4
  int tiles;  // tiles of a page (1 where a page holds fewer keys than a tile)
  int shift;  // log2(tiles), or -1 where tiles is not a power of two
};
__device__ __forceinline__ PageSteps page_steps(const MlaParams& p, int box_keys) {
  PageSteps s;
  s.boxes = kKeysPerTile / box_keys;
  s.tiles = box_keys == kKeysPerTile ? p.page_size / kKeysPerTile : 1;
  s.shift = (s.tiles & (s.tiles - 1)) == 0 ? __ffs(s.tiles) - 1 : -1;
  return s;
}

// A tile's pages from the block-table entries of its first `boxes` boxes
// (`entries`: the table's, or the copies of them in the ring): a box holds
// keys of the stream or is not copied, and a page outside the pool stands as 0.
__device__ __forceinline__ void read_boxes(const MlaParams& p, int boxes, int key0, int kv_len, int box_keys,
                                           const int* entries, TilePages& t) {
  t.boxes = 0;
  t.bad = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool used = i < boxes && key0 + i * box_keys < kv_len;
    const int pg = used ? entries[i] : 0;
    const bool outside = used && (pg < 0 || pg >= p.num_pages);
    t.bad |= outside;
    t.page[i] = outside ? 0 : pg;
    t.boxes += used;
  }
}

// The block-table entry of a tile's first box, and the tile's first key within its page.
__device__ __forceinline__ int tile_entry(const PageSteps& s, int tile, int& in_page) {
  const int page = s.shift >= 0 ? tile >> s.shift : tile / s.tiles;  // its page's place in the stream
  in_page = (tile - page * s.tiles) * kKeysPerTile;
  return page * s.boxes;
}

// tile_pages: the pages of a tile's boxes, from the block table (a unit's
// first two tiles).  fetch_pages: the block table's entries of a tile's boxes,
// copied by cp.async into `ring` (a slot of 4 ints per tile, 4 tiles) a pair of
// tiles before the copies need them: a load used when the copies are issued
// stalls the copier's warp, and with it its warpgroup's products and barriers,
// for a trip to L2.  ring_pages: the pages of a tile whose entries fetch_pages
// copied (after the copier's cp.async wait).
struct PagesBySteps {
__device__ static __forceinline__ TilePages tile_pages(const MlaParams& p, const PageSteps& s, const int* table,
                                                       int kv_len, int tile, int box_keys) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  const int entry = tile_entry(s, tile, t.in_page);
  read_boxes(p, s.boxes, key0, kv_len, box_keys, table + entry, t);
  return t;
}
__device__ static __forceinline__ void fetch_pages(const MlaParams&, const PageSteps& s, const int* table, int kv_len,
                                                   int tile, int box_keys, int* ring) {
  const int key0 = tile * kKeysPerTile;
  int in_page;
  const int entry = tile_entry(s, tile, in_page);
  int* slot = ring + 4 * (tile & 3);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i < s.boxes && key0 + i * box_keys < kv_len) cp_async4(smem_addr(slot + i), table + entry + i);
}
__device__ static __forceinline__ TilePages ring_pages(const MlaParams& p, const PageSteps& s, int kv_len, int tile,
                                                       int box_keys, const int* ring) {
  TilePages t;
  const int key0 = tile * kKeysPerTile;
  tile_entry(s, tile, t.in_page);
  read_boxes(p, s.boxes, key0, kv_len, box_keys, ring + 4 * (tile & 3), t);
  return t;
}
};

// How a tile's boxes lie in the tensor map: known when the kernel is compiled
// (kWholeTiles: tiles of one box of 64 keys whose chunks come four to a copy),
// or read from the KvTensor at each use, as a kernel parameter (held in a
// register instead, the kernel that asks spilled).  kFourChunks: whether a
// tile's chunks may come four to a copy at all.
template <bool kWholeTiles, bool kFourChunks = true>
struct SeeBoxes {
  const KvTensor& kv;
  __device__ __forceinline__ int keys() const { return kWholeTiles ? kKeysPerTile : kv.box_keys; }  // 64, 32 or 16
  // Whether a tile's chunks 0..3 and 4..7 are one copy each (KvTensor::chunk_boxes).
  __device__ __forceinline__ bool four_at_once() const { return kFourChunks && (kWholeTiles || kv.chunk_boxes != 0); }
};

template <class Parts>
__device__ void seesaw(const MlaParams& p, const Shape& sh, Cursor cur, unsigned char* smem, const KvTensor& kv);

// The seesaw's pieces that an experiment may swap (csrc/experiments/): the op's.
// run: the two warpgroups' loop (hopper/seesaw.cuh's).
template <bool kWholeTiles>
struct SeesawParts {
  using Boxes = SeeBoxes<kWholeTiles>;
  using Pages = PagesBySteps;
  using Softmax = SoftmaxFfma;
  using Stamps = NoStamps;
  template <class Self>
  __device__ static __forceinline__ void run(const MlaParams& p, const Shape& sh, const Cursor& cur,
                                             unsigned char* smem, const KvTensor& kv) {
    seesaw<Self>(p, sh, cur, smem, kv);
  }
};

// Chunk j of a tile (dims 64j .. 64j + 63 of its keys) into `tile_s`, counted on bar.
template <class Boxes>
__device__ __forceinline__ void copy_chunk(const KvTensor& kv, const Boxes& bx, uint32_t tile_s, uint64_t* bar,
                                           const TilePages& t, int j) {
  const int box_keys = bx.keys();
  mbar_arrive_expect_tx(bar, t.boxes * box_keys * 128);
  const uint32_t dst = tile_s + j * kChunkBytes;
  tma_load_3d(dst, &kv.map, j * kChunkDims, t.in_page, t.page[0], bar);
  if (t.boxes > 1) tma_load_3d(dst + box_keys * 128, &kv.map, j * kChunkDims, 0, t.page[1], bar);
  if (t.boxes > 2) tma_load_3d(dst + 2 * box_keys * 128, &kv.map, j * kChunkDims, 0, t.page[2], bar);
  if (t.boxes > 3) tma_load_3d(dst + 3 * box_keys * 128, &kv.map, j * kChunkDims, 0, t.page[3], bar);
}

// The barrier that counts chunk j of a tile: its group's first where one copy
// brings the group (KvTensor::chunk_boxes), else its own, so that where a group
// comes box by box (pages of 16 or 32 keys) the scores of its first chunk wait
// for that chunk's copies only.
template <class Boxes>
__device__ __forceinline__ int chunk_bar(const Boxes& bx, int j) {
  if (bx.four_at_once()) return j < 4 ? 0 : j < 8 ? 4 : 8;
  return j;
}
// Chunks j0 .. j0 + n - 1 of a tile into `tile_s`, counted on tile_bars as
// chunk_bar says (n = 4 from chunk 0 or 4, or 1: chunk 8).  Four chunks of a
// tile of one page are one copy of a four-dimensional box (map4), so that the
// copier's lane, which its warpgroup's other warps wait for at the next
// product, arms a barrier and issues a copy six times a pair of tiles, not 18.
template <class Boxes>
__device__ __forceinline__ void copy_chunks(const KvTensor& kv, const Boxes& bx, uint32_t tile_s,
                                            uint64_t* tile_bars, const TilePages& t, int j0, int n) {
  if (n == 4 && bx.four_at_once()) {
    mbar_arrive_expect_tx(&tile_bars[j0], 4 * kChunkBytes);
    tma_load_4d(tile_s + j0 * kChunkBytes, &kv.map4, 0, t.in_page, j0, t.page[0], &tile_bars[j0]);
    return;
  }
  for (int j = j0; j < j0 + n; ++j) copy_chunk(kv, bx, tile_s, &tile_bars[j], t, j);
}
#endif  // MLA_SM90A

}  // namespace
}  // namespace mla
