"""Calling the stages: one entry point for every rung of the ladder.

``attention(stage, q, kv_cache, block_table, kv_lens, scale)`` runs any stage
of the registry and returns ``(out, lse)``.  It checks its inputs first (the
contents too, which costs a host sync); ``check=False`` skips that, for
timing loops and CUDA-graph capture, where the kernels' own defences remain:
a stream with a bad length or page id gets NaN, never a stray read.

The CUDA stages are also plain torch ops, ``torch.ops.mla_lab.<stage>``, that
write into given ``out`` and ``lse``.  They exist once the extension is
loaded: :func:`load_ops` (also ``mla_lab.load_ops()``) builds it if needed,
loads it and registers the ops' fake implementations, so that they trace
under ``torch.compile``.  ``attention`` and ``runner`` call it themselves.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from . import extension as _extension
from . import stages as _stages
from .problem import D_V, DEFAULT_SCALE, Workload
from .stages import Stage
from .validate import InputError, check_contents, check_metadata

_FAKES_REGISTERED = False


def load_ops():
    """Build (first time) and load the extension; afterwards ``torch.ops.mla_lab.<stage>`` exist.

    Returns the extension module (its helpers: ``stage_ids``, ``launch_geometry``, ...).
    Cheap after the first call.
    """
    mod = _extension.load()
    register_fakes()
    return mod


extension = load_ops  # the name the chapters and tests use


def register_fakes() -> None:
    """Shape-only implementations of the ops, for meta/fake tensors (torch.compile)."""
    global _FAKES_REGISTERED
    if _FAKES_REGISTERED:
        return
    for st in _stages.cuda_stages():
        def fake(q, kv_cache, block_table, kv_lens, scale, *rest, _st=st):
            num_splits, out, lse = rest if _st.splits else (1, *rest)
            check_metadata(q, kv_cache, block_table, kv_lens, scale, out, lse, device_type=None,
                           align_bytes=1, name=f"mla_lab::{_st.id}")
            if _st.splits and not 1 <= num_splits <= _stages.MAX_SPLITS:
                raise ValueError(f"mla_lab::{_st.id}: num_splits must be in 1..{_stages.MAX_SPLITS}, got {num_splits}")
            return None

        torch.library.register_fake(st.op_name)(fake)
    _FAKES_REGISTERED = True


def _as_stage(stage: str | Stage) -> Stage:
    return stage if isinstance(stage, Stage) else _stages.get(stage)


def _check_splits(st: Stage, num_splits) -> None:
    """``None`` means "the stage's rule"; anything else must be a count the stage accepts."""
    if num_splits is None:
        return
    from .triton_baseline import MAX_SPLITS as TRITON_MAX
    most = TRITON_MAX if st.kind == "triton" else _stages.MAX_SPLITS
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 1 <= num_splits <= most:
        raise InputError(f"{st.id}: num_splits must be an int in 1..{most} (or None for the stage's rule), "
                         f"got {num_splits!r}")


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def resident_blocks(stage_id: str, dynamic_smem_bytes: int, device_index: int) -> int:
    """Blocks of the stage's main kernel one SM holds, as the CUDA runtime says."""
    st = _stages.get(stage_id)
    return load_ops().runtime_occupancy(st.id, st.kernel, dynamic_smem_bytes)


def default_num_splits(stage: str | Stage, q: torch.Tensor, kv_cache: torch.Tensor,
                       block_table: torch.Tensor) -> int:
    """The split count of :func:`stages.choose_num_splits` for this call's GPU.

    The longest stream is bounded by the block table (``max_pages x
    page_size``), which the host knows without reading the GPU.
    """
    st = _as_stage(stage)
    if not st.splits:
        return 1
    B, T, H, _ = q.shape
    max_pages, page_size = block_table.shape[1], kv_cache.shape[1]
    smem = st.smem_bytes(max_pages, page_size)
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return _stages.choose_num_splits(st, B, T, H, max_pages * page_size, _sm_count(dev),
                                     resident_blocks(st.id, smem, dev))


# The split count of a split stage, per stage, device and shape.  Working it
# out (device properties, the runtime's occupancy answer) costs more than the
# launch, so a decode loop pays for it once.  It depends on the block table's
# width, not on the lengths, so a captured call stays right when they change.
_SPLITS: dict = {}


def _default_splits_cached(st: Stage, q: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor) -> int:
    if not q.is_cuda:  # only reached by tests (the op refuses CPU tensors): nothing worth caching
        return default_num_splits(st, q, kv_cache, block_table)
    key = (st.id, q.device, q.shape, block_table.shape[1], kv_cache.shape[1])
    ns = _SPLITS.get(key)
    if ns is None:
        ns = _SPLITS[key] = default_num_splits(st, q, kv_cache, block_table)
    return ns


