"""The article's figures, each beside ours.

The path of this workbook follows a kernel engineer's article about writing
this kernel for an RTX PRO 6000 Blackwell (sm_120).  Every figure the article
gives that a chapter can check is quoted here once, word for word, with:

* the chapter that checks it and what the figure is, in this workbook's terms
  (stage, shape);
* ``ours``: the same quantity for our kernels on the GPU the chapter ran on (an
  H200 for the stored outputs): from a timing record, the CUDA-core and
  tensor-core floors, the occupancy calculator fed by the compiler's report, a
  stage model, or the stage's own parameters;
* ``sm_120``: the figure for the article's GPU by arithmetic, where it can be
  derived without the article's hardware (the occupancy calculator and the
  device table's sm_120 entry; never a timing, which only that GPU can give).

The article's figures are the only numbers typed in this module, each inside
its quote.  Chapters print their own claims (:func:`table`, :func:`verdicts`);
:func:`verdict_table` gathers all of them from recorded results, so it runs
the same with or without a GPU.

A figure *agrees* with the article's when it lies within 10% of it (25% where
the article itself says "~", "roughly" or "approximately"; a range widened by
that much; counts and design parameters exactly).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

from ..measure import roofline
from ..core import stages
from ..core.problem import D_QK, Problem

TOLERANCE = 0.10  # how far a figure may be from the article's and still agree
APPROX_TOLERANCE = 0.25  # the same, where the article says "~", "roughly" or "approximately"
NA = "n/a"  # the figure of a kernel that cannot run at a shape (as the article's table writes it)

# The article's benchmark: one stream, 9 query rows, 64 heads (its microbenchmark); 8 heads is one GPU under TP8.
ARTICLE_HEADS, TP8_HEADS, ARTICLE_Q_LEN = 64, 8, 9


class NotMeasured(LookupError):
    """A claim needs a record that the given records lack."""


@dataclass
class Evidence:
    """What our figures are computed from: timing records, and the ceilings measured with them."""

    records: list
    ceilings: dict | None = None

    def time_us(self, stage: str, heads: int, prefix: int, **config):
        """Graph-replay time, or :data:`NA` where the stage cannot run; :class:`NotMeasured` if absent."""
        want = dict(streams=1, q_len=ARTICLE_Q_LEN, heads=heads, prefix=prefix, page_size=1, scattered=True, **config)
        for r in self.records:
            if r["stage"] == stage and all(r.get(k) == v for k, v in want.items()):
                return NA if r.get("unsupported") else r["us_graph"]
        raise NotMeasured(f"{stage} at H{heads} prefix {prefix}")

    def ceiling(self, key: str) -> float:
        if not self.ceilings or key not in self.ceilings:
            raise NotMeasured(f"the {key} ceiling")
        return self.ceilings[key]


@dataclass(frozen=True)
class Claim:
    chapter: int  # the chapter that checks it
    quote: str  # the article's claim: its own words where short, else ours around its figure
    figure: str  # the figure, as the article writes it (part of the quote)
    what: str  # what the figure is, in this workbook's terms
    unit: str
    ours: Callable[[Evidence], object]  # our figure (H200 for the stored outputs)
    how: str  # where ours comes from
    sm120: Callable[[Evidence], object] | None = None  # the sm_120 figure by arithmetic, if derivable
    exact: bool = False  # counts and design parameters: equal or not
    approximate: bool = False  # the article qualifies the figure ("~", "roughly", "approximately")

    @property
    def tolerance(self) -> float:
        return 0.0 if self.exact else APPROX_TOLERANCE if self.approximate else TOLERANCE

    @property
    def value(self):
        """The article's figure as numbers: one, a (low, high) range, or several; :data:`NA` for "n/a"."""
        return parse_figure(self.figure)

    @property
    def is_range(self) -> bool:
        return "–" in self.figure

    def margin(self) -> str:
        return "exactly" if self.exact else f"within {round(100 * self.tolerance)}%"


_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "eight": 8}


