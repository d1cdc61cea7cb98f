"""The problem every kernel in this workbook solves, and the paged KV cache it reads.

MLA verify attention, as a serving engine runs it when it checks a draft:

* each *stream* (a request being decoded) brings ``q_len`` query rows: the
  draft tokens plus the token that was sampled last;
* each row has ``heads`` query heads, each a 576-wide vector (512 latent
  dimensions + 64 RoPE dimensions, after the weight absorption that makes MLA
  decode cheap);
* every head of every row reads the same single latent KV head: 576 values per
  token, of which the first 512 are also the value vector;
* the draft's own keys are already in the cache, so a stream whose cache holds
  ``kv_len`` tokens has ``prefix = kv_len - q_len`` tokens before the draft, and
  query row ``t`` sees keys ``0 .. prefix + t`` (the causal mask is aligned to
  the bottom right).

Outputs: ``out[streams, q_len, heads, 512]`` (bf16) and the natural-log
log-sum-exp ``lse[streams, q_len, heads]`` (fp32) of the scaled scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

D_LATENT = 512  # latent (no-RoPE) part of q and of each cached token
D_ROPE = 64  # decoupled RoPE part
D_QK = D_LATENT + D_ROPE  # 576: width of a query head and of a cached token
D_V = D_LATENT  # the value vector is the first 512 values of the cached token

KIMI_HEADS = 64  # query heads of Kimi K2.x (and DeepSeek-V3 has 128)
KIMI_TP = 8  # tensor parallel ranks a K2.x deployment usually runs on
# Kimi K2.x's per-head query/key width before absorption is 128 (no RoPE) + 64
# (RoPE) = 192; attention scales scores by 1/sqrt(192).  Real checkpoints fold
# a YaRN factor into this, so every entry point takes the scale as an argument.
DEFAULT_SCALE = 1.0 / math.sqrt(192.0)

# What an unused block-table slot holds in poisoned workloads: a page id far
# outside any pool, so a kernel that reads it faults or returns garbage.
POISON_PAGE_ID = 1 << 30


@dataclass(frozen=True)
class Problem:
    """One verify-attention call: its shapes and its cache layout."""

    streams: int = 1
    q_len: int = 9
    heads: int = 8
    # Tokens in the cache before the draft: one int for every stream, or one
    # per stream (streams of different lengths).
    prefix: int | tuple[int, ...] = 1024
    page_size: int = 1
    scattered: bool = True  # page ids a random permutation, not 0, 1, 2, ...
    scale: float = DEFAULT_SCALE

    def __post_init__(self):
        if self.streams < 1 or self.q_len < 1 or self.heads < 1:
            raise ValueError(f"streams, q_len and heads must be >= 1, got {self}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        p = self.prefixes
        if len(p) != self.streams:
            raise ValueError(f"{len(p)} prefixes given for {self.streams} streams")
        if min(p) < 0:
            raise ValueError(f"prefix lengths must be >= 0, got {p}")

    @property
    def prefixes(self) -> tuple[int, ...]:
        if isinstance(self.prefix, int):
            return (self.prefix,) * self.streams
        return tuple(int(x) for x in self.prefix)

    @property
    def kv_lens(self) -> tuple[int, ...]:
        return tuple(p + self.q_len for p in self.prefixes)

    @property
    def pages_per_stream(self) -> tuple[int, ...]:
        return tuple(-(-n // self.page_size) for n in self.kv_lens)

    def table_width(self, spare_table_slots: int = 1) -> int:
        """The block table's columns in :func:`make_workload`: the longest stream's pages and the spare slots."""
        return max(self.pages_per_stream) + spare_table_slots

    def with_(self, **changes) -> "Problem":
        return replace(self, **changes)

    def label(self) -> str:
        pre = self.prefix if isinstance(self.prefix, int) else "/".join(map(str, self.prefix))
        lay = f"page{self.page_size}{'s' if self.scattered else 'c'}"
        return f"B{self.streams} T{self.q_len} H{self.heads} prefix{pre} {lay}"


@dataclass
class Workload:
    """The tensors of one problem: inputs as a serving engine holds them."""

    problem: Problem
    q: torch.Tensor  # [streams, q_len, heads, 576] bf16
    kv_cache: torch.Tensor  # [num_pages, page_size, 576] bf16
    block_table: torch.Tensor  # [streams, max_pages] int32
    kv_lens: torch.Tensor  # [streams] int32
    poisoned: bool = field(default=False)

    @property
    def scale(self) -> float:
        return self.problem.scale

    @property
    def device(self) -> torch.device:
        return self.q.device

    def new_outputs(self, poison: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Output buffers; NaN-filled so an element a kernel forgets to write shows."""
        B, T, H, _ = self.q.shape
        out = torch.empty(B, T, H, D_V, dtype=self.q.dtype, device=self.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=self.device)
        if poison:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
        return out, lse

    def args(self):
        """(q, kv_cache, block_table, kv_lens, scale): the order every op takes."""
        return self.q, self.kv_cache, self.block_table, self.kv_lens, self.scale


