"""A model-level verify step: a stack of MLA decoder layers that calls any stage.

The kernels of this workbook compute one thing, attention over the absorbed
latent cache.  A serving engine's verify step does much more around it, in
every layer; this module writes that out at Kimi K2.x's sizes under
tensor parallelism over 8 GPUs (one rank's share of the heads), so that the
attention kernels can be compared by the time of a whole step:

    x ─ RMSNorm ─┬─ W_DQ ─ RMSNorm ─ W_UQ ─┬─ q_nope ─ ·W_UK (absorbed) ─┐
                 │                          └─ q_pe ─ RoPE ───────────────┴─ q [576]
                 └─ W_DKV ─┬─ RMSNorm ─────── c [512] ─┐
                           └─ RoPE ────────── k_pe [64] ┴─ append to the paged cache
    attention(q, cache) [512] ─ ·W_UV (absorbed) ─ W_O ─ + x

Absorbing W_UK into the query and W_UV into the output is what makes every
head read the same 576-wide latent row: score = (q_nope W_UK_h) · c + q_pe · k_pe
and out_h = (softmax · c) W_UV_h.  The MoE/MLP half of each layer is left
out: it does not touch the cache, so it adds the same time to every stage's
step (:func:`moe_bytes_per_step` gives its size by arithmetic); it lowers the
ratio between stages but cannot change which one wins.

:class:`ModelStep` runs the stack eagerly or as one captured CUDA graph per
step.  :func:`reference_layer` is the same layer written plainly in fp32
without absorption or paging, for the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from ..core.paging import append_slots
from ..core.problem import D_LATENT, D_QK, D_ROPE, D_V


@dataclass(frozen=True)
class MLAConfig:
    hidden: int = 7168
    q_lora: int = 1536
    kv_lora: int = D_LATENT  # the kernels' latent width
    rope: int = D_ROPE  # the kernels' RoPE width
    nope: int = 128  # per-head query/key dims without RoPE, before absorption
    v_head: int = 128
    heads: int = 8  # per rank: Kimi K2.x's 64 heads over 8 GPUs
    layers: int = 61
    rope_theta: float = 50000.0
    eps: float = 1e-6

    def __post_init__(self):
        if self.kv_lora != D_LATENT or self.rope != D_ROPE:
            raise ValueError(f"the kernels read {D_LATENT} latent + {D_ROPE} RoPE values per token; "
                             f"got kv_lora {self.kv_lora}, rope {self.rope}")

    @property
    def scale(self) -> float:
        """Softmax scale: 1/sqrt of the per-head q.k width before absorption (128 + 64 = 192)."""
        return 1.0 / math.sqrt(self.nope + self.rope)

    def with_(self, **changes) -> "MLAConfig":
        return replace(self, **changes)

    def layer_params(self) -> int:
        H = self.heads
        return (self.hidden + self.hidden * self.q_lora + self.q_lora + self.q_lora * H * (self.nope + self.rope)
                + self.hidden * D_QK + D_LATENT + H * self.nope * D_LATENT + H * D_LATENT * self.v_head
                + H * self.v_head * self.hidden)

    def layer_bytes(self) -> int:
        return 2 * self.layer_params()  # bf16


KIMI_K2_TP8 = MLAConfig()
SMALL = MLAConfig(hidden=256, q_lora=96, nope=32, v_head=32, heads=8, layers=2)


# ---- the MoE half, by arithmetic -------------------------------------------------------

@dataclass(frozen=True)
class MoEConfig:
    """Kimi K2.x's MoE layers: 384 routed experts of which each token uses 8, one shared expert."""

    experts: int = 384
    active: int = 8
    shared: int = 1
    expert_ffn: int = 2048  # each expert: gate and up [hidden -> 2048], down [2048 -> hidden]
    tp: int = 8  # each expert's ffn dims split over the ranks, as the attention heads are
    moe_layers: int = 60  # the first of the 61 layers is dense
    dense_ffn: int = 18432


