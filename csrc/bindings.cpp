// The torch side of the extension: one op per kernel stage in the `mla_lab`
// library, the argument checks in front of them, and a few pybind11 helpers
// (launch geometry, kernel attributes, the runtime's occupancy answer).
//
// Ops write into caller-given outputs on the current stream and never wait
// for the GPU, so a call can be captured in a CUDA graph.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "mla_params.h"

namespace mla {

// What each stage file provides (see mla_params.h).
#define MLA_DECLARE_STAGE(name)                              \
  LaunchGeometry name##_geometry(const MlaParams& p);        \
  cudaError_t name##_launch(const MlaParams& p, cudaStream_t s); \
  int name##_kernels(const KernelHandle** handles);
MLA_DECLARE_STAGE(naive)
MLA_DECLARE_STAGE(flash_ht8)
MLA_DECLARE_STAGE(kv_split)
MLA_DECLARE_STAGE(per_head)
MLA_DECLARE_STAGE(warp_per_key)
MLA_DECLARE_STAGE(float4)
MLA_DECLARE_STAGE(shared_rows)
MLA_DECLARE_STAGE(tensor_core)
MLA_DECLARE_STAGE(combine)
#undef MLA_DECLARE_STAGE
cudaError_t float4_reads_launch(const MlaParams& p, unsigned* sink, cudaStream_t stream);

namespace {

// Error messages are built with std::to_string, not iostreams: on a machine
// whose libstdc++ differs from the compiler's, an extension's own copy of the
// stream inserters for numbers can crash (seen on the H200 image: a segfault
// in basic_ostream::_M_insert<long> while formatting a TORCH_CHECK message).
inline std::string to_text(const std::string& s) { return s; }
inline std::string to_text(const char* s) { return s; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
std::string to_text(T v) { return std::to_string(v); }
inline std::string to_text(c10::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}
template <typename... Args>
std::string cat(const Args&... args) {
  std::string s;
  ((s += to_text(args)), ...);
  return s;
}
#define MLA_CHECK(cond, ...) TORCH_CHECK(cond, ::mla::cat(__VA_ARGS__))

struct Stage {
  const char* id;
  LaunchGeometry (*geometry)(const MlaParams&);
  cudaError_t (*launch)(const MlaParams&, cudaStream_t);
  int (*kernels)(const KernelHandle**);
  bool splits;      // writes partials and runs the combine kernel
  int align_bytes;  // the widest access to q, the cache and out
  const char* limit_hint;  // said when a launch needs more shared memory than a block may have
  int min_cc = 0;          // lowest compute capability (major * 10 + minor) the kernels run on
};

const Stage kStages[] = {
    {"naive", naive_geometry, naive_launch, naive_kernels, false, 4,
     "the naive stage keeps a score for every key the block table can address in shared memory; "
     "use a shorter block table or a later stage"},
    {"flash_ht8", flash_ht8_geometry, flash_ht8_launch, flash_ht8_kernels, false, 4, ""},
    {"kv_split", kv_split_geometry, kv_split_launch, kv_split_kernels, true, 4, ""},
    {"per_head", per_head_geometry, per_head_launch, per_head_kernels, true, 4, ""},
    {"warp_per_key", warp_per_key_geometry, warp_per_key_launch, warp_per_key_kernels, true, 4, ""},
    {"float4", float4_geometry, float4_launch, float4_kernels, true, 16,
     "the float4 stage moves q, the cache and out in 16-byte units; use stage warp_per_key for "
     "tensors that are not 16-byte aligned"},
    {"shared_rows", shared_rows_geometry, shared_rows_launch, shared_rows_kernels, true, 16,
     "the shared_rows stage moves q, the cache and out in 16-byte units; use stage warp_per_key for "
     "tensors that are not 16-byte aligned"},
    {"tensor_core", tensor_core_geometry, tensor_core_launch, tensor_core_kernels, true, 16,
     "the tensor_core stage moves q and the cache in 16-byte units (cp.async); use stage warp_per_key "
     "for tensors that are not 16-byte aligned",
     80},
};

constexpr int kMaxSplits = 256;

const Stage& find_stage(const std::string& id) {
  for (const Stage& s : kStages)
    if (id == s.id) return s;
  MLA_CHECK(false, "mla_lab: no stage named '", id, "'");
}

std::string desc(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "] " + std::string(c10::toString(t.scalar_type())) + " on " + t.device().str();
}

// Everything a launch can check without reading GPU memory.  The order lets
// a CPU-only machine test every check but the last (the device).
void check_args(const Stage& st, const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt,
                const at::Tensor& lens, double scale, const at::Tensor& out, const at::Tensor& lse,
                int64_t num_splits) {
  const std::string op = std::string("mla_lab::") + st.id + ": ";
  MLA_CHECK(q.dim() == 4 && q.size(3) == kDimQK, op, "q must be [streams, q_len, heads, 576], got ", desc(q));
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2);
  MLA_CHECK(B > 0 && T > 0 && H > 0, op, "empty batch: q is ", desc(q),
              "; streams, q_len and heads must all be >= 1");
  MLA_CHECK(q.scalar_type() == at::kBFloat16, op, "q must be bfloat16, got ", desc(q));
  MLA_CHECK(kv.dim() == 3 && kv.size(2) == kDimQK, op, "kv_cache must be [num_pages, page_size, 576], got ", desc(kv));
  MLA_CHECK(kv.size(0) > 0 && kv.size(1) > 0, op, "kv_cache is empty: ", desc(kv));
  MLA_CHECK(kv.scalar_type() == at::kBFloat16, op, "kv_cache must be bfloat16, got ", desc(kv));
  MLA_CHECK(bt.dim() == 2 && bt.size(0) == B && bt.size(1) > 0, op,
              "block_table must be [streams=", B, ", max_pages >= 1], got ", desc(bt));
  MLA_CHECK(bt.scalar_type() == at::kInt, op, "block_table must be int32, got ", desc(bt));
  MLA_CHECK(lens.dim() == 1 && lens.size(0) == B, op, "kv_lens must be [streams=", B, "], got ", desc(lens));
  MLA_CHECK(lens.scalar_type() == at::kInt, op, "kv_lens must be int32, got ", desc(lens));
  MLA_CHECK(out.dim() == 4 && out.size(0) == B && out.size(1) == T && out.size(2) == H && out.size(3) == kDimV &&
                  out.scalar_type() == at::kBFloat16,
              op, "out must be [", B, ", ", T, ", ", H, ", 512] bfloat16, got ", desc(out));
  MLA_CHECK(lse.dim() == 3 && lse.size(0) == B && lse.size(1) == T && lse.size(2) == H &&
                  lse.scalar_type() == at::kFloat,
              op, "lse must be [", B, ", ", T, ", ", H, "] float32, got ", desc(lse));

  MLA_CHECK(q.stride(3) == 1, op, "q's last dimension must be contiguous (stride 1), got strides ", q.strides());
  MLA_CHECK(kv.stride(2) == 1, op, "kv_cache's last dimension must be contiguous, got strides ", kv.strides());
  MLA_CHECK(bt.stride(1) == 1, op, "block_table's rows must be contiguous, got strides ", bt.strides());
  MLA_CHECK(lens.is_contiguous(), op, "kv_lens must be contiguous, got strides ", lens.strides());
  MLA_CHECK(out.stride(3) == 1, op, "out's last dimension must be contiguous, got strides ", out.strides());
  MLA_CHECK(std::isfinite(scale) && scale > 0, op, "scale must be a finite positive number, got ", scale);
  if (st.splits)
    MLA_CHECK(num_splits >= 1 && num_splits <= kMaxSplits, op, "num_splits must be in 1..", kMaxSplits,
              ", got ", num_splits);
  MLA_CHECK(T <= 65535 && B * std::max<int64_t>(num_splits, 1) <= 65535, op,
              "the grid allows at most 65535 query rows and 65535 streams x splits; got q_len ", T,
              ", streams ", B, ", splits ", num_splits);
  MLA_CHECK(kv.size(0) <= INT32_MAX && (int64_t)bt.size(1) * kv.size(1) <= INT32_MAX, op,
              "page ids and token positions must fit in int32");

  // Alignment: the kernels move rows of q, of the cache and of out in units of
  // align_bytes, so every row must start on that boundary.
  const int64_t elems = st.align_bytes / 2;
  auto aligned = [&](const at::Tensor& t) {
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % st.align_bytes) return false;
    for (int64_t i = 0; i + 1 < t.dim(); ++i)
      if (t.stride(i) % elems) return false;
    return true;
  };
  for (auto* t : {&q, &kv, &out})
    MLA_CHECK(aligned(*t), op, "needs q, kv_cache and out to start on ", st.align_bytes,
                "-byte boundaries with strides that are multiples of ", elems, " elements; got ",
                (t == &q ? "q" : t == &kv ? "kv_cache" : "out"), " at address offset ",
                reinterpret_cast<uintptr_t>(t->data_ptr()) % st.align_bytes, " with strides ", t->strides(),
                st.align_bytes > 4 ? std::string(". ") + st.limit_hint : std::string());

