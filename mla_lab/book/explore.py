"""Exploring a stage on a GPU, beyond the bench's fixed choices (``mla-lab sweep``,
``mla-lab kernel-times``, ``mla-lab profile-target``).

* :func:`sweep`: time a stage at several split counts, its own rule's count
  marked, each checked against the reference first: how much the split rule
  leaves on the table.
* :func:`kernel_times`: the GPU time of each kernel one call launches (main
  kernel, combine kernel, ...), from CUDA's activity records.
* :func:`profile_target`: a few calls of one stage on one shape and nothing
  else, for a profiler to attach to (Nsight Compute's ``ncu``).

None of them writes results: what they print is for the person exploring.
"""

from __future__ import annotations

import torch

from ..core import stages
from ..core.problem import Problem, make_workload

DEFAULT_SPLITS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class NeedsGPU(SystemExit):
    """Raised (and so printed, exit status 1) when a command that measures runs without a GPU."""

    def __init__(self, what: str):
        super().__init__(f"mla-lab {what}: needs a CUDA GPU, and this machine has none "
                         "(without one, `mla-lab bench` shows the recorded results)")


def _require_gpu(what: str) -> None:
    if not torch.cuda.is_available():
        raise NeedsGPU(what)


def split_limit(st: stages.Stage) -> int:
    if st.kind == "triton":
        from ..core.triton_baseline import MAX_SPLITS

        return MAX_SPLITS
    return stages.MAX_SPLITS


def sweep(stage_ids, problems, splits=DEFAULT_SPLITS, *, rep_ms: float = 40.0, out=print) -> list[dict]:
    """Graph-replay time of each stage at each split count on each problem; returns one dict per timing."""
    _require_gpu("sweep")
    from ..core import ops
    from ..core.reference import reference_attention
    from ..measure.timing import time_call
    from ..core.verify import compare

    wanted = [stages.get(s) for s in stage_ids]
    for st in wanted:
        if not st.splits and st.kind != "triton":
            raise SystemExit(f"mla-lab sweep: stage {st.id} does not split the keys (no num_splits); "
                             f"split stages: {', '.join(s.id for s in stages.STAGES if s.splits or s.kind == 'triton')}")
    rows = []
    for i, p in enumerate(problems):
        w = make_workload(p, device="cuda", seed=9000 + i, poison=True)
        ref = reference_attention(*w.args(), check=False)
        for st in wanted:
            own = (stages.TRITON_DEFAULT_SPLITS if st.kind == "triton"
                   else ops.default_num_splits(st, w.q, w.kv_cache, w.block_table))
            cells = []
            for ns in sorted({own, *(n for n in splits if 1 <= n <= split_limit(st))}):
                call = ops.runner(st, w, num_splits=ns)
                call()
                chk = compare(call.out, call.lse, *ref)
                if not chk.ok:
                    raise SystemExit(f"mla-lab sweep: {st.id} with {ns} splits is WRONG on {p.label()}: {chk}")
                us = time_call(call, graph=True, rep_ms=rep_ms)
                rows.append(dict(stage=st.id, problem=p.label(), num_splits=ns, own_rule=ns == own, us_graph=us))
                cells.append(f"{ns}{'*' if ns == own else ''}:{us:.1f}")
            best = min((r for r in rows if r["stage"] == st.id and r["problem"] == p.label()),
                       key=lambda r: r["us_graph"])
            out(f"{st.id:<13} {p.label():<34} splits:us  {'  '.join(cells)}   best {best['num_splits']}", flush=True)
        del w, ref
    return rows


def kernel_times(stage_ids, problems, *, calls: int = 20, out=print) -> list[dict]:
    """GPU time per kernel of one call, averaged over ``calls`` calls (CUPTI activity, via torch.profiler)."""
    _require_gpu("kernel-times")
    from torch.profiler import ProfilerActivity, profile

    from ..core import ops

    rows = []
    for p in problems:
        w = make_workload(p, device="cuda", seed=1)
        for sid in stage_ids:
            st = stages.get(sid)
            call = ops.runner(st, w)
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
            parts = []
            for e in prof.key_averages():
                if e.device_type.name == "CUDA" and e.count >= calls:
                    per_call = e.device_time_total / calls
                    rows.append(dict(stage=sid, problem=p.label(), kernel=e.key, us_per_call=per_call,
                                     launches_per_call=e.count / calls))
                    parts.append(f"{e.key[:48]} {per_call:.1f} us")
            splits = ops.default_num_splits(st, w.q, w.kv_cache, w.block_table) if st.splits else "-"
            out(f"{sid:<13} {p.label():<34} splits {splits}: " + " | ".join(parts), flush=True)
        del w
    return rows


PROFILE_PEERS = ("flashmla",)


def profile_target(stage_id: str, problem: Problem, *, num_splits: int | None = None, calls: int = 3,
                   build: str | None = None, peer: str | None = None) -> None:
    """``calls`` calls of one stage on one problem, then a sync: what a profiler should see, and nothing else.

    ``build`` names one of the experiment builds (``mla_lab/book/experiments.py``) to call instead of the op;
    only for ``hopper``.  ``peer`` (``flashmla``) calls that library on the same
    workload instead, as ``mla-lab bench --peers`` times it, so that a profile can set it beside ours.
    """
    from . import experiments as ablation
    from ..core import ops

    if build is not None and peer is not None:
        raise ValueError("profile-target takes --build or --peer, not both")
    if build is not None:
        if stage_id != "hopper":
            raise ValueError(f"--build is for the op (hopper) only, not {stage_id!r}")
        ablation.build_defines(build)  # an unknown name is refused before any GPU work
    if peer is not None:
        if peer not in PROFILE_PEERS:
            raise ValueError(f"no peer {peer!r}; the peers are {', '.join(PROFILE_PEERS)}")
        if problem.page_size != 64:
            raise ValueError(f"FlashMLA needs pages of 64 tokens (--page-size 64), not {problem.page_size}")
    _require_gpu("profile-target")
    w = make_workload(problem, device="cuda", seed=1)
    if peer is not None:
        call = ablation.flashmla_runner(w)
        if call is None:
            raise RuntimeError("FlashMLA is not importable here (flash_mla)")
    elif build is None:
        call = ops.runner(stage_id, w, num_splits=num_splits)
    else:
        call = ablation.runner(build, w, num_splits=num_splits)
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
