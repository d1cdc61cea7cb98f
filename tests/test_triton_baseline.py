"""The Triton split-KV baseline against the fp32 reference.

Without a GPU the kernels run in Triton's interpreter (the module sets
TRITON_INTERPRET before it defines them), so the sizes here stay small.
"""

import pytest
import torch

from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.reference import reference_for
from mla_lab.core.problem import POISON_PAGE_ID
from mla_lab.core.triton_baseline import triton_verify_attention
from mla_lab.core.validate import InputError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OUT_TOL = 5e-3  # relative L2 error of bf16 out; bf16 rounding alone lands near 2e-3
LSE_TOL = 1e-2  # absolute error of lse

# The defences compute with NaN on purpose (a bad page's score); numpy, which
# runs the interpreter, may warn about it.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def assert_matches(workload, out, lse):
    assert not torch.isnan(out).any(), "out has NaN: an element not written, or a poisoned read"
    assert not torch.isnan(lse).any(), "lse has NaN"
    ref_out, ref_lse = reference_for(workload)
    err = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    assert err <= OUT_TOL, f"relative L2 error of out {err:.2e} > {OUT_TOL}"
    lse_err = (lse - ref_lse).abs().max().item()
    assert lse_err < LSE_TOL, f"max |lse - ref| = {lse_err:.2e}"


CASES = [
    # (problem, num_splits)
    (Problem(streams=1, q_len=1, heads=1, prefix=30, page_size=16, scattered=False), 4),
    (Problem(streams=1, q_len=9, heads=8, prefix=60, page_size=1, scattered=True), 1),
    (Problem(streams=3, q_len=9, heads=8, prefix=(5, 40, 17), page_size=1, scattered=True), 4),
    (Problem(streams=3, q_len=9, heads=20, prefix=(5, 40, 17), page_size=16, scattered=True), 4),
    (Problem(streams=2, q_len=9, heads=8, prefix=0, page_size=16, scattered=False), 4),
    (Problem(streams=1, q_len=9, heads=8, prefix=100, page_size=64, scattered=False), 1),
    (Problem(streams=3, q_len=1, heads=20, prefix=(5, 40, 17), page_size=64, scattered=True), 4),
    # More splits than keys: most splits are empty and must be skipped.
    (Problem(streams=2, q_len=9, heads=8, prefix=(0, 20), page_size=16, scattered=True), 64),
]


@pytest.mark.parametrize("problem, num_splits", CASES, ids=lambda c: c.label() if isinstance(c, Problem) else f"splits{c}")
def test_matches_reference(problem, num_splits):
    w = make_workload(problem, DEVICE, seed=1, poison=True)
    out, lse = w.new_outputs(poison=True)  # NaN-filled: every element must be written
    res_out, res_lse = triton_verify_attention(*w.args(), out, lse, num_splits=num_splits)
    assert res_out is out and res_lse is lse
    assert_matches(w, out, lse)


def test_allocates_outputs_and_block_n_32():
    w = make_workload(Problem(streams=2, q_len=4, heads=8, prefix=(50, 13), page_size=16), DEVICE)
    out, lse = triton_verify_attention(*w.args(), block_n=32)
    assert out.shape == (2, 4, 8, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 4, 8) and lse.dtype == torch.float32
    assert_matches(w, out, lse)


