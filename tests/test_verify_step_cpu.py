"""The captured verify step's bookkeeping, run eagerly on the CPU with the Triton baseline (interpreted).

The same object replays a CUDA graph on a GPU (tests/test_gpu_graphs.py); here ``graph=False`` runs its call
eagerly, which checks what it copies, pads and returns.
"""

import pytest
import torch

from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.validate import InputError
from mla_lab.serving.verify_step import VerifyStep, VerifySteps



def _workload(seed=1):
    return make_workload(Problem(streams=3, q_len=4, heads=8, prefix=(20, 33, 9), page_size=16), "cpu", seed=seed)


def test_padded_bucket_equals_the_eager_call_and_pads_with_nan():
    w = _workload()
    step = VerifyStep("triton", w.kv_cache, streams=5, q_len=4, heads=8, max_pages=6, graph=False)
    assert step.num_splits == 4
    for b, shorten in ((3, 0), (2, 3), (3, 5), (1, 0)):  # the real count shrinks and grows; lengths change
        q, bt, lens = w.q[:b], w.block_table[:b], w.kv_lens[:b] - shorten
        out, lse = step(q, bt, lens)
        eo, el = step.eager(q, bt, lens)
        assert out.shape == (b, 4, 8, 512) and torch.equal(out, eo) and torch.equal(lse, el)
        assert not torch.isnan(out.float()).any()
        # padded streams: length 0, nothing read, NaN in their own rows only
        assert step.kv_lens[b:].tolist() == [0] * (5 - b)
        assert torch.isnan(step.out[b:].float()).all() and torch.isnan(step.lse[b:]).all()


# The bad page makes the interpreter compute with NaN and -inf on purpose; numpy warns about it.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_a_narrower_table_is_padded_with_bad_pages():
    """Columns beyond the given table hold -1: a length reaching past them gets NaN, as the eager call."""
    w = _workload(2)
    step = VerifyStep("triton", w.kv_cache, streams=3, q_len=4, heads=8, max_pages=8, graph=False)
    lens = w.kv_lens.clone()
    lens[1] = w.block_table.shape[1] * 16 + 2  # beyond the given table, within the bucket's width
    out, lse = step(w.q, w.block_table, lens)
    assert (step.block_table[:, w.block_table.shape[1]:] == -1).all()
    assert torch.isnan(out[1].float()).all() and not torch.isnan(out[[0, 2]].float()).any()
    eo, el = step.eager(w.q, w.block_table, lens)
    assert torch.isnan(eo[1].float()).all() and torch.equal(out[[0, 2]], eo[[0, 2]])


def test_calls_the_bucket_cannot_hold_are_refused():
    w = _workload()
    step = VerifyStep("triton", w.kv_cache, streams=2, q_len=4, heads=8, max_pages=6, graph=False)
    with pytest.raises(InputError, match=r"bucket takes q \[<= 2, 4, 8, 576\]"):
        step(w.q, w.block_table, w.kv_lens)  # 3 streams
    with pytest.raises(InputError, match="block_table"):
        step(w.q[:2], torch.zeros(2, 7, dtype=torch.int32), w.kv_lens[:2])  # wider than the bucket
    with pytest.raises(InputError, match="q_len"):
        VerifyStep("triton", w.kv_cache, streams=2, q_len=0, heads=8, max_pages=6, graph=False)


def test_buckets_are_chosen_and_reused():
    w = _workload()
    steps = VerifySteps("triton", w.kv_cache, q_len=4, heads=8, stream_buckets=(2, 4), page_buckets=(4, 8))
    assert steps.bucket(1, 3) == (2, 4) and steps.bucket(3, 5) == (4, 8)
    with pytest.raises(InputError, match="no bucket holds 5 streams"):
        steps.bucket(5, 1)
    # on a CPU the step cannot capture a graph: build the bucket's step eagerly and check it is reused
    key = steps.bucket(3, w.block_table.shape[1])
    steps.steps[key] = VerifyStep("triton", w.kv_cache, streams=key[0], q_len=4, heads=8, max_pages=key[1],
                                  graph=False)
    out, _ = steps(w.q, w.block_table, w.kv_lens)
    assert out.shape == (3, 4, 8, 512) and list(steps.steps) == [key]
