"""mla_lab.flash_mla without a GPU: FlashMLA's signatures, its layouts and causal alignment (through the Triton
baseline in its interpreter, stage="triton"), the metadata conventions, the stage chosen per architecture, and
the errors.  tests/test_flash_mla_gpu.py runs the CUDA stages, FlashMLA itself, graphs and the host overhead."""

import inspect

import pytest
import torch

from mla_lab.core.validate import InputError
from mla_lab.flash_mla import FlashMLASchedMeta, fastest_stage, flash_mla_with_kvcache, get_mla_metadata


def flashmla_reference(q, k_cache, block_table, cache_seqlens, causal, scale):
    """FlashMLA's semantics as its documentation and tests state them, in fp32: every stream attends to its first
    cache_seqlens tokens through the block table; causal masks with tril(diagonal=s_k - s_q); lse (b, h_q, s_q)."""
    b, s_q, h_q, _ = q.shape
    page = k_cache.shape[1]
    out = torch.empty(b, s_q, h_q, 512)
    lse = torch.empty(b, h_q, s_q)
    for i in range(b):
        s_k = int(cache_seqlens[i])
        pos = torch.arange(s_k)
        k = k_cache[block_table[i].long()[pos // page], pos % page, 0].float()  # (s_k, 576)
        scores = torch.einsum("shd,kd->hsk", q[i].float(), k) * scale       # (h_q, s_q, s_k)
        if causal:
            seen = torch.ones(s_q, s_k, dtype=torch.bool).tril(diagonal=s_k - s_q)
            scores = scores.masked_fill(~seen, float("-inf"))
        lse[i] = scores.logsumexp(-1)
        out[i] = (scores.softmax(-1) @ k[:, :512]).transpose(0, 1)
    return out, lse


def _inputs(b=2, s_q=3, h_q=4, page=16, lens=(20, 37), seed=0):
    g = torch.Generator().manual_seed(seed)
    width = -(-max(lens) // page) + 1
    blocks = b * width + 1
    k_cache = torch.randn(blocks, page, 1, 576, generator=g).bfloat16()
    block_table = torch.randperm(blocks, generator=g)[:b * width].to(torch.int32).view(b, width)
    q = torch.randn(b, s_q, h_q, 576, generator=g).bfloat16()
    return q, k_cache, block_table, torch.tensor(lens, dtype=torch.int32)


def _close(out, lse, ref_out, ref_lse):
    rel = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    assert rel < 1e-2, rel
    assert (lse - ref_lse).abs().max().item() < 1e-3


# ---- FlashMLA's signatures ------------------------------------------------------------------

def test_signatures_are_flashmla_s():
    params = list(inspect.signature(flash_mla_with_kvcache).parameters)
    assert params[:16] == ["q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata",
                           "num_splits", "softmax_scale", "causal", "is_fp8_kvcache", "indices", "attn_sink",
                           "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length"]
    assert inspect.signature(flash_mla_with_kvcache).parameters["stage"].kind is inspect.Parameter.KEYWORD_ONLY


def test_current_convention_returns_an_empty_object():
    meta, second = get_mla_metadata()
    assert isinstance(meta, FlashMLASchedMeta) and second is None
    assert not meta.have_initialized and meta.config is None and meta.stage is None
    assert get_mla_metadata()[0] is not meta  # one per set of shapes


# ---- which stage runs where ---------------------------------------------------------------------

@pytest.mark.parametrize("cc, stage", [((9, 0), "hopper"), ((8, 0), "tensor_core"), ((8, 6), "tensor_core"),
                                       ((8, 9), "tensor_core"), ((10, 0), "tensor_core"), ((12, 0), "tensor_core"),
                                       ((7, 5), "shared_rows")])
def test_the_fastest_stage_each_gpu_runs(cc, stage):
    st = fastest_stage(*cc)
    assert st.id == stage and st.is_cuda and st.runs_on(*cc)


# ---- layouts and causal alignment, run by the Triton baseline in its interpreter ---------------------------

@pytest.mark.parametrize("causal, s_q, page, convention", [(True, 3, 16, "object"), (False, 3, 1, "older"),
                                                           (True, 1, 64, "none"), (False, 1, 16, "object")])
def test_layouts_and_alignment_are_flashmla_s(causal, s_q, page, convention):
    q, k_cache, block_table, lens = _inputs(s_q=s_q, page=page)
    if convention == "object":
        meta, splits = get_mla_metadata()
    elif convention == "older":  # FlashMLA's older tensors, as a caller that copied them would pass them
        meta, splits = torch.zeros(132, 8, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    else:
        meta = splits = None
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, splits, softmax_scale=0.1,
                                      causal=causal, stage="triton")
    assert out.shape == (2, s_q, 4, 512) and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == (2, 4, s_q) and lse.dtype == torch.float32 and lse.is_contiguous()
    _close(out, lse, *flashmla_reference(q, k_cache, block_table, lens, causal, 0.1))


def test_the_default_scale_is_flashmla_s():
    q, k_cache, block_table, lens = _inputs(s_q=1, h_q=2)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, stage="triton")
    _close(out, lse, *flashmla_reference(q, k_cache, block_table, lens, False, 576 ** -0.5))


def test_the_metadata_is_filled_once_and_holds_its_shapes():
    q, k_cache, block_table, lens = _inputs(s_q=2, h_q=2)
    meta, _ = get_mla_metadata()
    flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, causal=True, stage="triton")
    assert meta.have_initialized and meta.stage.id == "triton" and meta.splits == 4
    assert meta.config == FlashMLASchedMeta.Config(b=2, s_q=2, h_q=2, page_block_size=16, h_k=1, causal=True)
    # new lengths and a wider table: fine (the split count is the table width's, worked out again)
    wider = torch.cat([block_table, block_table[:, :1]], dim=1)
    flash_mla_with_kvcache(q, k_cache, wider, lens - 1, 512, meta, causal=True, stage="triton")
    assert meta.table_width == wider.shape[1]
    with pytest.raises(InputError, match=r"^mla_lab.flash_mla: this call's arguments .*b=1.* differ from those the "
                                         r"metadata was filled with .*b=2"):
        flash_mla_with_kvcache(q[:1], k_cache, block_table[:1], lens[:1], 512, meta, causal=True, stage="triton")
    with pytest.raises(InputError, match="causal=False"):
        flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, causal=False, stage="triton")


