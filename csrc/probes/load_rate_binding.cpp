// The Python side of csrc/probes/load_rate.cu: the book's load-rate probe calls run().
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cstdint>

namespace load_rate {
cudaError_t run(const uint16_t* kv, int64_t num_pages, int64_t page_stride, const int* pages, int tiles, int groups,
                int blocks, int mode, int ring, uint16_t* first_tile, cudaStream_t stream, const char** why);
}

namespace {

// One run of the probe on the current stream: every group of blocks reads the
// tiles of `pages` (one page of 64 keys each) from `kv`, [pages, 64, 576] bf16.
// With `first_tile` ([9, 64, 64] bf16), block 0 writes its first tile there as it landed.
void run(at::Tensor kv, at::Tensor pages, int64_t groups, int64_t blocks, int64_t mode, int64_t ring,
         c10::optional<at::Tensor> first_tile) {
  TORCH_CHECK(kv.is_cuda() && pages.is_cuda() && kv.device() == pages.device(), "load_rate: kv and pages on one GPU");
  TORCH_CHECK(kv.scalar_type() == at::kBFloat16 && kv.dim() == 3 && kv.size(1) == 64 && kv.size(2) == 576 &&
                  kv.stride(2) == 1 && kv.stride(1) == 576,
              "load_rate: kv must be [pages, 64, 576] bf16 with whole rows of 576");
  TORCH_CHECK(kv.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0,
              "load_rate: pages must start on 16 bytes");
  TORCH_CHECK(pages.scalar_type() == at::kInt && pages.dim() == 1 && pages.is_contiguous() && pages.numel() >= 1,
              "load_rate: pages must be a contiguous int32 vector");
  uint16_t* dump = nullptr;
  if (first_tile) {
    TORCH_CHECK(first_tile->device() == kv.device() && first_tile->scalar_type() == at::kBFloat16 &&
                    first_tile->is_contiguous() && first_tile->numel() == 9 * 64 * 64,
                "load_rate: first_tile must be a contiguous [9, 64, 64] bf16 tensor on kv's GPU");
    dump = reinterpret_cast<uint16_t*>(first_tile->data_ptr());
  }
  int device = 0, major = 0, minor = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  TORCH_CHECK(major == 9 && minor == 0, "load_rate: needs a compute capability 9.0 GPU (TMA and mbarriers of sm_90a)");
  const c10::cuda::CUDAGuard guard(kv.device());
  const char* why = nullptr;
  const cudaError_t err = load_rate::run(reinterpret_cast<const uint16_t*>(kv.data_ptr()), kv.size(0), kv.stride(0),
                                         pages.data_ptr<int>(), (int)pages.numel(), (int)groups, (int)blocks, (int)mode,
                                         (int)ring, dump, c10::cuda::getCurrentCUDAStream().stream(), &why);
  TORCH_CHECK(why == nullptr, "load_rate: ", why ? why : "");
  C10_CUDA_CHECK(err);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run, "fill every SM's shared memory with the given key tiles", py::arg("kv"), py::arg("pages"),
        py::arg("groups"), py::arg("blocks"), py::arg("mode"), py::arg("ring"), py::arg("first_tile") = py::none()); }
