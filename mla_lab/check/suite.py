"""``mla-lab check``: how far to trust the kernels beyond the shapes the chapters show.

Six parts, each over every stage of the registry that this GPU can run:

1. **compute-sanitizer**: memcheck, racecheck, synccheck and initcheck, one
   process per (tool, stage), on small varied workloads that include spoiled
   streams (``sanitize.py``);
2. **fuzz**: hypothesis draws valid shapes, layouts and views; every stage is
   held to the fp32 reference on each (``fuzz.py``);
3. **graph soak**: one captured call replayed many times while its lengths and
   tables change; replays compared at intervals with an eager call (``stress.py``);
4. **concurrency**: two stages on two CUDA streams at once against the same
   calls one after the other (``stress.py``);
5. **bad inputs**: every entry of the table in ``badinput.py`` through
   ``attention()``, the raw ops and ``check=False``;
6. **extreme values**: huge scores, identical keys, draft-only caches (``extremes.py``).

It prints a table per part and a summary, and writes ``results/check/<gpu>.json``
(``<gpu>-quick.json`` for ``--quick``) with the GPU, the date, the commit and
every count.  Without a GPU it runs what needs none (the fuzz against the
stages' CPU models and the Triton interpreter, the bad-input table through the
Python checks and the compiled ops' argument checks, the extreme values on the
models) and says which parts need a GPU.  docs/trust.md ("How far to trust it")
section is generated from the record (:func:`readme_section`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.extension import ROOT

CHECKS = ROOT / "results" / "check"
PARTS = ("sanitizer", "fuzz", "soak", "concurrency", "bad_inputs", "extremes")
GPU_ONLY = ("sanitizer", "soak", "concurrency")
FUZZ_TARGET = 1000  # cases per stage the full mode must reach with 0 mismatches


@dataclass(frozen=True)
class Plan:
    """The sizes of one mode; all of them are printed and recorded."""

    mode: str
    tools: tuple[str, ...]  # compute-sanitizer tools on the CUDA stages
    triton_tools: tuple[str, ...]  # ... and on the Triton baseline
    fuzz_per_stage: int  # GPU: at least this many cases reach every stage
    soak_replays: int  # the soak of the last stage this GPU runs
    soak_other_replays: int  # the soak of every other stage
    soak_compare_every: int
    concurrency_iterations: int
    cpu_fuzz_cases: int  # no GPU: cases for the CPU models
    cpu_triton_cases: int  # ... of which the Triton interpreter takes the first


FULL = Plan("full", ("memcheck", "racecheck", "synccheck", "initcheck"), ("memcheck",), FUZZ_TARGET,
            100_000, 2_000, 1000, 20, 200, 30)
QUICK = Plan("quick", ("memcheck",), ("memcheck",), 100, 10_000, 500, 1000, 5, 60, 8)


def _say(*a):
    print(*a, flush=True)


def _first_line(e: BaseException) -> str:
    lines = [l for l in str(e).splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


# ---- which stages run here --------------------------------------------------------------

def runnable_stages(ids=None) -> tuple[list, dict]:
    """(stages this GPU runs, {stage id: why not} for the others), from the registry."""
    import torch

    from ..core import stages as _stages
    from ..core.ops import attention, load_ops
    from ..core.problem import Problem, make_workload

    chosen = [_stages.get(s) for s in ids] if ids else list(_stages.STAGES)
    ok, skipped = [], {}
    w = make_workload(Problem(streams=1, q_len=2, heads=2, prefix=30, page_size=16), device="cuda", seed=1)
    major, minor = torch.cuda.get_device_capability()
    for st in chosen:
        if hasattr(st, "runs_on") and not st.runs_on(major, minor):
            skipped[st.id] = (f"its kernels need compute capability {st.min_cc / 10:.1f}"
                              f"{'' if st.max_cc == st.min_cc else ' or newer'}; this GPU is {major}.{minor}")
            continue
        try:
            if st.is_cuda:
                load_ops()
                if not hasattr(torch.ops.mla_lab, st.id):
                    raise RuntimeError("not compiled into the extension")
            attention(st, *w.args())
            torch.cuda.synchronize()
            ok.append(st)
        except Exception as e:  # noqa: BLE001 - the stage's own words say why
            skipped[st.id] = _first_line(e)
    return ok, skipped


def kernels_of(st) -> list[str]:
    """The kernels the extension says a stage launches (its main kernel, combine, scheduler...)."""
    if not st.is_cuda:
        return ["Triton: _split_kv_stage1, _split_kv_stage2"]
    from ..core.ops import load_ops

    try:
        return [a["kernel"] for a in load_ops().kernel_attributes(st.id)]
    except Exception:  # noqa: BLE001
        return list(st.kernels)


# ---- the GPU run ------------------------------------------------------------------------------

def _hypothesis_missing() -> str | None:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        return "the fuzz needs hypothesis: pip install -e \".[test]\""
    return None


def run_gpu(plan: Plan, parts, stage_ids, seed: int, jobs: int) -> dict:
    import torch

    from . import badinput, extremes, fuzz, sanitize, stress
    from ..core.ops import load_ops

    load_ops()  # build before any child process needs it
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sts, skipped = runnable_stages(stage_ids)
    rec: dict = {"stages": [st.id for st in sts], "stages_skipped": skipped}
    _say(f"stages: {', '.join(rec['stages'])}")
    for sid, why in skipped.items():
        _say(f"skipped on this GPU: {sid}: {why}")
    cuda = [st for st in sts if st.is_cuda]

    # In this process first, while the GPU is not shared: extremes, soak, concurrency, bad inputs.
    if "extremes" in parts:
        t0 = time.perf_counter()
        res = extremes.run(sts, "cuda")
        rec["extremes"] = {"seconds": round(time.perf_counter() - t0, 1),
                           "results": {sid: {k: v.as_dict() for k, v in r.items()} for sid, r in res.items()},
                           "reached": {st.id: extremes.kernels_reached(st, sms) for st in cuda}}
        _print_extremes(rec["extremes"])
    if "soak" in parts:
        _say(f"\ngraph soak (every {plan.soak_compare_every}th replay of the longest soak compared with an eager call)")
        rec["soak"] = []
        main_stage = cuda[-1] if cuda else None
        for st in sts:
            n = plan.soak_replays if st is main_stage else plan.soak_other_replays
            every = plan.soak_compare_every if st is main_stage else max(1, n // 10)
            # A Hopper stage soaks a second shape too, which reaches its seesaw (stages 12, 13) or its tensor copy
            # (11), where the first does not.
            shapes = [(stress.SOAK, n, every)]
            if st.persistent:
                shapes.append((stress.SEESAW_SOAK, plan.soak_other_replays, max(1, plan.soak_other_replays // 10)))
            for shape, n, every in shapes:
                try:
                    rec["soak"].append(stress.soak(st, n, every, seed=seed, shape=shape))
                except Exception as e:  # noqa: BLE001
                    rec["soak"].append(dict(stage=st.id, replays=0, compared=0, mismatches=1, error=_first_line(e),
                                            shape=shape.describe()))
                _print_soak_row(rec["soak"][-1])
    if "concurrency" in parts:
        _say(f"\ntwo CUDA streams at once ({plan.concurrency_iterations} calls of each stage)")
        rec["concurrency"] = []
        pairs = list(zip(sts, sts[1:])) or [(sts[0], sts[0])]
        for a, b in pairs:
            try:
                rec["concurrency"].append(stress.concurrency(a, b, plan.concurrency_iterations, seed=seed))
            except Exception as e:  # noqa: BLE001
                rec["concurrency"].append(dict(stages=[a.id, b.id], ok=False, detail=_first_line(e)))
            r = rec["concurrency"][-1]
            _say(f"  concurrency {r['stages'][0]:>13} + {r['stages'][1]:<13} {'equal' if r['ok'] else 'DIFFERENT'}  "
                 f"{r.get('detail', '')}")
    if "bad_inputs" in parts:
        rec["bad_inputs"] = _bad_inputs_in_process(sts, "cuda")

    # Then the process pool: fuzz shards, sanitizer runs, the check=False half of the bad inputs.
    tasks = []
    if "fuzz" in parts and _hypothesis_missing():
        rec["fuzz"] = dict(seed=seed, limits_text=_hypothesis_missing(), stages={}, problems=[_hypothesis_missing()])
    elif "fuzz" in parts:
        shards = max(1, min(6, jobs // 2))
        for i in range(shards):
            tasks.append(("fuzz", i, lambda i=i, k=shards: fuzz.run_shard(sts, plan.fuzz_per_stage, seed, i, k)))
    if "sanitizer" in parts:
        exe = sanitize.find_sanitizer()
        for st in sts:
            for tool in (plan.tools if st.is_cuda else plan.triton_tools):
                if exe is None:
                    tasks.append(("sanitizer", (st.id, tool), lambda st=st, tool=tool: sanitize.Run(
                        st.id, tool, "skipped", reason="compute-sanitizer not found (PATH, CUDA_HOME/bin)")))
                else:
                    tasks.append(("sanitizer", (st.id, tool), lambda st=st, tool=tool: sanitize.run_one(exe, st, tool)))
    if "bad_inputs" in parts:
        for st in sts:
            tasks.append(("unchecked", st.id, lambda st=st: badinput.unchecked_isolated(st, "cuda")))
    t0 = time.perf_counter()
    done: dict = {}
    if tasks:
        _say(f"running {len(tasks)} processes, {jobs} at a time (fuzz shards, sanitizer runs, check=False)...")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(fn): (kind, key) for kind, key, fn in tasks}
            for fut in as_completed(futures):
                kind, key = futures[fut]
                try:
                    done[(kind, key)] = r = fut.result()
                except Exception as e:  # noqa: BLE001
                    done[(kind, key)] = r = e
                if isinstance(r, Exception):
                    _say(f"  {kind} {key}: {_first_line(r)}")
                elif kind == "sanitizer":
                    _say(f"  {r.tool:<10} {r.stage:<13} {r.status:<12} findings {r.findings}  {r.seconds:5.1f} s  "
                         f"{r.reason[:150]}")
                else:
                    _say(f"  {kind} {key} done ({time.perf_counter() - t0:.0f} s)")
    rec["pool_seconds"] = round(time.perf_counter() - t0, 1)

    if "fuzz" in parts and "fuzz" not in rec:
        tallies, problems, lines = [], [], []
        for (kind, key), v in done.items():
            if kind != "fuzz":
                continue
            if isinstance(v, Exception):
                problems.append(f"fuzz shard {key}: {_first_line(v)}")
                continue
            tally, mism, problem = v
            lines += mism
            if tally is not None:
                tallies.append(tally)
            if problem:
                problems.append(problem)
        fuzz_cases = fuzz.generate_for(fuzz.GPU_LIMITS, sts, plan.fuzz_per_stage, seed)  # the shards' cases
        rec["fuzz"] = dict(seed=seed, per_stage_target=plan.fuzz_per_stage, limits=asdict(fuzz.GPU_LIMITS),
                           limits_text=fuzz.GPU_LIMITS.describe(), slow_stage_caps={k: asdict(v) for k, v in
                                                                                    fuzz.SLOW_STAGE_CAPS.items()},
                           shards=len(tallies), problems=problems, stages=fuzz.merge(tallies),
                           reached={st.id: fuzz.kernels_reached(st, fuzz_cases, sms) for st in cuda})
        for line in lines[:20]:
            _say(line)
    if "sanitizer" in parts:
        runs = [done[("sanitizer", key)] for kind, key, _ in tasks if kind == "sanitizer"]
        rec["sanitizer"] = dict(tools=list(plan.tools), triton_tools=list(plan.triton_tools),
                                workloads=[label for label, _, _ in sanitize.WORKLOADS + sanitize.SPOILED_WORKLOADS],
                                kernels={st.id: kernels_of(st) for st in sts},
                                reached={st.id: sanitize.kernels_reached(st, sms) for st in sts if st.is_cuda},
                                runs=[r.as_dict() if not isinstance(r, Exception) else
                                      dict(stage="?", tool="?", status="failed", reason=_first_line(r)) for r in runs])
    if "bad_inputs" in parts:
        for st in sts:
            v = done.get(("unchecked", st.id))
            row = rec["bad_inputs"]["stages"][st.id]
            if isinstance(v, Exception) or v is None:
                row["unchecked"] = {"_process": dict(ok=False, got=_first_line(v) if v else "not run")}
            else:
                row["unchecked"] = {k: o.as_dict() for k, o in v.items()}
        _print_bad_inputs(rec["bad_inputs"])
    return rec


def _bad_inputs_in_process(sts, device, ops: bool = True) -> dict:
    """The public API and the raw ops (both must raise before any kernel runs, so in this process).

    On the CPU, attention() refuses a CUDA stage's CPU tensors before it reads
    any content, so the content cases go through the stages that run on the CPU.
    """
    from . import badinput

    out = {"cases": len(badinput.BAD_INPUTS), "stages": {}}
    for st in sts:
        api, op = {}, {}
        for c in badinput.BAD_INPUTS:
            if not c.applies_to(st):
                continue
            if not (device == "cpu" and c.content and st.is_cuda):
                api[c.key] = badinput.api_outcome(c, st, device).as_dict()
            if ops and not c.content and c.op_applies_to(st):
                op[c.key] = badinput.op_outcome(c, st, device).as_dict()
        out["stages"][st.id] = {"api": api, "op": op}
    return out


# ---- the CPU run ---------------------------------------------------------------------------

def run_cpu(plan: Plan, parts, stage_ids, seed: int) -> dict:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import badinput, extremes, fuzz
    from ..core import stages as _stages

    sts = [_stages.get(s) for s in stage_ids] if stage_ids else list(_stages.STAGES)
    rec: dict = {"stages": [st.id for st in sts], "stages_skipped": {}}
    if "fuzz" in parts and _hypothesis_missing():
        rec["fuzz"] = dict(seed=seed, limits_text=_hypothesis_missing(), stages={}, problems=[_hypothesis_missing()])
    elif "fuzz" in parts:
        t0 = time.perf_counter()
        cases = fuzz.generate(fuzz.CPU_LIMITS, plan.cpu_fuzz_cases, seed)
        tallies = fuzz.fuzz(sts, cases, device="cpu", models=True,
                            stage_case_limit={"triton": plan.cpu_triton_cases})
        rec["fuzz"] = dict(seed=seed, limits=asdict(fuzz.CPU_LIMITS), limits_text=fuzz.CPU_LIMITS.describe(),
                           against="the stages' CPU models; the Triton baseline in its interpreter",
                           stages={sid: t.as_dict() for sid, t in tallies.items()},
                           seconds=round(time.perf_counter() - t0, 1))
    if "bad_inputs" in parts:
        why = None
        try:
            from ..core.ops import load_ops

            load_ops()
        except Exception as e:  # noqa: BLE001 - no toolkit: the Python checks still run
            why = _first_line(e)
        rec["bad_inputs"] = _bad_inputs_in_process(sts, "cpu", ops=why is None)
        if why:
            rec["bad_inputs"]["ops_unavailable"] = why
        for st in sts:
            if not st.is_cuda:  # the Triton baseline runs here: check=False, in a process of its own
                rec["bad_inputs"]["stages"][st.id]["unchecked"] = {
                    k: o.as_dict() for k, o in badinput.unchecked_isolated(st, "cpu").items()}
        _print_bad_inputs(rec["bad_inputs"])
    if "extremes" in parts:
        t0 = time.perf_counter()
        res = extremes.run(sts, "cpu", models=True)
        rec["extremes"] = {"seconds": round(time.perf_counter() - t0, 1), "against": "CPU models; Triton interpreted",
                           "results": {sid: {k: v.as_dict() for k, v in r.items()} for sid, r in res.items()}}
        _print_extremes(rec["extremes"])
    return rec


# ---- tables ------------------------------------------------------------------------------------

def _print_extremes(ex: dict) -> None:
    from .extremes import KINDS

    _say(f"\nextreme values ({ex['seconds']} s)")
    _say(f"  {'stage':<13} " + " ".join(f"{k:>15}" for k in KINDS))
    for sid, r in ex["results"].items():
        _say(f"  {sid:<13} " + " ".join(f"{('ok' if r[k]['ok'] else 'FAIL') if k in r else '-':>15}" for k in KINDS))
        for k, v in r.items():
            if not v["ok"]:
                _say(f"      {k}: {v['detail']}")


def _print_soak_row(r: dict) -> None:
    if "error" in r:
        _say(f"  soak {r['stage']:<13} ERROR {r['error']}")
        return
    ms, me = r["memory_start"], r["memory_end"]
    _say(f"  soak {r['stage']:<13} {r['replays']:>7} replays  {r['compared']:>4} compared  {r['mismatches']} mismatches  "
         f"{r['bitwise_equal']}/{r['compared']} bit-equal to eager  allocated {ms['allocated']} -> {me['allocated']} B  "
         f"reserved {ms['reserved']} -> {me['reserved']} B  {r['seconds']} s")


def _count(d: dict | None) -> tuple[int, int]:
    d = {k: v for k, v in (d or {}).items()}
    return sum(1 for v in d.values() if v["ok"]), len(d)


def _print_bad_inputs(bi: dict) -> None:
    _say(f"\nbad inputs ({bi['cases']} kinds; each stage takes those that apply to it)")
    _say(f"  {'stage':<13} {'attention()':>12} {'raw op':>8} {'check=False':>12}")
    for sid, row in bi["stages"].items():
        cells = []
        for part in ("api", "op", "unchecked"):
            ok, n = _count(row.get(part))
            cells.append(f"{ok}/{n}" if n else "-")
        _say(f"  {sid:<13} {cells[0]:>12} {cells[1]:>8} {cells[2]:>12}")
        for part in ("api", "op", "unchecked"):
            for k, v in (row.get(part) or {}).items():
                if not v["ok"]:
                    _say(f"      {part} {k}: {v['got'][:200]}")
    if bi.get("ops_unavailable"):
        _say(f"  raw ops not checked: {bi['ops_unavailable']}")


def _print_fuzz(fz: dict) -> None:
    _say(f"\nfuzz (hypothesis, seed {fz['seed']}): {fz['limits_text']}")
    if fz.get("slow_stage_caps"):
        _say("  caps: " + "; ".join(f"{k}: lengths <= {v['max_len']}, work <= {v['max_work']:,}"
                                    for k, v in fz["slow_stage_caps"].items()))
    _say(f"  {'stage':<13} {'cases':>6} {'mismatches':>10} {'refused':>8} {'not taken':>9} {'worst rel_err':>13}"
         "   (not taken: over the stage's cap, or past the Triton interpreter's share)")
    for sid, t in fz["stages"].items():
        _say(f"  {sid:<13} {t['cases']:>6} {t['mismatches']:>10} {t['refused']:>8} {t['skipped']:>9} "
             f"{t['worst_rel_err']:>13.1e}")
        for line in t["failures"][:3] + t["refusals"][:3]:
            _say(f"      {line}")
    for p in fz.get("problems", []):
        _say(f"  PROBLEM {p}")


def _print_sanitizer(sz: dict) -> None:
    tools = sz["tools"]
    _say(f"\ncompute-sanitizer: findings per tool and stage ({len(sz['workloads'])} workloads each)")
    _say(f"  {'stage':<13} " + " ".join(f"{t:>10}" for t in tools))
    by = {(r["stage"], r["tool"]): r for r in sz["runs"]}
    for sid in dict.fromkeys(r["stage"] for r in sz["runs"]):
        cells = []
        for t in tools:
            r = by.get((sid, t))
            cells.append("-" if r is None else (str(r["findings"]) if r["status"] in ("clean", "findings")
                                                else r["status"]))
        _say(f"  {sid:<13} " + " ".join(f"{c:>10}" for c in cells))
    for r in sz["runs"]:
        if r["status"] != "clean":
            _say(f"      {r['tool']} {r['stage']}: {r['status']} {r.get('reason', '')[:200]}")
            for line in r.get("first_findings", [])[:3]:
                _say(f"        {line[:200]}")


# ---- verdicts ----------------------------------------------------------------------------------

def verdicts(rec: dict) -> list[tuple[str, str, str, bool]]:
    """(part, target, result, met) for every part that ran."""
    out = []
    full = rec.get("mode") == "full" and rec.get("device") == "cuda"
    if "sanitizer" in rec:
        runs = rec["sanitizer"]["runs"]
        clean = sum(r["status"] == "clean" for r in runs)
        findings = sum(r["findings"] or 0 for r in runs)
        out.append(("compute-sanitizer", "0 findings per tool and stage, right answers under the tool",
                    f"{clean}/{len(runs)} runs clean, {findings} findings", clean == len(runs)))
    if "fuzz" in rec:
        st = rec["fuzz"]["stages"]
        least = min((t["cases"] for t in st.values()), default=0)
        bad = sum(t["mismatches"] + t["refused"] for t in st.values())
        target = FUZZ_TARGET if full else None
        met = bad == 0 and not rec["fuzz"].get("problems") and (target is None or least >= target)
        out.append(("fuzz", f">= {target} cases per stage, 0 mismatches" if target else "0 mismatches",
                    f"{least}-{max((t['cases'] for t in st.values()), default=0)} cases per stage, {bad} mismatches "
                    f"or refusals", met))
    if "soak" in rec:
        rows = rec["soak"]
        mism = sum(r["mismatches"] for r in rows)
        growth = sum(abs(r.get("memory_growth", 0)) for r in rows)
        longest = max((r["replays"] for r in rows), default=0)
        out.append(("graph soak", "0 mismatches, no memory growth",
                    f"{longest:,} replays (longest), {mism} mismatches, {growth} B growth",
                    mism == 0 and growth == 0 and not any("error" in r for r in rows)))
    if "concurrency" in rec:
        rows = rec["concurrency"]
        ok = sum(r["ok"] for r in rows)
        out.append(("concurrency", "two streams equal to sequential", f"{ok}/{len(rows)} pairs equal", ok == len(rows)))
    if "bad_inputs" in rec:
        total = passed = 0
        for row in rec["bad_inputs"]["stages"].values():
            for part in ("api", "op", "unchecked"):
                ok, n = _count(row.get(part))
                passed, total = passed + ok, total + n
        out.append(("bad inputs", "InputError or the op's error; NaN for bad contents with check=False",
                    f"{passed}/{total} (stage, entry point, input) as promised", passed == total))
    if "extremes" in rec:
        res = rec["extremes"]["results"]
        n = sum(len(r) for r in res.values())
        ok = sum(v["ok"] for r in res.values() for v in r.values())
        out.append(("extreme values", "exact out (planted / identical keys), lse 1e-5 rel.; draft-only within tol.",
                    f"{ok}/{n} (stage, kind) pass", ok == n))
    return out


# ---- the record ----------------------------------------------------------------------------------

def record_path(gpu: str | None, mode: str) -> Path:
    from ..measure.results import gpu_slug

    slug = gpu_slug(gpu) if gpu else "cpu"
    return CHECKS / (f"{slug}.json" if mode == "full" else f"{slug}-{mode}.json")


def _environment(device: str) -> dict:
    import platform

    import torch

    from ..measure import provenance

    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    for mod in ("triton", "hypothesis"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            env[mod] = None
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, cc=f"{p.major}.{p.minor}")
        try:
            import subprocess

            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            env["driver"] = None
        from .sanitize import find_sanitizer

        exe = find_sanitizer()
        if exe:
            import subprocess

            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
            env["compute_sanitizer"] = " ".join(out.split()[-3:]) if out else None
    else:
        env["gpu"] = None
    return {**env, **provenance.run_record()}


def load_record(path: Path | None = None) -> dict | None:
    """The given check record, or the full-mode record of the H200, or the newest full-mode record."""
    if path is None:
        h200 = CHECKS / "h200.json"
        files = [h200] if h200.exists() else sorted(
            (p for p in CHECKS.glob("*.json") if not p.stem.endswith("-quick")), key=lambda p: p.stat().st_mtime)
        if not files:
            return None
        path = files[-1]
    rec = json.loads(Path(path).read_text())
    rec["_path"] = str(Path(path).resolve().relative_to(ROOT)) if Path(path).resolve().is_relative_to(ROOT) else str(path)
    return rec


# ---- docs/trust.md's section ---------------------------------------------------------------------------

def readme_section(rec: dict | None = None) -> str:
    """The generated part of docs/trust.md: figures from the record, the bad-input table."""
    from . import badinput, fuzz, stress
    from .extremes import KINDS

    if rec is None:
        rec = load_record()
    lines = []
    if rec is None:
        lines += ["No full `mla-lab check` has been recorded yet: run it on a GPU, then `python -m mla_lab.book.readme`.", ""]
    else:
        when = rec["date"][:10]
        lines.append(f"Recorded by `{rec['command']}` on {rec['gpu']} ({when}, commit {rec.get('commit') or 'unknown'}, "
                     f"{rec['seconds']:.0f} s) in `{rec['_path']}`:")
        lines += ["", "| part | target | result | met |", "|---|---|---|---|"]
        for part, target, result, met in verdicts(rec):
            lines.append(f"| {part} | {target} | {result} | {'yes' if met else '**no**'} |")
        lines.append("")
        if rec.get("stages_skipped"):
            lines.append("Stages this GPU could not run: " + "; ".join(
                f"`{k}` ({v})" for k, v in rec["stages_skipped"].items()) + ".")
            lines.append("")
        lines += _per_stage_table(rec)
        lines.append("")
        if "soak" in rec:
            main = max(rec["soak"], key=lambda r: r["replays"])
            if "memory_start" in main:
                lines.append(f"Graph soak of `{main['stage']}`: {main['replays']:,} replays ({main.get('shape', '')}), "
                             f"lengths and tables rewritten before each; {main['compared']} compared with an eager call "
                             f"({main['bitwise_equal']} bit for bit), {main['mismatches']} mismatches; PyTorch's "
                             f"allocated memory {main['memory_start']['allocated']:,} B before and "
                             f"{main['memory_end']['allocated']:,} B after, reserved {main['memory_start']['reserved']:,}"
                             f" B and {main['memory_end']['reserved']:,} B.")
                lines.append("")
        lines += _later_stage_records(rec)
        lines += _kernels_never_checked(rec)
        failing = _failures(rec)
        if failing:
            lines.append("Where it falls short:")
            lines += [f"- {f}" for f in failing]
            lines.append("")
    lines.append("Sizes and caps (the code's constants):")
    lines.append(f"- fuzz on a GPU: {fuzz.GPU_LIMITS.describe()}; layouts: q {', '.join(fuzz.Q_VIEWS)}; "
                 f"kv_cache {', '.join(fuzz.KV_VIEWS)}; block_table {', '.join(fuzz.TABLE_VIEWS)}; "
                 f"out {', '.join(fuzz.OUT_VIEWS)}; lse {', '.join(fuzz.LSE_VIEWS)}")
    lines.append("- the stages with one block walking a row's whole cache take only small cases: " + "; ".join(
        f"`{k}` lengths <= {v.max_len}, work <= {v.max_work:,}" for k, v in fuzz.SLOW_STAGE_CAPS.items()))
    lines.append(f"- fuzz on the CPU (CI): {fuzz.CPU_LIMITS.describe()}, against the stages' CPU models; the Triton "
                 f"baseline in its interpreter takes the first {QUICK.cpu_triton_cases} cases of `--quick`")
    lines.append(f"- compute-sanitizer: {', '.join(FULL.tools)} on the CUDA stages, {', '.join(FULL.triton_tools)} on "
                 f"the Triton baseline (`--quick`: {', '.join(QUICK.tools)})")
    lines.append(f"- graph soak: {FULL.soak_replays:,} replays of the last stage, every {FULL.soak_compare_every:,}th "
                 f"compared, {FULL.soak_other_replays:,} of each other stage, every "
                 f"{FULL.soak_other_replays // 10:,}th compared (`--quick`: {QUICK.soak_replays:,} / "
                 f"{QUICK.soak_other_replays:,}); "
                 f"{stress.SOAK_STREAMS} streams, q_len {stress.SOAK_Q_LEN}, {stress.SOAK_HEADS} heads; each Hopper "
                 f"stage also {FULL.soak_other_replays:,} replays of a shape that reaches its seesaw or its tensor copy "
                 f"({stress.SEESAW_SOAK.describe()})")
    lines.append(f"- concurrency: each pair of neighbouring stages, {FULL.concurrency_iterations} calls each on two "
                 f"streams; extreme values: {', '.join(KINDS)}")
    lines.append("- " + reach_sentence())
    lines += ["", "Every bad input and what it gets (the messages as the checks give them now, for CPU tensors; on a "
                  "GPU they name `cuda:0`). Shapes, dtypes, strides, alignment, devices, the scale and `num_splits` "
                  "are checked on every call, `check=False` included; lengths and page ids are contents, which only "
                  "`attention()`'s checks read (a host sync), so without them the kernels answer NaN for the stream:",
              "", badinput.markdown_table()]
    return "\n".join(lines)


def reach_sentence(device: str = "h200") -> str:
    """Which kernels the sanitizer's workloads and the extreme values launch on ``device``, from the registry."""
    from . import extremes, sanitize
    from ..measure.roofline import DEVICES
    from ..core.stages import cuda_stages

    spec = DEVICES[device]
    missed = []
    for part, reached in (("the sanitizer's workloads", sanitize.kernels_reached),
                          ("the extreme values", extremes.kernels_reached)):
        for st in cuda_stages():
            left = [k for k in st.kernels if k not in reached(st, spec.sms)]
            if left:
                missed.append(f"{part} do not reach {', '.join(f'`{k}`' for k in left)} of `{st.id}`")
    where = f"on the {spec.name} ({spec.sms} SMs), by the registry's account of every launch"
    if not missed:
        return (f"kernels reached: the sanitizer's workloads and the extreme values launch every kernel of every CUDA "
                f"stage {where} (the Hopper stages take their tensor copy's and their seesaw's kernels only where "
                f"the table gives each block enough tiles: those workloads ask for two or four blocks)")
    return f"kernels reached {where}: " + "; ".join(missed)


