"""The production baseline: vLLM's two-stage split-KV MLA decode design, in Triton.

A serving engine that has only a *decode* attention kernel verifies a draft of
``q_len`` tokens by turning every draft token into its own decode row: row
``(b, t)`` reads stream ``b``'s pages up to its own causal length
``kv_lens[b] - q_len + t + 1``.  The kernel never learns that the ``q_len`` rows
of a stream share almost all their keys, so it reads the shared prefix once per
row.  That repeated read is what the later chapters of this workbook remove.

The kernel itself has two stages:

1. grid (rows, head groups, splits): each program takes ``BLOCK_H`` heads of one
   row and one slice ("split") of its keys, gathers the keys through the block
   table ``BLOCK_N`` at a time, runs an online softmax, and writes the slice's
   normalized partial output and its log-sum-exp to an fp32 workspace.  Splits
   exist so that a batch with few rows still fills the GPU.
2. grid (rows, heads): merges the splits of one head by their log-sum-exp.

vLLM expands the streams into decode rows (a block-table row and a length per
row) with tensor ops before the launch.  Here the kernels derive a row's
stream, table row and causal length from ``kv_lens`` themselves: the same
arithmetic, but nothing is prepared on the host, so an eager call is just the
two launches, and a captured call follows lengths changed between replays.

Like the CUDA stages, the kernels defend themselves when the inputs were not
checked (``check=False``, a graph replay): a stream whose length is below its
draft or beyond its block table, or whose table holds a page id outside the
pool within its length, gets NaN in ``out`` and ``lse``, and nothing outside
the table or the pool is read.

Grouping heads matters for MLA: all heads read the same latent KV head, so a
program that holds 16 heads reads each key once for 16 heads, and the score
and P.V products become matrix products (``tl.dot``, tensor cores).
"""

from __future__ import annotations

import math
import os

import torch

# Without a GPU, run the kernels in Triton's interpreter (numpy on the CPU).
# The flag is read when @triton.jit decorates a function, so set it first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .problem import D_LATENT, D_QK, D_ROPE, D_V  # noqa: E402
from .stages import TRITON_DEFAULT_SPLITS as DEFAULT_SPLITS  # noqa: E402
from .validate import InputError, check_contents, check_metadata  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _teach_interpreter_bf16():
    """Make Triton's interpreter treat bf16 as the GPU does; kernels stay unchanged.

    The interpreter holds bf16 tensors as their uint16 bit patterns.  Its tl.dot
    multiplies those bits (triton-lang/triton#11584: bf16 dot "not supported
    yet"), and its fp32 -> bf16 cast truncates where the GPU rounds to nearest
    even, which doubles the rounding error of the output.  Widening bf16 dot
    operands to fp32 is exact (bf16 is the top half of an fp32).
    """
    import numpy as np
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    if getattr(builder, "_mla_lab_bf16", False):
        return
    dot, cast = builder.create_dot, builder.cast_impl

    def widen(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        bits = np.asarray(h.data).astype(np.uint32) << 16
        return interp.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, *args, **kwargs):
        return dot(self, widen(a), widen(b), d, *args, **kwargs)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return cast(self, src, dst_type)
        x = np.asarray(src.data, dtype=np.float32)
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        return interp.TensorHandle(np.where(np.isnan(x), np.uint16(0x7FC0), rounded), tl.bfloat16)

    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    builder._mla_lab_bf16 = True


if INTERPRETED:
    _teach_interpreter_bf16()

BLOCK_H = 16  # heads per program: tl.dot wants at least 16 rows
MAX_SPLITS = 1024


