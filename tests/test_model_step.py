"""The model-level verify step's layer math against a plain fp32 implementation (CPU, small sizes)."""

import pytest
import torch

from mla_lab.serving.model_step import (KIMI_K2_TP8, SMALL, MLAConfig, ModelStep, _rope_pairs, apply_rope, forward,
                                moe_bytes_per_step, random_weights, reference_attend, reference_layer, rope_cis,
                                stage_attend)
from mla_lab.core.paging import SINK_PAGE, PageTable, gather_stream

CFG = SMALL


def _setup(prefix=(7, 20), q_len=3, page_size=4, layers=2, dtype=torch.float32, seed=0, bucket=None):
    """A scattered page table with random prompt rows in every layer; the same rows as each stream's history."""
    B = len(prefix)
    table = PageTable(64, page_size, 16, B, scatter_seed=seed)
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((layers, 64, page_size, 576), float("nan"), dtype=dtype)
    history = [[None] * B for _ in range(layers)]
    for b, n in enumerate(prefix):
        table.add_prefix(b, n)
        pos = torch.arange(n)
        slots = torch.tensor(table.pages[b], dtype=torch.long)[pos // page_size] * page_size + pos % page_size
        for i in range(layers):
            rows = torch.randn(n, 576, generator=gen).to(dtype)
            cache[i].view(-1, 576)[slots] = rows
            history[i][b] = rows.float()
    table.begin_step(q_len)
    x = torch.randn(B * q_len, CFG.hidden, generator=gen)
    return table, cache, history, x


def _reference(x, weights, history, q_len):
    new = []
    for i, w in enumerate(weights):
        x, h = reference_layer(x, w, CFG, history[i], q_len)
        new.append(h)
    return x, new


def _rel(a, b, base):
    return ((a.float() - b.float()).norm() / (b.float() - base.float()).norm()).item()


def test_absorbed_paged_layers_equal_the_plain_ones_in_fp32():
    """In fp32 the absorption, the pages and the RoPE layout change nothing but rounding."""
    weights = random_weights(CFG, dtype=torch.float32, seed=1)
    table, cache, history, x = _setup()
    rows = torch.zeros(2, x.shape[0], 576)
    y = forward(x, weights, CFG, cache, table.block_table(), table.kv_lens(), reference_attend, rows_out=rows)
    y_ref, new = _reference(x, weights, history, 3)
    assert _rel(y, y_ref, x) < 1e-5
    # the appended rows are the plain layer's new rows, and they sit in the cache after each prompt
    for i in range(2):
        for b, n in enumerate((7, 20)):
            assert torch.allclose(rows[i, b * 3:(b + 1) * 3], new[i][b][n:], atol=1e-5)
            assert torch.allclose(gather_stream(cache[i], table.pages[b], n + 3), new[i][b], atol=1e-5)


@pytest.mark.parametrize("attend", ["reference", "triton"])
def test_bf16_layers_match_the_plain_fp32_ones(attend):
    weights = random_weights(CFG, seed=2)  # bf16
    table, cache, history, x = _setup(dtype=torch.bfloat16, seed=3)
    fn = reference_attend if attend == "reference" else stage_attend("triton")  # Triton runs interpreted
    y = forward(x.bfloat16(), weights, CFG, cache, table.block_table(), table.kv_lens(), fn)
    y_ref, _ = _reference(x.bfloat16().float(), [w.to(torch.float32) for w in weights], history, 3)
    assert y.dtype == torch.bfloat16
    assert _rel(y, y_ref, x.bfloat16()) < 2e-2


def test_rope_two_ways():
    """The complex-number RoPE of the step equals cos/sin written out on (even, odd) pairs."""
    x = torch.randn(5, 3, 64)
    pos = torch.tensor([0, 1, 7, 1000, 65000])
    assert torch.allclose(apply_rope(x, rope_cis(pos, CFG)), _rope_pairs(x, pos, CFG), atol=1e-4)
    assert torch.equal(apply_rope(x[:, 0], rope_cis(torch.zeros(5, dtype=torch.long), CFG)), x[:, 0])


def test_padded_bucket_leaves_real_streams_and_other_pages_alone():
    """Two real streams in a bucket of four: the same rows as a bucket of two, and the padded streams'
    appends land in the sink page only."""
    weights = random_weights(CFG, seed=4)
    table, cache, _, x = _setup(dtype=torch.bfloat16, seed=5)
    x = x.bfloat16()
    exact = ModelStep(CFG, weights, cache.clone(), reference_attend, streams=2, q_len=3, max_pages=16)
    y_exact = exact.eager(x, table.block_table(), table.kv_lens())
    padded_cache = cache.clone()
    padded = ModelStep(CFG, weights, padded_cache, reference_attend, streams=4, q_len=3, max_pages=16)
    y = padded.eager(x, table.block_table(), table.kv_lens())
    assert y.shape == (6, CFG.hidden) and torch.equal(y, y_exact)
    changed = (padded_cache != exact.cache) & ~(padded_cache.isnan() & exact.cache.isnan())
    pages = changed.any(-1).any(-1).any(0).nonzero().flatten().tolist()
    assert pages in ([], [SINK_PAGE])
    # with fewer real streams than before, the ones dropped are padded again
    y1 = padded.eager(x[:3], table.block_table()[:1], table.kv_lens()[:1])
    assert y1.shape == (3, CFG.hidden) and padded.kv_lens.tolist() == [table.kv_lens()[0].item(), 0, 0, 0]


def test_model_step_rejects_a_call_its_bucket_cannot_hold():
    weights = random_weights(CFG.with_(layers=1), seed=0)
    step = ModelStep(CFG.with_(layers=1), weights, torch.zeros(1, 8, 4, 576, dtype=torch.bfloat16),
                     reference_attend, streams=2, q_len=3, max_pages=4)
    with pytest.raises(ValueError, match="bucket is 2 streams x 3 rows"):
        step.load(torch.zeros(9, CFG.hidden, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.int32),
                  torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="cache must be"):
        ModelStep(CFG, random_weights(CFG), torch.zeros(1, 8, 4, 576), reference_attend, streams=1, q_len=1,
                  max_pages=1)


def test_kimi_tp8_sizes_by_hand():
    c = KIMI_K2_TP8
    assert (c.hidden, c.q_lora, c.kv_lora, c.rope, c.nope, c.v_head, c.heads, c.layers) == \
        (7168, 1536, 512, 64, 128, 128, 8, 61)
    assert c.scale == pytest.approx(192 ** -0.5)
    # norms 7168 + 1536 + 512; W_DQ 7168 x 1536; W_UQ 1536 x 8 x 192; W_DKV 7168 x 576;
    # W_UK 8 x 128 x 512; W_UV 8 x 512 x 128; W_O 1024 x 7168
    params = (7168 + 1536 + 512 + 7168 * 1536 + 1536 * 8 * 192 + 7168 * 576 + 8 * 128 * 512 * 2 + 1024 * 7168)
    assert c.layer_params() == params == 25_895_936
    assert c.layer_bytes() * 61 / 1e9 == pytest.approx(3.16, abs=0.01)  # about 3 GB of bf16 weights
    with pytest.raises(ValueError, match="kernels read 512 latent"):
        MLAConfig(kv_lora=256)


def test_moe_bytes_by_hand():
    m = moe_bytes_per_step(9)
    # one expert's share on a rank: gate, up and down, 7168 x 2048 / 8 each, bf16
    assert m["per_expert_bytes"] == 3 * 7168 * 256 * 2 == 11_010_048
    # 9 tokens, 8 of 384 experts each: 384 * (1 - (376/384)^9) distinct on average
    assert m["distinct_experts"] == pytest.approx(384 * (1 - (376 / 384) ** 9))
    assert 66 < m["distinct_experts"] < 67
    assert m["step_bytes"] == pytest.approx(60 * (m["distinct_experts"] + 1) * 11_010_048 + 3 * 7168 * 2304 * 2)
    assert moe_bytes_per_step(1)["distinct_experts"] == pytest.approx(8)
