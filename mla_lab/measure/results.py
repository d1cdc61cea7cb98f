"""Recorded measurements: ``results/<gpu>.json``, written only by ``mla-lab bench``.

One file per GPU model.  It holds the runs that wrote it (date, GPU, driver,
versions, the command, the ceilings measured in that run) and one record per
(stage, configuration), the latest run's record replacing an older one of the
same key.  Chapters read this file when there is no GPU, and say so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.extension import ROOT

RESULTS = ROOT / "results"

CONFIG_KEYS = ("streams", "q_len", "heads", "prefix", "page_size", "scattered")


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200'; 'NVIDIA RTX PRO 6000 Blackwell ...' -> 'rtx_pro_6000_blackwell_...'."""
    s = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "_", s).strip("_")


def record_key(r: dict) -> tuple:
    return (r["stage"],) + tuple(r[k] for k in CONFIG_KEYS)


@dataclass
class Recorded:
    path: Path
    runs: list
    records: list

    @property
    def gpu(self) -> str:
        return self.runs[-1]["gpu"] if self.runs else "?"

    @property
    def date(self) -> str:
        return self.runs[-1]["date"] if self.runs else "?"

    def run_of(self, record: dict) -> dict:
        return self.runs[record["run"]]

    def select(self, **where) -> list:
        return [r for r in self.records if all(r.get(k) == v for k, v in where.items())]

    def get(self, stage: str, **config) -> dict | None:
        found = self.select(stage=stage, **config)
        return found[0] if found else None

    def describe(self) -> str:
        dates = sorted({r["date"][:10] for r in self.runs})
        try:
            where = self.path.resolve().relative_to(ROOT)
        except ValueError:  # a results file outside the repository (bench --out)
            where = self.path
        commits = sorted({str(r.get("commit")) for r in self.runs if r.get("commit")})
        at = f" at commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}" if commits else ""
        return (f"recorded on {self.gpu} by `mla-lab bench` ({', '.join(dates)}){at}, "
                f"{len(self.records)} measurements in {where}")


def same_run_pairs(rec: Recorded, ours: str, peer: str) -> list[tuple[dict, dict]]:
    """(``ours``, ``peer``) records of one configuration taken in the same run, neither unsupported,
    in the order of streams, q_len, heads, page size and prefix."""
    pairs = []
    for theirs in rec.select(stage=peer):
        mine = rec.get(ours, **{k: theirs[k] for k in CONFIG_KEYS})
        if mine is None or mine["run"] != theirs["run"] or mine.get("unsupported") or theirs.get("unsupported"):
            continue
        pairs.append((mine, theirs))

    def order(pair):
        r = pair[0]
        prefix = (0, r["prefix"], "") if isinstance(r["prefix"], int) else (1, 0, str(r["prefix"]))
        return (r["streams"], r["q_len"], r["heads"], r["page_size"]) + prefix

    return sorted(pairs, key=order)


# The GPU whose records the book reads where no GPU is present (its readings quote them).
REFERENCE_GPU = "h200"


def load(path: Path | str | None = None) -> Recorded | None:
    """The given results file; else this GPU's, where a GPU is present and has one; else the reference GPU's;
    else the most recently written one in results/.  (Not the newest file alone: a fresh clone gives every file
    the same age.)"""
    if path is None:
        import torch

        preferred = [gpu_slug(torch.cuda.get_device_name(0))] if torch.cuda.is_available() else []
        path = next((RESULTS / f"{slug}.json" for slug in preferred + [REFERENCE_GPU]
                     if (RESULTS / f"{slug}.json").is_file()), None)
        if path is None:
            files = sorted(RESULTS.glob("*.json"), key=lambda p: p.stat().st_mtime)
            if not files:
                return None
            path = files[-1]
    path = Path(path)
    data = json.loads(path.read_text())
    return Recorded(path=path, runs=data["runs"], records=data["records"])


