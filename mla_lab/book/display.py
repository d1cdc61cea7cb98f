"""What the chapters display: kernel source and diffs, occupancy tables, timing tables and plots, and the
stored Nsight Compute profiles.

Nothing here times a kernel (that is :mod:`mla_lab.book.measure`); these functions read the registry, the
compiler's report and records they are given.  The compiled code is :mod:`mla_lab.book.sass`'s, and checked
conclusions :mod:`mla_lab.book.verdicts`'.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from ..measure import results as _results
from ..measure import roofline
from ..core import stages
from .measure import GPU
from ..core.extension import CSRC, ROOT


def where() -> str:
    """One line: where this notebook is running, and so where its numbers come from."""
    if GPU:
        import torch

        p = torch.cuda.get_device_properties(0)
        return (f"GPU here: {p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs): "
                "measurements below are taken now.")
    rec = _results.load()
    src = f"the numbers shown were {rec.describe()}" if rec else "nothing is recorded in results/ yet either"
    return f"No GPU here, so nothing below is measured now: {src}."


def stages_upto(stage_id: str) -> list[str]:
    """Ids of the stages up to and including ``stage_id``: what a chapter may list, so that a
    later stage never changes an earlier chapter's output."""
    last = stages.get(stage_id).number
    return [s.id for s in stages.STAGES if s.number <= last]


# ---- source code ---------------------------------------------------------------

def _source_path(what: str) -> str:
    """csrc/'s file for a stage id, or a path under csrc/ itself ("hopper/tile_n.cuh", "experiments/short_call.cu")."""
    if (CSRC / what).is_file():
        return what
    return stages.get(what).source


def source_of(what: str) -> str:
    """The text of a stage's kernel file, or of a file under csrc/ named by its path there."""
    return (CSRC / _source_path(what)).read_text()


def show_diff(old: str, new: str, context: int = 2) -> None:
    """The lesson of a stage: the diff of its kernel file against the previous one (stage ids or csrc/ paths)."""
    a, b = _source_path(old), _source_path(new)
    lines = difflib.unified_diff((CSRC / a).read_text().splitlines(), (CSRC / b).read_text().splitlines(),
                                 f"csrc/{a}", f"csrc/{b}", n=context, lineterm="")
    print("\n".join(lines))


def show_lines(what: str, start: str, end: str | None = None) -> None:
    """Print a stage's kernel file (or a file under csrc/, by its path there) from the first line containing
    ``start`` up to (not including) the next line containing ``end``."""
    text = source_of(what).splitlines()
    name = _source_path(what)
    i = next((k for k, line in enumerate(text) if start in line), None)
    if i is None:
        raise ValueError(f"no line containing {start!r} in {name}")
    j = next((k for k in range(i + 1, len(text)) if end and end in text[k]), None if end else len(text))
    if j is None:
        raise ValueError(f"no line containing {end!r} after {start!r} in {name}")
    print("\n".join(text[i:j]))


# ---- occupancy -------------------------------------------------------------------

def occupancy_rows(arch: str, stage_ids=None, streams=1, q_len=9, heads=8, cache_tokens=16400):
    """For the main kernel of each stage: resources from the compiler's report and blocks per SM."""
    from ..measure.occupancy import occupancy
    from ..measure.resources import resources_by_kernel

    dev = roofline.device_for_arch(arch)
    res = resources_by_kernel(arch)
    rows = []
    for st in stages.cuda_stages():
        if stage_ids and st.id not in stage_ids:
            continue
        # the main kernel's launch (a Hopper stage's, at pages of one token: its gather), not the merge
        launches = st.launches(streams, q_len, heads, cache_tokens, 1, num_splits=1)
        launch = next(x for x in launches if x.kernel == st.kernel)
        r = res[launch.kernel]
        occ = occupancy(dev, launch.threads_per_block, r.registers, r.static_smem_bytes, launch.dynamic_smem_bytes)
        rows.append(dict(stage=st.id, threads=launch.threads_per_block, registers=r.registers,
                         smem=launch.dynamic_smem_bytes + r.static_smem_bytes, blocks=occ.blocks_per_sm,
                         limited_by=occ.limited_by, warps=occ.warps_per_sm,
                         occupancy=occ.fraction(dev), limits=occ.limits))
    return rows


def print_occupancy(arch: str, **kw) -> list:
    dev = roofline.device_for_arch(arch)
    rows = occupancy_rows(arch, **kw)
    print(f"{dev.name} (sm_{arch.replace('.', '')}): {dev.max_threads_per_sm} threads = {dev.max_warps_per_sm} warps, "
          f"{dev.max_blocks_per_sm} blocks, {dev.regs_per_sm} registers, {dev.smem_per_sm // 1024} KB shared memory per SM")
    print(f"{'stage':<13} {'threads':>7} {'regs':>5} {'smem B':>7} {'blocks/SM':>9} {'warps/SM':>8} "
          f"{'occupancy':>9}  limited by")
    for r in rows:
        print(f"{r['stage']:<13} {r['threads']:>7} {r['registers']:>5} {r['smem']:>7} {r['blocks']:>9} "
              f"{r['warps']:>8} {100 * r['occupancy']:>8.1f}%  {r['limited_by']}")
    return rows


