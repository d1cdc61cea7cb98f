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
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "mla_params.h"
#include "params_from_tensors.h"

namespace mla {

// What each stage file provides (see mla_params.h); stage_list.h names the stages.
#define MLA_STAGE(id, ...)                                          \
  cudaError_t id##_launch(const MlaParams& p, cudaStream_t stream); \
  int id##_kernels(const KernelHandle** handles);
#include "stage_list.h"
#undef MLA_STAGE
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
  cudaError_t (*launch)(const MlaParams&, cudaStream_t);
  int (*kernels)(const KernelHandle**);  // what launch launches, in order
  bool splits;             // takes num_splits: partials, merged by the combine kernel
  int align_bytes;         // the widest access to q, the cache and out
  int min_cc, max_cc;      // compute capabilities (major * 10 + minor) it runs on; 0: no bound
  const char* input_hint;  // said when a call's tensors are misaligned or need too much shared memory
  const char* gpu_hint;    // said when the GPU is outside min_cc .. max_cc
};

const Stage kStages[] = {
#define MLA_STAGE(id, splits, align_bytes, min_cc, max_cc, input_hint, gpu_hint) \
  {#id, id##_launch, id##_kernels, (splits) != 0, align_bytes, min_cc, max_cc, input_hint, gpu_hint},
#include "stage_list.h"
#undef MLA_STAGE
};
constexpr int kNumStages = sizeof(kStages) / sizeof(kStages[0]);

// Each stage's place in kStages, so an op reaches its stage without a search.
enum StageIndex : int {
#define MLA_STAGE(id, ...) kStage_##id,
#include "stage_list.h"
#undef MLA_STAGE
};

constexpr int kMaxSplits = 256;

// Whether stages that can overlap a launch with the one before it (the Hopper stages,
// programmatic dependent launch) do so; off only to measure what it is worth.
bool g_programmatic_launch = true;

int find_stage(const std::string& id) {
  for (int i = 0; i < kNumStages; ++i)
    if (id == kStages[i].id) return i;
  MLA_CHECK(false, "mla_lab: no stage named '", id, "'");
}

std::string cc_text(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// Empty if the stage's kernels run on a GPU of compute capability cc, else why not.
std::string gpu_refusal(const Stage& st, int cc) {
  if ((!st.min_cc || cc >= st.min_cc) && (!st.max_cc || cc <= st.max_cc)) return "";
  const std::string range = st.min_cc == st.max_cc ? cc_text(st.min_cc) + " exactly"
                            : !st.max_cc           ? cc_text(st.min_cc) + " or newer"
                            : !st.min_cc           ? cc_text(st.max_cc) + " or older"
                                                   : cc_text(st.min_cc) + " to " + cc_text(st.max_cc);
  return cat("mla_lab::", st.id, ": needs a GPU of compute capability ", range, ", and this one is ", cc_text(cc),
             *st.gpu_hint ? std::string(": ") + st.gpu_hint : std::string());
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
  // A stride of 0 over a size > 1 (expand()) maps two outputs to one address: blocks would race on it.
  for (auto* t : {&out, &lse}) {
    bool overlaps = false;
    for (int64_t i = 0; i < t->dim(); ++i) overlaps |= t->stride(i) == 0 && t->size(i) > 1;
    MLA_CHECK(!overlaps, op, (t == &out ? "out" : "lse"), " must not have overlapping elements (a stride of 0 "
              "over a size > 1), got shape ", t->sizes(), " with strides ", t->strides());
  }
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
                *st.input_hint ? std::string(". ") + st.input_hint : std::string());

  const auto dev = q.device();
  for (auto* t : {&kv, &bt, &lens, &out, &lse})
    MLA_CHECK(t->device() == dev, op, "all tensors must be on one device; q is on ", dev.str(), ", got ", desc(*t));
  MLA_CHECK(dev.is_cuda(), op, "runs on CUDA tensors; got tensors on ", dev.str());
}

// What a launch asks the runtime, asked once per device (and stage) rather
// than on every call: the answers cannot change while the process runs, and a
// call that is captured in a CUDA graph or timed should only launch.
constexpr int kMaxDevices = 64;

struct DeviceFacts {
  int cc;          // compute capability, major * 10 + minor
  int smem_optin;  // the most shared memory one block may have, after opting in
};

const DeviceFacts& device_facts(int device) {
  static std::once_flag once[kMaxDevices];
  static DeviceFacts facts[kMaxDevices];
  MLA_CHECK(device >= 0 && device < kMaxDevices, "mla_lab: device ", device, " is beyond the ", kMaxDevices,
            " devices this extension keeps facts for");
  std::call_once(once[device], [device] {  // a throw leaves it unset: the next call asks again
    int major = 0, minor = 0, optin = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    facts[device] = {major * 10 + minor, optin};
  });
  return facts[device];
}

// Static shared memory of each kernel of a stage on the current device, in the
// order of its handles.  Asked only once the GPU is known to run the stage.
const std::vector<int>& static_smem_bytes(int device, int stage) {
  static std::once_flag once[kMaxDevices][kNumStages];
  static std::vector<int> bytes[kMaxDevices][kNumStages];
  std::call_once(once[device][stage], [device, stage] {
    const KernelHandle* handles;
    const int n = kStages[stage].kernels(&handles);
    std::vector<int> found;
    for (int i = 0; i < n; ++i) {
      cudaFuncAttributes attr;
      C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, handles[i].func));
      found.push_back((int)attr.sharedSizeBytes);
    }
    bytes[device][stage] = std::move(found);
  });
  return bytes[device][stage];
}

