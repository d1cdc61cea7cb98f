"""The occupancy calculator on hand-checked cases, then fed the real ptxas table.

Rules (occupancy.py): blocks per SM = min over
  warps:      max_warps_per_sm // warps_per_block
  blocks:     max_blocks_per_sm
  registers:  regs per warp = round_up(regs * 32, 256); each of the 4 sub-partitions holds
              (regs_per_sm / 4) // regs_per_warp warps; blocks = (that * 4) // warps_per_block
  shared mem: per block = round_up(static + dynamic + 1024 reserved, 128); smem_per_sm // per block
"""

import pytest

from mla_lab.core import stages
from mla_lab.measure.occupancy import occupancy
from mla_lab.measure.resources import ptxas_report
from mla_lab.measure.roofline import DEVICES, device_for_arch

H200 = DEVICES["h200"]
RTX = DEVICES["rtx_pro_6000"]


def test_h200_flash_ht8_shape_is_limited_by_shared_memory():
    # 128 threads = 4 warps; 56 regs; 73184 B dynamic (the flash_ht8 tile).
    occ = occupancy(H200, 128, 56, 0, 73184)
    # warps: 64 // 4 = 16
    # regs: 56 * 32 = 1792 (already a multiple of 256); 16384 // 1792 = 9 warps per sub-partition;
    #       9 * 4 = 36 warps // 4 = 9 blocks
    # smem: 73184 + 1024 = 74208 -> round up to 128: 580 * 128 = 74240; 233472 // 74240 = 3 (3 * 74240 = 222720)
    assert occ.limits == {"warps": 16, "blocks": 32, "registers": 9, "shared memory": 3}
    assert occ.blocks_per_sm == 3 and occ.limited_by == "shared memory"
    assert occ.warps_per_sm == 12 and occ.fraction(H200) == pytest.approx(12 / 64)


def test_h200_per_head_shape_is_limited_by_registers():
    # 256 threads = 8 warps; 40 regs; 23052 B dynamic (the per_head tile).
    occ = occupancy(H200, 256, 40, 0, 23052)
    # regs: 40 * 32 = 1280; 16384 // 1280 = 12 per sub-partition; 48 warps // 8 = 6
    # smem: 23052 + 1024 = 24076 -> 189 * 128 = 24192; 233472 // 24192 = 9
    # warps: 64 // 8 = 8
    assert occ.limits == {"warps": 8, "blocks": 32, "registers": 6, "shared memory": 9}
    assert occ.blocks_per_sm == 6 and occ.limited_by == "registers"


def test_h200_32_registers_fill_the_sm():
    occ = occupancy(H200, 256, 32, 0, 23052)
    # regs: 32 * 32 = 1024; 16 per sub-partition; 64 // 8 = 8. warps: 64 // 8 = 8.
    assert occ.blocks_per_sm == 8 and occ.limited_by == "warps, registers"
    assert occ.fraction(H200) == 1.0


def test_register_granularity():
    # 33 regs: 33 * 32 = 1056 rounds up to 1280, the same allocation as 40 registers -> 6 blocks.
    # (Without the rounding: 16384 // 1056 = 15 warps per sub-partition -> 60 // 8 = 7.)
    assert occupancy(H200, 256, 33).limits["registers"] == 6
    # 24 regs: 768 = 3 * 256 exactly; 16384 // 768 = 21; 84 // 8 = 10 (but warps allow only 8)
    occ = occupancy(H200, 256, 24)
    assert occ.limits["registers"] == 10 and occ.blocks_per_sm == 8 and occ.limited_by == "warps"


def test_rtx_pro_6000_per_head_shape():
    occ = occupancy(RTX, 256, 40, 0, 23052)
    # warps: 48 // 8 = 6; regs: 6 as on H200; smem: 102400 // 24192 = 4 (4 * 24192 = 96768)
    assert occ.limits == {"warps": 6, "blocks": 24, "registers": 6, "shared memory": 4}
    assert occ.blocks_per_sm == 4 and occ.limited_by == "shared memory"
    # 4 blocks x 256 threads = 1024 of 1536 threads: 67%
    assert occ.warps_per_sm == 32 and occ.fraction(RTX) == pytest.approx(1024 / 1536)


def test_rtx_pro_6000_flash_ht8_shape():
    occ = occupancy(RTX, 128, 56, 0, 73184)
    # smem: 74240 per block (as above); 102400 // 74240 = 1
    assert occ.blocks_per_sm == 1 and occ.limited_by == "shared memory"
    assert occ.fraction(RTX) == pytest.approx(4 / 48)  # 8.3%
    assert round(100 * occ.fraction(RTX), 1) == 8.3


def test_static_and_dynamic_shared_memory_add_up():
    # 32 static + 23020 dynamic = 23052: the same as 23052 dynamic alone.
    assert occupancy(RTX, 256, 40, 32, 23020).limits == occupancy(RTX, 256, 40, 0, 23052).limits
    # 128-byte granularity: 23040 + 1024 = 24064 = 188 * 128 exactly; one byte more needs 189 * 128.
    assert occupancy(H200, 256, 0, 0, 23040).limits["shared memory"] == 233472 // 24064  # 9
    assert occupancy(RTX, 256, 0, 0, 23040).limits["shared memory"] == 102400 // 24064  # 4
    # Where the rounding matters: 18432 + 1024 = 19456 = 152 * 128 and 233472 // 19456 = 12 exactly.
    # One byte more rounds up to 153 * 128 = 19584, and 233472 // 19584 = 11.
    assert occupancy(H200, 32, 0, 0, 18432).limits["shared memory"] == 12
    assert occupancy(H200, 32, 0, 0, 18433).limits["shared memory"] == 11


