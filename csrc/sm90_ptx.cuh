// The Hopper (sm_90a) instructions the Hopper stages (10 onwards) use, one
// small wrapper each.
//
// Plain inline PTX with no library behind it, so a reader can hold every
// instruction against the PTX ISA.  Of the extension, only the Hopper stages
// include this file (through csrc/hopper/common.cuh; the probes do too), and
// only an sm_90a pass compiles the bodies (the guard below): the same extension
// still builds for sm_120 and for machines with no GPU at all.
#pragma once

#include <cuda.h>  // CUtensorMap (the driver call that fills it is found at run time: no -lcuda)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_SM90A 1
#else
#define MLA_SM90A 0
#endif

namespace mla {
namespace sm90 {

// The driver's cuTensorMapEncodeTiled, found once at run time (so that nothing
// links against the driver library), or null where the driver has none.  Host code.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    (void)cudaGetLastError();
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if MLA_SM90A

// ---- mbarrier: a 64-bit word in shared memory that counts arrivals per phase ----

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Wait until the phase of parity `parity` has completed.  The retry loop is
// written in PTX, inside one asm statement: a C++ loop here would be a
// divergent branch between wgmma instructions, and ptxas then serialises them.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Arrive on an mbarrier and add `bytes` to the transfers its phase waits for
// (the bulk copies that complete_tx on it).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// ---- ordering -----------------------------------------------------------------

// Shared memory written through the generic proxy (st.shared, cp.async,
// stmatrix) becomes visible to the tensor cores' async proxy only after this.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A barrier over `threads` threads (a multiple of 32) with its own id, so
// one warpgroup can synchronise without stopping the others.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// A counter in shared memory that one warp raises and others wait on: the
// store releases what the writer saw before it (its mbarrier waits), and the
// load acquires it, at the scope of the block.  Both are atomics (an exchange,
// and an OR of 0): a plain st.release / ld.acquire pair orders the same, but
// compute-sanitizer's racecheck reports it as a race, since it takes only
// atomics and barriers as synchronisation.
__device__ __forceinline__ void st_release_shared(uint32_t addr, int v) {
  int old;
  asm volatile("atom.release.cta.shared::cta.exch.b32 %0, [%1], %2;\n" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  (void)old;
}
__device__ __forceinline__ int ld_acquire_shared(uint32_t addr) {
  int v;
  asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
// Meant for one waiting thread, pausing between reads: with 64 threads
// spinning on the atomic, stage 10's long calls were 1 to 4% slower on the
// H200 (its other warps share the SM's shared-memory pipeline).
__device__ __forceinline__ void wait_until_at_least(uint32_t addr, int v) {
  while (ld_acquire_shared(addr) < v) __nanosleep(32);
}

// Arrive at barrier `id` without waiting: a producer's signal to the threads
// that wait there with named_barrier (`threads` counts both sides).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier, and the OR of `pred` over the threads that meet at it.
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"((uint32_t)pred), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// Programmatic dependent launch: let the next kernel on the stream start its
// launch now; wait here until the previous kernel has finished and its writes
// are visible.  Both are no-ops when the launch did not ask for it.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Hand registers from one warpgroup to another (the counts are per thread).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- cp.async: 16 bytes global -> shared, completion tracked in groups ----------

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// The same, and L2 fetches the 256 bytes around src from DRAM, not 128: the
// next chunk of a cached row (its next 64 dims) is then already in L2 when it
// is asked for (4-5% off stage 10 at 8 streams of 65536 keys, measured).
__device__ __forceinline__ void cp_async16_l2_256(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// Four bytes global -> shared (the block table's page ids, fetched ahead of their use).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Arrive on an mbarrier once every cp.async this thread has issued so far has
// landed, without waiting for them here (.noinc: the arrival is one of those
// the barrier was initialised to expect).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- TMA: a box of a tensor in global memory -> shared, counted on an mbarrier --

// The box of the 3-d tensor `map` whose first element is at (c0, c1, c2),
// innermost first, copied to dst (swizzled as the map says); the bytes land
// as transfers of `bar`'s current phase.  `map` is the generic address of a
// CUtensorMap in kernel parameter, constant or global memory.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

// The same for a four-dimensional map (coordinates innermost first).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void st_shared_u128(uint32_t dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// Two 8x8 bf16 matrices held as mma fragments (lane l: row l/4, columns
// 2(l%4), +1), stored transposed: lane j (0..15) names where row j%8 of
// matrix j/8 goes, and stored row j is fragment column j.
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(addr), "r"(r0), "r"(r1)
               : "memory");
}

// Four such matrices, stored transposed: lane j names where row j%8 of matrix j/8 goes.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Four 8x8 bf16 matrices held as mma fragments (lane l: row l/4, columns
// 2(l%4), +1), stored as they are: lane j names where row j%8 of matrix j/8 goes.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// ---- wgmma: a warpgroup's matrix product, operands described in shared memory ----

// A shared-memory matrix descriptor for the 128-byte swizzled layout: 8 rows of
// 128 bytes form a 1024-byte atom whose 16-byte chunks are XOR-ed with the row
// (chunk ^= row % 8).  `stride_bytes` steps from one 8-row group to the next
// (the "stride byte offset").  `lead_bytes`, the "leading byte offset", steps
// from one 64-element atom to the next along M or N; only an MN-major operand
// wider than 64 elements reads it (the rows layout's V at N = 256: four chunks
// of the ring, one after another).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t stride_bytes, uint32_t lead_bytes = 16) {
  uint64_t d = 0;
  d |= (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lead_bytes >> 4) & 0x3FFF) << 16;
  d |= (uint64_t)((stride_bytes >> 4) & 0x3FFF) << 32;
  d |= (uint64_t)1 << 62;                           // layout: 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler does not know that a wgmma writes its accumulators later, when
// it completes.  After wgmma_wait, pass every accumulator through this empty
// statement so no read of it can be scheduled above the wait.
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D[64 x 40] (+)= A[64 x 16] B[16 x 40], bf16 in, fp32 accumulate, both from
// shared memory.  kTransA = 1 reads A stored MN-major (the 64 rows contiguous);
// B is always K-major here.  Lane l of warp w holds D rows 16w + l/4 (+8) at
// columns 8i + 2(l%4) (+1): d[4i], d[4i+1] on the first row, d[4i+2], d[4i+3]
// on the second.
template <int kTransA>
__device__ __forceinline__ void wgmma_m64n40k16(float (&d)[20], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %22, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n40k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19}, "
      "%20, %21, p, 1, 1, %23, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransA));
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], both from shared memory.  A is
// K-major; kTransB = 1 reads B stored MN-major (its 64 columns contiguous).
// Lane l of warp w holds D rows 16w + l/4 (+8) at columns 8i + 2(l%4) (+1):
// d[4i], d[4i+1] on the first row, d[4i+2], d[4i+3] on the second.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(kTransB));
}