def _kernels_never_checked(rec: dict, others: list[dict] | None = None) -> list[str]:
    """A sentence for each stage with kernels that no recorded check ran under the sanitizer (added since).
    ``others``: the other records (default: every full one in results/check/)."""
    from ..core.stages import cuda_stages

    if others is None:
        others = [r for r in (load_record(p) for p in sorted(CHECKS.glob("*.json")) if not p.stem.endswith("-quick"))
                  if r and r["_path"] != rec["_path"]]
    recs = [rec, *others]
    lines = []
    for st in cuda_stages():
        seen = set()
        for r in recs:
            san = r.get("sanitizer", {})
            seen |= set(san.get("reached", san.get("kernels", {})).get(st.id, []))
        if st.id not in rec["stages"] or not seen:
            continue
        never = [k for k in st.kernels if k not in seen]
        if never:
            latest = max((r for r in recs if st.id in r.get("stages", [])), key=lambda r: r["date"])
            lines.append(f"`{st.id}` has kernels that no recorded check has run: "
                         f"{', '.join(f'`{k}`' for k in never)} (added after the latest, at commit "
                         f"{latest.get('commit') or 'unknown'}). `mla-lab check --stages {st.id}` on a GPU runs them: "
                         f"its workloads reach every kernel now (below).")
            lines.append("")
    return lines


