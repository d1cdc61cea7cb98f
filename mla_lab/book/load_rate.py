"""How fast one SM fills its shared memory with key tiles: a probe of the hardware for chapter 10.

Stage 10's loader, timed alone (the "no math" build), fills shared memory more
slowly than HBM delivers. Is that the way it asks for the bytes? The probe
(``csrc/probes/load_rate.cu``) keeps only the loading: one block per SM, a
loader warpgroup filling a ring of 8 KB chunks, and consumer warps that hand
each tile back as soon as it has landed. :data:`LOADERS` are the three ways it
can ask: the stage's 16-byte ``cp.async`` gathers, the tensor copy (TMA) one
chunk at a time, and the tensor copy of a whole tile in one instruction.
:func:`measure` times each on the patterns of :data:`PATTERNS` and returns the
rate at which the SMs' shared memories fill, with the rate of distinct bytes
from memory beside it.
"""

from __future__ import annotations

import functools

from ..core.extension import CSRC, load_sm90a

SOURCE = CSRC / "probes" / "load_rate.cu"
TILE_BYTES = 64 * 576 * 2  # one page of 64 keys: 9 chunks of 8 KB
LOADERS = {"cp.async": 0, "tma_chunk": 1, "tma_tile": 2}
MAX_RING = 27  # chunks: three tiles

# name -> (distinct tiles, groups of blocks that each read all of them)
PATTERNS = {
    # 8 streams of 65536 keys at 8 heads: every tile read by one block, from HBM.
    "hbm": (8 * 1025, 1),
    # 8 streams of 16384 keys at 64 heads: 8 pair groups read each tile at about the same time; L2 serves most.
    "l2": (8 * 257, 8),
    # A short call's share: one tile per block on a GPU of 132 SMs, so every copy is a first one.
    "one_tile": (132, 1),
}

# (loader, ring chunks): the stage's own ring of 15 chunks, then deeper rings and whole tiles.
CONFIGS = (("cp.async", 15), ("cp.async", 27), ("tma_chunk", 15), ("tma_chunk", 27), ("tma_tile", 18),
           ("tma_tile", 27))


@functools.lru_cache(maxsize=None)
def load(verbose: bool = False):
    """Build (once) and import the probe's module, for sm_90a."""
    return load_sm90a("mla_lab_load_rate", [SOURCE, CSRC / "probes" / "load_rate_binding.cpp"], "load-rate-sm90a",
                      verbose=verbose)


def _cache(tiles: int, seed: int):
    """A cache of ``tiles`` pages (random values) and a random order of its pages."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    kv = torch.randn(tiles, 64, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    pages = torch.randperm(tiles, device="cuda", generator=g).to(torch.int32)
    return kv, pages


def first_tile_ok(loader: str, ring: int, seed: int = 0) -> bool:
    """Whether block 0's first tile lands as the cache holds it (every loader, any ring)."""
    check_configs((), [(loader, ring)])
    import torch

    module = load()
    kv, pages = _cache(64, seed)
    dump = torch.full((9, 64, 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    module.run(kv, pages, 1, 1, LOADERS[loader], ring, dump)  # one block: it reads all 64 tiles, around the ring
    torch.cuda.synchronize()
    want = kv[int(pages[0])].view(64, 9, 64).transpose(0, 1)  # [chunk, key, dim]
    return bool(torch.equal(dump, want))


def check_configs(patterns, configs) -> None:
    """Refuse, before any GPU work, a pattern, loader or ring the probe does not have."""
    unknown = sorted(set(patterns) - set(PATTERNS)) + sorted({c[0] for c in configs} - set(LOADERS))
    if unknown:
        raise ValueError(f"the probe has patterns {sorted(PATTERNS)} and loaders {sorted(LOADERS)}; not {unknown}")
    for loader, ring in configs:
        if not 9 <= ring <= MAX_RING or (loader == "tma_tile" and ring % 9):
            raise ValueError(f"a ring holds 9 to {MAX_RING} chunks, a multiple of 9 for tma_tile; not {ring} for {loader}")


def measure(patterns=tuple(PATTERNS), configs=CONFIGS, rep_ms: float = 30, seed: int = 0) -> list[dict]:
    """One row per (pattern, loader, ring): the time of one pass and the rates it gives.

    ``smem_tbs`` counts every byte that lands in shared memory (each group's
    copy of a tile); ``distinct_tbs`` counts each tile once, the bytes that
    must come from memory. Timed as the stages are (graph replay, L2 flushed).
    """
    check_configs(patterns, configs)
    import torch

    from ..measure.timing import time_call

    module = load()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    rows = []
    for name in patterns:
        tiles, groups = PATTERNS[name]
        kv, pages = _cache(tiles, seed)
        blocks = sms - sms % groups
        for loader, ring in configs:
            us = time_call(lambda: module.run(kv, pages, groups, blocks, LOADERS[loader], ring), graph=True,
                           rep_ms=rep_ms)
            rows.append(dict(pattern=name, loader=loader, ring=ring, tiles=tiles, groups=groups, blocks=blocks, us=us,
                             smem_tbs=groups * tiles * TILE_BYTES / us / 1e6,
                             distinct_tbs=tiles * TILE_BYTES / us / 1e6))
        del kv, pages
        torch.cuda.empty_cache()
    return rows


def sass_counts() -> dict[str, int]:
    """The copy instructions of the probe compiled for sm_90a (a static count): needs nvcc, no GPU.

    ``LDGSTS``: the 16-byte ``cp.async`` copies; ``UTMALDG.3D`` and ``UTMALDG.4D``:
    the tensor copies of one chunk and of a whole tile.
    """
    from .sass import count_opcodes, cubin_sass, instruction_mix
    from ..measure.resources import compile_cubin

    mix = instruction_mix(cubin_sass(compile_cubin(SOURCE, "9.0")))
    return {name: count_opcodes(mix, name) for name in ("LDGSTS", "UTMALDG.3D", "UTMALDG.4D")}
