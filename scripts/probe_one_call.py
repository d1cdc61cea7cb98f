"""Run one stage once on one shape (for a profiler to look at): stage B T H prefix [splits]."""
import sys

import torch

from mla_lab import ops
from mla_lab.problem import Problem, make_workload

sid, B, T, H, prefix = sys.argv[1], *map(int, sys.argv[2:6])
ns = int(sys.argv[6]) if len(sys.argv) > 6 else None
w = make_workload(Problem(streams=B, q_len=T, heads=H, prefix=prefix, page_size=1), device="cuda")
call = ops.runner(sid, w, num_splits=ns)
for _ in range(3):
    call()
torch.cuda.synchronize()
