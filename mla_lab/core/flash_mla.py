"""FlashMLA's Python interface for dense bf16 MLA decode, run by this package's kernels on any GPU they build for.

A serving engine that calls FlashMLA changes one line::

    from mla_lab.flash_mla import get_mla_metadata, flash_mla_with_kvcache   # was: from flash_mla import ...

:func:`flash_mla_with_kvcache` takes FlashMLA's arguments and layouts (``q`` (b, s_q, h_q, 576) bf16, ``k_cache``
(blocks, page, 1, 576), ``block_table`` (b, max_blocks) int32, ``cache_seqlens`` (b,) int32, the new tokens
included; ``head_dim_v=512``) and returns FlashMLA's ``out`` (b, s_q, h_q, 512) bf16 and ``lse`` (b, h_q, s_q)
fp32, natural log.  With ``causal=True`` query row ``i`` sees keys ``0 .. cache_seqlens - s_q + i``, FlashMLA's
alignment (its reference masks with ``tril(diagonal=s_k - s_q)``) and the one every stage here computes; with
``causal=False`` every row sees every key (the rows are passed to the kernels as extra heads of one row).

It runs :func:`fastest_stage` for the GPU (``hopper`` on sm_90, ``tensor_core`` from sm_80 on), with pages of
any size the stages take.  No call reads GPU memory on the host or decides anything from the lengths or the
block table's contents, so a call can be captured in a CUDA graph and replayed with lengths and tables that
change; the split count (``hopper``: its blocks) depends only on the shapes and the table's width.

Both of FlashMLA's conventions for :func:`get_mla_metadata` work: the current one (no arguments; an object the
first call fills) and the older one (``cache_seqlens, s_q * h_q // h_k, h_k``; two int32 tensors in FlashMLA's
shapes, which the calls accept and do not read).

Written from FlashMLA's documented interface (``flash_mla/flash_mla_interface.py``, its README and tests in
deepseek-ai/FlashMLA); none of its code is here.  Not covered: its fp8 cache, sparse attention (``indices``),
attention sinks, and half-precision inputs.  A stream the kernels cannot serve (``cache_seqlens`` below ``s_q``
with ``causal=True``, or 0) gets NaN in its rows, where FlashMLA answers rows without keys with 0 and an lse of
+inf.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from . import ops as _ops
from . import stages as _stages
from .problem import D_QK, D_V
from .stages import Stage
from .validate import InputError

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "fastest_stage", "NO_GPU"]

TILE_SCHEDULER_METADATA_SIZE = 8  # the width of FlashMLA's tile_scheduler_metadata rows (older convention)

NO_GPU = ("the CUDA stages need tensors on a CUDA GPU, got {what} on {device}. Without a GPU, "
          "mla_lab.reference_attention(q, kv_cache, block_table, kv_lens, scale) gives the fp32 answer and "
          "mla_lab.attention(\"triton\", q, kv_cache, block_table, kv_lens, scale) runs the Triton baseline in "
          "Triton's interpreter (which it turns on where it finds no GPU), both in this package's layouts "
          "(q [b, s_q, h_q, 576], kv_cache [blocks, page, 576], lse [b, s_q, h_q]); here stage=\"triton\" does "
          "the same in FlashMLA's")


def _fail(msg: str):
    raise InputError(f"mla_lab.flash_mla: {msg}")


def fastest_stage(major: int, minor: int) -> Stage:
    """The stage the entry point runs on a GPU of compute capability ``major.minor``: the last CUDA stage of the
    ladder that runs there (:meth:`Stage.runs_on`): ``hopper`` on 9.0, ``tensor_core`` on 8.0 and later others,
    ``shared_rows`` before 8.0."""
    return [s for s in _stages.cuda_stages() if s.runs_on(major, minor)][-1]


@functools.lru_cache(maxsize=None)
def _stage_for_device(index: int) -> Stage:
    return fastest_stage(*torch.cuda.get_device_capability(index))


@dataclass
class FlashMLASchedMeta:
    """What :func:`get_mla_metadata` returns in FlashMLA's current convention: empty until the first
    :func:`flash_mla_with_kvcache` call fills it; later calls must have the same shapes, as in FlashMLA
    (the lengths and the tables' contents may change).

    ``stage`` is the stage the calls run and ``splits`` the split count they pass it (``hopper``: its blocks),
    for block tables ``table_width`` pages wide (a wider table gets its own count, worked out on the host).
    """

    @dataclass(frozen=True)
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool

    have_initialized: bool = False
    config: Config | None = None
    stage: Stage | None = field(default=None, repr=False)
    splits: int | None = None
    table_width: int | None = None
    _plan: tuple | None = field(default=None, repr=False)  # (stage, splits, op) for the calls
    _key: tuple | None = field(default=None, repr=False)  # the config as a tuple, compared on every call

    def __repr__(self) -> str:
        return (f"FlashMLASchedMeta(have_initialized={self.have_initialized}, config={self.config}, stage="
                f"{self.stage.id if self.stage else None}, splits={self.splits}, table_width={self.table_width})")


def get_mla_metadata(*args, **kwargs):
    """FlashMLA's ``get_mla_metadata``, in either convention.

    Current: ``get_mla_metadata()`` returns ``(FlashMLASchedMeta(), None)``; the first call of
    :func:`flash_mla_with_kvcache` fills the object.  Older: ``get_mla_metadata(cache_seqlens,
    num_heads_per_head_k, num_heads_k, ...)`` returns ``(tile_scheduler_metadata, num_splits)``, int32 tensors of
    FlashMLA's shapes ((SMs, 8) and (b + 1,)) on ``cache_seqlens``'s device, for callers that copy them into
    buffers of their own; the calls take them and read neither (the split count comes from the shapes).
    """
    seqlens = args[0] if args else kwargs.get("cache_seqlens")
    if seqlens is None:
        return FlashMLASchedMeta(), None
    if not isinstance(seqlens, torch.Tensor) or seqlens.dim() != 1 or seqlens.dtype != torch.int32:
        _fail(f"get_mla_metadata: cache_seqlens must be a (batch_size,) int32 tensor, got "
              f"{type(seqlens).__name__ if not isinstance(seqlens, torch.Tensor) else _desc(seqlens)}")
    if seqlens.device.type != "cuda":
        _fail("get_mla_metadata: " + NO_GPU.format(what="cache_seqlens", device=seqlens.device))
    sms = _ops._sm_count(seqlens.device.index if seqlens.device.index is not None else torch.cuda.current_device())
    meta = torch.zeros(sms, TILE_SCHEDULER_METADATA_SIZE, dtype=torch.int32, device=seqlens.device)
    return meta, torch.zeros(seqlens.shape[0] + 1, dtype=torch.int32, device=seqlens.device)


def _desc(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


_UNSUPPORTED = ("is_fp8_kvcache", "indices", "attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length",
                "extra_topk_length")


def _check(q, k_cache, block_table, cache_seqlens, head_dim_v) -> None:
    """What the kernels' own checks cannot say in FlashMLA's terms (shapes of its layouts); cheap, no sync."""
    for t, name in ((q, "q"), (k_cache, "k_cache"), (block_table, "block_table"), (cache_seqlens, "cache_seqlens")):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}"
                  + (" (dense decode needs block_table and cache_seqlens)" if t is None else ""))
    if q.dim() != 4 or q.shape[-1] != D_QK:
        _fail(f"q must be (batch_size, seq_len_q, num_heads_q, {D_QK}), got {_desc(q)}")
    if q.dtype != torch.bfloat16:
        _fail(f"q must be bfloat16 (dense bf16 decode only), got {q.dtype}")
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != D_QK:
        _fail(f"k_cache must be (num_blocks, page_block_size, 1, {D_QK}): MLA's one latent KV head, got "
              f"{_desc(k_cache)}")
    if head_dim_v != D_V:
        _fail(f"head_dim_v must be {D_V} (the latent part of each cached token), got {head_dim_v!r}")


_PLANS: dict = {}  # (stage asked for, device, q's shape as called, table width, page size) -> (stage, splits, op)


def _plan(st: Stage | None, q_call, kv, block_table) -> tuple:
    """The stage a call runs, its split count and its op, from the shapes alone (host only; once per shape)."""
    key = (st.id if st is not None else None, q_call.device, q_call.shape, block_table.shape[-1], kv.shape[1])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _make_plan(st, q_call, kv, block_table)
    return plan


def _make_plan(st: Stage | None, q_call, kv, block_table) -> tuple:
    if st is None:
        if q_call.device.type != "cuda":
            _fail(NO_GPU.format(what="q", device=q_call.device))
        st = _stage_for_device(q_call.device.index if q_call.device.index is not None else torch.cuda.current_device())
    if st.kind == "triton":
        return st, _stages.TRITON_DEFAULT_SPLITS, None
    if q_call.device.type != "cuda":
        _fail(NO_GPU.format(what="q", device=q_call.device))
    _ops.load_ops()
    ns = _ops.default_num_splits(st, q_call, kv, block_table) if st.splits else None
    return st, ns, getattr(torch.ops.mla_lab, st.id)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata=None,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, *, stage: str | Stage | None = None):
    """FlashMLA's ``flash_mla_with_kvcache`` for dense bf16 decode; returns ``(out, lse)``.

    ``q`` (b, s_q, h_q, 576) bf16; ``k_cache`` (num_blocks, page_block_size, 1, 576) bf16, pages of any size;
    ``block_table`` (b, max_num_blocks) int32; ``cache_seqlens`` (b,) int32, every stream's cached tokens with
    the s_q new ones; ``head_dim_v`` 512; ``tile_scheduler_metadata`` what :func:`get_mla_metadata` returned (either
    convention, or None) and ``num_splits`` its second value or None; ``softmax_scale`` (default 576 ** -0.5);
    ``causal``: row i sees keys ``0 .. cache_seqlens - s_q + i`` (else all).  Returns ``out`` (b, s_q, h_q, 512)
    bf16 and ``lse`` (b, h_q, s_q) fp32, natural log of the sum of exp(scaled scores).

    ``stage`` (not in FlashMLA) picks a stage instead of :func:`fastest_stage`; ``"triton"`` also runs on CPU
    tensors, in Triton's interpreter.  The fp8 cache and sparse attention are FlashMLA's alone: passing them
    raises :class:`InputError`, as do CPU tensors (naming what runs without a GPU).
    """
    if (is_fp8_kvcache or indices is not None or attn_sink is not None or extra_k_cache is not None
            or extra_indices_in_kvcache is not None or topk_length is not None or extra_topk_length is not None):
        given = (is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
                 extra_topk_length)
        extra = [k for k, v in zip(_UNSUPPORTED, given) if v is not None and v is not False]
        _fail(f"dense bf16 decode only: {', '.join(extra)} (FlashMLA's fp8 and sparse attention) is not supported; "
              "call FlashMLA itself for those")
    try:  # the usual call: FlashMLA's layouts, checked from the shapes alone
        qs, ks = q.shape, k_cache.shape
        ok = (len(qs) == 4 and qs[3] == D_QK and q.dtype is torch.bfloat16 and len(ks) == 4 and ks[2] == 1
              and ks[3] == D_QK and head_dim_v == D_V and cache_seqlens is not None and block_table is not None)
    except AttributeError:
        ok = False
    if not ok:
        _check(q, k_cache, block_table, cache_seqlens, head_dim_v)
    meta = tile_scheduler_metadata
    b, s_q, h_q, _ = qs
    fold = s_q > 1 and not causal  # every row sees every key: the rows go to the kernels as heads of one row
    q_call = q.reshape(b, 1, s_q * h_q, D_QK) if fold else q
    kv = k_cache.select(2, 0)
    st = stage if isinstance(stage, Stage) or stage is None else _stages.get(stage)

    if meta is None or isinstance(meta, torch.Tensor):  # none, or FlashMLA's older tensors (not read)
        st, ns, op = _plan(st, q_call, kv, block_table)
    elif isinstance(meta, FlashMLASchedMeta):
        key = (b, s_q, h_q, ks[1], ks[2], bool(causal))
        if not meta.have_initialized:
            meta._plan = _plan(st, q_call, kv, block_table)
            meta.stage, meta.splits = meta._plan[:2]
            meta.config, meta._key = FlashMLASchedMeta.Config(*key), key
            meta.table_width, meta.have_initialized = block_table.shape[-1], True
        elif key != meta._key:
            _fail(f"this call's arguments {FlashMLASchedMeta.Config(*key)} differ from those the metadata was "
                  f"filled with {meta.config}; FlashMLA, too, takes one metadata object per set of shapes "
                  "(call get_mla_metadata() for another)")
        elif st is not None and st.id != meta.stage.id:
            _fail(f"stage {st.id!r} differs from the metadata's {meta.stage.id!r}")
        elif block_table.shape[-1] != meta.table_width:
            meta._plan = _plan(meta.stage, q_call, kv, block_table)
            meta.splits, meta.table_width = meta._plan[1], block_table.shape[-1]
        st, ns, op = meta._plan
    else:
        _fail(f"tile_scheduler_metadata must be what get_mla_metadata() returned, got {type(meta).__name__}")

    scale = float(softmax_scale) if softmax_scale is not None else D_QK ** -0.5
    out = torch.empty((b, s_q, h_q, D_V), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    if fold:
        out_call = out.view(b, 1, s_q * h_q, D_V)
        lse_call = torch.empty((b, 1, s_q * h_q), dtype=torch.float32, device=q.device)
    else:
        out_call, lse_call = out, lse.transpose(1, 2)  # FlashMLA's (b, h_q, s_q), written in place
    if op is None:  # the Triton baseline
        from .triton_baseline import triton_verify_attention

        triton_verify_attention(q_call, kv, block_table, cache_seqlens, scale, out_call, lse_call, num_splits=ns,
                                check=False)
    elif ns is not None:
        op(q_call, kv, block_table, cache_seqlens, scale, ns, out_call, lse_call)
    else:
        op(q_call, kv, block_table, cache_seqlens, scale, out_call, lse_call)
    if fold:
        lse.copy_(lse_call.view(b, s_q, h_q).transpose(1, 2))
    return out, lse