@triton.jit
def _split_kv_stage1(
    q_ptr, kv_ptr, table_ptr, kv_lens_ptr, ws_out_ptr, ws_lse_ptr,
    scale, q_len, num_heads, page_size, num_pages, capacity, num_splits,
    stride_qb, stride_qt, stride_qh,
    stride_kv_page, stride_kv_slot, stride_table,
    stride_wo_row, stride_wo_head, stride_wo_split,
    stride_wl_row, stride_wl_head,
    D_LAT: tl.constexpr, D_PE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    group = tl.program_id(1)
    split = tl.program_id(2)
    row64 = row.to(tl.int64)  # workspace offsets can pass 2**31 elements

    offs_h = group * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads  # padded heads load q = 0 and are never stored
    offs_d = tl.arange(0, D_LAT)
    offs_pe = D_LAT + tl.arange(0, D_PE)

    # This program's heads of q, latent and RoPE parts: [BLOCK_H, 512], [BLOCK_H, 64].
    b = row // q_len
    t = row % q_len
    q_row = q_ptr + b.to(tl.int64) * stride_qb + t.to(tl.int64) * stride_qt
    q_head = q_row + offs_h[:, None].to(tl.int64) * stride_qh
    q_lat = tl.load(q_head + offs_d[None, :], mask=mask_h[:, None], other=0.0)
    q_pe = tl.load(q_head + offs_pe[None, :], mask=mask_h[:, None], other=0.0)

    # Decode row (b, t) sees the stream's first kv_len - q_len + t + 1 keys.  A
    # stream shorter than its draft or longer than its table reads no key at
    # all (stage 2 writes its NaN).
    kv_len = tl.load(kv_lens_ptr + b)
    stream_ok = (kv_len >= q_len) & (kv_len <= capacity)
    row_len = tl.where(stream_ok, kv_len - q_len + t + 1, 0)
    table_row = table_ptr + b.to(tl.int64) * stride_table

    # This split's keys: [start, end) of the row's causal length.
    split_len = tl.cdiv(row_len, num_splits)
    start = split * split_len
    end = tl.minimum(row_len, start + split_len)

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)  # running max
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)  # running sum of exp
    acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        mask_n = pos < end
        # Gather through the block table.  Masked keys load no page id and no
        # cache value: slots past the length may hold anything (NaN, garbage).
        page = tl.load(table_row + pos // page_size, mask=mask_n, other=0)
        # A page id outside the pool is not followed: that key loads zeros and
        # its score becomes NaN, which makes the row's answer NaN.
        mask_kv = mask_n & (page >= 0) & (page < num_pages)
        bad_page = mask_n & ((page < 0) | (page >= num_pages))
        slot = pos % page_size
        # Page ids near 1e6 times a 576-element stride overflow int32.
        kv_row = kv_ptr + page.to(tl.int64) * stride_kv_page + slot.to(tl.int64) * stride_kv_slot
        # As in vLLM, K is read as a [576, BLOCK_N] tile for the score dots and V
        # as a separate [BLOCK_N, 512] tile for P.V: its interface takes K and V
        # as two tensors, so it loads them twice even though for MLA they are
        # the same bytes (the second read mostly hits L1/L2).
        k_lat = tl.load(kv_row[None, :] + offs_d[:, None], mask=mask_kv[None, :], other=0.0)
        k_pe = tl.load(kv_row[None, :] + offs_pe[:, None], mask=mask_kv[None, :], other=0.0)

        # Scores [BLOCK_H, BLOCK_N]: two dots, 512 latent + 64 RoPE dimensions.
        s = tl.dot(q_lat, k_lat)
        s += tl.dot(q_pe, k_pe)
        s = tl.where(mask_n[None, :], s * scale, float("-inf"))
        s = tl.where(bad_page[None, :], float("nan"), s)

        # Online softmax.  The first block of a split always holds a valid
        # key, so m_new is finite and exp(m_i - m_new) is never NaN.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(kv_row[:, None] + offs_d[None, :], mask=mask_kv[:, None], other=0.0)
        # P goes to bf16 so the dot runs on tensor cores (as vLLM does).
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # An empty split (start >= end) leaves m_i = -inf and l_i = 0: it writes
    # lse = -inf + log 1 = -inf and zeros, and stage 2 skips it by its lse.  A
    # NaN score (a bad page) has made l_i NaN, and log keeps it: lse = NaN.
    safe_l = tl.where(l_i > 0.0, l_i, 1.0)
    lse = m_i + tl.log(tl.where(l_i == 0.0, 1.0, l_i))
    wo = (ws_out_ptr + row64 * stride_wo_row + offs_h[:, None].to(tl.int64) * stride_wo_head
          + split * stride_wo_split + offs_d[None, :])
    tl.store(wo, acc / safe_l[:, None], mask=mask_h[:, None])
    wl = ws_lse_ptr + row64 * stride_wl_row + offs_h * stride_wl_head + split
    tl.store(wl, lse, mask=mask_h)


@triton.jit
def _split_kv_stage2(
    ws_out_ptr, ws_lse_ptr, out_ptr, lse_ptr, kv_lens_ptr,
    q_len, capacity, num_splits,
    stride_wo_row, stride_wo_head, stride_wo_split,
    stride_wl_row, stride_wl_head,
    stride_ob, stride_ot, stride_oh,
    stride_lb, stride_lt, stride_lh,
    D_LAT: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    row64 = row.to(tl.int64)
    offs_d = tl.arange(0, D_LAT)
    wo = ws_out_ptr + row64 * stride_wo_row + head * stride_wo_head + offs_d
    wl = ws_lse_ptr + row64 * stride_wl_row + head * stride_wl_head
    b = row // q_len
    t = row % q_len

    # A stream stage 1 refused, or a split that met a page id outside the pool
    # (its lse is NaN), makes the answer NaN.
    kv_len = tl.load(kv_lens_ptr + b)
    bad = (kv_len < q_len) | (kv_len > capacity)

    # out = sum_s exp(lse_s - lse) * out_s, with lse = log sum_s exp(lse_s):
    # the same online rescaling as stage 1, one split at a time.
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([D_LAT], dtype=tl.float32)
    for s in range(0, num_splits):
        lse_s = tl.load(wl + s)
        bad = bad | (lse_s != lse_s)
        if lse_s > float("-inf"):  # empty split: no keys, output not written for real
            o_s = tl.load(wo + s * stride_wo_split)
            m_new = tl.maximum(m, lse_s)
            alpha = tl.exp(m - m_new)
            beta = tl.exp(lse_s - m_new)
            acc = acc * alpha + o_s * beta
            l = l * alpha + beta
            m = m_new

    # A valid row has at least one key, so l > 0; the guard only spares a
    # refused one a division by zero.
    safe_l = tl.where(l > 0.0, l, 1.0)
    o_val = tl.where(bad, float("nan"), acc / safe_l)
    lse_val = tl.where(bad, float("nan"), m + tl.log(safe_l))
    o = out_ptr + b.to(tl.int64) * stride_ob + t.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o, o_val.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + t.to(tl.int64) * stride_lt + head * stride_lh, lse_val)


def _overlaps(t: torch.Tensor) -> bool:
    """A stride of 0 over a size > 1 (an expand()): two outputs at one address, which programs would race on."""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


def _shapes_ok(q, kv_cache, block_table, kv_lens, scale, out, lse) -> bool:
    """What the kernels' addressing relies on, and the scale, checked in a few microseconds.

    With ``check=False`` nothing else is looked at: lengths and page ids are
    the kernels' to defend (NaN), but a q of the wrong width or a ``kv_lens``
    of the wrong size would make them address memory that is not there, and a
    negative scale would give a finite wrong answer.
    """
    try:
        B, T, H, D = q.shape
        return (scale.__class__ in (float, int) and 0 < scale < math.inf and D == D_QK and q.dtype == torch.bfloat16 and q.stride(3) == 1 and B * T * H > 0
                and kv_cache.dim() == 3 and kv_cache.shape[2] == D_QK and kv_cache.dtype == torch.bfloat16
                and kv_cache.stride(2) == 1 and kv_cache.shape[0] * kv_cache.shape[1] > 0
                and block_table.dim() == 2 and block_table.shape[0] == B and block_table.shape[1] > 0
                and block_table.dtype == torch.int32 and block_table.stride(1) == 1
                and kv_lens.shape == (B,) and kv_lens.dtype == torch.int32 and kv_lens.is_contiguous()
                and (out is None or (out.shape == (B, T, H, D_V) and out.dtype == torch.bfloat16
                                     and out.stride(3) == 1 and not _overlaps(out)))
                and (lse is None or (lse.shape == (B, T, H) and lse.dtype == torch.float32 and not _overlaps(lse)))
                and q.device == kv_cache.device == block_table.device == kv_lens.device
                and (out is None or out.device == q.device) and (lse is None or lse.device == q.device))
    except (AttributeError, TypeError, ValueError):  # not tensors, or q not 4-D
        return False


def triton_verify_attention(q, kv_cache, block_table, kv_lens, scale, out=None, lse=None, *,
                            num_splits: int = DEFAULT_SPLITS, block_n: int = 32,
                            check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify attention as vLLM runs it: one decode row per draft token, split-KV.

    ``num_splits`` (default 4, vLLM's long-standing default) slices every row's
    keys; ``block_n`` keys are gathered per step.  With ``check=False`` the
    call reads no GPU memory on the host and allocates only its workspace, so
    it may be captured in a CUDA graph; shapes and dtypes are still checked
    (cheaply), and lengths and page ids are defended by the kernels (NaN).
    """
    if num_splits.__class__ is not int or not 1 <= num_splits <= MAX_SPLITS:
        raise InputError(f"triton: num_splits must be an int in 1 .. {MAX_SPLITS}, got {num_splits!r}")
    if block_n.__class__ is not int or block_n < 16 or block_n & (block_n - 1):
        raise InputError(f"triton: block_n must be a power of two >= 16 (tl.dot's minimum), got {block_n!r}")
    if check or not _shapes_ok(q, kv_cache, block_table, kv_lens, scale, out, lse):
        # the full check, for its message (or, with check=True, for the contents too)
        check_metadata(q, kv_cache, block_table, kv_lens, scale, out, lse,
                       device_type=None, align_bytes=1, name="triton")
        if check:
            check_contents(q, kv_cache, block_table, kv_lens, name="triton")
    B, T, H, _ = q.shape
    R = B * T
    if out is None:
        out = torch.empty(B, T, H, D_V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    # fp32 partials: torch.empty is safe under CUDA-graph capture (graph pool).
    ws_out = torch.empty(R, H, num_splits, D_V, dtype=torch.float32, device=q.device)
    ws_lse = torch.empty(R, H, num_splits, dtype=torch.float32, device=q.device)
    launch(q, kv_cache, block_table, kv_lens, scale, out, lse, ws_out, ws_lse, num_splits=num_splits, block_n=block_n)
    return out, lse


def launch(q, kv_cache, block_table, kv_lens, scale, out, lse, ws_out, ws_lse, *, num_splits: int,
           block_n: int = 32) -> None:
    """The two kernel launches and nothing else: every buffer given, nothing checked.

    ``ws_out`` [streams * q_len, heads, num_splits, 512] and ``ws_lse``
    [streams * q_len, heads, num_splits] are fp32 workspace.  Timing this
    against :func:`triton_verify_attention` separates Triton's own launcher
    from what the wrapper adds.
    """
    B, T, H, _ = q.shape
    R = B * T
    num_pages, page_size = kv_cache.shape[0], kv_cache.shape[1]
    # Tokens the table can address; lengths are int32, so more is the same as 2**31 - 1.
    capacity = min(block_table.shape[1] * page_size, 2**31 - 1)
    _split_kv_stage1[(R, -(-H // BLOCK_H), num_splits)](
        q, kv_cache, block_table, kv_lens, ws_out, ws_lse,
        float(scale), T, H, page_size, num_pages, capacity, num_splits,
        q.stride(0), q.stride(1), q.stride(2),
        kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
        ws_out.stride(0), ws_out.stride(1), ws_out.stride(2),
        ws_lse.stride(0), ws_lse.stride(1),
        D_LAT=D_LATENT, D_PE=D_ROPE, BLOCK_H=BLOCK_H, BLOCK_N=block_n,
        num_warps=4, num_stages=2,
    )
    _split_kv_stage2[(R, H)](
        ws_out, ws_lse, out, lse, kv_lens,
        T, capacity, num_splits,
        ws_out.stride(0), ws_out.stride(1), ws_out.stride(2),
        ws_lse.stride(0), ws_lse.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        D_LAT=D_LATENT,
    )
