"""Input checks with messages that say what was expected and what came.

Two levels:

* :func:`check_metadata` looks only at shapes, dtypes, strides, alignment,
  devices and the scale: what a launch can check without reading GPU memory.
  The compiled ops make the same checks in C++ (``csrc/bindings.cpp``); this
  Python copy serves the reference, the Triton baseline and the ops' fake
  (meta) implementations.
* :func:`check_contents` reads the block table and the lengths (a host sync)
  and rejects a length beyond the cache, a stream shorter than its draft, or a
  page id outside the pool.  The public entry points run it unless told not to;
  a CUDA-graph replay cannot, and there the kernels defend themselves: a stream
  with a bad length or page id gets NaN in its output, never a stray read.
"""

from __future__ import annotations

import math

import torch

from .problem import D_QK, D_V


class InputError(ValueError):
    """A verify-attention input that no kernel should be given."""


def _fail(msg: str):
    raise InputError(msg)


def _desc(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


def check_metadata(q, kv_cache, block_table, kv_lens, scale, out=None, lse=None,
                   *, device_type: str | None = "cuda", align_bytes: int = 4,
                   name: str = "mla_lab") -> None:
    """Check everything about the arguments that needs no look at their contents."""
    for arg, label in ((q, "q"), (kv_cache, "kv_cache"), (block_table, "block_table"), (kv_lens, "kv_lens")):
        if not isinstance(arg, torch.Tensor):
            _fail(f"{name}: {label} must be a torch.Tensor, got {type(arg).__name__}")

    if q.dim() != 4 or q.shape[-1] != D_QK:
        _fail(f"{name}: q must be [streams, q_len, heads, {D_QK}], got {_desc(q)}")
    B, T, H, _ = q.shape
    if B == 0 or T == 0 or H == 0:
        _fail(f"{name}: empty batch: q is {_desc(q)}; streams, q_len and heads must all be >= 1")
    if q.dtype != torch.bfloat16:
        _fail(f"{name}: q must be bfloat16, got {q.dtype}")
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != D_QK:
        _fail(f"{name}: kv_cache must be [num_pages, page_size, {D_QK}], got {_desc(kv_cache)}")
    if kv_cache.shape[0] == 0 or kv_cache.shape[1] == 0:
        _fail(f"{name}: kv_cache is empty: {_desc(kv_cache)}")
    if kv_cache.dtype != torch.bfloat16:
        _fail(f"{name}: kv_cache must be bfloat16, got {kv_cache.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != B:
        _fail(f"{name}: block_table must be [streams={B}, max_pages], got {_desc(block_table)}")
    if block_table.shape[1] == 0:
        _fail(f"{name}: block_table has no columns: {_desc(block_table)}")
    if block_table.dtype != torch.int32:
        _fail(f"{name}: block_table must be int32, got {block_table.dtype}")
    if kv_lens.dim() != 1 or kv_lens.shape[0] != B:
        _fail(f"{name}: kv_lens must be [streams={B}], got {_desc(kv_lens)}")
    if kv_lens.dtype != torch.int32:
        _fail(f"{name}: kv_lens must be int32, got {kv_lens.dtype}")

    if q.stride(-1) != 1:
        _fail(f"{name}: q's last dimension must be contiguous (stride 1), got strides {q.stride()}")
    if kv_cache.stride(-1) != 1:
        _fail(f"{name}: kv_cache's last dimension must be contiguous, got strides {kv_cache.stride()}")
    if block_table.stride(-1) != 1:
        _fail(f"{name}: block_table's rows must be contiguous, got strides {block_table.stride()}")
    if not kv_lens.is_contiguous():
        _fail(f"{name}: kv_lens must be contiguous, got strides {kv_lens.stride()}")

    if out is not None:
        if out.shape != (B, T, H, D_V) or out.dtype != torch.bfloat16:
            _fail(f"{name}: out must be [{B}, {T}, {H}, {D_V}] bfloat16, got {_desc(out)}")
        if out.stride(-1) != 1:
            _fail(f"{name}: out's last dimension must be contiguous, got strides {out.stride()}")
    if lse is not None:
        if lse.shape != (B, T, H) or lse.dtype != torch.float32:
            _fail(f"{name}: lse must be [{B}, {T}, {H}] float32, got {_desc(lse)}")
    # An output view that maps two elements to one address (a stride of 0, as
    # expand() makes) would have blocks race to write it: a silent wrong answer.
    for t, label in ((out, "out"), (lse, "lse")):
        if t is not None and any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride())):
            _fail(f"{name}: {label} must not have overlapping elements (a stride of 0 over a size > 1), "
                  f"got shape {tuple(t.shape)} with strides {t.stride()}")

    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        _fail(f"{name}: scale must be a finite positive number, got {scale!r}")

    # Rows of q, of the cache and of out are read and written in units of
    # align_bytes; a view that starts or steps off that grid would fault.
    elems = align_bytes // 2
    for t, label in ((q, "q"), (kv_cache, "kv_cache"), (out, "out")):
        if t is None or elems <= 1 or t.device.type == "meta":
            continue
        if t.data_ptr() % align_bytes or any(s % elems for s in t.stride()[:-1]):
            _fail(f"{name}: {label} must start on a {align_bytes}-byte boundary and have strides that are "
                  f"multiples of {elems} elements (data_ptr % {align_bytes} = {t.data_ptr() % align_bytes}, "
                  f"strides {t.stride()})")

    devices = {t.device for t in (q, kv_cache, block_table, kv_lens, out, lse) if t is not None}
    if len(devices) != 1:
        _fail(f"{name}: all tensors must be on one device, got {sorted(map(str, devices))}")
    dev = devices.pop()
    if device_type is not None and dev.type not in (device_type, "meta"):
        hint = ("; without a GPU, stage 'triton' runs in Triton's interpreter and mla_lab.reference_attention gives "
                "the fp32 answer") if device_type == "cuda" and dev.type == "cpu" else ""
        _fail(f"{name}: needs {device_type} tensors, got tensors on {dev}{hint}")


def check_contents(q, kv_cache, block_table, kv_lens, *, name: str = "mla_lab") -> None:
    """Check the lengths and the page ids a call would use (reads them: a host sync)."""
    B, T = q.shape[0], q.shape[1]
    num_pages, P = kv_cache.shape[0], kv_cache.shape[1]
    cap = block_table.shape[1] * P
    lens = kv_lens.detach().to("cpu", torch.int64)
    bad = (lens < T).nonzero().flatten().tolist()
    if bad:
        b = bad[0]
        _fail(f"{name}: stream {b} has kv_len {int(lens[b])} < q_len {T}: the draft's own keys "
              f"must already be in the cache")
    bad = (lens > cap).nonzero().flatten().tolist()
    if bad:
        b = bad[0]
        _fail(f"{name}: stream {b} has kv_len {int(lens[b])}, beyond its block table's capacity "
              f"{block_table.shape[1]} pages x {P} = {cap} tokens")
    table = block_table.detach().to("cpu", torch.int64)
    used = (lens + P - 1) // P  # pages each stream uses
    cols = torch.arange(table.shape[1])
    mask = cols[None, :] < used[:, None]
    ids = table[mask]
    out_of_range = (ids < 0) | (ids >= num_pages)
    if bool(out_of_range.any()):
        where = mask.nonzero()[out_of_range.nonzero().flatten()[0]].tolist()
        _fail(f"{name}: block_table[{where[0]}, {where[1]}] = {int(table[where[0], where[1]])} is not a page "
              f"of the pool (0 .. {num_pages - 1})")
