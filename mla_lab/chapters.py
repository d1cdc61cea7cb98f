"""What the chapters call, and ``mla-lab chapters execute``.

A chapter measures live when it runs on a GPU; without one it shows the
results ``mla-lab bench`` recorded, and says which GPU and which day they
come from.  Every number a chapter prints is computed by a cell, from the
registry, the compiler's report, a model, a live run or the recorded file.
"""

from __future__ import annotations

import difflib
import functools
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch

from . import results as _results
from . import roofline, stages
from .extension import CSRC, ROOT
from .problem import Problem, make_workload

CHAPTERS = ROOT / "chapters"
GPU = torch.cuda.is_available()
ARTICLE_PREFIXES = (256, 1024, 4096, 16384, 65536)


def where() -> str:
    """One line: where this notebook is running, and so where its numbers come from."""
    if GPU:
        p = torch.cuda.get_device_properties(0)
        return (f"GPU here: {p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs): "
                "measurements below are taken now.")
    rec = _results.load()
    src = f"the numbers shown were {rec.describe()}" if rec else "nothing is recorded in results/ yet either"
    return f"No GPU here, so nothing below is measured now: {src}."


# ---- source code ---------------------------------------------------------------

def source_of(stage_id: str) -> str:
    return (CSRC / stages.get(stage_id).source).read_text()


def show_diff(old: str, new: str, context: int = 2) -> None:
    """The lesson of a stage: the diff of its kernel file against the previous one."""
    a, b = stages.get(old).source, stages.get(new).source
    lines = difflib.unified_diff((CSRC / a).read_text().splitlines(), (CSRC / b).read_text().splitlines(),
                                 f"csrc/{a}", f"csrc/{b}", n=context, lineterm="")
    print("\n".join(lines))


def show_lines(stage_id: str, start: str, end: str | None = None) -> None:
    """Print a kernel file from the first line containing ``start`` up to (not including) ``end``."""
    text = source_of(stage_id).splitlines()
    i = next(k for k, line in enumerate(text) if start in line)
    j = next((k for k in range(i + 1, len(text)) if end and end in text[k]), len(text))
    print("\n".join(text[i:j]))


@functools.lru_cache(maxsize=None)
def _cuobjdump() -> str | None:
    import shutil

    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.exists() else None
    except Exception:
        return None


