// How fast the tensor cores run one shape of wgmma: a probe of the hardware
// for chapter 10, not a stage.
//
// Every block (one per SM) runs one or two warpgroups; each issues the same
// wgmma, D[64 x N] += A[64 x 16] B[16 x N] (bf16 in, fp32 out, both operands
// from shared memory in the 128-byte swizzled layout stage 10 uses), 16 at a
// time into one accumulator, then waits for them, over and over.  The SM's
// clock around the loop gives the cycles per wgmma, and from it the
// multiply-adds per clock and SM, against the 2048 of the datasheet (989 dense
// bf16 TFLOP/s over 132 SMs at 1.83 GHz, for the H100 SXM; the H200 has the same SM).
// Stage 10 issues N = 40 (its pairs per warpgroup); FlashMLA's score tiles
// are N = 64.  The operands are zeros: only the rate is measured.
//
// The book's wgmma-rate probe builds this with wgmma_rate_binding.cpp into a module
// of its own, for sm_90a only.
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_RATE_SM90A 1
#else
#define WGMMA_RATE_SM90A 0
#endif

namespace wgmma_rate {
namespace {

constexpr int kPerBatch = 16;           // wgmmas issued before each wait
constexpr int kSmemBytes = 128 * 1024;  // A: 8 chunks of 64 x 64; B: up to 2 x 128 rows of 64, per warpgroup

#if WGMMA_RATE_SM90A
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// The same descriptor as stage 10's (csrc/sm90_ptx.cuh): 128-byte swizzle, 1024 bytes per 8 rows.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// D[64 x N] += A B, one wrapper per N (the accumulators are N / 2 registers a thread).
template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b);

template <>
__device__ __forceinline__ void wgmma_ss<40>(float (&d)[20], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}, %20, %21, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_ss<64>(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_ss<80>(float (&d)[40], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
      : "l"(desc_a), "l"(desc_b));
}

template <>
__device__ __forceinline__ void wgmma_ss<128>(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

template <int N>
__global__ void __launch_bounds__(256, 1) rate_kernel(int iters, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < kSmemBytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the zeros, visible to the tensor cores
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const uint32_t a0 = smem_addr(smem), b0 = smem_addr(smem + 65536 + wg * 32768);
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const long long start = clock64();
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < kPerBatch; ++k) {
      const int chunk = k / 4, ks = k % 4;  // as stage 10 walks a key tile: 4 k-steps per 64-dim chunk
      wgmma_ss<N>(d, sw128_desc(a0 + chunk * 8192 + 32 * ks), sw128_desc(b0 + (N <= 128 ? (chunk % 2) * N * 128 : 0) + 32 * ks));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  const long long stop = clock64();
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sum += d[i];
  if (sum != 0.f) sink[0] = sum;  // never true (zeros in): keeps the products
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = stop - start;
}
#else
template <int N>
__global__ void rate_kernel(int, long long*, float*) {}
#endif

template <int N>
cudaError_t launch(int warpgroups, int blocks, int iters, long long* cycles, float* sink) {
  cudaError_t err = cudaFuncSetAttribute(rate_kernel<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  rate_kernel<N><<<blocks, 128 * warpgroups, kSmemBytes>>>(iters, cycles, sink);
  return cudaGetLastError();
}

}  // namespace

// The shapes this probe has: N = 40, 64, 80, 128.
bool has_n(int n) { return n == 40 || n == 64 || n == 80 || n == 128; }

// One run: `blocks` blocks of `warpgroups` (1 or 2) warpgroups, `iters`
// batches of 16 wgmmas each.  cycles[2 * block + warpgroup] receives the
// clock cycles of that warpgroup's loop (device memory, 2 * blocks entries).
cudaError_t run(int n, int warpgroups, int blocks, int iters, long long* cycles, float* sink) {
  if (!has_n(n) || warpgroups < 1 || warpgroups > 2 || blocks < 1 || iters < 1) return cudaErrorInvalidValue;
  switch (n) {
    case 40: return launch<40>(warpgroups, blocks, iters, cycles, sink);
    case 64: return launch<64>(warpgroups, blocks, iters, cycles, sink);
    case 80: return launch<80>(warpgroups, blocks, iters, cycles, sink);
    default: return launch<128>(warpgroups, blocks, iters, cycles, sink);
  }
}

int wgmmas_per_batch() { return kPerBatch; }

}  // namespace wgmma_rate
