"""CPU models of each kernel stage: the kernel's loops, in plain PyTorch.

A model walks the same loops as its kernel (blocks, key tiles, online
softmax, head tiles, splits and their merge, the way a dot product is split
over threads) in fp32 on the CPU, so CI can check the *algorithm* of every
stage against the reference without a GPU.  While it runs it counts the
bytes the kernel asks the memory system for:

    traffic = bytes read from and written to global memory, counting a load
              that all threads of a block make to the same address once

That is the traffic the L2 cache (and behind it DRAM) must serve; the
chapters set it beside the time measured on the GPU.  :func:`traffic` gives
the same count in closed form for any problem size, and the tests hold the
two to each other.
"""

from __future__ import annotations

import functools

from ..core import stages as _stages
from ..core.problem import D_QK, D_V, Problem, Workload
from .common import (BF16, DOTS, FP32, INT32, Traffic, _combine_traffic, dot_chunks16, dot_serial, dot_warp,
                     split_length)
from .part1 import model_naive, model_tiled
from .part2 import _pair_tiles, model_shared_rows, model_tensor_core
from .part3 import (HOPPER_STAGE_ROW_BYTES, ROWS_RING_CHUNKS, SEESAW_PAIRS, TMA_LOADER_PROTOCOLS, HopperPlan,
                    hopper_blocks, hopper_out_staging, hopper_plan, model_hopper, model_seesaw, rows_ring_schedule,
                    seesaw_page_steps, seesaw_tile_boxes, tma_gather_schedule)

__all__ = ["BF16", "DOTS", "FP32", "INT32", "HOPPER_STAGE_ROW_BYTES", "MODELS", "ROWS_RING_CHUNKS", "SEESAW_PAIRS",
           "TMA_LOADER_PROTOCOLS", "HopperPlan", "Traffic", "dot_chunks16", "dot_serial", "dot_warp", "hopper_blocks",
           "hopper_out_staging", "hopper_plan", "model_hopper", "model_naive", "model_seesaw", "model_shared_rows",
           "model_tensor_core", "model_tiled", "rows_ring_schedule", "run_model", "seesaw_page_steps",
           "seesaw_tile_boxes", "split_length", "tma_gather_schedule", "traffic"]

MODELS = {"naive": model_naive, "shared_rows": model_shared_rows, "tensor_core": model_tensor_core,
          **{s: functools.partial(model_hopper, stage=s) for s in ("wgmma", "tensor_copy", "seesaw", "hopper")},
          **{s: model_tiled(s) for s in ("flash_ht8", "kv_split", "per_head", "warp_per_key", "float4")}}


def run_model(stage_id: str, w: Workload, num_splits: int | None = None):
    """(out, lse, Traffic) of the stage's model on ``w`` (keep ``w`` small: this is Python loops)."""
    return MODELS[stage_id](w, num_splits)


# ---- the same counts in closed form ------------------------------------------

