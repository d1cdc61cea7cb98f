"""The generated tables of README.md and docs/*.md: the stage table (README), the op (stage 13, `hopper`) beside
FlashMLA (docs/benchmark.md), the trust record (docs/trust.md), which GPUs (docs/using.md), the end-to-end step
(docs/using.md), from the registry and the recorded results.  Each table stands between its markers in
whichever of those files holds them.

    python -m mla_lab.book.readme          # rewrite the tables
    python -m mla_lab.book.readme --check  # exit 1 if one is out of date (the tests run this)
"""

from __future__ import annotations

import sys

from ..measure import results as _results
from ..core import stages
from ..core.extension import ROOT

README = ROOT / "README.md"


def pages() -> list:
    """The files whose tables are generated: the README and the docs."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]
BEGIN, END = "<!-- stage-table:begin -->", "<!-- stage-table:end -->"
GRAPHS_BEGIN, GRAPHS_END = "<!-- graphs-table:begin -->", "<!-- graphs-table:end -->"
# (streams, q_len, heads, prefix) columns of recorded graph-replay times
COLUMNS = ((1, 9, 8, 16384), (1, 9, 8, 65536), (1, 9, 64, 16384))


def _recorded():
    h200 = _results.RESULTS / "h200.json"
    return _results.load(h200) if h200.exists() else _results.load()


def table() -> str:
    rec = _recorded()
    head = ["#", "stage", "chapter", "what it adds", "threads", "smem/block"]
    head += [f"H{h} prefix {p // 1024}k µs" for _, _, h, p in COLUMNS]
    head += ["vs Triton (H8 16k)", "vs FlashMLA (H8 16k, pages of 64)"]
    header = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines = ["The article's ladder (chapters 00–07):", ""] + header
    triton = None
    if rec:
        r = rec.get("triton", streams=1, q_len=9, heads=8, prefix=16384, page_size=1, scattered=True)
        triton = r["us_graph"] if r and not r.get("unsupported") else None
    for number, stage_id, chapter, adds in stages.chapter_map():
        if number == stages.BEYOND_ARTICLE:
            lines += ["", f"Beyond the article (chapters {number:02d} onward):", ""] + header
        if stage_id is None:  # a chapter without a kernel of its own
            cells = [str(number), "—", f"[{chapter}](chapters/{chapter})", adds] + ["—"] * (len(head) - 4)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        s = stages.get(stage_id)
        threads = str(s.threads) if s.is_cuda else "Triton"
        smem = f"{s.smem_bytes(16385 if s.id == 'naive' else 1, 1) / 1024:.1f} KB" if s.is_cuda else "-"
        if s.id == "naive":
            smem += " (16k cache)"
        cells = [str(s.number), f"`{s.id}`", f"[{s.chapter}](chapters/{s.chapter})", s.adds, threads, smem]
        times = []
        for B, T, H, P in COLUMNS:
            r = rec.get(s.id, streams=B, q_len=T, heads=H, prefix=P, page_size=1, scattered=True) if rec else None
            if r is None:
                times.append(None)
                cells.append("—")
            elif r.get("unsupported"):
                times.append(None)
                cells.append("n/a")
            else:
                times.append(r["us_graph"])
                cells.append(f"{r['us_graph']:.0f}")
        cells.append(f"{triton / times[0]:.2f}x" if triton and times[0] else "—")
        peer = _flashmla_pair(rec, s.id) if rec else None
        cells.append(f"{peer[1]['us_graph'] / peer[0]['us_graph']:.2f}x" if peer else "—")
        lines.append("| " + " | ".join(cells) + " |")
    if rec:
        lines.append("")
        lines.append(f"Times: {rec.describe()}; CUDA-graph replay, median, L2 flushed, one stream, "
                     f"`q_len` 9, pages of one token at scattered ids. A ratio above 1 is faster than the peer. "
                     f"FlashMLA (pages of 64 only) is set beside a stage only where one run timed both "
                     f"(`mla-lab bench --peers`); '—': no such run.")
    else:
        lines.append("")
        lines.append("No recorded results yet: run `mla-lab bench` on a GPU.")
    return "\n".join(lines)


def _flashmla_pair(rec, stage_id: str):
    """The stage and FlashMLA at one stream, 9 rows, 8 heads, 16384 keys, pages of 64, timed in one run."""
    for ours, peer in _results.same_run_pairs(rec, stage_id, PEER):
        if (ours["streams"], ours["q_len"], ours["heads"], ours["prefix"], ours["page_size"]) == (1, 9, 8, 16384, 64):
            return ours, peer
    return None


PEERS_BEGIN, PEERS_END = "<!-- peers-table:begin -->", "<!-- peers-table:end -->"
OURS, PEER = "hopper", "flashmla"
# The shapes Part III's targets are set on; every other shape a peer run measured is "beyond" them.
PEER_GRID = dict(streams=(1, 8), q_len=(9, 16), heads=(8, 64), prefix=(1024, 4096, 16384, 65536))


def on_peer_grid(r: dict) -> bool:
    return all(r[k] in values for k, values in PEER_GRID.items())


def peers_table(rec=None) -> str:
    """The op beside FlashMLA at every configuration a run measured both: Part III's grid, then the rest."""
    rec = rec if rec is not None else _recorded()
    pairs = _results.same_run_pairs(rec, OURS, PEER) if rec else []
    if not pairs:
        return "No run with FlashMLA recorded yet: run `mla-lab bench --peers` on an sm_90 GPU (above)."
    lines = []
    for title, part in (("Part III's grid, the shapes its targets name",
                         [pair for pair in pairs if on_peer_grid(pair[0])]),
                        ("Beyond that grid", [pair for pair in pairs if not on_peer_grid(pair[0])])):
        if not part:
            continue
        wins = sum(ours["us_graph"] <= peer["us_graph"] for ours, peer in part)
        lines += [f"{title}: `{OURS}` takes at most FlashMLA's time at {wins} of {len(part)} shapes.", "",
                  "| streams | q_len | heads | prefix | page | hopper µs | FlashMLA µs | hopper / FlashMLA "
                  "| hopper, % of floor | FlashMLA, % of floor |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for ours, peer in part:
            lines.append(f"| {ours['streams']} | {ours['q_len']} | {ours['heads']} | {ours['prefix']} | "
                         f"{ours['page_size']} | {ours['us_graph']:.1f} | {peer['us_graph']:.1f} | "
                         f"{ours['us_graph'] / peer['us_graph']:.2f} | {100 * ours['floor_us'] / ours['us_graph']:.0f}% | "
                         f"{100 * peer['floor_us'] / peer['us_graph']:.0f}% |")
        lines.append("")
    runs = [rec.runs[i] for i in sorted({ours["run"] for ours, _ in pairs})]
    described = "; ".join(f"{run['date'][:10]}, `{run['command']}` at commit {run.get('commit') or '?'}"
                          f" (FlashMLA {(run.get('flash_mla') or {}).get('commit') or '?'})" for run in runs)
    lines.append(f"Recorded on {rec.gpu}, both kernels in the same run: {described}. CUDA-graph replay, median, "
                 "L2 flushed; the floor is the run's roofline floor (the bytes at its measured copy rate or the "
                 "FLOPs at its measured bf16 matrix rate, whichever takes longer).")
    return "\n".join(lines)


TRUST_BEGIN, TRUST_END = "<!-- trust:begin -->", "<!-- trust:end -->"
ARCH_BEGIN, ARCH_END = "<!-- arch-table:begin -->", "<!-- arch-table:end -->"
# A few GPUs of each architecture the build supports (extension.SUPPORTED_ARCHS), for the table's header.
ARCH_GPUS = {"8.0": "A100, A30", "8.6": "A10, A40, RTX 30xx", "8.9": "L4, L40, RTX 40xx", "9.0": "H100, H200",
             "12.0": "RTX PRO 6000, RTX 50xx"}


def measured_on() -> dict[str, list[str]]:
    """For each stage, the GPUs a recorded `mla-lab bench` run measured it on (results/<gpu>.json)."""
    found: dict[str, list[str]] = {}
    for path in sorted(_results.RESULTS.glob("*.json")):
        rec = _results.load(path)
        for r in rec.records:
            if r.get("unsupported") or r.get("kind") in ("peer", "probe"):
                continue
            gpu = rec.run_of(r)["gpu"].replace("NVIDIA ", "")
            if gpu not in found.setdefault(r["stage"], []):
                found[r["stage"]].append(gpu)
    return found


def arch_table() -> str:
    """Which stages run on which architecture (the registry's min_cc and max_cc), which one ``mla_lab.flash_mla``
    runs there, and where each was measured."""
    from ..core.extension import SUPPORTED_ARCHS
    from ..core.flash_mla import fastest_stage

    archs = list(SUPPORTED_ARCHS)
    head = ["stage"] + [f"sm_{a.replace('.', '')} ({ARCH_GPUS.get(a, '')})" for a in archs] + ["measured on"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    measured = measured_on()
    for s in stages.STAGES:
        cells = [("yes" if s.runs_on(*map(int, a.split("."))) else "—") if s.is_cuda else "yes (Triton)"
                 for a in archs]
        lines.append(f"| `{s.id}` | " + " | ".join(cells) + f" | {', '.join(measured.get(s.id, [])) or '—'} |")
    runs = [f"`{fastest_stage(*map(int, a.split('.'))).id}`" for a in archs]
    lines.append("| `mla_lab.flash_mla` runs | " + " | ".join(runs) + " | |")
    return "\n".join(lines)


def _trust_section() -> str:
    from ..check.suite import readme_section  # from the recorded `mla-lab check`

    return readme_section()


def _graphs_section() -> str:
    from ..serving.graphs import readme_section  # from the recorded `mla-lab graphs`

    return readme_section()


# Each generated table: its markers and what makes it (the stages, the trust record, the op beside FlashMLA, which
# stage runs where, the step end to end).
SECTIONS = ((BEGIN, END, lambda: table()), (TRUST_BEGIN, TRUST_END, _trust_section),
            (PEERS_BEGIN, PEERS_END, lambda: peers_table()), (ARCH_BEGIN, ARCH_END, lambda: arch_table()),
            (GRAPHS_BEGIN, GRAPHS_END, _graphs_section))


def render(text: str) -> str:
    for begin, end, make in SECTIONS:
        if begin in text:
            a, b = text.index(begin) + len(begin), text.index(end)
            text = text[:a] + "\n" + make() + "\n" + text[b:]
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = []
    for path in pages():
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path.relative_to(ROOT).as_posix())
            if "--check" not in argv:
                path.write_text(new)
    if "--check" in argv and stale:
        print(f"generated tables out of date in {', '.join(stale)}: run `python -m mla_lab.book.readme`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