def sass_memory_ops(stage_id: str, arch: str = "9.0") -> Counter:
    """Memory instructions in the compiled kernel (SASS), by opcode and width."""
    from .resources import ptxas_report

    ptxas_report(arch)  # makes sure build/ptxas/<file>.sm<arch>.cubin exists
    cubin = ROOT / "build" / "ptxas" / f"{Path(stages.get(stage_id).source).stem}.sm{arch.replace('.', '')}.cubin"
    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (it comes with the CUDA toolkit, or with Triton's package)")
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    kernel = stages.get(stage_id).kernel
    # keep only the main kernel's function body
    parts = re.split(r"\n\s*Function : ", sass)
    body = next((p for p in parts if kernel in p.splitlines()[0]), sass)
    return Counter(re.findall(r"\b((?:LDG|STG|LDS|STS|LDL|STL)(?:\.[A-Z0-9_]+)*)\b", body))


# ---- occupancy -------------------------------------------------------------------

def occupancy_rows(arch: str, stage_ids=None, streams=1, q_len=9, heads=8, cache_tokens=16400):
    """For each kernel of each stage: resources from the compiler's report and blocks per SM."""
    from .occupancy import occupancy
    from .resources import resources_by_kernel

    dev = roofline.device_for_arch(arch)
    res = resources_by_kernel(arch)
    rows = []
    for st in stages.cuda_stages():
        if stage_ids and st.id not in stage_ids:
            continue
        launch = st.launches(streams, q_len, heads, cache_tokens, 1, num_splits=1)[0]
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


# ---- measurements: live on a GPU, recorded otherwise ------------------------------

@functools.lru_cache(maxsize=None)
def _ceilings():
    from .timing import measure_ceilings

    return measure_ceilings()


def measure(stage_ids, problems, *, rep_ms: float = 25.0, num_splits: dict | None = None) -> list[dict]:
    """Check then time each stage on each problem, now, on this GPU (graph replay, L2 flushed)."""
    from . import ops
    from .reference import reference_attention
    from .timing import time_call
    from .verify import compare

    c = _ceilings()
    spec = roofline.DEVICES["h200"]
    out = []
    for i, p in enumerate(problems):
        w = make_workload(p, device="cuda", seed=7000 + i)
        ref = reference_attention(*w.args(), check=False)
        fl = roofline.floor(p, spec, bandwidth=c["copy_tbs"] * 1e12, matrix_rate=c["bf16_matmul_tflops"] * 1e12)
        for sid in stage_ids:
            rec = dict(stage=sid, streams=p.streams, q_len=p.q_len, heads=p.heads, prefix=p.prefixes[0],
                       page_size=p.page_size, scattered=p.scattered, floor_us=fl.floor_us,
                       cuda_core_floor_us=fl.cuda_core_floor_us)
            if sid in ops.PROBES:  # a floor: timed, not checked (it computes nothing)
                call = ops.probe_runner(sid, w)
                us = time_call(call, graph=True, rep_ms=rep_ms)
                out.append(dict(rec, kind="probe", us_graph=us, num_splits=call.num_splits, kv_bytes=call.kv_bytes,
                                tbs=call.kv_bytes / us / 1e6))
                continue
            st = stages.get(sid)
            try:
                call = ops.runner(st, w, num_splits=(num_splits or {}).get(sid))
                call()
            except RuntimeError as e:
                if "shared memory" not in str(e):
                    raise
                out.append(dict(rec, unsupported=str(e).splitlines()[0]))
                continue
            chk = compare(call.out, call.lse, *ref)
            if not chk.ok:
                raise AssertionError(f"{sid} is wrong on {p.label()}: {chk}")
            us = time_call(call, graph=True, rep_ms=rep_ms)
            tbs, tflops = roofline.achieved(p, us)
            out.append(dict(rec, us_graph=us, rel_err=chk.rel_err, tbs=tbs, tflops=tflops))
        del w, ref
    return out


def article_problems(heads=(64, 8), prefixes=ARTICLE_PREFIXES, q_len=9, streams=1, page_size=1, scattered=True):
    return [Problem(streams=streams, q_len=q_len, heads=h, prefix=pre, page_size=page_size, scattered=scattered)
            for h in heads for pre in prefixes]


def results_for(stage_ids, problems) -> tuple[list[dict], str]:
    """Measure now on a GPU, else take the recorded results; returns (records, where they come from)."""
    if GPU:
        name = torch.cuda.get_device_name(0)
        return measure(stage_ids, problems), f"measured now on {name}"
    rec = _results.load()
    if rec is None:
        return [], "no GPU here and no recorded results"
    found = []
    for p in problems:
        for sid in stage_ids:
            r = rec.get(sid, streams=p.streams, q_len=p.q_len, heads=p.heads, prefix=p.prefixes[0],
                        page_size=p.page_size, scattered=p.scattered)
            if r is not None:
                found.append(r)
    return found, f"recorded on {rec.gpu} by `mla-lab bench` ({rec.date[:10]}); no GPU here"


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

    from .bench import draw_prefix_panel

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


def ratio(records: list[dict], a: str, b: str, **config) -> float | None:
    """time(b) / time(a) at one configuration: how many times faster ``a`` is than ``b``."""
    ra = next((r for r in records if r["stage"] == a and all(r.get(k) == v for k, v in config.items())), None)
    rb = next((r for r in records if r["stage"] == b and all(r.get(k) == v for k, v in config.items())), None)
    if not ra or not rb or ra.get("unsupported") or rb.get("unsupported"):
        return None
    return rb["us_graph"] / ra["us_graph"]


# ---- executing the chapters ------------------------------------------------------

def execute(paths=None, timeout: int = 1200) -> int:
    """Run every chapter top to bottom and write the outputs back into the files."""
    import nbformat
    from nbclient import NotebookClient

    paths = [Path(p) for p in paths] if paths else sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    failed = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(CHAPTERS)}})
        try:
            client.execute()
            print(f"executed {path.name}", flush=True)
        except Exception as e:  # keep the partial outputs: they show where it stopped
            failed += 1
            print(f"FAILED {path.name}: {str(e).splitlines()[-1] if str(e) else e}", flush=True)
        nbformat.write(nb, path)
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "execute":
        print("usage: mla-lab chapters execute [chapters/NN_name.ipynb ...]")
        return 2
    return execute(argv[1:] or None)