def _later_stage_records(rec: dict) -> list[str]:
    """Sentences for the records of single stages checked again after ``rec`` (a stage that changed since)."""
    lines = []
    for path in sorted(CHECKS.glob("*.json")):
        if path.stem.endswith("-quick"):
            continue
        later = load_record(path)
        if (later["_path"] == rec["_path"] or later.get("date", "") <= rec["date"]
                or set(later.get("stages", [])) >= set(rec["stages"])):
            continue
        names = ", ".join(f"`{s}`" for s in later["stages"])
        parts = " ".join(later.get("parts", []))
        found = "; ".join(f"{part}: {result}{'' if met else ' (**missed**)'}" for part, _, result, met in verdicts(later))
        lines.append(f"{names} changed after that run and was checked again by `mla-lab check --stages "
                     f"{' '.join(later['stages'])} --parts {parts}` on {later['gpu']} ({later['date'][:10]}, commit "
                     f"{later.get('commit') or 'unknown'}) in `{later['_path']}`: {found}. In the table above, "
                     f"{'its row comes' if len(later['stages']) == 1 else 'their rows come'} from the earlier code.")
        lines.append("")
    return lines


def _per_stage_table(rec: dict) -> list[str]:
    from .extremes import KINDS

    tools = rec.get("sanitizer", {}).get("tools", [])
    head = ["stage"] + tools + ["fuzz cases", "mismatches", "bad inputs as promised", "extreme values"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    runs = {(r["stage"], r["tool"]): r for r in rec.get("sanitizer", {}).get("runs", [])}
    for sid in rec["stages"]:
        cells = [f"`{sid}`"]
        for t in tools:
            r = runs.get((sid, t))
            cells.append("-" if r is None else str(r["findings"]) if r["status"] in ("clean", "findings") else r["status"])
        fz = rec.get("fuzz", {}).get("stages", {}).get(sid)
        cells += [str(fz["cases"]) if fz else "-", str(fz["mismatches"] + fz["refused"]) if fz else "-"]
        bi = rec.get("bad_inputs", {}).get("stages", {}).get(sid, {})
        ok = n = 0
        for part in ("api", "op", "unchecked"):
            a, b = _count(bi.get(part))
            ok, n = ok + a, n + b
        cells.append(f"{ok}/{n}" if n else "-")
        ex = rec.get("extremes", {}).get("results", {}).get(sid, {})
        cells.append(f"{sum(v['ok'] for v in ex.values())}/{len(KINDS)}" if ex else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _failures(rec: dict) -> list[str]:
    out = []
    for r in rec.get("sanitizer", {}).get("runs", []):
        if r["status"] != "clean":
            out.append(f"{r['tool']} on `{r['stage']}`: {r['status']}, {r.get('findings')} findings "
                       f"{('(' + r['reason'][:160] + ')') if r.get('reason') else ''}".rstrip())
    for sid, t in rec.get("fuzz", {}).get("stages", {}).items():
        for line in (t["failures"] + t["refusals"])[:2]:
            out.append(f"fuzz `{sid}`: `{line[:200]}`")
    for sid, row in rec.get("bad_inputs", {}).get("stages", {}).items():
        for part in ("api", "op", "unchecked"):
            for k, v in (row.get(part) or {}).items():
                if not v["ok"]:
                    out.append(f"bad input `{k}` on `{sid}` ({part}): {v['got'][:160]}")
    for sid, r in rec.get("extremes", {}).get("results", {}).items():
        for k, v in r.items():
            if not v["ok"]:
                out.append(f"extreme `{k}` on `{sid}`: {v['detail'][:160]}")
    for r in rec.get("soak", []):
        if r.get("mismatches") or r.get("memory_growth") or r.get("error"):
            out.append(f"soak `{r['stage']}`: {r.get('mismatches')} mismatches, {r.get('memory_growth')} B growth "
                       f"{r.get('error', '')}".rstrip())
    for r in rec.get("concurrency", []):
        if not r["ok"]:
            out.append(f"concurrency {' + '.join(r['stages'])}: {r.get('detail') or 'differs from sequential'}")
    return out


# ---- the command ------------------------------------------------------------------------------------

SUMMARY = "how far to trust the kernels: sanitizers, fuzzing, a graph soak, two streams, bad inputs"
DESCRIPTION = (
    "How far to trust the kernels beyond the chapters' shapes, over every stage of the registry this GPU runs: "
    "compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on small varied workloads with spoiled streams; "
    "property-based fuzzing (hypothesis) of valid shapes, layouts and views against the fp32 reference; a CUDA graph "
    "replayed while its lengths and tables change; two stages on two CUDA streams at once; every bad input through "
    "attention(), the raw ops and check=False; extreme values. Prints a table per part and a summary, and writes "
    "results/check/<gpu>.json (<gpu>-quick.json with --quick) with the GPU, date, commit and every count; the "
    "docs/trust.md is generated from it. Without a GPU it runs the parts that need none (the fuzz "
    "and extreme values against the stages' CPU models, the bad-input table through the Python checks and the "
    "compiled ops' argument checks, the Triton baseline in its interpreter) and names the parts that need a GPU. "
    "Exits 1 if a target is missed.")
EXAMPLES = ("examples:\n  mla-lab check --quick          a few minutes on a GPU; without one, the CPU parts\n"
            "  mla-lab check                  the full run (its record holds how long it took)\n"
            "  mla-lab check --parts fuzz --stages tensor_core --out /tmp/fuzz.json\n"
            "  python -m mla_lab.check.fuzz tensor_core '{...}'   re-run one failing fuzz case, as printed")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help=f"minutes, not the full run: memcheck only, {QUICK.fuzz_per_stage} fuzz cases per stage, "
                         f"{QUICK.soak_replays:,} replays (full: all four tools, >= {FULL.fuzz_per_stage} cases per "
                         f"stage, {FULL.soak_replays:,} replays)")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), metavar="PART",
                    help=f"run only these parts, of {', '.join(PARTS)} (a record is then written only with --out)")
    from ..core import argtypes

    ap.add_argument("--stages", nargs="+", default=None, choices=argtypes.stage_ids(), metavar="STAGE",
                    help="stage ids (default: every stage of the registry; a record is then written only with --out)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis's seed for the fuzz (default 0)")
    ap.add_argument("--jobs", type=argtypes.positive_int, default=None,
                    help="processes at once for the fuzz shards and sanitizer runs (default: CPU cores - 2, at most 14)")
    ap.add_argument("--out", type=Path, default=None, help="write the record here instead of results/check/")
    ap.add_argument("--no-record", action="store_true", help="write no record")