# ---- what it refuses, and how it says so --------------------------------------------------------

def test_cpu_tensors_get_one_error_naming_what_runs_without_a_gpu():
    q, k_cache, block_table, lens = _inputs()
    for meta in (None, get_mla_metadata()[0]):
        with pytest.raises(InputError) as e:
            flash_mla_with_kvcache(q, k_cache, block_table, lens, 512, meta, causal=True)
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith("mla_lab.flash_mla: the CUDA stages need tensors on a CUDA GPU, got q on cpu.")
        assert "mla_lab.reference_attention(q, kv_cache, block_table, kv_lens, scale)" in msg
        assert "mla_lab.attention(\"triton\", q, kv_cache, block_table, kv_lens, scale)" in msg
        assert "stage=\"triton\"" in msg
    with pytest.raises(InputError, match=r"^mla_lab.flash_mla: get_mla_metadata: the CUDA stages need tensors on a "
                                         r"CUDA GPU, got cache_seqlens on cpu"):
        get_mla_metadata(lens, 3 * 4, 1)
    with pytest.raises(InputError, match=r"get_mla_metadata: cache_seqlens must be a \(batch_size,\) int32 tensor, "
                                         r"got \(2,\) int64 on cpu"):
        get_mla_metadata(lens.long(), 12, 1)


def _refuses(match, **change):
    q, k_cache, block_table, lens = _inputs()
    args = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=lens, head_dim_v=512)
    args.update({k: v for k, v in change.items() if k in args})
    kw = {k: v for k, v in change.items() if k not in args}
    with pytest.raises(InputError, match=match):
        flash_mla_with_kvcache(**args, stage="triton", **kw)


@pytest.mark.parametrize("change, match", [
    (dict(is_fp8_kvcache=True), r"^mla_lab.flash_mla: dense bf16 decode only: is_fp8_kvcache \(FlashMLA's fp8 and "
                                r"sparse attention\) is not supported"),
    (dict(indices=torch.zeros(2, 3, 8, dtype=torch.int32), topk_length=torch.ones(2, dtype=torch.int32)),
     "dense bf16 decode only: indices, topk_length"),
    (dict(attn_sink=torch.zeros(4)), "attn_sink"),
    (dict(head_dim_v=576), r"head_dim_v must be 512 \(the latent part of each cached token\), got 576"),
    (dict(q=torch.zeros(2, 3, 4, 512, dtype=torch.bfloat16)), r"q must be \(batch_size, seq_len_q, num_heads_q, 576\), "
                                                              r"got \(2, 3, 4, 512\) bfloat16 on cpu"),
    (dict(q=torch.zeros(2, 3, 4, 576, dtype=torch.float16)), "q must be bfloat16 .dense bf16 decode only., got "
                                                             "torch.float16"),
    (dict(k_cache=torch.zeros(8, 16, 2, 576, dtype=torch.bfloat16)),
     r"k_cache must be \(num_blocks, page_block_size, 1, 576\): MLA's one latent KV head, got \(8, 16, 2, 576\)"),
    (dict(k_cache=torch.zeros(8, 16, 576, dtype=torch.bfloat16)), "k_cache must be"),
    (dict(block_table=None), r"block_table must be a torch.Tensor, got NoneType \(dense decode needs block_table and "
                             r"cache_seqlens\)"),
    (dict(tile_scheduler_metadata="meta"), "tile_scheduler_metadata must be what get_mla_metadata.. returned, got str"),
], ids=lambda x: "-".join(x) if isinstance(x, dict) else None)
def test_what_it_refuses(change, match):
    _refuses(match, **change)