  const auto dev = q.device();
  for (auto* t : {&kv, &bt, &lens, &out, &lse})
    MLA_CHECK(t->device() == dev, op, "all tensors must be on one device; q is on ", dev.str(), ", got ", desc(*t));
  MLA_CHECK(dev.is_cuda(), op, "runs on CUDA tensors; got tensors on ", dev.str());
}

MlaParams make_params(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt, const at::Tensor& lens,
                      double scale, at::Tensor& out, at::Tensor& lse, int64_t num_splits) {
  MlaParams p{};
  p.batch = (int)q.size(0);
  p.q_len = (int)q.size(1);
  p.num_heads = (int)q.size(2);
  p.num_pages = (int)kv.size(0);
  p.page_size = (int)kv.size(1);
  p.max_pages = (int)bt.size(1);
  p.scale = (float)scale;
  p.q = reinterpret_cast<const bf16*>(q.data_ptr());
  p.q_stride_b = q.stride(0);
  p.q_stride_t = q.stride(1);
  p.q_stride_h = q.stride(2);
  p.kv = reinterpret_cast<const bf16*>(kv.data_ptr());
  p.kv_stride_page = kv.stride(0);
  p.kv_stride_slot = kv.stride(1);
  p.block_table = bt.data_ptr<int>();
  p.bt_stride_b = bt.stride(0);
  p.kv_lens = lens.data_ptr<int>();
  p.out = reinterpret_cast<bf16*>(out.data_ptr());
  p.o_stride_b = out.stride(0);
  p.o_stride_t = out.stride(1);
  p.o_stride_h = out.stride(2);
  p.lse = lse.data_ptr<float>();
  p.lse_stride_b = lse.stride(0);
  p.lse_stride_t = lse.stride(1);
  p.lse_stride_h = lse.stride(2);
  p.num_splits = (int)num_splits;
  return p;
}

int static_smem_bytes(const Stage& st) {
  const KernelHandle* handles;
  const int n = st.kernels(&handles);
  int most = 0;
  for (int i = 0; i < n; ++i) {
    cudaFuncAttributes attr;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, handles[i].func));
    most = std::max(most, (int)attr.sharedSizeBytes);
  }
  return most;
}

