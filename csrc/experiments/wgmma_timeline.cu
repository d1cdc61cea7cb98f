// A tile's timeline in stage 10, and the turns that FlashAttention-3 takes at
// the tensor cores.
//
//   timeline            stage 10 with clock stamps: thread 0 of each compute
//                       warpgroup of block 0 stamps six points of each of its
//                       first 64 tiles (tile start, scores done, softmax pass
//                       done, P stored, products issued, products done);
//   pingpong            the two compute warpgroups take turns to issue (0's
//                       scores, 1's scores, 0's products, 1's products, ...) on
//                       two named barriers, so that one's softmax runs while
//                       the other's products are on the tensor cores (where a
//                       stream has at most 40 pairs only warpgroup 0 computes,
//                       and nothing changes);
//   pingpong_no_copies  its math alone (the loader copies nothing);
//   pingpong_timeline   pingpong with the timeline's stamps.
// Their answers are stage 10's (the last two's: no_copies' are wrong on purpose).
#include "experiments/common.cuh"
#include "experiments/tile_stamps.cuh"
#include "experiments/taken_away.cuh"

namespace mla {
namespace {

#if MLA_SM90A
// The turns: warpgroup `group` may issue once its own barrier (kBarTurn +
// group) is passed, and passes the turn by arriving at the other's.
// Warpgroup 0 goes first: warpgroup 1 gives it the first turn before its
// loop, and warpgroup 0 takes the last one back after: every arrival at a
// turn's barrier is matched by a wait.
constexpr int kBarTurn = 7;
struct PingPongTurns {
  bool on;  // else warpgroup 1 only passes chunks
  int group;
  __device__ PingPongTurns(const Shape& sh, int g) : on(sh.per_group > kPairsPerGroup), group(g) {}
  __device__ void take() const {
    if (on) named_barrier(kBarTurn + group, 256);
  }
  __device__ void pass() const {
    if (on) named_barrier_arrive(kBarTurn + 1 - group, 256);
  }
};
struct TimelineParts : TileNParts {
  using Stamps = TileStamps;
};
struct PingPongParts : TileNParts {
  using Turns = PingPongTurns;
};
struct PingPongTimelineParts : PingPongParts {
  using Stamps = TileStamps;
};
#endif  // MLA_SM90A

__global__ void __launch_bounds__(kThreads, 1) timeline_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, TimelineParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) pingpong_kernel(const MlaParams p, const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, PingPongParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) pingpong_no_copies_kernel(const MlaParams p,
                                                                         const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, NoCopiesLoader, false, PingPongParts>(p, kv);
#else
  __trap();
#endif
}

__global__ void __launch_bounds__(kThreads, 1) pingpong_timeline_kernel(const MlaParams p,
                                                                        const __grid_constant__ KvTensor kv) {
#if MLA_SM90A
  tile_n_block<NoSeesaw, CpAsyncLoader, false, PingPongTimelineParts>(p, kv);
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

const char* const kVariants[] = {"timeline", "pingpong", "pingpong_no_copies", "pingpong_timeline"};
const MainKernel kMain[] = {timeline_kernel, pingpong_kernel, pingpong_no_copies_kernel, pingpong_timeline_kernel};

cudaError_t launch_variant(int v, const MlaParams& p, cudaStream_t stream) {
  return launch_tile_n<NoSeesaw>(p, stream, kMain[v], kSmemBytes, false,
                                 merge_as_staged<NoSeesaw>(combine_kernel, merge_by_warps_kernel));
}

}  // namespace

const Experiment& experiment() {
  static const Experiment e = {kVariants, 4, launch_variant, tile_stamps_read, tile_stamps_clear, nullptr, nullptr};
  return e;
}

}  // namespace mla
