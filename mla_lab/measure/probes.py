"""Probes: kernels that measure a floor, not stages.

A probe runs a stage's grid and loads with no arithmetic, so that a chapter can
say how long any kernel of that shape needs just to read its keys.  It is timed
like a stage (``mla-lab bench``, the chapters) but checked against nothing: it
computes nothing.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..core.ops import default_num_splits, load_ops
from ..core.problem import Workload
from ..models import traffic

PROBES = {
    "float4_reads": "stage 6's grid, block-table lookups and 16-byte loads with no arithmetic: "
                    "the time any kernel with a block per (row, head) needs just to read its keys",
}


def probe_runner(probe: str, w: Workload, *, num_splits: int | None = None) -> Callable[[], None]:
    """A no-argument call of a probe kernel on ``w`` (see :data:`PROBES`), for timing and graphs.

    ``float4_reads`` uses float4's split count unless told otherwise, so that
    it reads exactly what that stage reads; the call carries that split count
    (``num_splits``) and the key bytes it reads (``kv_bytes``).
    """
    if probe not in PROBES:
        raise KeyError(f"no probe {probe!r}; probes are {', '.join(PROBES)}")
    ext = load_ops()
    ns = int(num_splits if num_splits is not None else default_num_splits("float4", w.q, w.kv_cache, w.block_table))
    B, T, H, _ = w.q.shape
    sink = torch.empty(B * T * H * ns, dtype=torch.int32, device=w.q.device)

    def call():
        ext.probe_float4_reads(w.q, w.kv_cache, w.block_table, w.kv_lens, ns, sink)

    call.num_splits = ns  # type: ignore[attr-defined]
    call.kv_bytes = traffic("float4", w.problem, ns).parts["kv"]  # type: ignore[attr-defined]
    return call