def test_strided_outputs_unchecked():
    """out/lse as transposed views of larger buffers, no checks."""
    w = make_workload(Problem(streams=3, q_len=5, heads=20, prefix=(5, 40, 17), page_size=16), DEVICE)
    B, T, H = 3, 5, 20
    out_buf = torch.full((T, B, H + 3, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse_buf = torch.full((H + 2, T, B), float("nan"), dtype=torch.float32, device=DEVICE)
    out = out_buf.transpose(0, 1)[:, :, :H]  # [B, T, H, 512], last dim contiguous
    lse = lse_buf.permute(2, 1, 0)[:, :, :H]  # [B, T, H], no contiguous dim at all
    triton_verify_attention(*w.args(), out, lse, check=False)
    assert_matches(w, out, lse)
    # Untouched padding heads stay NaN: nothing was written outside the views.
    assert torch.isnan(out_buf[:, :, H:]).all() and torch.isnan(lse_buf[H:]).all()


def test_rows_follow_lengths_changed_after_the_first_call():
    """The kernels derive each row's length from kv_lens: nothing prepared on the host goes stale."""
    p = Problem(streams=2, q_len=3, heads=8, prefix=(30, 12), page_size=16, scattered=True)
    w = make_workload(p, DEVICE, seed=3, poison=False)
    out, lse = w.new_outputs(poison=True)
    triton_verify_attention(*w.args(), out, lse, check=False)
    w.kv_lens.copy_(torch.tensor([20, 15], dtype=torch.int32))  # shorter, within the same pages
    out.fill_(float("nan"))
    triton_verify_attention(*w.args(), out, lse, check=False)
    assert_matches(w, out, lse)


# ---- the promise made with check=False: bad lengths and page ids give NaN ---------

def _bad_case(kind, w):
    """Break stream 1 of ``w``; return what the kernels must keep exact (stream 0 and 2)."""
    if kind == "length_beyond_table":
        w.kv_lens[1] = w.block_table.shape[1] * w.kv_cache.shape[1] + 1
    elif kind == "length_below_draft":
        w.kv_lens[1] = w.q.shape[1] - 1
    elif kind == "negative_length":
        w.kv_lens[1] = -7
    elif kind == "page_past_pool":
        w.block_table[1, 0] = w.kv_cache.shape[0]
    elif kind == "huge_page":
        w.block_table[1, 1] = POISON_PAGE_ID
    elif kind == "negative_page":
        w.block_table[1, 0] = -1
    else:
        raise ValueError(kind)


@pytest.mark.parametrize("kind", ["length_beyond_table", "length_below_draft", "negative_length",
                                  "page_past_pool", "huge_page", "negative_page"])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_unchecked_bad_stream_gets_nan_others_exact(kind, num_splits):
    p = Problem(streams=3, q_len=4, heads=8, prefix=(20, 33, 9), page_size=16, scattered=True)
    w = make_workload(p, DEVICE, seed=5, poison=True)
    good_out, good_lse = triton_verify_attention(*w.args(), num_splits=num_splits)
    _bad_case(kind, w)
    out, lse = w.new_outputs(poison=False)
    out.zero_()
    lse.zero_()
    triton_verify_attention(*w.args(), out, lse, num_splits=num_splits, check=False)
    assert torch.isnan(out[1].float()).all() and torch.isnan(lse[1]).all(), "the bad stream must be all NaN"
    for b in (0, 2):
        assert torch.equal(out[b], good_out[b]) and torch.equal(lse[b], good_lse[b])
    with pytest.raises(InputError):  # and the checked call refuses it
        triton_verify_attention(*w.args(), num_splits=num_splits)


@pytest.mark.parametrize("change, words", [
    (lambda a: dict(a, q=a["q"][..., :512].contiguous()), "q must be"),
    (lambda a: dict(a, kv_lens=a["kv_lens"][:1].contiguous()), "kv_lens must be"),
    (lambda a: dict(a, kv_lens=torch.cat([a["kv_lens"], a["kv_lens"]])), "kv_lens must be"),
    (lambda a: dict(a, kv_lens=a["kv_lens"].long()), "kv_lens must be int32"),
    (lambda a: dict(a, block_table=a["block_table"][:1]), "block_table must be"),
    (lambda a: dict(a, kv_cache=a["kv_cache"][..., :512]), "kv_cache must be"),
    (lambda a: dict(a, q=a["q"].float()), "q must be bfloat16"),
])
def test_unchecked_wrong_shapes_raise_input_error(change, words):
    w = make_workload(Problem(streams=2, q_len=3, heads=8, prefix=10, page_size=16), DEVICE)
    a = change(dict(q=w.q, kv_cache=w.kv_cache, block_table=w.block_table, kv_lens=w.kv_lens))
    with pytest.raises(InputError, match=words):
        triton_verify_attention(a["q"], a["kv_cache"], a["block_table"], a["kv_lens"], w.scale, check=False)


@pytest.mark.parametrize("kw, words", [
    (dict(num_splits=0), "num_splits"),
    (dict(num_splits=1025), "num_splits"),
    (dict(num_splits=2.0), "num_splits"),
    (dict(block_n=8), "block_n"),
    (dict(block_n=24), "block_n"),
])
def test_invalid_settings_raise(kw, words):
    w = make_workload(Problem(streams=1, q_len=2, heads=8, prefix=3), DEVICE)
    with pytest.raises(InputError, match=words):
        triton_verify_attention(*w.args(), **kw)


def test_bad_inputs_are_rejected():
    w = make_workload(Problem(streams=1, q_len=2, heads=8, prefix=3), DEVICE)
    with pytest.raises(ValueError, match="triton"):
        triton_verify_attention(w.q.float(), *w.args()[1:])
    with pytest.raises(ValueError, match="kv_len"):
        triton_verify_attention(w.q, w.kv_cache, w.block_table, w.kv_lens * 0 + 1, w.scale)


@pytest.mark.parametrize("scale", [-0.1, 0.0, float("nan"), float("inf")])
def test_unchecked_bad_scale_raises_input_error(scale):
    w = make_workload(Problem(streams=1, q_len=2, heads=8, prefix=3), DEVICE)
    with pytest.raises(InputError, match="scale"):
        triton_verify_attention(w.q, w.kv_cache, w.block_table, w.kv_lens, scale, check=False)
