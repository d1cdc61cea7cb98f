"""Exploration on a GPU: where a stage's time goes, kernel by kernel (CUPTI activity via torch.profiler)."""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from mla_lab import ops, stages
from mla_lab.problem import Problem, make_workload

stage_ids = sys.argv[1:] or ["tensor_core"]
for B, T, H, prefix in [(1, 9, 8, 16384), (1, 9, 8, 65536), (1, 9, 64, 16384), (8, 9, 8, 16384)]:
    w = make_workload(Problem(streams=B, q_len=T, heads=H, prefix=prefix, page_size=1), device="cuda")
    for sid in stage_ids:
        call = ops.runner(sid, w)
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                call()
            torch.cuda.synchronize()
        parts = []
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.count >= 20:
                parts.append(f"{e.key[:40]} {e.device_time / 1:.1f}us x{e.count}")
        print(f"B{B} T{T} H{H} {prefix} {sid} splits {ops.default_num_splits(sid, w.q, w.kv_cache, w.block_table)}: "
              + " | ".join(parts), flush=True)