def test_shared_memory_over_the_limit_gives_zero():
    # H200: a block may ask for 232448 B; with 1024 reserved that is 233472 = the whole SM.
    assert occupancy(H200, 128, 32, 0, 232448).blocks_per_sm == 1
    over = occupancy(H200, 128, 32, 0, 232449)
    assert over.blocks_per_sm == 0 and over.limited_by == "shared memory"
    # RTX PRO 6000: 101376 allowed per block.
    assert occupancy(RTX, 128, 32, 0, 101376).blocks_per_sm == 1
    assert occupancy(RTX, 128, 32, 0, 101377).blocks_per_sm == 0
    assert occupancy(RTX, 128, 32, 73184, 73184).blocks_per_sm == 0  # static + dynamic together


def test_zero_registers_and_no_shared_memory():
    # 32 threads, nothing else: registers impose no limit; smem: 233472 // 1024 = 228
    occ = occupancy(H200, 32, 0)
    assert occ.limits["warps"] == 64 and occ.limits["blocks"] == 32 and occ.limits["shared memory"] == 228
    assert occ.limits["registers"] > 1000
    assert occ.blocks_per_sm == 32 and occ.limited_by == "blocks"


def test_registers_per_block_and_thread_limits():
    # 1024 threads = 32 warps at 64 regs: 2048 per warp, 32 * 2048 = 65536 = regs_per_block: fits, 1 block.
    assert occupancy(H200, 1024, 64).limits["registers"] == 1
    # 65 regs: 2080 -> 2304 per warp; 32 * 2304 = 73728 > 65536: the block cannot launch.
    occ = occupancy(H200, 1024, 65)
    assert occ.limits["registers"] == 0 and occ.blocks_per_sm == 0 and occ.limited_by == "registers"
    # More than 1024 threads per block: no launch at all.
    assert occupancy(H200, 1056, 32).limits["warps"] == 0
    # A partial warp occupies a whole warp slot: 33 threads = 2 warps.
    assert occupancy(H200, 33, 32).limits["warps"] == 32 and occupancy(H200, 33, 32).warps_per_sm == 64


# ---- the real kernels: ptxas's registers + each stage's launch geometry -------

ARCHS = ("9.0", "12.0")


@pytest.fixture(scope="module")
def reports():
    return {a: {r.kernel: r for r in ptxas_report(a)} for a in ARCHS}


def _blocks(report, arch, stage, launch):
    r = report[arch][launch.kernel]
    return occupancy(device_for_arch(arch), launch.threads_per_block, r.registers, r.static_smem_bytes,
                     launch.dynamic_smem_bytes)


@pytest.mark.parametrize("page_size, max_pages", [(1, 1000), (16, 63), (64, 16)])
def test_every_stage_fits_at_a_1000_token_cache(reports, page_size, max_pages):
    for arch in ARCHS:
        for st in stages.cuda_stages():
            if not st.runs_on(*map(int, arch.split("."))):
                continue  # stage 10 is sm_90 only: 231 KB of shared memory, more than sm_120 gives a block
            for launch in st.launches(3, 9, 8, max_pages, page_size, num_splits=5):
                occ = _blocks(reports, arch, st, launch)
                assert occ.blocks_per_sm >= 1, (arch, st.id, launch, occ.limits)
                assert occ.blocks_per_sm <= device_for_arch(arch).max_blocks_per_sm


def test_flash_ht8_gets_fewer_blocks_on_sm120(reports):
    st = stages.get("flash_ht8")
    launch = st.launches(1, 9, 8, 1000, 1)[0]
    h, b = _blocks(reports, "9.0", st, launch), _blocks(reports, "12.0", st, launch)
    # ~73 KB of shared memory: 3 fit in H200's 228 KB, 1 in the RTX PRO 6000's 100 KB.
    assert b.blocks_per_sm < h.blocks_per_sm
    assert b.blocks_per_sm == 1 and b.limited_by == "shared memory"


def test_naive_stops_fitting_as_the_table_grows(reports):
    """The naive kernel's score array grows with the block table until no block fits."""
    st = stages.get("naive")
    for arch in ARCHS:
        dev = device_for_arch(arch)
        # (576 + capacity) * 4 + 32 static <= optin  <=>  capacity <= (optin - 32) // 4 - 576
        cap = (dev.smem_per_block_optin - reports[arch]["naive_kernel"].static_smem_bytes) // 4 - 576
        fits = st.launches(1, 1, 1, cap, 1)[0]
        too_big = st.launches(1, 1, 1, cap + 1, 1)[0]
        assert _blocks(reports, arch, st, fits).blocks_per_sm == 1
        assert _blocks(reports, arch, st, too_big).blocks_per_sm == 0
