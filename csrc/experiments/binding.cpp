// The Python side of one experiment module: the book's list of experiments
// compiles this file beside one experiment file (csrc/experiments/*.cu) into a
// module of its own.  Several experiments' answers are wrong on purpose (work
// taken away), so none becomes an op; the caller checks its arguments as the op
// does (the package's validation) before the first call, and the checks here only
// keep a wrong call from reaching the GPU.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "params_from_tensors.h"

namespace {

int variant_index(const std::string& name) {
  const mla::Experiment& e = mla::experiment();
  for (int i = 0; i < e.n_variants; ++i)
    if (name == e.variants[i]) return i;
  std::string known;
  for (int i = 0; i < e.n_variants; ++i) known += (i ? ", " : "") + std::string(e.variants[i]);
  TORCH_CHECK(false, "experiment: this module has no variant '", name, "'; it has ", known);
}

std::vector<std::string> variants() {
  const mla::Experiment& e = mla::experiment();
  return std::vector<std::string>(e.variants, e.variants + e.n_variants);
}

void run(const std::string& variant, const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt,
         const at::Tensor& lens, double scale, int64_t num_splits, at::Tensor& out, at::Tensor& lse) {
  const int v = variant_index(variant);
  const at::Tensor* all[] = {&q, &kv, &bt, &lens, &out, &lse};
  for (const at::Tensor* t : all)
    TORCH_CHECK(t->is_cuda() && t->device() == q.device(), "experiment: every tensor must be on q's GPU");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && kv.scalar_type() == at::kBFloat16 &&
                  out.scalar_type() == at::kBFloat16 && lse.scalar_type() == at::kFloat &&
                  bt.scalar_type() == at::kInt && lens.scalar_type() == at::kInt,
              "experiment: q, kv_cache, out bf16; lse float32; block_table, kv_lens int32");
  TORCH_CHECK(q.dim() == 4 && kv.dim() == 3 && bt.dim() == 2 && lens.dim() == 1 && out.dim() == 4 && lse.dim() == 3,
              "experiment: q [B, T, H, 576], kv_cache [pages, page_size, 576], block_table [B, pages]");
  TORCH_CHECK(num_splits >= 1 && num_splits <= 256, "experiment: num_splits must be in 1..256");
  const at::cuda::CUDAGuard guard(q.device());
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.device().index()));
  TORCH_CHECK(major == 9 && minor == 0, "experiment: needs a compute capability 9.0 GPU (sm_90a)");

  mla::MlaParams p = mla::params_from_tensors(q, kv, bt, lens, scale, out, lse, num_splits);
  p.pdl = 1;  // as the ops launch by default
  std::vector<at::Tensor> held;  // scratch from the caching allocator, on the call's stream (graph-safe)
  p.scratch_ctx = &held;
  p.scratch = [](void* ctx, int64_t bytes) -> void* {
    auto& h = *static_cast<std::vector<at::Tensor>*>(ctx);
    h.push_back(at::empty({std::max<int64_t>(bytes, 1)},
                          at::TensorOptions().dtype(at::kByte).device(at::kCUDA, c10::cuda::current_device())));
    return h.back().data_ptr();
  };
  const cudaError_t err = mla::experiment().launch(v, p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "experiment ", variant, ": launch failed: ", cudaGetErrorString(err));
}

// The tile stamps of the last call: [compute warpgroup, tile, event], SM clock
// cycles from each warpgroup's start.
at::Tensor timeline_read(int64_t tiles, int64_t events) {
  const mla::Experiment& e = mla::experiment();
  TORCH_CHECK(e.timeline_read, "experiment: this module takes no tile stamps");
  at::Tensor stamps = at::zeros({2, tiles, events}, at::TensorOptions().dtype(at::kFloat));
  C10_CUDA_CHECK(cudaDeviceSynchronize());
  C10_CUDA_CHECK(e.timeline_read(stamps.data_ptr<float>(), (int)stamps.numel()));
  return stamps;
}
void timeline_clear() {
  const mla::Experiment& e = mla::experiment();
  TORCH_CHECK(e.timeline_clear, "experiment: this module takes no tile stamps");
  C10_CUDA_CHECK(e.timeline_clear());
}

// The global timer's stamps of the last call, in nanoseconds (0 where none):
// [block of the main kernel][start, end], [merge block of the first cut unit][event]
// and [event of block 0's way to its first tile].
std::vector<at::Tensor> merge_timeline_read(int64_t main_blocks, int64_t merge_blocks, int64_t events,
                                            int64_t block0_events) {
  const mla::Experiment& e = mla::experiment();
  TORCH_CHECK(e.merge_timeline_read, "experiment: this module takes no global-timer stamps");
  const auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor main = at::zeros({main_blocks, 2}, opts), merge = at::zeros({merge_blocks, events}, opts);
  at::Tensor block0 = at::zeros({block0_events}, opts);
  auto ptr = [](at::Tensor& t) { return reinterpret_cast<unsigned long long*>(t.data_ptr<int64_t>()); };
  C10_CUDA_CHECK(cudaDeviceSynchronize());
  C10_CUDA_CHECK(e.merge_timeline_read(ptr(main), (int)main.numel(), ptr(merge), (int)merge.numel(), ptr(block0),
                                       (int)block0.numel()));
  return {main, merge, block0};
}
void merge_timeline_clear() {
  const mla::Experiment& e = mla::experiment();
  TORCH_CHECK(e.merge_timeline_clear, "experiment: this module takes no global-timer stamps");
  C10_CUDA_CHECK(e.merge_timeline_clear());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("variants", &variants, "the variants this module runs");
  m.def("run", &run, "one call of a variant, launched as the op's launcher would");
  m.def("timeline_read", &timeline_read, "the clock stamps of block 0's tiles in the last call");
  m.def("timeline_clear", &timeline_clear, "zero the tile stamps");
  m.def("merge_timeline_read", &merge_timeline_read,
        "the global timer's stamps of the main blocks, the merge and block 0's start");
  m.def("merge_timeline_clear", &merge_timeline_clear, "zero the global-timer stamps");
}