// D[64 x 256] += A[64 x 16] B[16 x 256], B from shared memory stored MN-major
// over four 64-column atoms `lead_bytes` apart (see sw128_desc); d[j] holds
// columns 64j .. 64j + 63 in the layout of wgmma_m64n64k16_ss's d.  One product
// of N = 256 reads A once where four of N = 64 read it four times.  Its 128
// accumulators, as the instruction names them and as asm operands:
#define MLA_D256_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MLA_D256_OUTS(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[0][4]), "+f"(d[0][5]), "+f"(d[0][6]), "+f"(d[0][7]), "+f"(d[0][8]), "+f"(d[0][9]), "+f"(d[0][10]), "+f"(d[0][11]), "+f"(d[0][12]), "+f"(d[0][13]), "+f"(d[0][14]), "+f"(d[0][15]), \
  "+f"(d[0][16]), "+f"(d[0][17]), "+f"(d[0][18]), "+f"(d[0][19]), "+f"(d[0][20]), "+f"(d[0][21]), "+f"(d[0][22]), "+f"(d[0][23]), "+f"(d[0][24]), "+f"(d[0][25]), "+f"(d[0][26]), "+f"(d[0][27]), "+f"(d[0][28]), "+f"(d[0][29]), "+f"(d[0][30]), "+f"(d[0][31]), \
  "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[1][4]), "+f"(d[1][5]), "+f"(d[1][6]), "+f"(d[1][7]), "+f"(d[1][8]), "+f"(d[1][9]), "+f"(d[1][10]), "+f"(d[1][11]), "+f"(d[1][12]), "+f"(d[1][13]), "+f"(d[1][14]), "+f"(d[1][15]), \
  "+f"(d[1][16]), "+f"(d[1][17]), "+f"(d[1][18]), "+f"(d[1][19]), "+f"(d[1][20]), "+f"(d[1][21]), "+f"(d[1][22]), "+f"(d[1][23]), "+f"(d[1][24]), "+f"(d[1][25]), "+f"(d[1][26]), "+f"(d[1][27]), "+f"(d[1][28]), "+f"(d[1][29]), "+f"(d[1][30]), "+f"(d[1][31]), \
  "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[2][4]), "+f"(d[2][5]), "+f"(d[2][6]), "+f"(d[2][7]), "+f"(d[2][8]), "+f"(d[2][9]), "+f"(d[2][10]), "+f"(d[2][11]), "+f"(d[2][12]), "+f"(d[2][13]), "+f"(d[2][14]), "+f"(d[2][15]), \
  "+f"(d[2][16]), "+f"(d[2][17]), "+f"(d[2][18]), "+f"(d[2][19]), "+f"(d[2][20]), "+f"(d[2][21]), "+f"(d[2][22]), "+f"(d[2][23]), "+f"(d[2][24]), "+f"(d[2][25]), "+f"(d[2][26]), "+f"(d[2][27]), "+f"(d[2][28]), "+f"(d[2][29]), "+f"(d[2][30]), "+f"(d[2][31]), \
  "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[3][4]), "+f"(d[3][5]), "+f"(d[3][6]), "+f"(d[3][7]), "+f"(d[3][8]), "+f"(d[3][9]), "+f"(d[3][10]), "+f"(d[3][11]), "+f"(d[3][12]), "+f"(d[3][13]), "+f"(d[3][14]), "+f"(d[3][15]), \
  "+f"(d[3][16]), "+f"(d[3][17]), "+f"(d[3][18]), "+f"(d[3][19]), "+f"(d[3][20]), "+f"(d[3][21]), "+f"(d[3][22]), "+f"(d[3][23]), "+f"(d[3][24]), "+f"(d[3][25]), "+f"(d[3][26]), "+f"(d[3][27]), "+f"(d[3][28]), "+f"(d[3][29]), "+f"(d[3][30]), "+f"(d[3][31])
// A in registers (a[0..3]: the fragment of an mma.m16n8k16 A operand, per warp its 16 rows):
__device__ __forceinline__ void wgmma_m64n256k16_rs_tb(float (&d)[4][32], const uint32_t* a, uint64_t desc_b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLA_D256_REGS "}, "
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : MLA_D256_OUTS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// A from shared memory, K-major:
__device__ __forceinline__ void wgmma_m64n256k16_ss_tb(float (&d)[4][32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MLA_D256_REGS "}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : MLA_D256_OUTS(d)
      : "l"(desc_a), "l"(desc_b));
}
#undef MLA_D256_REGS
#undef MLA_D256_OUTS

#endif  // MLA_SM90A

}  // namespace sm90
}  // namespace mla
