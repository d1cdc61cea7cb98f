// The Python side of csrc/probes/wgmma_rate.cu: the book's wgmma-rate probe calls it.
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

namespace wgmma_rate {
bool has_n(int n);
int wgmmas_per_batch();
cudaError_t run(int n, int warpgroups, int blocks, int iters, long long* cycles, float* sink);
}  // namespace wgmma_rate

namespace {

// Cycles of each warpgroup's loop, [blocks, warpgroups], for one run on the current GPU.
at::Tensor cycles(int64_t n, int64_t warpgroups, int64_t blocks, int64_t iters) {
  TORCH_CHECK(wgmma_rate::has_n((int)n), "wgmma_rate: N must be 40, 64, 80 or 128, not ", n);
  TORCH_CHECK(warpgroups == 1 || warpgroups == 2, "wgmma_rate: one or two warpgroups, not ", warpgroups);
  TORCH_CHECK(blocks >= 1 && iters >= 1, "wgmma_rate: blocks and iters must be positive");
  int device = 0, major = 0, minor = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  TORCH_CHECK(major == 9 && minor == 0, "wgmma_rate: needs a compute capability 9.0 GPU (wgmma is sm_90a)");
  auto opts = at::TensorOptions().device(at::kCUDA, device);
  at::Tensor out = at::zeros({blocks, 2}, opts.dtype(at::kLong));
  at::Tensor sink = at::zeros({1}, opts.dtype(at::kFloat));
  C10_CUDA_CHECK(wgmma_rate::run((int)n, (int)warpgroups, (int)blocks, (int)iters,
                                 reinterpret_cast<long long*>(out.data_ptr<int64_t>()), sink.data_ptr<float>()));
  C10_CUDA_CHECK(cudaDeviceSynchronize());
  return out.narrow(1, 0, warpgroups).cpu();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cycles", &cycles, "clock cycles of each warpgroup's wgmma loop");
  m.def("per_batch", &wgmma_rate::wgmmas_per_batch, "wgmmas issued between waits");
}