def parse_figure(figure: str):
    """'1.6–1.9×' -> (1.6, 1.9); '10^10 FMAs' -> 1e10; 'only one block' -> 1; 'n/a' -> NA."""
    if figure.strip() == NA:
        return NA
    if re.search(r"\d", figure):
        nums = [float(m["base"]) ** int(m["exp"]) if m["exp"] else float(m["base"])
                for m in re.finditer(r"(?P<base>\d+(?:\.\d+)?)(?:\^(?P<exp>\d+))?", figure)]
    else:  # a count in words: "only one block"
        nums = [float(_WORDS[w]) for w in re.findall(r"\b(" + "|".join(_WORDS) + r")\b", figure)]
    if not nums:
        raise ValueError(f"no number in the figure {figure!r}")
    return nums[0] if len(nums) == 1 else tuple(nums)


def agrees(claim: Claim, x) -> bool:
    """Whether ``x`` (ours or the sm_120 figure) agrees with the article's figure (module docstring)."""
    a, tol = claim.value, claim.tolerance
    if a == NA or x == NA:
        return a == x
    if claim.is_range:
        lo, hi = a
        return lo * (1 - tol) <= x <= hi * (1 + tol)
    if isinstance(a, tuple):
        return isinstance(x, tuple) and len(x) == len(a) and all(abs(u - v) <= tol * v for u, v in zip(x, a))
    return abs(x - a) <= tol * a


# ---- our figures --------------------------------------------------------------------

def _problem(heads: int, prefix: int) -> Problem:
    return Problem(streams=1, q_len=ARTICLE_Q_LEN, heads=heads, prefix=prefix)


@functools.lru_cache(maxsize=None)
def _occupancy(arch: str, stage: str) -> dict:
    from .display import occupancy_rows

    return occupancy_rows(arch, stage_ids=[stage])[0]


def _blocks(arch: str, stage: str) -> int:
    return _occupancy(arch, stage)["blocks"]


def _occupancy_pct(arch: str, stage: str) -> float:
    return 100 * _occupancy(arch, stage)["occupancy"]


def _largest_smem_for(arch: str, blocks: int, stage: str = "flash_ht8") -> float:
    """The most shared memory (KB) a block of ``stage``'s threads and registers may take for ``blocks`` per SM."""
    from ..measure.occupancy import occupancy
    from ..measure.resources import resources_by_kernel

    dev = roofline.device_for_arch(arch)
    st = stages.get(stage)
    regs = resources_by_kernel(arch)[st.kernel].registers
    smem = dev.smem_per_block_optin
    while smem > 0 and occupancy(dev, st.threads, regs, 0, smem).blocks_per_sm < blocks:
        smem -= dev.smem_granularity
    return smem / 1024


def _naive_runs(arch: str, prefix: int):
    """On sm_120 no timing exists, but whether a launch fits does: 'n/a' where no block fits an SM."""
    from ..measure.occupancy import occupancy
    from ..measure.resources import resources_by_kernel

    dev = roofline.device_for_arch(arch)
    st = stages.get("naive")
    r = resources_by_kernel(arch)[st.kernel]
    fits = occupancy(dev, st.threads, r.registers, r.static_smem_bytes,
                     st.smem_bytes(prefix + ARTICLE_Q_LEN, 1)).blocks_per_sm > 0
    return "runs" if fits else NA


def _ms(ev: Evidence, stage: str, heads: int, prefix: int):
    t = ev.time_us(stage, heads, prefix)
    return t if t == NA else t / 1e3


def _speedup(ev: Evidence, fast: str, slow: str, heads: int, prefix: int):
    a, b = ev.time_us(fast, heads, prefix), ev.time_us(slow, heads, prefix)
    return NA if NA in (a, b) else b / a


def _cuda_core_floor_ms(device: str, heads: int = ARTICLE_HEADS, prefix: int = 16384) -> float:
    return roofline.floor(_problem(heads, prefix), device).cuda_core_us / 1e3


def _triton_gbs(ev: Evidence) -> float:
    """The Triton baseline's effective bandwidth at TP8, 65536: the cache's bytes (once) over its time."""
    return roofline.min_bytes(_problem(TP8_HEADS, 65536)) / ev.time_us("triton", TP8_HEADS, 65536) / 1e3


