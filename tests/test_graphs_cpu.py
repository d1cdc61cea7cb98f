"""mla-lab graphs without a GPU: it shows what is recorded, in the layout the measurements write.

The record here is made up to exercise the printing; real ones are written only by the command on a GPU.
"""

import json
import statistics

import pytest
import torch

from mla_lab.serving import graphs
from mla_lab.core import stages

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the command")


def _made_up_record():
    ids = [s.id for s in stages.STAGES]
    launch = dict(prefix=256, streams=1, q_len=9, heads=8, tiny_op_us=4.0, tiny_op_busy=True,
                  rows=[dict(stage=s, launches=2, bare="x", bare_us=10.0 + i, attention_us=12.0 + i,
                             attention_alloc_us=15.0 + i, overhead_us=2.0, alloc_overhead_us=5.0, busy=True)
                        for i, s in enumerate(ids)])
    best = dict(prefix=16384, kernel_us={s: 100.0 + i for i, s in enumerate(ids)}, best=ids[0])
    loop = [dict(stage=s, prefix=p, eager_us=30.0, graph_us=10.0, calls_in_graph=61)
            for s in ("triton", "float4") for p in (256, 1024, 16384)]
    steps = dict(rows=[dict(stage=s, prefix=p, layers=61, eager_us=9000.0, graph_us=6000.0 + p / 10)
                       for p in (1024, 16384, 65536) for s in ("triton", "float4", ids[-1])],
                 one_layer=dict(stage=ids[-1], prefix=1024, eager_us=200.0, graph_us=100.0), hidden=7168, heads=8,
                 q_len=9, layer_bytes=51_791_872)
    verify = [dict(stage=s, replays=12, bit_equal=True, padded_nan=True, num_splits=4, streams=4, max_pages=160,
                   page_size=16) for s in ids]
    defrag = dict(prefix=16384, layers=61, page_size=1, moved_pages=16000, moved_bytes=10**9, defrag_us=5000.0,
                  kernel_us_before={"triton": 500.0}, kernel_us_after={"triton": 499.0},
                  step_us_before={"triton": 35000.0}, step_us_after={"triton": 34900.0},
                  kernel_same_output={"triton": True}, step_same_output={"triton": True})
    acceptance = [dict(stage="triton", steps=100, appended=2700, accepted=1500, cache_checks=624, defrags=4,
                       max_rel_err=0.01, summary="triton: 100 steps")]
    return dict(run=dict(gpu="NVIDIA H200", date="2026-11-30T00:00:00+00:00", command="mla-lab graphs"),
                launch=launch, best=best, loop=loop,
                prediction=dict(stage=ids[0], prefix=1024, layers=61, kernels_per_layer=25, kernels_per_step=12,
                                one_layer_step_host_us=180.0, host_busy=True),
                steps=steps, verify_step=verify, defrag=defrag, acceptance=acceptance)


def test_without_a_gpu_the_command_prints_the_record(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(graphs, "GRAPHS", tmp_path)
    assert graphs.main([]) == 0
    assert "nothing recorded by `mla-lab graphs` yet" in capsys.readouterr().out
    (tmp_path / "h200.json").write_text(json.dumps(_made_up_record()))
    assert graphs.main([]) == 0
    out = capsys.readouterr().out
    assert "recorded on NVIDIA H200 by `mla-lab graphs` (2026-11-30)" in out
    for words in ("host time per call", "61 captured us/call", "graphs gain", "triton/float4",
                  "replay == eager", "defragmentation moved 16000 pages", "triton: 100 steps"):
        assert words in out, words
    assert graphs.section("steps")["one_layer"]["eager_us"] == 200.0
    assert graphs.source().endswith("; no GPU here")
    assert graphs.step_stages_of(graphs.section("steps")) == ["triton", "float4", stages.STAGES[-1].id]


def test_readme_section_from_the_record(tmp_path, monkeypatch):
    monkeypatch.setattr(graphs, "GRAPHS", tmp_path)
    assert graphs.readme_section() == "No end-to-end results recorded yet: run `mla-lab graphs` on a GPU."
    (tmp_path / "h200.json").write_text(json.dumps(_made_up_record()))
    text = graphs.readme_section()
    lines = text.splitlines()
    assert lines[0].startswith("| stage | prefix 1k ms | prefix 16k ms | prefix 64k ms | vs Triton (16k) |")
    assert lines[2].startswith("| `triton` (fastest) | 6.10 | 7.64 | 12.55 | 1.00x | 1.47x |")
    assert "adds at most 2.0 µs of host time to the bare op" in text
    assert f"for {len(stages.STAGES)} of {len(stages.STAGES)} stages" in text
    assert text.endswith("Recorded on NVIDIA H200 by `mla-lab graphs` (2026-11-30).")


def test_median_difference_compares_run_by_run():
    # A slow stretch of the host caught two of bare's runs and three of given's. Median against median says
    # given costs 22 us more; run by run, four of the five pairs show the 2 us it really costs.
    bare = [10.0, 10.0, 30.0, 30.0, 10.0]
    given = [12.0, 32.0, 32.0, 32.0, 12.0]
    assert statistics.median(given) - statistics.median(bare) == 22.0
    assert graphs.median_difference(given, bare) == 2.0
    with pytest.raises(ValueError, match="equally long"):
        graphs.median_difference([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-empty"):
        graphs.median_difference([], [])


def test_back_to_back_timing_refuses_an_empty_measurement():
    from mla_lab.measure.timing import back_to_back_us

    for kw in (dict(calls=0), dict(rounds=0)):
        with pytest.raises(ValueError, match="at least one call and one round"):
            back_to_back_us(lambda: None, **kw)


def test_without_a_gpu_the_command_names_the_options_it_cannot_apply(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(graphs, "GRAPHS", tmp_path)
    assert graphs.main(["--quick", "--out", str(tmp_path / "x.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Ignored here (nothing is measured without a GPU): --quick --out.")
    assert not (tmp_path / "x.json").exists()
