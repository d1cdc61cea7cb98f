"""Part II's stages (8-9): the draft's rows sharing each key tile, and the (row, head) pairs as one
tensor-core product."""

from __future__ import annotations

import math

import torch

from ..core import stages as _stages
from ..core.problem import D_QK, D_V, Workload

from .common import BF16, DOTS, FP32, Traffic, _combine, _kv_rows, split_length


def model_shared_rows(w: Workload, num_splits: int | None = None):
    """Stage 8: a block per (head, group of up to 16 rows, split); each key tile serves every row."""
    st = _stages.get("shared_rows")
    B, T, H, _ = w.q.shape
    S = num_splits or 1
    R = st.rows_per_block
    out = torch.empty(B, T, H, D_V)
    lse = torch.empty(B, T, H)
    tr = Traffic()
    for b in range(B):
        L = int(w.kv_lens[b])
        per_split = split_length(L, S, st.keys_per_tile)
        for h in range(H):
            parts = {t: [] for t in range(T)}
            for t0 in range(0, T, R):
                rows = list(range(t0, min(t0 + R, T)))
                n_row = torch.tensor([L - T + t + 1 for t in rows])  # keys each row sees
                for split in range(S):
                    begin, end = split * per_split, min(int(n_row.max()), (split + 1) * per_split)
                    if begin >= end:  # no row sees a key here
                        for t in rows:
                            parts[t].append(None)
                        tr.add("partial lse", FP32 * len(rows))
                        continue
                    q = w.q[b, rows, h].float()  # [nr, 576]
                    tr.add("q", BF16 * D_QK * len(rows))
                    m = torch.full((len(rows),), -math.inf)
                    l = torch.zeros(len(rows))
                    acc = torch.zeros(len(rows), D_V)
                    for key0 in range(begin, end, st.keys_per_tile):
                        keys = torch.arange(key0, min(key0 + st.keys_per_tile, end))
                        kv = _kv_rows(w, b, keys, tr)  # staged once for every row
                        s = DOTS["shared_rows"](q[:, None, :], kv[None, :, :]) * w.scale
                        s = s.masked_fill(keys[None, :] >= n_row[:, None], -math.inf)
                        m_new = torch.maximum(m, s.max(-1).values)
                        m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                        alpha = torch.exp(m - m_use)
                        p = torch.exp(s - m_use[:, None])
                        l = l * alpha + p.sum(-1)
                        acc = acc * alpha[:, None] + p @ kv[:, :D_V]
                        m = m_new
                    for i, t in enumerate(rows):
                        tr.add("partial lse", FP32)
                        if l[i] == 0:  # this row's keys end before the split
                            parts[t].append(None)
                            continue
                        parts[t].append((acc[i] / l[i], m[i] + torch.log(l[i])))
                        tr.add("partial out", FP32 * D_V)
            for t in range(T):
                _combine(out, lse, tr, b, t, h, parts[t], S)
    return out, lse, tr


def _pair_tiles(st, L: int, T: int, H: int, S: int):
    """Stage 9's blocks of one stream: (pairs [(t, h)], keys each pair sees, split, key range)."""
    per_split = split_length(L, S, st.keys_per_tile)
    pairs = [(t, h) for t in range(T) for h in range(H)]  # row-major, head fastest
    for p0 in range(0, len(pairs), st.pair_tile):
        tile = pairs[p0:p0 + st.pair_tile]
        n = [L - T + t + 1 for t, _ in tile]
        for split in range(S):
            begin = split * per_split
            yield tile, n, split, begin, min(max(n), begin + per_split)


def model_tensor_core(w: Workload, num_splits: int | None = None, round_p: bool = True):
    """Stage 9: a block per 16 (row, head) pairs and split; S = Q K^T and O += P V as matrix products.

    What the tensor cores change in the numbers: the products take bf16 operands
    with fp32 sums, so P is rounded to bf16 before it multiplies V (its fp32 sum
    l is not); the softmax runs in base 2 on scores pre-multiplied by log2(e).
    ``round_p=False`` keeps P in fp32, which leaves only the order of the sums
    different from the reference.
    """
    st = _stages.get("tensor_core")
    B, T, H, _ = w.q.shape
    S = num_splits or 1
    out = torch.empty(B, T, H, D_V)
    lse = torch.empty(B, T, H)
    tr = Traffic()
    log2e = 1.0 / math.log(2.0)
    for b in range(B):
        L = int(w.kv_lens[b])
        parts = {(t, h): [] for t in range(T) for h in range(H)}
        for tile, n, split, begin, end in _pair_tiles(st, L, T, H, S):
            tr.add("partial lse", FP32 * len(tile))
            if begin >= end:  # no pair of the tile sees a key here
                for pr in tile:
                    parts[pr].append(None)
                continue
            q = torch.stack([w.q[b, t, h] for t, h in tile]).float()  # bf16 values, held exactly
            tr.add("q", BF16 * D_QK * len(tile))
            lens = torch.tensor([min(x, end) for x in n])
            m = torch.full((len(tile),), -math.inf)
            l = torch.zeros(len(tile))
            acc = torch.zeros(len(tile), D_V)
            for key0 in range(begin, end, st.keys_per_tile):
                keys = torch.arange(key0, min(key0 + st.keys_per_tile, end))
                kv = _kv_rows(w, b, keys, tr)
                s = (q @ kv.T) * (w.scale * log2e)
                s = s.masked_fill(keys[None, :] >= lens[:, None], -math.inf)
                m_new = torch.maximum(m, s.max(-1).values)
                m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                alpha = torch.exp2(m - m_use)
                p = torch.exp2(s - m_use[:, None])
                l = l * alpha + p.sum(-1)
                p_v = p.bfloat16().float() if round_p else p
                acc = acc * alpha[:, None] + p_v @ kv[:, :D_V]
                m = m_new
            for i, pr in enumerate(tile):
                if l[i] == 0:  # this pair's keys end before the split
                    parts[pr].append(None)
                    continue
                parts[pr].append((acc[i] / l[i], (m[i] + torch.log2(l[i])) * math.log(2.0)))
                tr.add("partial out", FP32 * D_V)
        for t in range(T):
            for h in range(H):
                _combine(out, lse, tr, b, t, h, parts[(t, h)], S)
    return out, lse, tr