def _passes_per_row(stage: str, heads: int, prefix: int = 16384) -> float:
    """Key bytes a stage reads over the bytes its query rows see: passes over the cache per row."""
    from ..models import traffic

    p = _problem(heads, prefix)
    seen = sum(prefix + t + 1 for t in range(p.q_len)) * D_QK * 2
    return traffic(stage, p).parts["kv"] / seen


def _traffic_ratio(a: str, b: str, heads: int = ARTICLE_HEADS, prefix: int = 16384) -> float:
    from ..models import traffic

    p = _problem(heads, prefix)
    return traffic(a, p).total / traffic(b, p).total


def _per_head_score_threads() -> tuple[int, int]:
    """Threads of a per-head block with a dot product to do in the score phase (one per key), and the rest."""
    st = stages.get("per_head")
    busy = st.keys_per_tile * st.head_tile
    return busy, st.threads - busy


def _warp_per_key_parameters() -> tuple[int, int, int]:
    st = stages.get("warp_per_key")
    return st.threads, st.head_tile, st.keys_per_tile


# ---- the claims ---------------------------------------------------------------------

_H200, _RTX = "9.0", "12.0"
_SHAPE = "64 heads, one stream, q_len 9, prefix {}"


def _table_row(prefix: str, naive: str, flash: str, speedup: str) -> str:
    return f"{'1':>6}{'9':>7}{prefix:>9}{naive:>12}{flash:>12}{speedup:>9}"


# The article's table (its v4, the KV-split kernel, against its naive kernel), row by row, as printed there.
_V4_TABLE = {
    256: ("199.5", "436.4", "0.5x"),
    1024: ("738.8", "1665.6", "0.4x"),
    4096: ("2887.8", "4342.1", "0.7x"),
    16384: ("19602.0", "11600.7", "1.7x"),
    65536: ("n/a", "48477.6", "-"),
}


def _v4_claims() -> list[Claim]:
    out = []
    for prefix, (naive, flash, speedup) in _V4_TABLE.items():
        quote = _table_row(str(prefix), naive, flash, speedup)
        out.append(Claim(
            1, quote, naive, f"naive kernel, µs, {_SHAPE.format(prefix)}; the article's table, naive_us", "us",
            lambda ev, p=prefix: ev.time_us("naive", ARTICLE_HEADS, p), "measured",
            (lambda ev, p=prefix: _naive_runs(_RTX, p)) if naive == NA else None))
    for prefix, (naive, flash, speedup) in _V4_TABLE.items():
        out.append(Claim(
            3, _table_row(str(prefix), naive, flash, speedup), flash,
            f"KV-split kernel, µs, {_SHAPE.format(prefix)}; the article's table, flash_us", "us",
            lambda ev, p=prefix: ev.time_us("kv_split", ARTICLE_HEADS, p), "measured"))
    for prefix, (naive, flash, speedup) in _V4_TABLE.items():
        if speedup == "-":
            continue
        out.append(Claim(
            3, _table_row(str(prefix), naive, flash, speedup), speedup,
            f"KV-split over naive, {_SHAPE.format(prefix)}; the article's table, speedup", "x",
            lambda ev, p=prefix: _speedup(ev, "kv_split", "naive", ARTICLE_HEADS, p), "measured"))
    return out


