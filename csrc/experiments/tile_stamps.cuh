// Clock stamps of a tile's timeline, for the experiments that time a tile
// from inside: the op's NoStamps hooks (csrc/hopper/common.cuh) given bodies.
// Only these stores are added to the kernel they stamp.
#pragma once

#include "hopper/common.cuh"

namespace mla {
namespace {


// ---- a tile's timeline: thread 0 of each compute warpgroup of block 0 writes
// the SM's clock at six points of each of its first kStampTiles tiles (or pairs
// of tiles, in the seesaw), counted from the warpgroup's start ----
constexpr int kStampTiles = 64, kStampEvents = 6;
__device__ float tile_stamps[2][kStampTiles][kStampEvents];

struct TileStamps : NoStamps {
  struct Tiles {
    long long start;
    int tile = 0;
    int group;
    __device__ explicit Tiles(int warpgroup) : group(warpgroup) { start = clock64(); }
    __device__ void at(int event) {
      if (blockIdx.x == 0 && threadIdx.x % 128 == 0 && tile < kStampTiles)
        tile_stamps[group][tile][event] = float(clock64() - start);
    }
    __device__ void next() { ++tile; }
  };
};

cudaError_t tile_stamps_read(float* host, int capacity) {
  if (capacity < int(sizeof(tile_stamps) / sizeof(float))) return cudaErrorInvalidValue;
  return cudaMemcpyFromSymbol(host, tile_stamps, sizeof(tile_stamps));
}
cudaError_t tile_stamps_clear() {
  static const float zeros[2][kStampTiles][kStampEvents] = {};
  return cudaMemcpyToSymbol(tile_stamps, zeros, sizeof(zeros));
}

}  // namespace
}  // namespace mla
