"""The load rate probe (csrc/probes/load_rate.cu) that chapter 10 runs."""

import pytest
import torch

from mla_lab.book import load_rate

from conftest import needs_gpu

sm90_only = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                               reason="TMA and these mbarriers are sm_90a")


def test_the_probe_compiles_all_three_loaders():
    # the stage's 16-byte gathers, the tensor copy of one chunk (3-d) and of a whole tile (4-d)
    counts = load_rate.sass_counts()
    assert all(counts[name] > 0 for name in ("LDGSTS", "UTMALDG.3D", "UTMALDG.4D")), counts


def test_what_the_probe_does_not_have_is_refused_before_any_gpu_work():
    with pytest.raises(ValueError, match="not \\['dram'\\]"):
        load_rate.measure(patterns=("dram",))
    with pytest.raises(ValueError, match="not \\['tma_box'\\]"):
        load_rate.measure(configs=(("tma_box", 15),))
    with pytest.raises(ValueError, match="not 15 for tma_tile"):  # whole tiles need a ring of whole tiles
        load_rate.measure(configs=(("tma_tile", 15),))
    with pytest.raises(ValueError, match="not 28 for cp.async"):
        load_rate.first_tile_ok("cp.async", 28)


def test_the_patterns_are_the_stages_tiles():
    # 8 streams of 65536 keys (+ a draft) in tiles of 64, read once; 8 of 16384 read by 8 pair groups
    assert load_rate.PATTERNS["hbm"] == (8 * ((65536 + 9 + 63) // 64), 1)
    assert load_rate.PATTERNS["l2"] == (8 * ((16384 + 9 + 63) // 64), 8)
    assert load_rate.TILE_BYTES == 64 * 576 * 2


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("loader, ring", [("cp.async", 9), ("cp.async", 15), ("tma_chunk", 15), ("tma_chunk", 27),
                                          ("tma_tile", 9), ("tma_tile", 27)])
def test_every_loader_puts_the_tile_where_the_stage_reads_it(loader, ring):
    assert load_rate.first_tile_ok(loader, ring, seed=3)


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_measured_rates_are_possible():
    rows = load_rate.measure(patterns=("hbm",), configs=(("cp.async", 15), ("tma_tile", 18)), rep_ms=5)
    assert [(r["loader"], r["ring"]) for r in rows] == [("cp.async", 15), ("tma_tile", 18)]
    for r in rows:  # distinct bytes no faster than the memory can deliver them, and not absurdly slow
        assert 0.5 < r["distinct_tbs"] <= 4.9, r
        assert r["smem_tbs"] == pytest.approx(r["distinct_tbs"])
