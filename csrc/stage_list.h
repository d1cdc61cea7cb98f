// The CUDA stages of the extension, in ladder order: one line per stage.
//
// bindings.cpp includes this list several times, each time with its own
// definition of MLA_STAGE, to declare each stage's functions, build the stage
// table, define one op per stage and register it with torch.  So adding a
// stage is: its kernel file (csrc/stageNN_<id>.cu, which defines
// <id>_launch and <id>_kernels, see mla_params.h), one line here, and its
// entry in the Python registry of stages; a test checks that the
// registry lists the same stages, in this order, with the same fields.
//
//   MLA_STAGE(id, splits, align_bytes, min_cc, max_cc, input_hint, gpu_hint)
//
//   id           the op torch.ops.mla_lab.<id> and the prefix of the file's functions
//   splits       1: split-KV (the op takes num_splits and the combine kernel merges); 0: not
//   align_bytes  the widest access to q, the cache and out: each must start on this boundary
//   min_cc       lowest compute capability (major * 10 + minor) the kernels run on; 0: any
//   max_cc       highest one; 0: no limit (min_cc == max_cc: that architecture only)
//   input_hint   said when a call's tensors are misaligned or need too much shared memory
//   gpu_hint     said when the GPU is outside min_cc .. max_cc: what the kernels need, what to use
//
// No include guard: the file is meant to be included more than once.

MLA_STAGE(naive, 0, 4, 0, 0,
          "the naive stage keeps a score for every key the block table can address in shared memory; "
          "use a shorter block table or a later stage",
          "")
MLA_STAGE(flash_ht8, 0, 4, 0, 0, "", "")
MLA_STAGE(kv_split, 1, 4, 0, 0, "", "")
MLA_STAGE(per_head, 1, 4, 0, 0, "", "")
MLA_STAGE(warp_per_key, 1, 4, 0, 0, "", "")
MLA_STAGE(float4, 1, 16, 0, 0,
          "the float4 stage moves q, the cache and out in 16-byte units; use stage warp_per_key for "
          "tensors that are not 16-byte aligned",
          "")
MLA_STAGE(shared_rows, 1, 16, 0, 0,
          "the shared_rows stage moves q, the cache and out in 16-byte units; use stage warp_per_key for "
          "tensors that are not 16-byte aligned",
          "")
MLA_STAGE(tensor_core, 1, 16, 80, 0,
          "the tensor_core stage moves q and the cache in 16-byte units (cp.async); use stage warp_per_key "
          "for tensors that are not 16-byte aligned",
          "it uses cp.async, ldmatrix and bf16 mma.sync; use stage shared_rows there")
MLA_STAGE(wgmma, 1, 16, 90, 90,
          "the wgmma stage moves q and the cache in 16-byte units (cp.async); use stage warp_per_key for tensors "
          "that are not 16-byte aligned",
          "it uses wgmma, setmaxnreg and mbarriers, which exist on sm_90 (H100, H200) alone; use stage tensor_core there")
MLA_STAGE(tensor_copy, 1, 16, 90, 90,
          "the tensor_copy stage moves q and the cache in 16-byte units (cp.async); use stage warp_per_key for "
          "tensors that are not 16-byte aligned",
          "it uses wgmma, setmaxnreg, mbarriers and the tensor copy, which exist on sm_90 (H100, H200) alone; use "
          "stage tensor_core there")
MLA_STAGE(seesaw, 1, 16, 90, 90,
          "the seesaw stage moves q and the cache in 16-byte units (cp.async); use stage warp_per_key for tensors "
          "that are not 16-byte aligned",
          "it uses wgmma, setmaxnreg, mbarriers and the tensor copy, which exist on sm_90 (H100, H200) alone; use "
          "stage tensor_core there")
MLA_STAGE(hopper, 1, 16, 90, 90,
          "the hopper stage moves q and the cache in 16-byte units (cp.async); use stage warp_per_key for tensors "
          "that are not 16-byte aligned",
          "it uses wgmma, setmaxnreg and mbarriers, which exist on sm_90 (H100, H200) alone; use stage tensor_core there")