def moe_bytes_per_step(tokens: int, hidden: int = 7168, moe: MoEConfig = MoEConfig()) -> dict:
    """Weight bytes one rank reads for the MLP/MoE half of a verify step of ``tokens`` tokens.

    With routing spread evenly, ``tokens`` tokens touch on average
    ``E (1 - (1 - k/E)^tokens)`` distinct routed experts, each read once.
    """
    per_expert = 3 * hidden * (moe.expert_ffn // moe.tp) * 2
    distinct = moe.experts * (1 - (1 - moe.active / moe.experts) ** tokens)
    moe_layer = (distinct + moe.shared) * per_expert
    dense_layer = 3 * hidden * (moe.dense_ffn // moe.tp) * 2
    return dict(per_expert_bytes=per_expert, distinct_experts=distinct, moe_layer_bytes=moe_layer,
                dense_layer_bytes=dense_layer, step_bytes=moe.moe_layers * moe_layer + dense_layer)


# ---- weights -------------------------------------------------------------------------------

@dataclass
class LayerWeights:
    """One layer's weights, each stored [in, out] so that a product is ``x @ w``."""

    attn_norm: torch.Tensor  # [hidden]
    w_dq: torch.Tensor  # [hidden, q_lora]
    q_norm: torch.Tensor  # [q_lora]
    w_uq: torch.Tensor  # [q_lora, heads * (nope + rope)]
    w_dkv: torch.Tensor  # [hidden, 512 + 64]
    kv_norm: torch.Tensor  # [512]
    w_uk: torch.Tensor  # [heads, nope, 512]: k_nope_h = c @ w_uk[h].T, so q_nope_h @ w_uk[h] is the absorbed query
    w_uv: torch.Tensor  # [heads, 512, v_head]: v_h = c @ w_uv[h]
    w_o: torch.Tensor  # [heads * v_head, hidden]

    def to(self, dtype=None, device=None) -> "LayerWeights":
        return LayerWeights(**{k: v.to(device=device, dtype=dtype) for k, v in vars(self).items()})


def random_weights(cfg: MLAConfig, device="cpu", dtype=torch.bfloat16, seed: int = 0) -> list[LayerWeights]:
    """Random weights, scaled by 1/sqrt(fan-in) so activations stay near unit size.

    Drawn one layer at a time in fp32 on ``device`` (the 61 layers at Kimi's
    sizes are about 3 GB in bf16).
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    H = cfg.heads

    def mat(*shape, fan_in):
        return (torch.randn(*shape, generator=gen, device=device) * fan_in ** -0.5).to(dtype)

    def norm(n):
        return (1.0 + 0.1 * torch.randn(n, generator=gen, device=device)).to(dtype)

    return [LayerWeights(
        attn_norm=norm(cfg.hidden), w_dq=mat(cfg.hidden, cfg.q_lora, fan_in=cfg.hidden), q_norm=norm(cfg.q_lora),
        w_uq=mat(cfg.q_lora, H * (cfg.nope + cfg.rope), fan_in=cfg.q_lora),
        w_dkv=mat(cfg.hidden, D_QK, fan_in=cfg.hidden), kv_norm=norm(D_LATENT),
        w_uk=mat(H, cfg.nope, D_LATENT, fan_in=cfg.nope), w_uv=mat(H, D_LATENT, cfg.v_head, fan_in=D_LATENT),
        w_o=mat(H * cfg.v_head, cfg.hidden, fan_in=H * cfg.v_head)) for _ in range(cfg.layers)]


# ---- the layer -------------------------------------------------------------------------------

def rope_cis(positions: torch.Tensor, cfg: MLAConfig) -> torch.Tensor:
    """``exp(i * position * theta^(-2j/64))`` for j < 32: ``[tokens, 32]`` complex64."""
    j = torch.arange(0, cfg.rope, 2, device=positions.device, dtype=torch.float32)
    inv_freq = cfg.rope_theta ** (-j / cfg.rope)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2j], x[2j+1]) of the last dim by the token's angle j (DeepSeek's layout).

    ``x``: ``[tokens, ..., 64]``; ``cis``: ``[tokens, 32]``.  In fp32, returned in x's dtype.
    """
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    cis = cis.view(cis.shape[0], *([1] * (x.dim() - 2)), cis.shape[1])
    return torch.view_as_real(pairs * cis).flatten(-2).to(x.dtype)


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def stage_attend(stage) -> Attend:
    """Attention through one stage of the ladder, unchecked (as in a captured step)."""
    from ..core import ops

    st = ops._as_stage(stage)

    def attend(q, pool, block_table, kv_lens, scale):
        return ops.attention(st, q, pool, block_table, kv_lens, scale, check=False)[0]

    attend.stage = st.id  # type: ignore[attr-defined]
    return attend


def reference_attend(q, pool, block_table, kv_lens, scale):
    """The fp32 reference through the block table, in q's dtype (for CPU runs and tests)."""
    from ..core.reference import reference_attention

    return reference_attention(q, pool, block_table, kv_lens, scale, check=False)[0].to(q.dtype)


def mla_layer(x: torch.Tensor, w: LayerWeights, cfg: MLAConfig, pool: torch.Tensor, block_table: torch.Tensor,
              kv_lens: torch.Tensor, slots: torch.Tensor, cis: torch.Tensor, attend: Attend,
              rows_out: torch.Tensor | None = None) -> torch.Tensor:
    """One decoder layer's attention half on ``x`` ``[streams * q_len, hidden]``; returns the new x.

    ``slots`` and ``cis`` come from the step (:func:`append_slots`,
    :func:`rope_cis`): the same for every layer.  The draft's latent rows are
    written into ``pool`` before attention reads it.  ``rows_out``, if given,
    receives them (tests compare the cache with it).
    """
    N, H = x.shape[0], cfg.heads
    B = block_table.shape[0]
    h = F.rms_norm(x, (cfg.hidden,), w.attn_norm, cfg.eps)
    cq = F.rms_norm(h @ w.w_dq, (cfg.q_lora,), w.q_norm, cfg.eps)
    qf = (cq @ w.w_uq).view(N, H, cfg.nope + cfg.rope)
    q_lat = torch.bmm(qf[..., :cfg.nope].transpose(0, 1), w.w_uk)  # [H, N, 512]: W_UK absorbed
    q = torch.cat([q_lat.transpose(0, 1), apply_rope(qf[..., cfg.nope:], cis)], dim=-1)  # [N, H, 576]

    ckv = h @ w.w_dkv  # [N, 576]
    rows = torch.cat([F.rms_norm(ckv[:, :D_LATENT], (D_LATENT,), w.kv_norm, cfg.eps),
                      apply_rope(ckv[:, D_LATENT:], cis)], dim=-1)
    pool.view(-1, D_QK).index_copy_(0, slots, rows)
    if rows_out is not None:
        rows_out.copy_(rows)

    out = attend(q.view(B, N // B, H, D_QK), pool, block_table, kv_lens, cfg.scale)  # [B, T, H, 512]
    o = torch.bmm(out.reshape(N, H, D_V).transpose(0, 1), w.w_uv)  # [H, N, v_head]: W_UV absorbed
    return torch.addmm(x, o.transpose(0, 1).reshape(N, H * cfg.v_head), w.w_o)


def forward(x, weights: list[LayerWeights], cfg: MLAConfig, cache: torch.Tensor, block_table, kv_lens,
            attend: Attend, rows_out: torch.Tensor | None = None) -> torch.Tensor:
    """The stack on ``x`` ``[streams * q_len, hidden]``; ``cache`` is ``[layers, pages, page_size, 576]``.

    ``kv_lens`` are the lengths after this step's append, as the kernels take
    them.  Tensor ops only (no host sync), so the whole step can be captured.
    """
    B = block_table.shape[0]
    T = x.shape[0] // B
    slots, positions = append_slots(block_table, kv_lens, T, cache.shape[2], cache.shape[1])
    cis = rope_cis(positions, cfg)
    for i, w in enumerate(weights):
        x = mla_layer(x, w, cfg, cache[i], block_table, kv_lens, slots, cis, attend,
                      None if rows_out is None else rows_out[i])
    return x


class ModelStep:
    """The stack for a bucket of (streams, q_len, table width): eager, or one CUDA graph per step.

    It owns static inputs (``x``, ``block_table``, ``kv_lens``); a call copies
    the real streams in, pads the rest, and replays.  A padded stream gets
    length 0 and the sink page: the kernels read nothing for it (its attention
    answer is NaN, which stays in its own rows) and its appended rows land in
    the sink page.  Only the real streams' rows are returned.
    """

    def __init__(self, cfg: MLAConfig, weights: list[LayerWeights], cache: torch.Tensor, attend: Attend | str, *,
                 streams: int, q_len: int, max_pages: int, record_rows: bool = False):
        if cache.dim() != 4 or cache.shape[0] < len(weights) or cache.shape[3] != D_QK:
            raise ValueError(f"cache must be [layers >= {len(weights)}, pages, page_size, {D_QK}], "
                             f"got {tuple(cache.shape)}")
        self.cfg, self.weights, self.cache = cfg, weights, cache
        self.attend = stage_attend(attend) if isinstance(attend, str) else attend
        self.streams, self.q_len, self.max_pages = streams, q_len, max_pages
        dev = cache.device
        self.x = torch.zeros(streams * q_len, cfg.hidden, dtype=weights[0].w_o.dtype, device=dev)
        self.block_table = torch.zeros(streams, max_pages, dtype=torch.int32, device=dev)  # the sink page
        self.kv_lens = torch.zeros(streams, dtype=torch.int32, device=dev)
        self.rows = (torch.zeros(len(weights), streams * q_len, D_QK, dtype=cache.dtype, device=dev)
                     if record_rows else None)
        self.y: torch.Tensor | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self._real = streams

    def load(self, x: torch.Tensor, block_table: torch.Tensor, kv_lens: torch.Tensor) -> int:
        """Copy a step's inputs into the statics (padding the rest); returns the real stream count."""
        b = kv_lens.shape[0]
        if not 1 <= b <= self.streams or x.shape != (b * self.q_len, self.cfg.hidden) \
                or block_table.shape[0] != b or block_table.shape[1] > self.max_pages:
            raise ValueError(f"bucket is {self.streams} streams x {self.q_len} rows, table {self.max_pages} wide; "
                             f"got x {tuple(x.shape)}, block_table {tuple(block_table.shape)}, "
                             f"kv_lens {tuple(kv_lens.shape)}")
        load_bucket(self.block_table, self.kv_lens, block_table, kv_lens, self._real)
        self.x[:b * self.q_len].copy_(x)
        self._real = b
        return b

    def _run(self) -> torch.Tensor:
        return forward(self.x, self.weights, self.cfg, self.cache, self.block_table, self.kv_lens, self.attend,
                       self.rows)

    def eager(self, x=None, block_table=None, kv_lens=None) -> torch.Tensor:
        """The step, op by op, on the statics (after loading the given inputs)."""
        if x is not None:
            self.load(x, block_table, kv_lens)
        return self._run()[:self._real * self.q_len]

    def capture(self) -> "ModelStep":
        from ..measure.timing import cuda_graph

        holder = {}

        def body():
            holder["y"] = self._run()

        self.graph = cuda_graph(body, warmup_calls=2)
        self.y = holder["y"]  # the graph's output: rewritten by every replay
        return self

    def replay(self) -> torch.Tensor:
        if self.graph is None:
            self.capture()
        self.graph.replay()
        return self.y[:self._real * self.q_len]

    def __call__(self, x, block_table, kv_lens) -> torch.Tensor:
        self.load(x, block_table, kv_lens)
        return self.replay()


def load_bucket(static_table: torch.Tensor, static_lens: torch.Tensor, block_table: torch.Tensor,
                kv_lens: torch.Tensor, previous_real: int) -> None:
    """Copy ``b`` real streams' table and lengths into a bucket's statics; pad the rest.

    Table columns beyond the given width get page -1, so a length reaching
    past them gets NaN from the kernels, as an eager call with the narrower
    table does.  Streams beyond ``b`` get length 0 (nothing read) and the sink
    page (their appends land there); they are re-padded only when the real
    count shrank.
    """
    b, width = block_table.shape
    static_table[:b, :width].copy_(block_table)
    if width < static_table.shape[1]:
        static_table[:b, width:].fill_(-1)
    static_lens[:b].copy_(kv_lens)
    if b < previous_real:
        static_table[b:previous_real].fill_(0)
        static_lens[b:previous_real].fill_(0)


# ---- the plain fp32 layer, for the tests ------------------------------------------------------

def _rope_pairs(x: torch.Tensor, positions: torch.Tensor, cfg: MLAConfig) -> torch.Tensor:
    """RoPE written out with cos and sin on (even, odd) pairs: x [tokens, ..., 64] fp32."""
    j = torch.arange(0, cfg.rope, 2, dtype=torch.float32)
    ang = positions.float()[:, None] * cfg.rope_theta ** (-j / cfg.rope)  # fp32 angles, as a model computes them
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cfg.rope // 2,)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def reference_layer(x: torch.Tensor, w: LayerWeights, cfg: MLAConfig, history: list[torch.Tensor],
                    q_len: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The layer as the model defines it, in fp32: keys and values per head, no absorption, no pages.

    ``history[b]``: stream ``b``'s cached rows before this step, ``[prefix_b, 576]``
    (512 latent + 64 RoPE'd).  Returns the new x and each stream's rows with
    this step's appended.
    """
    w = w.to(torch.float32)
    x = x.float()
    H, T = cfg.heads, q_len
    B = len(history)
    positions = torch.cat([torch.arange(len(hb), len(hb) + T) for hb in history])
    h = _rms(x, w.attn_norm, cfg.eps)
    qf = (_rms(h @ w.w_dq, w.q_norm, cfg.eps) @ w.w_uq).view(B * T, H, cfg.nope + cfg.rope)
    q_nope, q_pe = qf[..., :cfg.nope], _rope_pairs(qf[..., cfg.nope:], positions, cfg)
    ckv = h @ w.w_dkv
    new_rows = torch.cat([_rms(ckv[:, :D_LATENT], w.kv_norm, cfg.eps),
                          _rope_pairs(ckv[:, D_LATENT:], positions, cfg)], dim=-1)
    outs, histories = [], []
    for b in range(B):
        rows = torch.cat([history[b].float(), new_rows[b * T:(b + 1) * T]])  # [L, 576]
        L = rows.shape[0]
        c, k_pe = rows[:, :D_LATENT], rows[:, D_LATENT:]
        k_nope = torch.einsum("lc,hnc->lhn", c, w.w_uk)  # [L, H, nope]
        v = torch.einsum("lc,hcv->lhv", c, w.w_uv)  # [L, H, v_head]
        qn, qp = q_nope[b * T:(b + 1) * T], q_pe[b * T:(b + 1) * T]
        s = (torch.einsum("thn,lhn->thl", qn, k_nope) + torch.einsum("thr,lr->thl", qp, k_pe)) * cfg.scale
        visible = torch.arange(L)[None, :] <= (L - T + torch.arange(T))[:, None]  # [T, L]
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        outs.append(torch.einsum("thl,lhv->thv", torch.softmax(s, dim=-1), v).reshape(T, H * cfg.v_head))
        histories.append(rows)
    return x + torch.cat(outs) @ w.w_o, histories