_triton_attention = None  # the Triton baseline's entry point, imported on first use (it imports triton)
_extension_loaded = None  # the extension, once attention() has loaded it


def _load_once() -> None:
    global _extension_loaded
    _extension_loaded = load_ops()


def attention(stage: str | Stage, q, kv_cache, block_table, kv_lens, scale: float = DEFAULT_SCALE, *,
              out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
              num_splits: int | None = None, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify attention with one stage of the ladder; returns ``(out, lse)``.

    ``q`` [streams, q_len, heads, 576] bf16, ``kv_cache`` [pages, page_size, 576] bf16,
    ``block_table`` [streams, max_pages] int32, ``kv_lens`` [streams] int32 (the draft
    included).  ``out`` [streams, q_len, heads, 512] bf16 and ``lse`` [streams, q_len,
    heads] fp32 (natural log) are allocated unless given.  ``num_splits`` applies to
    the split stages and the Triton baseline (default: the stage's own rule, 4 for
    Triton).  The CUDA stages need CUDA tensors (CPU ones raise :class:`InputError`);
    ``"triton"`` also runs on CPU tensors, in Triton's interpreter.
    """
    st = stage if isinstance(stage, Stage) else _stages.get(stage)
    if num_splits is not None:
        _check_splits(st, num_splits)
    if check:
        check_metadata(q, kv_cache, block_table, kv_lens, scale, out, lse,
                       device_type="cuda" if st.is_cuda else None,
                       align_bytes=st.align_bytes if st.is_cuda else 1, name=st.id)
        check_contents(q, kv_cache, block_table, kv_lens, name=st.id)
    if st.kind == "triton":
        global _triton_attention
        if _triton_attention is None:
            from .triton_baseline import triton_verify_attention as _triton_attention
        # it allocates out and lse itself, and checks shapes cheaply even unchecked
        return _triton_attention(q, kv_cache, block_table, kv_lens, scale, out, lse,
                                 num_splits=num_splits or _stages.TRITON_DEFAULT_SPLITS, check=False)
    if out is None:
        out = q.new_empty((*q.shape[:3], D_V))
    if lse is None:
        lse = q.new_empty(q.shape[:3], dtype=torch.float32)
    if _extension_loaded is None:
        _load_once()
    op = getattr(torch.ops.mla_lab, st.id)
    if st.splits:
        if num_splits is None:
            num_splits = _default_splits_cached(st, q, kv_cache, block_table)
        op(q, kv_cache, block_table, kv_lens, float(scale), num_splits, out, lse)
    else:
        op(q, kv_cache, block_table, kv_lens, float(scale), out, lse)
    return out, lse


def runner(stage: str | Stage, w: Workload, *, num_splits: int | None = None,
           out: torch.Tensor | None = None, lse: torch.Tensor | None = None) -> Callable[[], None]:
    """A no-argument call of ``stage`` on ``w`` for timing loops and graph capture.

    Everything a call can prepare ahead is prepared here (outputs, the split
    count), so the call itself only launches kernels: no allocation but the
    split scratch, no host sync.  ``call.num_splits`` is the split count it
    launches with (``None`` for a stage without splits).
    """
    st = _as_stage(stage)
    _check_splits(st, num_splits)
    if out is None or lse is None:
        out, lse = w.new_outputs(poison=True)
    args = w.args()
    if st.kind == "triton":
        from .triton_baseline import DEFAULT_SPLITS, triton_verify_attention

        ns = num_splits or DEFAULT_SPLITS  # 0 was rejected by _check_splits

        def call():
            triton_verify_attention(*args, out, lse, num_splits=ns, check=False)
    else:
        load_ops()
        op = getattr(torch.ops.mla_lab, st.id)
        if st.splits:
            ns = int(num_splits if num_splits is not None else default_num_splits(st, w.q, w.kv_cache, w.block_table))
            scale = float(w.scale)

            def call():
                op(w.q, w.kv_cache, w.block_table, w.kv_lens, scale, ns, out, lse)
        else:
            scale = float(w.scale)

            def call():
                op(w.q, w.kv_cache, w.block_table, w.kv_lens, scale, out, lse)
    call.out, call.lse = out, lse  # type: ignore[attr-defined]
    call.num_splits = ns if st.takes_num_splits else None  # type: ignore[attr-defined]
    return call
