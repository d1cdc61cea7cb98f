"""Exploration on a GPU: how the split count moves a stage's time (H 8, one stream of 9 rows)."""
import sys

from mla_lab import ops, stages
from mla_lab.problem import Problem, make_workload
from mla_lab.timing import time_call
from mla_lab.triton_baseline import triton_verify_attention

prefixes = (1024, 16384, 65536)
for prefix in prefixes:
    w = make_workload(Problem(streams=1, q_len=9, heads=8, prefix=prefix, page_size=1), device="cuda")
    out, lse = w.new_outputs()
    row = []
    for bn in (16, 32, 64):
        for ns in (4, 16):
            us = time_call(lambda: triton_verify_attention(*w.args(), out, lse, num_splits=ns, block_n=bn,
                                                           check=False), graph=True, rep_ms=50)
            row.append(f"n{bn}s{ns}:{us:.0f}")
    print(f"triton H8 prefix {prefix}: " + "  ".join(row), flush=True)
    for sid in sys.argv[1:]:
        st = stages.get(sid)
        dflt = ops.default_num_splits(st, w.q, w.kv_cache, w.block_table)
        row = []
        for ns in sorted({dflt, 9, 36, 144}):
            us = time_call(ops.runner(st, w, num_splits=ns), graph=True, rep_ms=50)
            row.append(f"{ns}:{us:.0f}")
        print(f"{sid} H8 prefix {prefix} (default {dflt}) splits:us  " + "  ".join(row), flush=True)