_CLAIMS_BEFORE_TABLE = (
    # ---- chapter 00: the problem, the floor, the baseline
    Claim(0, "one call's work is approximately 10^10 FMAs",
          "10^10 FMAs", f"multiply-adds of one call, {_SHAPE.format(16384)}", "FMAs",
          lambda ev: roofline.fma_count(_problem(ARTICLE_HEADS, 16384)), "counted (the same on any GPU)",
          lambda ev: roofline.fma_count(_problem(ARTICLE_HEADS, 16384)), approximate=True),
    Claim(0, "The RTX PRO 6000 Blackwell has roughly 90 TFLOP/s of fp32 compute throughput.",
          "90 TFLOP/s", "fp32 CUDA-core rate (sm_120: its datasheet)", "TFLOP/s",
          lambda ev: ev.ceiling("fp32_matmul_tflops"), "measured: an 8192^3 fp32 matmul",
          lambda ev: roofline.DEVICES["rtx_pro_6000"].fp32_tflops, approximate=True),
    Claim(0, "At peak compute utilization, the kernel should complete in 0.22 milliseconds.",
          "0.22 milliseconds", f"CUDA-core floor at the datasheet fp32 rate, ms, {_SHAPE.format(16384)}", "ms",
          lambda ev: _cuda_core_floor_ms("h200"), "datasheet arithmetic",
          lambda ev: _cuda_core_floor_ms("rtx_pro_6000")),
    Claim(0, "the Triton kernel performed scattered gather memory accesses that achieved only ~14 GB/s effective "
             "bandwidth", "~14 GB/s",
          "the Triton baseline's effective bandwidth: the cache's bytes (once) over its time, 8 heads, prefix 65536, "
          "pages of one token at scattered ids", "GB/s", _triton_gbs, "measured", approximate=True),
    Claim(0, "roughly 130× below the GPU's 1.8 TB/s peak", "130×",
          "memory bandwidth over the Triton baseline's effective bandwidth (sm_120: its datasheet bandwidth over "
          "the article's 14 GB/s)", "x",
          lambda ev: ev.ceiling("copy_tbs") * 1e3 / _triton_gbs(ev), "measured: a copy and the Triton baseline",
          lambda ev: roofline.DEVICES["rtx_pro_6000"].bandwidth_tbs * 1e3 / claim("~14 GB/s").value, approximate=True),
    Claim(0, "roughly 130× below the GPU's 1.8 TB/s peak", "1.8 TB/s",
          "memory bandwidth (sm_120: its datasheet)", "TB/s",
          lambda ev: ev.ceiling("copy_tbs"), "measured: a device-to-device copy",
          lambda ev: roofline.DEVICES["rtx_pro_6000"].bandwidth_tbs),
    # ---- chapter 02: flash over a head tile of 8
    Claim(2, "The flash kernel uses 70 KB of shared memory per thread block.", "70 KB",
          "shared memory per block of the head-tile kernel (flash_ht8, kv_split), KB", "KB",
          lambda ev: stages.get("flash_ht8").smem_bytes(1, 1) / 1024, "stage layout (the same on any GPU)",
          lambda ev: stages.get("flash_ht8").smem_bytes(1, 1) / 1024),
    Claim(2, "this means only one block can reside on each SM at a time", "only one block",
          "blocks per SM of the head-tile kernel (flash_ht8)", "blocks/SM",
          lambda ev: _blocks(_H200, "flash_ht8"), "occupancy calculator, sm_90",
          lambda ev: _blocks(_RTX, "flash_ht8"), exact=True),
    Claim(2, "the flash kernel reads the KV cache 16× fewer times than the naive kernel", "16×",
          f"naive's traffic over flash_ht8's (stage models), {_SHAPE.format(16384)}", "x",
          lambda ev: _traffic_ratio("naive", "flash_ht8"), "stage models (the same on any GPU)",
          lambda ev: _traffic_ratio("naive", "flash_ht8")),
    Claim(2, "cutting latency roughly in half from the pre-split ~20ms", "~20ms",
          f"flash kernel before the split (flash_ht8), ms, {_SHAPE.format(16384)}", "ms",
          lambda ev: _ms(ev, "flash_ht8", ARTICLE_HEADS, 16384), "measured", approximate=True),
)

