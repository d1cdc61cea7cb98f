"""The Triton split-KV baseline against the fp32 reference.

Without a GPU the kernels run in Triton's interpreter (the module sets
TRITON_INTERPRET before it defines them), so the sizes here stay small.
"""

import pytest
import torch

from mla_lab.problem import Problem, make_workload
from mla_lab.reference import reference_for
from mla_lab.triton_baseline import RowPlan, plan_rows, triton_verify_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OUT_TOL = 5e-3  # relative L2 error of bf16 out; bf16 rounding alone lands near 2e-3
LSE_TOL = 1e-2  # absolute error of lse

# An empty split writes lse = log(0) = -inf on purpose; numpy, which runs the
# interpreter, warns about that log.
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


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


def test_strided_outputs_and_prebuilt_plan():
    """out/lse as transposed views of larger buffers; a plan built ahead, no checks."""
    w = make_workload(Problem(streams=3, q_len=5, heads=20, prefix=(5, 40, 17), page_size=16), DEVICE)
    B, T, H = 3, 5, 20
    out_buf = torch.full((T, B, H + 3, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse_buf = torch.full((H + 2, T, B), float("nan"), dtype=torch.float32, device=DEVICE)
    out = out_buf.transpose(0, 1)[:, :, :H]  # [B, T, H, 512], last dim contiguous
    lse = lse_buf.permute(2, 1, 0)[:, :, :H]  # [B, T, H], no contiguous dim at all
    plan = plan_rows(w.block_table, w.kv_lens, T)
    triton_verify_attention(*w.args(), out, lse, plan=plan, check=False)
    assert_matches(w, out, lse)
    # Untouched padding heads stay NaN: nothing was written outside the views.
    assert torch.isnan(out_buf[:, :, H:]).all() and torch.isnan(lse_buf[H:]).all()


def test_plan_rows_lengths_and_tables():
    p = Problem(streams=3, q_len=9, heads=8, prefix=(5, 40, 17), page_size=16)
    w = make_workload(p, DEVICE)
    plan = plan_rows(w.block_table, w.kv_lens, p.q_len)
    assert isinstance(plan, RowPlan)
    assert plan.lens.dtype == torch.int32 and plan.block_table.dtype == torch.int32
    expected = [prefix + t + 1 for prefix in (5, 40, 17) for t in range(9)]
    assert plan.lens.tolist() == expected
    assert plan.block_table.shape == (27, w.block_table.shape[1])
    for r in range(27):
        assert torch.equal(plan.block_table[r], w.block_table[r // 9])


@pytest.mark.parametrize("kw, words", [
    (dict(num_splits=0), "num_splits"),
    (dict(num_splits=1025), "num_splits"),
    (dict(num_splits=2.0), "num_splits"),
    (dict(block_n=8), "block_n"),
    (dict(block_n=24), "block_n"),
])
def test_invalid_settings_raise(kw, words):
    w = make_workload(Problem(streams=1, q_len=2, heads=8, prefix=3), DEVICE)
    with pytest.raises(ValueError, match=words):
        triton_verify_attention(*w.args(), **kw)


def test_bad_inputs_are_rejected():
    w = make_workload(Problem(streams=1, q_len=2, heads=8, prefix=3), DEVICE)
    with pytest.raises(ValueError, match="triton"):
        triton_verify_attention(w.q.float(), *w.args()[1:])
    with pytest.raises(ValueError, match="kv_len"):
        triton_verify_attention(w.q, w.kv_cache, w.block_table, w.kv_lens * 0 + 1, w.scale)