def main(argv=None) -> int:
    import textwrap

    ap = argparse.ArgumentParser(prog="mla-lab check", description=textwrap.fill(DESCRIPTION, 100), epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace, argv=None) -> int:
    plan = QUICK if args.quick else FULL
    parts = list(dict.fromkeys(args.parts))
    t0 = time.perf_counter()

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    jobs = args.jobs or max(1, min(14, (os.cpu_count() or 4) - 2))
    _say(f"mla-lab check ({plan.mode}) on {torch.cuda.get_device_name(0) if device == 'cuda' else 'the CPU (no GPU)'}")
    if device == "cuda":
        rec = run_gpu(plan, parts, args.stages, args.seed, jobs)
    else:
        need = [p for p in parts if p in GPU_ONLY]
        _say("No CUDA GPU: running the parts that need none, against the stages' CPU models (the Triton baseline "
             "in its interpreter).")
        _say("Needs a GPU, not run here: " + ", ".join(
            ["compute-sanitizer (memcheck, racecheck, synccheck, initcheck)" if "sanitizer" in need else "",
             "the graph soak" if "soak" in need else "", "two CUDA streams at once" if "concurrency" in need else "",
             "the fuzz, bad inputs and extreme values on the CUDA kernels themselves",
             "the CUDA stages' NaN answers to bad lengths and page ids"]).replace(", ,", ",").strip(", "))
        if args.jobs is not None:
            _say("Ignored here: --jobs (the CPU parts run in this process).")
        rec = run_cpu(plan, [p for p in parts if p not in GPU_ONLY], args.stages, args.seed)
    rec.update(mode=plan.mode, device=device, parts=parts, plan=asdict(plan),
               command="mla-lab check" + (" --quick" if args.quick else ""),
               date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               seconds=round(time.perf_counter() - t0, 1), **_environment(device))
    if "fuzz" in rec:
        _print_fuzz(rec["fuzz"])
    if "sanitizer" in rec:
        _print_sanitizer(rec["sanitizer"])
    _say(f"\nsummary ({plan.mode}, {rec['seconds']:.0f} s)")
    ok = True
    for part, target, result, met in verdicts(rec):
        ok &= met
        _say(f"  {'ok  ' if met else 'FAIL'} {part:<18} {result}   (target: {target})")
    path = args.out
    if path is None and not args.no_record and device == "cuda" and set(parts) == set(PARTS) and not args.stages:
        path = record_path(rec["gpu"], plan.mode)
    if path is not None and not args.no_record:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec, indent=1, default=str) + "\n")
        _say(f"wrote {path}")
    elif device == "cpu":
        _say("no record written (CPU mode; --out PATH writes one)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
