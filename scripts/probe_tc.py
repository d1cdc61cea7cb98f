"""Exploration on a GPU: the tensor-core stage's split count, beside Triton (4 splits), float4 and
shared_rows, and the read-only probe of float4's grid (a floor for a block per (row, head))."""
import sys

import torch

from mla_lab import ops, stages
from mla_lab.extension import load
from mla_lab.problem import Problem, make_workload
from mla_lab.timing import time_call
from mla_lab.triton_baseline import triton_verify_attention

ext = load()
shapes = [(1, 9, 8, 1024), (1, 9, 8, 4096), (1, 9, 8, 16384), (1, 9, 8, 65536), (8, 9, 8, 16384),
          (1, 9, 64, 16384), (1, 16, 8, 16384), (8, 16, 64, 65536)]
for B, T, H, prefix in shapes:
    w = make_workload(Problem(streams=B, q_len=T, heads=H, prefix=prefix, page_size=1), device="cuda")
    out, lse = w.new_outputs()
    only_tc = "--only-tc" in sys.argv
    tri = time_call(lambda: triton_verify_attention(*w.args(), out, lse, num_splits=4, check=False), graph=True, rep_ms=40)
    row = [f"triton s4 {tri:.1f}"]
    for sid in () if only_tc else ("float4", "shared_rows"):
        if B * T * H * prefix > 8 * 9 * 64 * 16384:
            continue
        us = time_call(ops.runner(sid, w), graph=True, rep_ms=40)
        row.append(f"{sid} {us:.1f}")
    st = stages.get("tensor_core")
    dflt = ops.default_num_splits(st, w.q, w.kv_cache, w.block_table)
    for ns in sorted({dflt, max(1, dflt // 2), min(256, 2 * dflt), 16, 64}):
        us = time_call(ops.runner(st, w, num_splits=ns), graph=True, rep_ms=40)
        row.append(f"tc s{ns}{'*' if ns == dflt else ''} {us:.1f}")
    if B == 1 and H == 8 and T == 9 and not only_tc:
        ns = ops.default_num_splits("float4", w.q, w.kv_cache, w.block_table)
        sink = torch.empty(B * T * H * ns, dtype=torch.int32, device="cuda")
        us = time_call(lambda: ext.probe_float4_reads(w.q, w.kv_cache, w.block_table, w.kv_lens, ns, sink),
                       graph=True, rep_ms=40)
        gb = B * T * H * prefix * 1152 / 1e9
        row.append(f"float4-reads s{ns} {us:.1f} ({gb / us * 1e3:.2f} TB/s of {gb:.2f} GB)")
    print(f"B{B} T{T} H{H} prefix {prefix}: " + " | ".join(row), flush=True)