void run_stage(const Stage& st, const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt,
               const at::Tensor& lens, double scale, at::Tensor& out, at::Tensor& lse, int64_t num_splits) {
  check_args(st, q, kv, bt, lens, scale, out, lse, num_splits);
  const c10::cuda::CUDAGuard guard(q.device());
  MlaParams p = make_params(q, kv, bt, lens, scale, out, lse, st.splits ? num_splits : 1);

  if (st.min_cc) {
    int major = 0, minor = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index()));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.device().index()));
    MLA_CHECK(major * 10 + minor >= st.min_cc, "mla_lab::", st.id, ": needs a GPU of compute capability ",
              st.min_cc / 10, ".", st.min_cc % 10, " or newer (cp.async, ldmatrix, bf16 mma.sync); this one is ",
              major, ".", minor, ". Use stage shared_rows there.");
  }
  const LaunchGeometry g = st.geometry(p);
  int optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.device().index()));
  const int need = g.dynamic_smem_bytes + static_smem_bytes(st);
  MLA_CHECK(need <= optin, "mla_lab::", st.id, ": this call needs ", need,
              " bytes of shared memory per block and the GPU allows ", optin, " (block table of ", p.max_pages,
              " pages x ", p.page_size, " tokens); ", st.limit_hint);

  at::Tensor o_partial, lse_partial;  // scratch, from the caching allocator (graph-safe)
  if (st.splits) {
    o_partial = at::empty({p.batch, p.q_len, p.num_heads, p.num_splits, kDimV}, q.options().dtype(at::kFloat));
    lse_partial = at::empty({p.batch, p.q_len, p.num_heads, p.num_splits}, q.options().dtype(at::kFloat));
    p.o_partial = o_partial.data_ptr<float>();
    p.lse_partial = lse_partial.data_ptr<float>();
  }
  const cudaError_t err = st.launch(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_lab::", st.id, ": launch failed: ", cudaGetErrorString(err));
}