# ---- timing tables and plots --------------------------------------------------------

def print_table(records: list[dict], stage_ids, baseline: str | None = None, source: str = "") -> None:
    """The article's table: one line per shape, a column per stage, speedups over ``baseline``."""
    if source:
        print(f"[{source}]")
    by = {}
    for r in records:
        by.setdefault((r["streams"], r["q_len"], r["heads"], r["prefix"]), {})[r["stage"]] = r
    head = f"{'B':>2} {'T':>3} {'H':>3} {'prefix':>6} {'floor us':>9}" + "".join(f" {s + ' us':>16}" for s in stage_ids)
    if baseline:
        head += "".join(f" {s + '/' + baseline:>18}" for s in stage_ids if s != baseline)
    print(head)
    for (B, T, H, pre), rs in by.items():
        line = f"{B:>2} {T:>3} {H:>3} {pre:>6} {next(iter(rs.values()))['floor_us']:>9.1f}"
        for s in stage_ids:
            r = rs.get(s)
            line += f" {'n/a' if r is None or r.get('unsupported') else format(r['us_graph'], '.1f'):>16}"
        if baseline:
            base = rs.get(baseline)
            for s in stage_ids:
                if s == baseline:
                    continue
                r = rs.get(s)
                ok = base and r and not base.get("unsupported") and not r.get("unsupported")
                line += f" {format(base['us_graph'] / r['us_graph'], '.2f') + 'x' if ok else '-':>18}"
        print(line)


def plot_prefix(records: list[dict], stage_ids, source: str = ""):
    """Time against prefix, a panel per head count, the floor dashed."""
    import matplotlib.pyplot as plt

    from ..measure.bench import draw_prefix_panel

    heads = sorted({r["heads"] for r in records}, reverse=True)
    if not heads:
        print("nothing to plot")
        return None
    fig, axes = plt.subplots(1, len(heads), figsize=(6 * len(heads), 4.2), squeeze=False)
    for ax, H in zip(axes[0], heads):
        rs = [r for r in records if r["heads"] == H]
        draw_prefix_panel(ax, rs, stage_ids, f"{H} heads, one stream, q_len {rs[0]['q_len'] if rs else '?'}")
        ax.legend(fontsize=8)
    if source:
        fig.suptitle(source, fontsize=9)
    fig.tight_layout()
    return fig


# ---- profiles ----------------------------------------------------------------------------

PROFILES = ROOT / "results" / "profiles"


@dataclass
class Profile:
    """One kernel's part of a recorded Nsight Compute text report (``results/profiles/``)."""

    path: Path
    kernel: str
    metrics: dict  # metric name -> value (the first table row of that name: the % of peak where two exist)
    stalls: list  # (what the warps wait for, % of the cycles between two issues), from the report's advice

    def stall_metrics(self) -> dict:
        """The rows of the report that name a stall reason (present when it was asked for them)."""
        return {k: v for k, v in self.metrics.items() if "stall" in k.lower()}


def read_profile(pattern: str, kernel: str) -> Profile | None:
    """The first report in results/profiles/ whose name matches ``pattern`` (a glob), the part about
    ``kernel``; ``None`` if there is no such report or it does not profile that kernel."""
    found = sorted(PROFILES.glob(pattern))
    if not found:
        return None
    parts, name, lines = {}, None, []
    for line in found[0].read_text().splitlines() + ["  end() (1, 1, 1)x(1, 1, 1)"]:
        # a kernel's header: its name, template arguments if any (FlashMLA's), parameters, grid and block
        head = re.search(r"(\w+)(?:<.*>)?\([^()]*\) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if head:
            if name:
                parts[name] = lines
            name, lines = head.group(1), []
        elif name:
            lines.append(line)
    if kernel not in parts:
        return None
    metrics = {}
    for line in parts[kernel]:
        row = re.match(r"\s+([A-Za-z(][\w ()./-]*?[\w)])\s{2,}(?:\S+\s+)?(-?[\d,]+(?:\.\d+)?)\s*$", line)
        if row:
            metrics.setdefault(row.group(1), float(row.group(2).replace(",", "")))
    text = " ".join(line.strip() for line in parts[kernel])
    stalls = [(what.strip(), float(share)) for what, share in re.findall(
        r"stalled ((?:waiting|on) [^.]*?)\. .*?represents about ([\d.]+)% of the total", text)]
    return Profile(found[0], kernel, metrics, stalls)