def make_workload(
    problem: Problem,
    device: str | torch.device = "cpu",
    seed: int | None = 0,
    poison: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    spare_pages: int = 2,
    spare_table_slots: int = 1,
) -> Workload:
    """Random inputs for ``problem`` in a paged cache.

    The page pool holds every stream's pages plus ``spare_pages`` that belong to
    nobody; the block table has ``spare_table_slots`` columns more than the
    longest stream needs.  With ``poison`` set, everything no kernel may read is
    made harmful: NaN in the cache slots past each stream's length and in the
    spare pages, and :data:`POISON_PAGE_ID` in every unused block-table slot.
    A kernel that reads any of it returns NaN or faults, and the tests see it.
    """
    device = torch.device(device)
    gen = torch.Generator(device="cpu")
    if seed is not None:
        gen.manual_seed(seed)
    else:
        gen.seed()

    P = problem.page_size
    need = problem.pages_per_stream
    num_pages = sum(need) + spare_pages
    width = problem.table_width(spare_table_slots)

    if problem.scattered:
        order = torch.randperm(num_pages, generator=gen)
    else:
        order = torch.arange(num_pages)
    fill = POISON_PAGE_ID if poison else 0
    block_table = torch.full((problem.streams, width), fill, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        block_table[b, :n] = order[used : used + n].to(torch.int32)
        used += n
    spare = order[used:]

    # Draw the values on the target device: a 64k-token cache is 75 MB.
    dgen = torch.Generator(device=device)
    dgen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    B, T, H = problem.streams, problem.q_len, problem.heads
    q = torch.randn(B, T, H, D_QK, generator=dgen, device=device, dtype=torch.float32).to(dtype)
    kv_cache = torch.randn(num_pages, P, D_QK, generator=dgen, device=device, dtype=torch.float32).to(dtype)

    kv_lens = torch.tensor(problem.kv_lens, dtype=torch.int32)
    if poison:
        nan = float("nan")
        for b, L in enumerate(problem.kv_lens):
            last = int(block_table[b, need[b] - 1])
            tail = L - (need[b] - 1) * P  # valid slots in the last page
            kv_cache[last, tail:] = nan
        if len(spare):
            kv_cache[spare.to(device)] = nan

    return Workload(
        problem=problem,
        q=q,
        kv_cache=kv_cache,
        block_table=block_table.to(device),
        kv_lens=kv_lens.to(device),
        poisoned=poison,
    )


def gather_kv(workload_or_cache, block_table=None, stream: int = 0, length: int | None = None,
              kv_lens=None) -> torch.Tensor:
    """The first ``length`` cached tokens of one stream, in order: [length, 576]."""
    if isinstance(workload_or_cache, Workload):
        w = workload_or_cache
        cache, block_table, kv_lens = w.kv_cache, w.block_table, w.kv_lens
    else:
        cache = workload_or_cache
    if length is None:
        length = int(kv_lens[stream])
    P = cache.shape[1]
    pos = torch.arange(length, device=cache.device)
    pages = block_table[stream].to(cache.device).long()[pos // P]
    return cache[pages, pos % P]