def save(path: Path, run: dict, records: list[dict]) -> Recorded:
    """Add one run's records to ``path``, replacing older records of the same keys."""
    old = load(path) if path.is_file() else Recorded(path, [], [])
    runs = old.runs + [run]
    idx = len(runs) - 1
    new = {record_key(r): dict(r, run=idx) for r in records}
    kept = [r for r in old.records if record_key(r) not in new]
    # Drop runs no record refers to any more, renumbering the rest.
    merged = kept + list(new.values())
    used = sorted({r["run"] for r in merged})
    renum = {old_i: i for i, old_i in enumerate(used)}
    runs = [runs[i] for i in used]
    for r in merged:
        r["run"] = renum[r["run"]]
    merged.sort(key=lambda r: (r["streams"], r["q_len"], r["heads"], r["page_size"], r["scattered"],
                               r["prefix"], r.get("order", 0)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs, "records": merged}, indent=1) + "\n")
    return Recorded(path, runs, merged)


def format_table(records: list[dict], stage_order: list[str] | None = None) -> str:
    """The article's table, grown: time per stage, speedups, bandwidth, FLOP rate, % of floor."""
    lines = []
    head = (f"{'B':>2} {'T':>3} {'H':>3} {'prefix':>6} {'page':>5} {'stage':<13} {'splits':>6} "
            f"{'eager us':>9} {'graph us':>9} {'x naive':>8} {'x triton':>8} {'TB/s':>6} {'TFLOP/s':>7} "
            f"{'floor us':>8} {'% floor':>7} {'rel_err':>8}")
    lines.append(head)
    lines.append("-" * len(head))
    groups: dict = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in CONFIG_KEYS), []).append(r)
    for key, rs in groups.items():
        by_stage = {r["stage"]: r for r in rs}
        base_naive = by_stage.get("naive", {}).get("us_graph")
        base_triton = by_stage.get("triton", {}).get("us_graph")
        order = stage_order or [r["stage"] for r in rs]
        for sid in order:
            r = by_stage.get(sid)
            if r is None:
                continue
            page = f"{r['page_size']}{'s' if r['scattered'] else 'c'}"
            pre = (f"{r['streams']:>2} {r['q_len']:>3} {r['heads']:>3} {r['prefix']:>6} {page:>5} "
                   f"{r['stage']:<13} {str(r.get('num_splits') or ''):>6} ")
            if r.get("unsupported"):
                lines.append(pre + f"{'n/a':>9} {'n/a':>9}   ({r['unsupported']})")  # whole: it says what to do
                continue
            g = r["us_graph"]
            if r.get("kind") == "probe":  # a floor, not an answer: no eager time, no error
                lines.append(pre + f"{'-':>9} {g:>9.1f} {'-':>8} {'-':>8} {r['tbs']:>6.2f}   (probe: key reads only)")
                continue
            xn = f"{base_naive / g:.2f}" if base_naive else "-"
            xt = f"{base_triton / g:.2f}" if base_triton else "-"
            lines.append(pre + f"{r['us_eager']:>9.1f} {g:>9.1f} {xn:>8} {xt:>8} {r['tbs']:>6.2f} "
                         f"{r['tflops']:>7.1f} {r['floor_us']:>8.1f} {100 * r['floor_us'] / g:>6.1f}% "
                         f"{r['rel_err']:>8.1e}")
    return "\n".join(lines)


def legend() -> str:
    """What the columns of :func:`format_table` mean, printed under it."""
    return "\n".join([
        "B streams; T query rows per stream (the draft and the token sampled last); H query heads; prefix: cached "
        "tokens before the draft;",
        "page: tokens per page, s at scattered page ids, c at contiguous ones; splits: key ranges per stream "
        "(hopper: blocks in all; blank: no split);",
        "eager us / graph us: median time per call, launched from Python / replayed from a CUDA graph, L2 "
        "flushed before each;",
        "x naive, x triton: speedup over those stages on the same shape (their graph time / this one's); TB/s, "
        "TFLOP/s: the problem's bytes and FLOPs per graph time;",
        "floor us: the roofline floor (the least bytes at the copy rate or the FLOPs at the bf16 matrix rate, "
        "whichever is longer); % floor: floor / graph time;",
        "rel_err: relative L2 error of out against the fp32 reference."])
