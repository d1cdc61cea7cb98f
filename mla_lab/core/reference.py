"""The fp32 reference every kernel is held to (stage 0 of the ladder).

Plain PyTorch through the block table, on whatever device the inputs are on.
Keys are taken in chunks with an online softmax, so that a 64k-token prefix at
64 heads needs a few hundred MB, not the 2.4 GB of a full score matrix.
"""

from __future__ import annotations

import torch

from .problem import D_V, Workload
from .validate import check_contents, check_metadata


def reference_attention(q, kv_cache, block_table, kv_lens, scale, *,
                        precision: torch.dtype = torch.float32, chunk: int = 4096,
                        check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify attention in ``precision`` (fp32, or fp64 on request).

    Returns ``(out, lse)``: ``out[streams, q_len, heads, 512]`` and the natural-log
    ``lse[streams, q_len, heads]``, both in ``precision``.
    """
    if check:
        check_metadata(q, kv_cache, block_table, kv_lens, scale, device_type=None,
                       align_bytes=1, name="reference_attention")
        check_contents(q, kv_cache, block_table, kv_lens, name="reference_attention")
    B, T, H, _ = q.shape
    P = kv_cache.shape[1]
    dev = q.device
    out = torch.empty(B, T, H, D_V, dtype=precision, device=dev)
    lse = torch.empty(B, T, H, dtype=precision, device=dev)
    rows = torch.arange(T, device=dev)
    for b, L in enumerate(kv_lens.tolist()):
        prefix = L - T
        qb = q[b].to(precision)  # [T, H, 576]
        m = torch.full((T, H), float("-inf"), dtype=precision, device=dev)
        l = torch.zeros(T, H, dtype=precision, device=dev)
        acc = torch.zeros(T, H, D_V, dtype=precision, device=dev)
        table = block_table[b].to(dev).long()
        for start in range(0, L, chunk):
            pos = torch.arange(start, min(L, start + chunk), device=dev)
            kv = kv_cache[table[pos // P], pos % P].to(precision)  # [C, 576]
            s = torch.einsum("thd,cd->thc", qb, kv) * scale
            visible = pos[None, :] <= (prefix + rows)[:, None]  # [T, C]
            s = s.masked_fill(~visible[:, None, :], float("-inf"))
            # Key 0 is visible to every row and sits in the first chunk, so m is
            # finite from the first chunk on and exp(m - m_new) is never NaN.
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + torch.einsum("thc,cd->thd", p, kv[:, :D_V])
            m = m_new
        out[b] = acc / l[..., None]
        lse[b] = m + torch.log(l)
    return out, lse


def reference_for(workload: Workload, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    return reference_attention(*workload.args(), **kw)


def dense_attention_fp64(q, kv_cache, block_table, kv_lens, scale):
    """The textbook formula, whole score matrix at once, in fp64: for tiny checks only."""
    B, T, H, _ = q.shape
    P = kv_cache.shape[1]
    outs, lses = [], []
    for b in range(B):
        L = int(kv_lens[b])
        pos = torch.arange(L)
        kv = kv_cache.cpu()[block_table[b].cpu().long()[pos // P], pos % P].double()
        s = torch.einsum("thd,cd->thc", q[b].cpu().double(), kv) * scale
        mask = pos[None, :] > (L - T + torch.arange(T))[:, None]
        s[mask[:, None, :].expand_as(s)] = float("-inf")
        outs.append(torch.softmax(s, dim=-1) @ kv[:, :D_V])
        lses.append(torch.logsumexp(s, dim=-1))
    return torch.stack(outs), torch.stack(lses)
