"""What every stage's model shares: the byte counter, the ways a dot product is split over threads,
the block-table lookup, the split lengths and the combine kernel's merge."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..core.problem import D_QK, D_V, Workload

BF16, FP32, INT32 = 2, 4, 4


@dataclass
class Traffic:
    """Bytes one launch (or several) moves through global memory, by what they are."""

    parts: dict = field(default_factory=dict)

    def add(self, what: str, nbytes: int) -> None:
        self.parts[what] = self.parts.get(what, 0) + int(nbytes)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def __add__(self, other: "Traffic") -> "Traffic":
        t = Traffic(dict(self.parts))
        for k, v in other.parts.items():
            t.add(k, v)
        return t


# ---- the ways a 576-long dot product is split over threads --------------------

def dot_serial(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """One thread, one element at a time (stages 1-4)."""
    return (q * k).sum(-1)


def dot_warp(q: torch.Tensor, k: torch.Tensor, lanes: int = 32) -> torch.Tensor:
    """Stage 5: lane l sums elements l, l+32, ...; then an xor-shuffle butterfly adds the 32 partials."""
    prod = q * k
    prod = prod.reshape(*prod.shape[:-1], -1, lanes)  # [..., 18, 32]: row i holds elements 32 i .. 32 i + 31
    partial = prod.sum(-2)  # [..., 32]: lane l's sum
    offset = lanes // 2
    while offset:
        partial = partial + partial[..., torch.arange(lanes) ^ offset]
        offset //= 2
    return partial[..., 0]


def dot_chunks16(q: torch.Tensor, k: torch.Tensor, lanes: int = 32) -> torch.Tensor:
    """Stage 6: lane l takes 16-byte chunks (8 bf16) l, l+32, l+64; then the butterfly."""
    prod = q * k
    prod = prod.reshape(*prod.shape[:-1], D_QK // 8, 8).sum(-1)  # [..., 72] one sum per chunk
    pad = torch.zeros(*prod.shape[:-1], 3 * lanes - prod.shape[-1], dtype=prod.dtype)
    partial = torch.cat([prod, pad], -1).reshape(*prod.shape[:-1], 3, lanes).sum(-2)
    offset = lanes // 2
    while offset:
        partial = partial + partial[..., torch.arange(lanes) ^ offset]
        offset //= 2
    return partial[..., 0]


DOTS = {"naive": dot_serial, "flash_ht8": dot_serial, "kv_split": dot_serial, "per_head": dot_serial,
        "warp_per_key": dot_warp, "float4": dot_chunks16, "shared_rows": dot_chunks16}


def _kv_rows(w: Workload, b: int, keys: torch.Tensor, traffic: Traffic, width: int = D_QK) -> torch.Tensor:
    """Look keys up through the block table (4 bytes each) and read ``width`` values of each."""
    P = w.kv_cache.shape[1]
    pages = w.block_table[b].long()[keys // P]
    traffic.add("block table", INT32 * len(keys))
    traffic.add("kv", BF16 * width * len(keys))
    return w.kv_cache[pages, keys % P, :width].float()


def split_length(kv_len: int, num_splits: int, keys_per_tile: int) -> int:
    """Keys per split of a stream: ceil(kv_len / num_splits) rounded up to whole tiles (as the kernels do)."""
    return -(-(-(-kv_len // num_splits)) // keys_per_tile) * keys_per_tile


def _combine_traffic(tr: Traffic, S: int, H: int, live: int) -> None:
    """Closed form of the combine kernel for one (stream, row) over H heads: S lse, ``live`` partials, out."""
    tr.add("combine reads lse", FP32 * S * H)
    tr.add("combine reads partial out", FP32 * D_V * live * H)
    tr.add("out", BF16 * D_V * H)
    tr.add("lse", FP32 * H)


def _combine(out, lse, tr: Traffic, b: int, t: int, h: int, parts: list, S: int) -> None:
    """The combine kernel for one (stream, row, head): all lse_s, then the live o_s."""
    tr.add("combine reads lse", FP32 * S)
    live = [pt for pt in parts if pt is not None]
    tr.add("combine reads partial out", FP32 * D_V * len(live))
    mx = max(float(ls) for _, ls in live)
    wts = torch.tensor([math.exp(float(ls) - mx) for _, ls in live])
    out[b, t, h] = sum(wt * o for wt, (o, _) in zip(wts, live)) / wts.sum()
    lse[b, t, h] = mx + math.log(float(wts.sum()))
    tr.add("out", BF16 * D_V)
    tr.add("lse", FP32)

