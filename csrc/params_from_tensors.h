// MlaParams from the op's tensors: sizes, strides and pointers, nothing checked.
// Both bindings (the ops' and the experiments') check the tensors first and then
// call this, so that an experiment sees exactly the parameters an op would.
#pragma once

#include <ATen/ATen.h>

#include "mla_params.h"

namespace mla {

inline MlaParams params_from_tensors(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& bt,
                                     const at::Tensor& lens, double scale, at::Tensor& out, at::Tensor& lse,
                                     int64_t num_splits) {
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

}  // namespace mla
