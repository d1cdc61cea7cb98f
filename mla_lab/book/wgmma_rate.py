"""How fast the tensor cores run one ``wgmma`` shape: a probe of the hardware for chapter 10.

Stage 10 turns the products around so that the keys are the M side (64) of
``wgmma`` and the (row, head) pairs its N side: 40 per warpgroup.  Is N = 40
as fast, per multiply-add, as the N = 64 of FlashMLA's score tiles?  The
probe (``csrc/probes/wgmma_rate.cu``) has every SM run one or two warpgroups
that issue nothing but ``m64nNk16`` wgmmas from shared memory, and counts
clock cycles.  :func:`measure` returns, per N and warpgroup count, the
cycles per wgmma of each warpgroup and the multiply-adds per clock of the SM,
against the :data:`PEAK_MACS_PER_CLOCK` of the datasheet.
"""

from __future__ import annotations

import functools

from ..core.extension import CSRC, load_sm90a

SOURCE = CSRC / "probes" / "wgmma_rate.cu"
NS = (40, 64, 80, 128)
PEAK_MACS_PER_CLOCK = 2048  # dense bf16 multiply-adds per clock and SM: 989 TFLOP/s / (132 SMs x 1.83 GHz) / 2


@functools.lru_cache(maxsize=None)
def load(verbose: bool = False):
    """Build (once) and import the probe's module, for sm_90a."""
    return load_sm90a("mla_lab_wgmma_rate", [SOURCE, CSRC / "probes" / "wgmma_rate_binding.cpp"], "wgmma-rate-sm90a",
                      verbose=verbose)


def measure(ns=NS, warpgroups=(1, 2), iters: int = 256) -> list[dict]:
    """One row per (N, warpgroups): median cycles per wgmma of a warpgroup, and MACs per clock of an SM.

    One block per SM, so every SM is busy, as in stage 10's persistent grid.
    A first run of each shape warms the clocks up and is discarded.
    """
    import torch

    unknown = sorted(set(ns) - set(NS)) + sorted(set(warpgroups) - {1, 2})
    if unknown:
        raise ValueError(f"the probe has N in {NS} and one or two warpgroups; not {unknown}")
    module = load()
    per_batch = module.per_batch()
    blocks = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    rows = []
    for n in ns:
        for wg in warpgroups:
            module.cycles(n, wg, blocks, iters)
            cycles = module.cycles(n, wg, blocks, iters).double()
            per_wgmma = float(cycles.median()) / (iters * per_batch)
            macs = 64 * n * 16 * wg / per_wgmma
            rows.append(dict(n=n, warpgroups=wg, cycles_per_wgmma=per_wgmma, macs_per_clock=macs,
                             of_peak=macs / PEAK_MACS_PER_CLOCK))
    return rows


def sass_shapes() -> dict[str, int]:
    """The ``HGMMA`` instructions of the probe compiled for sm_90a, by shape: needs nvcc, no GPU."""
    from .sass import cubin_sass, hgmma_shapes
    from ..measure.resources import compile_cubin

    return hgmma_shapes(cubin_sass(compile_cubin(SOURCE, "9.0")))
