"""Work counts and floors (roofline.py) on hand-checked cases, and the device table."""

import pytest

from mla_lab.core.problem import Problem
from mla_lab.measure.roofline import DEVICES, achieved, device_for_arch, floor, fma_count, flops, min_bytes


def test_seed_article_case():
    """One stream, 9 rows (8 draft tokens + 1), 64 heads, a 16384-token prefix."""
    p = Problem(streams=1, q_len=9, heads=64, prefix=16384)
    # Row t sees prefix + t + 1 keys; summed over t = 0..8: 9 * 16384 + (1 + 2 + ... + 9) = 9 * 16384 + 45.
    keys = 9 * 16384 + 45
    assert keys == 147501
    # Per (head, key): a 576-long dot product and a 512-long multiply-add into out = 1088 FMAs.
    fmas = 64 * keys * 1088
    assert fmas == 10_270_789_632  # the seed article's "10^10 FMAs"
    assert fma_count(p) == fmas and flops(p) == 2 * fmas
    assert 1.02e10 < fma_count(p) < 1.04e10
    # Bytes: each cached token once (prefix + draft = 16393 tokens x 576 bf16), q once, out once.
    kv = (16384 + 9) * 576 * 2
    q = 9 * 64 * 576 * 2
    out = 9 * 64 * 512 * 2
    assert (kv, q, out) == (18_884_736, 663_552, 589_824)
    assert min_bytes(p) == kv + q + out == 20_138_112


def test_floors_on_h200_use_measured_rates():
    p = Problem(streams=1, q_len=9, heads=64, prefix=16384)
    fl = floor(p, DEVICES["h200"])
    f, b = 2 * 64 * (9 * 16384 + 45) * 1088, (16384 + 9) * 576 * 2 + 9 * 64 * 576 * 2 + 9 * 64 * 512 * 2
    # measured: 687 TFLOP/s bf16 matmul and 4.25 TB/s copy (not the datasheet's 989 and 4.8)
    assert fl.compute_us == pytest.approx(f / 687e12 * 1e6, rel=1e-12)  # ~29.9 us
    assert fl.memory_us == pytest.approx(b / 4.25e12 * 1e6, rel=1e-12)  # ~4.74 us
    assert fl.cuda_core_us == pytest.approx(f / 67e12 * 1e6, rel=1e-12)  # fp32 CUDA cores, datasheet: ~307 us
    assert 29 < fl.compute_us < 31 and 4.6 < fl.memory_us < 4.9
    assert fl.bound == "compute" and fl.floor_us == fl.compute_us
    assert fl.cuda_core_floor_us == fl.cuda_core_us
    assert floor(p, "h200") == fl  # a name works as well as a spec
    # Rates measured in a run replace the table's.
    fl2 = floor(p, "h200", bandwidth=2e12, matrix_rate=1e15)
    assert fl2.memory_us == pytest.approx(b / 2e12 * 1e6) and fl2.compute_us == pytest.approx(f / 1e15 * 1e6)
    # H100 has no measured rates: the datasheet's (3.35 TB/s, 989 TFLOP/s) are used.
    h = floor(p, "h100")
    assert h.memory_us == pytest.approx(b / 3.35e12 * 1e6) and h.compute_us == pytest.approx(f / 989e12 * 1e6)


def test_short_cache_is_memory_bound():
    # One row, one head: 1 key per token, so bytes dominate. prefix 1000, q_len 1:
    # FLOPs = 2 * 1 * 1001 * 1088 = 2_178_176; bytes = 1001 * 1152 + 1152 + 1024 = 1_155_328.
    p = Problem(streams=1, q_len=1, heads=1, prefix=1000)
    assert flops(p) == 2_178_176 and min_bytes(p) == 1_155_328
    fl = floor(p, "h200")
    assert fl.bound == "memory" and fl.floor_us == fl.memory_us


def test_multi_stream_prefixes():
    p = Problem(streams=3, q_len=2, heads=4, prefix=(0, 10, 3))
    # keys per stream: 2 * prefix + (1 + 2) -> 3, 23, 9: 35 in all
    assert flops(p) == 2 * 4 * 35 * 1088
    # tokens: 2, 12, 5 = 19; q and out: 3 streams x 2 rows x 4 heads
    assert min_bytes(p) == 19 * 576 * 2 + 24 * 576 * 2 + 24 * 512 * 2
    # The same as the sum of the streams taken one at a time.
    parts = [Problem(streams=1, q_len=2, heads=4, prefix=x) for x in (0, 10, 3)]
    assert flops(p) == sum(map(flops, parts)) and min_bytes(p) == sum(map(min_bytes, parts))


def test_achieved_is_the_inverse_of_the_floor():
    p = Problem(streams=2, q_len=9, heads=8, prefix=(5000, 123))
    fl = floor(p, "h200")
    tbs, _ = achieved(p, fl.memory_us)
    _, tflops = achieved(p, fl.compute_us)
    assert tbs == pytest.approx(4.25) and tflops == pytest.approx(687.0)
    a = achieved(p, 10.0)
    b = achieved(p, 20.0)
    assert b[0] == pytest.approx(a[0] / 2) and b[1] == pytest.approx(a[1] / 2)
    # 10 us: bytes / 10e-6 s, in TB/s
    assert a[0] == pytest.approx(min_bytes(p) / 10e-6 / 1e12)
    assert a[1] == pytest.approx(flops(p) / 10e-6 / 1e12)


def test_device_table():
    h200, rtx = DEVICES["h200"], DEVICES["rtx_pro_6000"]
    assert (h200.max_threads_per_sm, h200.max_blocks_per_sm, h200.max_warps_per_sm) == (2048, 32, 64)
    assert (rtx.max_threads_per_sm, rtx.max_blocks_per_sm, rtx.max_warps_per_sm) == (1536, 24, 48)
    assert h200.arch == "9.0" and rtx.arch == "12.0" and DEVICES["h100"].arch == "9.0"
    assert h200.bandwidth() == 4.25e12 and h200.matrix_rate() == 687e12 and h200.fp32_rate() == 67e12
    assert DEVICES["h100"].bandwidth() == 3.35e12
    for d in DEVICES.values():
        assert d.warp_size == 32
        assert d.smem_per_block_optin + d.reserved_smem_per_block <= d.smem_per_sm
        assert d.regs_per_sm == 65536 and d.reg_granularity == 256 and d.smem_granularity == 128
        assert d.sources, f"{d.name}: no sources given"
        # measured rates, where given, are below the datasheet's
        if d.measured_bandwidth_tbs:
            assert d.measured_bandwidth_tbs < d.bandwidth_tbs
        if d.measured_bf16_tflops:
            assert d.measured_bf16_tflops < d.bf16_tflops
    assert device_for_arch("12.0") is rtx
    assert device_for_arch("9.0").arch == "9.0"
    with pytest.raises(KeyError, match="8.0"):
        device_for_arch("8.0")
