"""The wgmma rate probe (csrc/probes/wgmma_rate.cu) that chapter 10 runs."""

import pytest
import torch

from mla_lab.book import wgmma_rate

from conftest import needs_gpu


def test_the_probe_compiles_one_product_shape_per_n():
    # 16 products per batch, unrolled, for each N the probe offers; nothing else on the tensor cores
    assert wgmma_rate.sass_shapes() == {f"64x{n}x16": 16 for n in wgmma_rate.NS}


def test_a_shape_the_probe_does_not_have_is_refused_before_any_gpu_work():
    with pytest.raises(ValueError, match="not \\[48\\]"):
        wgmma_rate.measure(ns=(40, 48))
    with pytest.raises(ValueError, match="not \\[3\\]"):
        wgmma_rate.measure(ns=(40,), warpgroups=(3,))


def test_the_peak_is_the_datasheet_rate_per_sm_and_clock():
    # 989.4 dense bf16 TFLOP/s, 132 SMs, 1.83 GHz boost: 2 flops per multiply-add
    assert wgmma_rate.PEAK_MACS_PER_CLOCK == pytest.approx(989.4e12 / (132 * 1.83e9) / 2, rel=0.01)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                    reason="wgmma is sm_90a")
def test_the_measured_rates_are_possible():
    rows = wgmma_rate.measure(ns=(40, 64), iters=64)
    assert [(r["n"], r["warpgroups"]) for r in rows] == [(40, 1), (40, 2), (64, 1), (64, 2)]
    for r in rows:  # no faster than the hardware can go, and not absurdly slow
        assert 0.2 < r["of_peak"] <= 1.05, r
        assert r["cycles_per_wgmma"] * r["macs_per_clock"] == pytest.approx(64 * r["n"] * 16 * r["warpgroups"])