def traffic(stage_id: str, p: Problem, num_splits: int = 1, table_width: int | None = None) -> Traffic:
    """Bytes the stage's kernels move for problem ``p``, without running anything.

    ``table_width``: the block table's pages a stream (a Hopper stage picks its kernel by it); by default
    :func:`mla_lab.core.problem.make_workload`'s, one more than the longest stream needs.
    """
    st = _stages.get(stage_id)
    tr = Traffic()
    B, T, H = p.streams, p.q_len, p.heads
    if stage_id == "naive":
        for L in p.kv_lens:
            keys = sum(L - T + t + 1 for t in range(T))  # summed over rows
            tr.add("q", BF16 * D_QK * T * H)
            tr.add("block table", INT32 * keys * H * 2)
            tr.add("kv", BF16 * (D_QK + D_V) * keys * H)
            tr.add("out", BF16 * D_V * T * H)
            tr.add("lse", FP32 * T * H)
        return tr
    S = num_splits if st.splits else 1
    if st.persistent:
        width = table_width if table_width is not None else max(p.pages_per_stream) + 1
        see = _stages.hopper_seesaw_pays(B, T, H, width, p.page_size, num_splits or 132, stage_id)
        S = _stages.hopper_unit_start_slots(B, T, H, width, p.page_size, num_splits or 132, stage_id)
        plan = hopper_plan(p.kv_lens, T, H, num_splits or 132, pairs_per_block=SEESAW_PAIRS if see else None,
                           start_slots=S)
        K = st.keys_per_tile
        n_pairs = [len(range(g * plan.per_group, min(T * H, (g + 1) * plan.per_group))) for g in range(plan.groups)]
        for c in range(plan.blocks):
            for u, t0, t1 in plan.share(c):
                L, n = p.kv_lens[plan.stream_of(u)], n_pairs[plan.group_of(u)]
                keys = min(t1 * K, L) - t0 * K
                tr.add("q", BF16 * D_QK * n)
                tr.add("block table", INT32 * keys)
                tr.add("kv", BF16 * D_QK * keys)
                if t0 == 0 and t1 == plan.tiles(u):
                    tr.add("out", BF16 * D_V * n)
                    tr.add("lse", FP32 * n)
                else:
                    tr.add("partial out", FP32 * D_V * n)
                    tr.add("partial lse", FP32 * n)
        for u, c0, c1 in plan.cut_units():
            g, L = plan.group_of(u), p.kv_lens[plan.stream_of(u)]
            firsts = [max(plan.start(c), plan.first_tile(u)) - plan.first_tile(u) for c in range(c0, c1 + 1)]
            for pr in range(g * plan.per_group, g * plan.per_group + n_pairs[g]):
                visible = L - T + pr // H + 1  # a piece starting past the pair's last key left it nothing
                tr.add("combine reads lse", FP32 * len(firsts))
                tr.add("combine reads partial out", FP32 * D_V * sum(1 for t0 in firsts if t0 * K < visible))
                tr.add("out", BF16 * D_V)
                tr.add("lse", FP32)
        return tr
    if stage_id == "tensor_core":
        for L in p.kv_lens:
            for tile, n, split, begin, end in _pair_tiles(st, L, T, H, S):
                tr.add("partial lse", FP32 * len(tile))
                if begin >= end:
                    continue
                tr.add("q", BF16 * D_QK * len(tile))
                tr.add("block table", INT32 * (end - begin))
                tr.add("kv", BF16 * D_QK * (end - begin))
                tr.add("partial out", FP32 * D_V * sum(1 for x in n if begin < x))
            per_split = split_length(L, S, st.keys_per_tile)
            for t in range(T):
                _combine_traffic(tr, S, H, live=sum(1 for s in range(S) if s * per_split < L - T + t + 1))
        return tr
    if stage_id == "shared_rows":
        R = st.rows_per_block
        for L in p.kv_lens:
            per_split = split_length(L, S, st.keys_per_tile)
            n = [L - T + t + 1 for t in range(T)]
            for t0 in range(0, T, R):
                rows = range(t0, min(t0 + R, T))
                n_max = max(n[t] for t in rows)
                for s in range(S):
                    begin = s * per_split
                    if begin >= n_max:
                        tr.add("partial lse", FP32 * len(rows) * H)
                        continue
                    keys = min(n_max, begin + per_split) - begin
                    tr.add("q", BF16 * D_QK * len(rows) * H)
                    tr.add("block table", INT32 * keys * H)
                    tr.add("kv", BF16 * D_QK * keys * H)
                    tr.add("partial lse", FP32 * len(rows) * H)
                    tr.add("partial out", FP32 * D_V * H * sum(1 for t in rows if begin < n[t]))
            for t in range(T):
                _combine_traffic(tr, S, H, live=sum(1 for s in range(S) if s * per_split < n[t]))
        return tr
    tiles_of_heads = [min(st.head_tile, H - h0) for h0 in range(0, H, st.head_tile)]
    for L in p.kv_lens:
        per_split = split_length(L, S, st.keys_per_tile)
        for t in range(T):
            n = L - T + t + 1
            live = sum(1 for s in range(S) if s * per_split < n)
            for nh in tiles_of_heads:
                tr.add("q", BF16 * D_QK * nh * live)
                tr.add("block table", INT32 * n)
                tr.add("kv", BF16 * D_QK * n)
                if st.splits:
                    tr.add("partial out", FP32 * D_V * nh * live)
                    tr.add("partial lse", FP32 * nh * S)
            if st.splits:
                tr.add("combine reads lse", FP32 * S * H)
                tr.add("combine reads partial out", FP32 * D_V * live * H)
            tr.add("out", BF16 * D_V * H)
            tr.add("lse", FP32 * H)
    return tr