// One function per op, because the dispatcher wants a plain function pointer.
#define MLA_OP(name)                                                                                  \
  void name##_op(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt, const at::Tensor& lens, \
                 double scale, at::Tensor& out, at::Tensor& lse) {                                     \
    run_stage(find_stage(#name), q, kv, bt, lens, scale, out, lse, 1);                                 \
  }
#define MLA_SPLIT_OP(name)                                                                            \
  void name##_op(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt, const at::Tensor& lens, \
                 double scale, int64_t num_splits, at::Tensor& out, at::Tensor& lse) {                \
    run_stage(find_stage(#name), q, kv, bt, lens, scale, out, lse, num_splits);                        \
  }
MLA_OP(naive)
MLA_OP(flash_ht8)
MLA_SPLIT_OP(kv_split)
MLA_SPLIT_OP(per_head)
MLA_SPLIT_OP(warp_per_key)
MLA_SPLIT_OP(float4)
MLA_SPLIT_OP(shared_rows)
MLA_SPLIT_OP(tensor_core)

// ---- helpers for Python -----------------------------------------------------

MlaParams shape_params(int64_t B, int64_t T, int64_t H, int64_t max_pages, int64_t page_size, int64_t num_splits) {
  MlaParams p{};
  p.batch = (int)B;
  p.q_len = (int)T;
  p.num_heads = (int)H;
  p.max_pages = (int)max_pages;
  p.page_size = (int)page_size;
  p.num_splits = (int)num_splits;
  return p;
}

std::vector<std::string> stage_ids() {
  std::vector<std::string> ids;
  for (const Stage& s : kStages) ids.push_back(s.id);
  return ids;
}

// Every launch a call of `stage` makes: (kernel, grid, block, dynamic smem).
py::list launch_geometry(const std::string& stage, int64_t B, int64_t T, int64_t H, int64_t max_pages,
                         int64_t page_size, int64_t num_splits) {
  const Stage& st = find_stage(stage);
  const MlaParams p = shape_params(B, T, H, max_pages, page_size, st.splits ? num_splits : 1);
  auto entry = [](const KernelHandle& k, const LaunchGeometry& g) {
    py::dict d;
    d["kernel"] = std::string(k.name);
    d["grid"] = py::make_tuple(g.grid.x, g.grid.y, g.grid.z);
    d["block"] = py::make_tuple(g.block.x, g.block.y, g.block.z);
    d["dynamic_smem_bytes"] = g.dynamic_smem_bytes;
    return d;
  };
  py::list out;
  const KernelHandle* handles;
  st.kernels(&handles);
  out.append(entry(handles[0], st.geometry(p)));
  if (st.splits) {
    combine_kernels(&handles);
    out.append(entry(handles[0], combine_geometry(p)));
  }
  return out;
}

std::vector<KernelHandle> stage_kernels(const Stage& st) {
  std::vector<KernelHandle> all;
  const KernelHandle* handles;
  const int n = st.kernels(&handles);
  all.insert(all.end(), handles, handles + n);
  if (st.splits) {
    combine_kernels(&handles);
    all.push_back(handles[0]);
  }
  return all;
}

// What the CUDA runtime reports for each kernel of a stage on the current GPU.
py::list kernel_attributes(const std::string& stage) {
  py::list out;
  for (const KernelHandle& k : stage_kernels(find_stage(stage))) {
    cudaFuncAttributes a;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&a, k.func));
    py::dict d;
    d["kernel"] = std::string(k.name);
    d["registers"] = a.numRegs;
    d["static_smem_bytes"] = (int64_t)a.sharedSizeBytes;
    d["local_bytes"] = (int64_t)a.localSizeBytes;
    d["max_threads_per_block"] = a.maxThreadsPerBlock;
    d["ptx_version"] = a.ptxVersion;
    d["binary_version"] = a.binaryVersion;
    d["block_threads"] = k.block_threads;
    out.append(d);
  }
  return out;
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor for one kernel of a stage at
// a given dynamic shared memory size (after the same opt-in a launch makes).
int runtime_occupancy(const std::string& stage, const std::string& kernel, int64_t dynamic_smem_bytes) {
  for (const KernelHandle& k : stage_kernels(find_stage(stage))) {
    if (kernel != k.name) continue;
    if (dynamic_smem_bytes > 48 * 1024)
      C10_CUDA_CHECK(cudaFuncSetAttribute(k.func, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dynamic_smem_bytes));
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.func, k.block_threads,
                                                                 (size_t)dynamic_smem_bytes));
    return blocks;
  }
  MLA_CHECK(false, "mla_lab: stage ", stage, " has no kernel named ", kernel);
}

// The probe of chapter 6: float4's grid and loads with no arithmetic (probe_float4_reads.cu).
void probe_float4_reads(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt, const at::Tensor& lens,
                        int64_t num_splits, at::Tensor& sink) {
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), kDimV}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  check_args(find_stage("float4"), q, kv, bt, lens, 1.0, out, lse, num_splits);
  MLA_CHECK(sink.scalar_type() == at::kInt && sink.is_contiguous() && sink.device() == q.device() &&
                sink.numel() >= q.size(1) * q.size(2) * q.size(0) * num_splits,
            "probe_float4_reads: sink must be a contiguous int32 tensor on q's device with a word per block");
  const c10::cuda::CUDAGuard guard(q.device());
  const MlaParams p = make_params(q, kv, bt, lens, 1.0, out, lse, num_splits);
  const cudaError_t err = float4_reads_launch(p, reinterpret_cast<unsigned*>(sink.data_ptr<int>()),
                                              c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "probe_float4_reads: launch failed: ", cudaGetErrorString(err));
}

