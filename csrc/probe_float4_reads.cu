// A probe, not a stage: the reads of stage 6 and nothing else.
//
// Same grid as float4_kernel (a block per head, query row and split; 256
// threads, 8 blocks per SM), same block-table lookups, same 16-byte loads of
// every cached token the block's row sees, and no arithmetic but an XOR to
// keep the loads alive.  Its time is a floor for any kernel that gives each
// (row, head) a block of its own: chapter 6 sets float4's time beside it.
#include "mla_device.cuh"

namespace mla {
namespace {

constexpr int kThreads = 256;
constexpr int kKeysPerTile = 8;
constexpr int kChunks = kDimQK / 8;

__global__ void __launch_bounds__(kThreads, 8) float4_reads_kernel(const MlaParams p, unsigned* sink) {
  const int t = blockIdx.y, tid = threadIdx.x;
  const int b = blockIdx.z / p.num_splits, split = blockIdx.z % p.num_splits;
  const int kv_len = p.kv_lens[b];
  if (!stream_ok(p, kv_len)) return;
  const int n_keys = kv_len - p.q_len + t + 1;
  const int per_split = ((kv_len + p.num_splits - 1) / p.num_splits + kKeysPerTile - 1)
                        / kKeysPerTile * kKeysPerTile;
  const int key_begin = split * per_split, key_end = min(n_keys, key_begin + per_split);
  unsigned x = 0;
  for (int i = tid; i < (key_end - key_begin) * kChunks; i += kThreads) {
    const bf16* row = kv_row(p, b, key_begin + i / kChunks);
    if (row) {
      const uint4 v = reinterpret_cast<const uint4*>(row)[i % kChunks];
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  x ^= __shfl_xor_sync(0xffffffffu, x, 16);
  if (tid == 0) sink[(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x] = x;
}

}  // namespace

// Launch on `stream`; p needs the shape, the cache, the block table, kv_lens and num_splits.
// sink holds one word per block: grid.x * grid.y * grid.z of them.
cudaError_t float4_reads_launch(const MlaParams& p, unsigned* sink, cudaStream_t stream) {
  const dim3 grid(p.num_heads, p.q_len, p.batch * p.num_splits);
  float4_reads_kernel<<<grid, kThreads, 0, stream>>>(p, sink);
  return cudaGetLastError();
}

}  // namespace mla
