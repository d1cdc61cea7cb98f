"""Stage 10's ablation variants (chapter 10's budget of a tile): built from the stage's own source."""

import pytest
import torch

from mla_lab import ablation
from mla_lab.problem import Problem, make_workload
from mla_lab.validate import InputError

from conftest import needs_gpu


@pytest.fixture(scope="module")
def counts():
    return {v: ablation.sass_counts(v) for v in (None, *ablation.VARIANTS)}


def test_each_variant_takes_away_what_it_says(counts):
    op = counts[None]
    assert op["HGMMA"] > 0 and op["LDGSTS"] > 1
    # no math: not one product left; the copies all there
    assert counts["no_math"]["HGMMA"] == 0 and counts["no_math"]["LDGSTS"] == op["LDGSTS"]
    # no copies: every product there; only Q's copy left (one cp.async in its loop)
    assert counts["no_copies"]["HGMMA"] == op["HGMMA"] and counts["no_copies"]["LDGSTS"] == 1
    assert counts["neither"] == dict(counts["no_copies"], HGMMA=0)


def test_an_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="no_copies, no_math, neither"):
        ablation.build_defines("no_softmax")


def test_the_runner_checks_arguments_as_the_op_does():
    w = make_workload(Problem(streams=1, q_len=2, heads=2, prefix=10), seed=0)  # on the CPU
    with pytest.raises(InputError, match="hopper \\(no_math\\)"):
        ablation.runner("no_math", w)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                    reason="stage 10 runs on compute capability 9.0 only")
@pytest.mark.parametrize("variant", list(ablation.VARIANTS))
def test_every_variant_runs_and_replays_in_a_graph(variant):
    from mla_lab.timing import cuda_graph

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), device="cuda",
                      seed=5, poison=True)
    call = ablation.runner(variant, w)
    call()
    g = cuda_graph(call)
    g.replay()
    torch.cuda.synchronize()
    if variant == "no_copies":  # keys all zero: every score 0, every output the mean of zeros
        assert torch.isfinite(call.out.float()).all() and call.out.float().abs().max() == 0