_CLAIMS_AFTER_TABLE = (
    # ---- chapter 03: the KV split
    Claim(3, "The KV-split optimization—a standard technique borrowed from flash-attention literature—has delivered "
             "only a 1.6–1.9× speedup over the naive baseline at long context lengths", "1.6–1.9×",
          f"KV-split over naive at the longest prefix naive runs, {_SHAPE.format(16384)}", "x",
          lambda ev: _speedup(ev, "kv_split", "naive", ARTICLE_HEADS, 16384), "measured"),
    Claim(3, "That is a 50× gap between theoretical peak and measured performance.", "50×",
          f"KV-split time over the CUDA-core floor at the datasheet fp32 rate, {_SHAPE.format(16384)} (sm_120: "
          "the article's 11600.7 µs over its floor)", "x",
          lambda ev: ev.time_us("kv_split", ARTICLE_HEADS, 16384) / 1e3 / _cuda_core_floor_ms("h200"),
          "measured over datasheet arithmetic",
          lambda ev: parse_figure(_V4_TABLE[16384][1]) / 1e3 / _cuda_core_floor_ms("rtx_pro_6000")),
    # ---- chapter 04: occupancy, one head per block
    Claim(4, "an SM designed to support up to 2048 threads (64 warps)", "2048 threads (64 warps)",
          "threads and warps per SM", "threads, warps",
          lambda ev: (roofline.DEVICES["h200"].max_threads_per_sm, roofline.DEVICES["h200"].max_warps_per_sm),
          "device table (CUDA programming guide)",
          lambda ev: (roofline.DEVICES["rtx_pro_6000"].max_threads_per_sm,
                      roofline.DEVICES["rtx_pro_6000"].max_warps_per_sm), exact=True),
    Claim(4, "the kernel achieves only 6% occupancy", "6%",
          "occupancy of the KV-split kernel (warps resident over warp slots)", "%",
          lambda ev: _occupancy_pct(_H200, "kv_split"), "occupancy calculator, sm_90",
          lambda ev: _occupancy_pct(_RTX, "kv_split")),
    Claim(4, "But the shared memory footprint drops to ~23 KB", "~23 KB",
          "shared memory per block of the per-head kernel, KB", "KB",
          lambda ev: stages.get("per_head").smem_bytes(1, 1) / 1024, "stage layout (the same on any GPU)",
          lambda ev: stages.get("per_head").smem_bytes(1, 1) / 1024, approximate=True),
    Claim(4, "allowing 4 blocks per SM and achieving 67% occupancy", "4 blocks",
          "blocks per SM of the per-head kernel", "blocks/SM",
          lambda ev: _blocks(_H200, "per_head"), "occupancy calculator, sm_90",
          lambda ev: _blocks(_RTX, "per_head"), exact=True),
    Claim(4, "allowing 4 blocks per SM and achieving 67% occupancy", "67%",
          "occupancy of the per-head kernel", "%",
          lambda ev: _occupancy_pct(_H200, "per_head"), "occupancy calculator, sm_90",
          lambda ev: _occupancy_pct(_RTX, "per_head")),
    Claim(4, "achieving 67% occupancy—an 11× improvement", "11×",
          "occupancy of the per-head kernel over the KV-split kernel's", "x",
          lambda ev: _occupancy_pct(_H200, "per_head") / _occupancy_pct(_H200, "kv_split"),
          "occupancy calculator, sm_90",
          lambda ev: _occupancy_pct(_RTX, "per_head") / _occupancy_pct(_RTX, "kv_split")),
    Claim(4, "By shrinking the shared memory footprint below 49 KB, the kernel could fit 2 blocks per SM", "49 KB",
          "the most shared memory a 128-thread block may take for 2 blocks per SM, KB", "KB",
          lambda ev: _largest_smem_for(_H200, 2), "occupancy calculator, sm_90",
          lambda ev: _largest_smem_for(_RTX, 2)),
    Claim(4, "Below 33 KB, it could fit 3 blocks.", "33 KB",
          "the most shared memory a 128-thread block may take for 3 blocks per SM, KB", "KB",
          lambda ev: _largest_smem_for(_H200, 3), "occupancy calculator, sm_90",
          lambda ev: _largest_smem_for(_RTX, 3)),
    Claim(4, "With only 8 heads per rank, the per-head design reads the KV cache 8 times per decode step",
          "8 times", "passes over the cache per query row of the per-head kernel at 8 heads (stage model)", "passes",
          lambda ev: _passes_per_row("per_head", TP8_HEADS), "stage model (the same on any GPU)",
          lambda ev: _passes_per_row("per_head", TP8_HEADS)),
    # ---- chapter 05: a warp per key
    Claim(5, "a naive implementation would activate only 16 threads (one per key) while the remaining 240 threads "
             "sit idle", "only 16 threads (one per key) while the remaining 240 threads",
          "threads of the per-head kernel busy and idle while scores are computed", "threads",
          lambda ev: _per_head_score_threads(), "stage parameters (the same on any GPU)",
          lambda ev: _per_head_score_threads(), exact=True),
    Claim(5, "Each thread in the warp handles 18 elements of the 576-element embedding dimension", "18 elements",
          "elements of the 576-long dot product per lane in the warp-per-key kernel", "elements",
          lambda ev: D_QK // 32, "arithmetic (the same on any GPU)", lambda ev: D_QK // 32, exact=True),
    Claim(5, "reducing the serial work per thread from 576 FMAs to 18 FMAs plus a warp reduction",
          "from 576 FMAs to 18 FMAs", "multiply-adds in one thread's chain per score: per-head, warp-per-key", "FMAs",
          lambda ev: (D_QK, D_QK // 32), "arithmetic (the same on any GPU)", lambda ev: (D_QK, D_QK // 32),
          exact=True),
    Claim(5, "with specific parameters (BLOCK=256, HT=1, TK=8)", "BLOCK=256, HT=1, TK=8",
          "threads per block, heads per block, keys per tile of the warp-per-key kernel", "",
          lambda ev: _warp_per_key_parameters(), "stage parameters (the same on any GPU)",
          lambda ev: _warp_per_key_parameters(), exact=True),
    # ---- chapter 06: 16-byte loads, and the article's final figure
    Claim(6, "would go on to achieve a 3–6× end-to-end decode speedup over the Triton baseline", "3–6×",
          "float4 over the Triton baseline, 8 heads, prefix 16384: the attention kernel alone (the article's figure "
          "is a whole decode step)", "x",
          lambda ev: _speedup(ev, "float4", "triton", TP8_HEADS, 16384), "measured"),
)

# In chapter order; within chapter 03 the article's table comes before its headline figures.
CLAIMS: tuple[Claim, ...] = tuple(sorted(_CLAIMS_BEFORE_TABLE + tuple(_v4_claims()) + _CLAIMS_AFTER_TABLE,
                                         key=lambda c: c.chapter))


def claims(chapter: int | None = None) -> list[Claim]:
    """The claims a chapter checks (all of them, in chapter order, without ``chapter``)."""
    found = [c for c in CLAIMS if chapter is None or c.chapter == chapter]
    return sorted(found, key=lambda c: c.chapter) if chapter is None else found


def claim(figure: str, chapter: int | None = None) -> Claim:
    """The claim whose figure is ``figure`` (in ``chapter``, where a figure recurs)."""
    found = [c for c in claims(chapter) if c.figure == figure]
    if len(found) != 1:
        raise KeyError(f"{len(found)} claims with the figure {figure!r}")
    return found[0]


# ---- evaluating and printing ------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    claim: Claim
    ours: object  # a number, a tuple, NA; None: not measured
    sm120: object  # the same; None: not derivable (or not measured)
    ours_agrees: bool | None
    sm120_agrees: bool | None


def evaluate(c: Claim, ev: Evidence) -> Row:
    def get(fn):
        if fn is None:
            return None
        try:
            return fn(ev)
        except NotMeasured:
            return None

    ours, sm = get(c.ours), get(c.sm120)
    return Row(c, ours, sm, None if ours is None else agrees(c, ours), None if sm is None else agrees(c, sm))


def evidence(records=None, ceilings=None) -> tuple[Evidence, str, str]:
    """Records and ceilings as given (measured now on a GPU, or recorded), else the recorded results.

    Returns the evidence, where it comes from (empty when given) and the GPU it was measured on.
    """
    from ..measure import results
    from .measure import GPU

    rec = results.load()
    if records is not None:
        if GPU:
            import torch

            gpu = torch.cuda.get_device_name(0)
        else:
            gpu = rec.gpu if rec else "?"
        return Evidence(list(records), ceilings), "", gpu
    if rec is None:
        return Evidence([], None), "no recorded results", "?"
    return (Evidence(rec.records, rec.runs[-1]["ceilings"] if rec.runs else None),
            f"ours: {rec.describe()}", rec.gpu)


def _short(gpu: str) -> str:
    return re.sub(r"^NVIDIA\s+", "", gpu)


def fmt(x, unit: str = "") -> str:
    if x is None:
        return "-"
    if x == NA or isinstance(x, str):
        return str(x)
    if isinstance(x, tuple):
        return ", ".join(fmt(v) for v in x)
    if abs(x) >= 1e6:
        return f"{x:.3g}"
    if abs(x) >= 1000 or float(x).is_integer():
        return f"{x:.0f}"
    return f"{x:.3g}"


def _word(ok: bool | None, missing: str) -> str:
    return missing if ok is None else "agrees" if ok else "differs"


def _print_rows(rows: list[Row], gpu: str, chapter_column: bool) -> None:
    """Two lines per claim: the figures and verdicts, then what they are and where ours comes from."""
    ours = f"ours ({_short(gpu)})"
    print((f"{'ch':<4}" if chapter_column else "")
          + f"{'the article (sm_120)':<26} {ours:>14} {'sm_120 by arithmetic':>21}   {'ours':<9} sm_120")
    for r in rows:
        c = r.claim
        art = c.figure if len(c.figure) <= 26 else c.figure[:23] + "..."
        print((f"{c.chapter:02d}  " if chapter_column else "")
              + f"{art:<26} {fmt(r.ours):>14} {fmt(r.sm120):>21}   {_word(r.ours_agrees, 'not measured'):<9} "
                f"{_word(r.sm120_agrees, 'not derivable' if c.sm120 is None else 'not measured')}")
        print((" " * 4 if chapter_column else "") + f"    {c.what} [ours: {c.how}; agreeing means {c.margin()}]")


def table(chapter: int, records=None, ceilings=None, source: str = "") -> list[Row]:
    """The article's figures a chapter checks, beside ours and the sm_120 figure by arithmetic."""
    ev, found, gpu = evidence(records, ceilings)
    rows = [evaluate(c, ev) for c in claims(chapter)]
    if source or found:
        print(f"[{source or found}]")
    _print_rows(rows, gpu, chapter_column=False)
    return rows


def verdicts(chapter: int, records=None, ceilings=None) -> list[Row]:
    """One line per claim of a chapter: whether ours and the sm_120 figure agree with the article's.

    No measured number is printed, so the lines read the same wherever the
    chapter runs, as long as the measurements fall on the same side of the
    margin (each line names it).
    """
    ev, _, _ = evidence(records, ceilings)
    rows = [evaluate(c, ev) for c in claims(chapter)]
    for r in rows:
        c = r.claim
        sm = "" if c.sm120 is None else f", sm_120 by arithmetic {_word(r.sm120_agrees, 'not measured')}"
        print(f"the article's {c.figure} ({c.what}): ours {_word(r.ours_agrees, 'not measured')}{sm} "
              f"[agreeing means {c.margin()}]")
    return rows


def verdict_table(records=None, ceilings=None, *, numbers: bool = True) -> list[Row]:
    """Every claim of the article, chapter by chapter: the article's figure, ours, the sm_120 one, verdicts.

    Without ``records`` it reads the recorded results (``results/``), so it
    gives the same table with or without a GPU.  ``numbers=False`` prints only
    the verdicts and a count, text that stays the same as long as no verdict
    changes (for a compared notebook cell).
    """
    ev, found, gpu = evidence(records, ceilings)
    rows = [evaluate(c, ev) for c in claims()]
    if numbers:
        if found:
            print(f"[{found}]")
        _print_rows(rows, gpu, chapter_column=True)
    else:
        for r in rows:
            c = r.claim
            sm = "" if c.sm120 is None else f", sm_120 {_word(r.sm120_agrees, 'not measured')}"
            print(f"{c.chapter:02d} {c.figure!r}: ours {_word(r.ours_agrees, 'not measured')}{sm}")
    n = len(rows)
    ours_ok = sum(1 for r in rows if r.ours_agrees)
    derivable = [r for r in rows if r.claim.sm120 is not None]
    sm_ok = sum(1 for r in derivable if r.sm120_agrees)
    print(f"{n} figures of the article: ours agree with {ours_ok}; of the {len(derivable)} that arithmetic "
          f"derives for sm_120, {sm_ok} agree")
    return rows