void run_stage(int stage, const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt,
               const at::Tensor& lens, double scale, at::Tensor& out, at::Tensor& lse, int64_t num_splits) {
  const Stage& st = kStages[stage];
  check_args(st, q, kv, bt, lens, scale, out, lse, num_splits);
  const int device = q.device().index();
  const c10::cuda::CUDAGuard guard(q.device());
  MlaParams p = params_from_tensors(q, kv, bt, lens, scale, out, lse, st.splits ? num_splits : 1);

  const DeviceFacts& facts = device_facts(device);
  const std::string refusal = gpu_refusal(st, facts.cc);
  MLA_CHECK(refusal.empty(), refusal);
  const KernelHandle* handles;
  const int n = st.kernels(&handles);
  const std::vector<int>& static_smem = static_smem_bytes(device, stage);
  for (int i = 0; i < n; ++i) {
    const int need = handles[i].geometry(p).dynamic_smem_bytes + static_smem[i];
    MLA_CHECK(need <= facts.smem_optin, "mla_lab::", st.id, ": this call needs ", need,
              " bytes of shared memory per block and the GPU allows ", facts.smem_optin, " (block table of ",
              p.max_pages, " pages x ", p.page_size, " tokens); ", st.input_hint);
  }

  // Scratch, from the caching allocator on the call's stream (graph-safe):
  // the [B, T, H, splits] partials the shared combine kernel reads, or, for a
  // stage with a combine of its own, whatever it asks for through p.scratch.
  at::Tensor o_partial, lse_partial;
  std::vector<at::Tensor> asked;
  p.scratch_ctx = &asked;
  p.scratch = [](void* ctx, int64_t bytes) -> void* {
    auto& held = *static_cast<std::vector<at::Tensor>*>(ctx);
    held.push_back(at::empty({std::max<int64_t>(bytes, 1)}, at::TensorOptions().dtype(at::kByte).device(
                                                                at::kCUDA, c10::cuda::current_device())));
    return held.back().data_ptr();
  };
  p.pdl = g_programmatic_launch ? 1 : 0;
  if (st.splits && std::string(handles[n - 1].name) == "combine_splits_kernel") {
    o_partial = at::empty({p.batch, p.q_len, p.num_heads, p.num_splits, kDimV}, q.options().dtype(at::kFloat));
    lse_partial = at::empty({p.batch, p.q_len, p.num_heads, p.num_splits}, q.options().dtype(at::kFloat));
    p.o_partial = o_partial.data_ptr<float>();
    p.lse_partial = lse_partial.data_ptr<float>();
  }
  const cudaError_t err = st.launch(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_lab::", st.id, ": launch failed: ", cudaGetErrorString(err));
}

// One function per op, because the dispatcher wants a plain function pointer;
// MLA_OP_0 for the stages without splits, MLA_OP_1 for the split stages.
#define MLA_OP_0(id)                                                                                  \
  void id##_op(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt, const at::Tensor& lens, \
               double scale, at::Tensor& out, at::Tensor& lse) {                                       \
    run_stage(kStage_##id, q, kv, bt, lens, scale, out, lse, 1);                                       \
  }
#define MLA_OP_1(id)                                                                                  \
  void id##_op(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt, const at::Tensor& lens, \
               double scale, int64_t num_splits, at::Tensor& out, at::Tensor& lse) {                  \
    run_stage(kStage_##id, q, kv, bt, lens, scale, out, lse, num_splits);                              \
  }
#define MLA_STAGE(id, splits, ...) MLA_OP_##splits(id)
#include "stage_list.h"
#undef MLA_STAGE

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

std::vector<KernelHandle> stage_kernels(const Stage& st) {
  const KernelHandle* handles;
  const int n = st.kernels(&handles);
  return std::vector<KernelHandle>(handles, handles + n);
}

// Every launch a call of `stage` makes: (kernel, grid, block, dynamic smem).
py::list launch_geometry(const std::string& stage, int64_t B, int64_t T, int64_t H, int64_t max_pages,
                         int64_t page_size, int64_t num_splits) {
  const Stage& st = kStages[find_stage(stage)];
  const MlaParams p = shape_params(B, T, H, max_pages, page_size, st.splits ? num_splits : 1);
  py::list out;
  for (const KernelHandle& k : stage_kernels(st)) {
    const LaunchGeometry g = k.geometry(p);
    py::dict d;
    d["kernel"] = std::string(k.name);
    d["grid"] = py::make_tuple(g.grid.x, g.grid.y, g.grid.z);
    d["block"] = py::make_tuple(g.block.x, g.block.y, g.block.z);
    d["dynamic_smem_bytes"] = g.dynamic_smem_bytes;
    out.append(d);
  }
  return out;
}

// The stage table as compiled: what the Python registry must agree with.
py::list stage_table() {
  py::list out;
  for (const Stage& st : kStages) {
    py::list kernels;
    for (const KernelHandle& k : stage_kernels(st)) kernels.append(std::string(k.name));
    py::dict d;
    d["id"] = std::string(st.id);
    d["splits"] = st.splits;
    d["align_bytes"] = st.align_bytes;
    d["min_cc"] = st.min_cc;
    d["max_cc"] = st.max_cc;
    d["kernels"] = kernels;
    out.append(d);
  }
  return out;
}

// What an op of `stage` says on a GPU of compute capability major.minor, before
// launching anything: "" if it runs there.
std::string gpu_support(const std::string& stage, int64_t major, int64_t minor) {
  return gpu_refusal(kStages[find_stage(stage)], (int)(major * 10 + minor));
}

// What the CUDA runtime reports for each kernel of a stage on the current GPU.
py::list kernel_attributes(const std::string& stage) {
  py::list out;
  for (const KernelHandle& k : stage_kernels(kStages[find_stage(stage)])) {
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
  for (const KernelHandle& k : stage_kernels(kStages[find_stage(stage)])) {
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
  check_args(kStages[kStage_float4], q, kv, bt, lens, 1.0, out, lse, num_splits);
  MLA_CHECK(sink.scalar_type() == at::kInt && sink.is_contiguous() && sink.device() == q.device() &&
                sink.numel() >= q.size(1) * q.size(2) * q.size(0) * num_splits,
            "probe_float4_reads: sink must be a contiguous int32 tensor on q's device with a word per block");
  const c10::cuda::CUDAGuard guard(q.device());
  const MlaParams p = params_from_tensors(q, kv, bt, lens, 1.0, out, lse, num_splits);
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
#define MLA_STAGE(id, splits, ...) m.def((std::string(#id) + ((splits) ? split : plain)).c_str());
#include "stage_list.h"
#undef MLA_STAGE
}

// The same functions serve CPU tensors, so that a call with tensors on the
// wrong device gets this library's message rather than a dispatcher error.
#define MLA_STAGE(id, ...) m.impl(#id, &mla::id##_op);
TORCH_LIBRARY_IMPL(mla_lab, CUDA, m) {
#include "stage_list.h"
}
TORCH_LIBRARY_IMPL(mla_lab, CPU, m) {
#include "stage_list.h"
}
#undef MLA_STAGE

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mla_lab's compiled kernels: ops live in torch.ops.mla_lab; these are helpers.";
  m.def("stage_ids", &mla::stage_ids, "The compiled stages, in ladder order.");
  m.def("stage_table", &mla::stage_table,
        "Each compiled stage as stage_list.h declares it: id, splits, align_bytes, min_cc, max_cc, kernels.");
  m.def("gpu_support", &mla::gpu_support,
        "What the stage's op says on a GPU of this compute capability before launching: '' if it runs there.",
        py::arg("stage"), py::arg("major"), py::arg("minor"));
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
  m.def("set_programmatic_launch", [](bool on) { mla::g_programmatic_launch = on; },
        "Let the Hopper stages overlap each kernel's launch with the previous one (default on; off to measure it).",
        py::arg("on"));
  m.def("device_limits", &mla::device_limits, "cudaGetDeviceProperties, the fields occupancy needs.",
        py::arg("device") = 0);
}
