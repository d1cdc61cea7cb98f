"""Part I's stages (1-6, the article's ladder): the naive kernel and the tiled flash kernel."""

from __future__ import annotations

import math

import torch

from ..core import stages as _stages
from ..core.problem import D_QK, D_V, Workload

from .common import BF16, DOTS, FP32, Traffic, _combine, _kv_rows, dot_serial, split_length


# ---- stage 1 ------------------------------------------------------------------

def model_naive(w: Workload, num_splits: int | None = None):
    """Per (head, row, stream): all scores, softmax, then every key again for V."""
    B, T, H, _ = w.q.shape
    out = torch.empty(B, T, H, D_V)
    lse = torch.empty(B, T, H)
    tr = Traffic()
    for b in range(B):
        L = int(w.kv_lens[b])
        for t in range(T):
            n = L - T + t + 1
            keys = torch.arange(n)
            for h in range(H):
                q = w.q[b, t, h].float()
                tr.add("q", BF16 * D_QK)
                k = _kv_rows(w, b, keys, tr)  # phase 1: every key, whole row
                s = dot_serial(q[None, :], k) * w.scale
                m = s.max()
                p = torch.exp(s - m)
                l = p.sum()
                v = _kv_rows(w, b, keys, tr, width=D_V)  # phase 3: every key again, V only
                out[b, t, h] = (p[:, None] * v).sum(0) / l
                lse[b, t, h] = m + torch.log(l)
                tr.add("out", BF16 * D_V)
                tr.add("lse", FP32)
    return out, lse, tr


# ---- stages 2-6: the tiled flash kernel ---------------------------------------

def _flash_block(w: Workload, st, b: int, t: int, heads: range, key_begin: int, key_end: int,
                 tr: Traffic, dot):
    """One block of a tiled stage: online softmax over [key_begin, key_end) in tiles.

    Returns the unnormalised accumulator, the running max and the running sum
    for each head of the block.
    """
    nh = len(heads)
    q = w.q[b, t, heads.start:heads.stop].float()  # [nh, 576]
    tr.add("q", BF16 * D_QK * nh)
    m = torch.full((nh,), -math.inf)
    l = torch.zeros(nh)
    acc = torch.zeros(nh, D_V)
    for key0 in range(key_begin, key_end, st.keys_per_tile):
        keys = torch.arange(key0, min(key0 + st.keys_per_tile, key_end))
        kv = _kv_rows(w, b, keys, tr)  # the tile, staged once for all heads of the block
        s = dot(q[:, None, :], kv[None, :, :]) * w.scale  # [nh, n]
        m_new = torch.maximum(m, s.max(-1).values)
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[:, None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[:, None] + p @ kv[:, :D_V]
        m = m_new
    return acc, m, l


def model_tiled(stage_id: str):
    st = _stages.get(stage_id)
    dot = DOTS[stage_id]

    def model(w: Workload, num_splits: int | None = None):
        B, T, H, _ = w.q.shape
        S = (num_splits or 1) if st.splits else 1
        out = torch.empty(B, T, H, D_V)
        lse = torch.empty(B, T, H)
        tr = Traffic()
        for b in range(B):
            L = int(w.kv_lens[b])
            # split boundaries: whole tiles, the same for every row of the stream
            per_split = split_length(L, S, st.keys_per_tile)
            for t in range(T):
                n = L - T + t + 1
                for h0 in range(0, H, st.head_tile):
                    heads = range(h0, min(h0 + st.head_tile, H))
                    parts = []
                    for split in range(S):
                        begin, end = split * per_split, min(n, (split + 1) * per_split)
                        if begin >= end:
                            parts.append(None)  # writes lse = -inf only
                            if st.splits:
                                tr.add("partial lse", FP32 * len(heads))
                            continue
                        acc, m, l = _flash_block(w, st, b, t, heads, begin, end, tr, dot)
                        parts.append((acc / l[:, None], m + torch.log(l)))
                        if st.splits:
                            tr.add("partial out", FP32 * D_V * len(heads))
                            tr.add("partial lse", FP32 * len(heads))
                    if not st.splits:
                        o, ls = parts[0]
                        out[b, t, heads.start:heads.stop], lse[b, t, heads.start:heads.stop] = o, ls
                        tr.add("out", BF16 * D_V * len(heads))
                        tr.add("lse", FP32 * len(heads))
                        continue
                    # the combine kernel, one block per (row, head)
                    for i, h in enumerate(heads):
                        _combine(out, lse, tr, b, t, h, [None if pt is None else (pt[0][i], pt[1][i])
                                                         for pt in parts], S)
        return out, lse, tr

    model.__name__ = f"model_{stage_id}"
    model.__doc__ = f"CPU model of stage {stage_id}: {st.adds}"
    return model