py::dict device_limits(int64_t device) {
  cudaDeviceProp prop;
  C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, (int)device));
  py::dict d;
  d["name"] = std::string(prop.name);
  d["cc"] = py::make_tuple(prop.major, prop.minor);
  d["sms"] = prop.multiProcessorCount;
  d["max_threads_per_sm"] = prop.maxThreadsPerMultiProcessor;
  d["max_blocks_per_sm"] = prop.maxBlocksPerMultiProcessor;
  d["regs_per_sm"] = prop.regsPerMultiprocessor;
  d["regs_per_block"] = prop.regsPerBlock;
  d["smem_per_sm"] = (int64_t)prop.sharedMemPerMultiprocessor;
  d["smem_per_block_optin"] = (int64_t)prop.sharedMemPerBlockOptin;
  d["reserved_smem_per_block"] = (int64_t)prop.reservedSharedMemPerBlock;
  d["l2_bytes"] = prop.l2CacheSize;
  d["memory_bus_bits"] = prop.memoryBusWidth;
  return d;
}

}  // namespace
}  // namespace mla

TORCH_LIBRARY(mla_lab, m) {
  const char* plain = "(Tensor q, Tensor kv_cache, Tensor block_table, Tensor kv_lens, float scale, "
                      "Tensor(a!) out, Tensor(b!) lse) -> ()";
  const char* split = "(Tensor q, Tensor kv_cache, Tensor block_table, Tensor kv_lens, float scale, "
                      "int num_splits, Tensor(a!) out, Tensor(b!) lse) -> ()";
  m.def((std::string("naive") + plain).c_str());
  m.def((std::string("flash_ht8") + plain).c_str());
  m.def((std::string("kv_split") + split).c_str());
  m.def((std::string("per_head") + split).c_str());
  m.def((std::string("warp_per_key") + split).c_str());
  m.def((std::string("float4") + split).c_str());
  m.def((std::string("shared_rows") + split).c_str());
  m.def((std::string("tensor_core") + split).c_str());
}

// The same functions serve CPU tensors, so that a call with tensors on the
// wrong device gets this library's message rather than a dispatcher error.
#define MLA_IMPLS(m)                          \
  m.impl("naive", &mla::naive_op);            \
  m.impl("flash_ht8", &mla::flash_ht8_op);    \
  m.impl("kv_split", &mla::kv_split_op);      \
  m.impl("per_head", &mla::per_head_op);      \
  m.impl("warp_per_key", &mla::warp_per_key_op); \
  m.impl("float4", &mla::float4_op);            \
  m.impl("shared_rows", &mla::shared_rows_op);      \
  m.impl("tensor_core", &mla::tensor_core_op);
TORCH_LIBRARY_IMPL(mla_lab, CUDA, m) { MLA_IMPLS(m) }
TORCH_LIBRARY_IMPL(mla_lab, CPU, m) { MLA_IMPLS(m) }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mla_lab's compiled kernels: ops live in torch.ops.mla_lab; these are helpers.";
  m.def("stage_ids", &mla::stage_ids, "The compiled stages, in ladder order.");
  m.def("launch_geometry", &mla::launch_geometry, "Each launch of a stage for a shape: kernel, grid, block, smem.",
        py::arg("stage"), py::arg("streams"), py::arg("q_len"), py::arg("heads"), py::arg("max_pages"),
        py::arg("page_size"), py::arg("num_splits") = 1);
  m.def("kernel_attributes", &mla::kernel_attributes, "cudaFuncGetAttributes of each kernel of a stage.");
  m.def("runtime_occupancy", &mla::runtime_occupancy,
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor for a kernel at a dynamic shared memory size.");
  m.def("probe_float4_reads", &mla::probe_float4_reads,
        "Stage 6's grid and 16-byte loads with no arithmetic: a floor for a block per (row, head).",
        py::arg("q"), py::arg("kv_cache"), py::arg("block_table"), py::arg("kv_lens"), py::arg("num_splits"),
        py::arg("sink"));
  m.def("device_limits", &mla::device_limits, "cudaGetDeviceProperties, the fields occupancy needs.",
        py::arg("device") = 0);
}
