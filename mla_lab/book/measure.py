"""What the chapters measure: live on a GPU, recorded without one.

On a GPU a chapter checks each stage against the reference and times it now
(graph replay, L2 flushed, median).  Without one it takes the records
``mla-lab bench`` wrote to ``results/``, and says which GPU and which day they
come from.  Either way a chapter gets the same list of records, so the
cells that draw conclusions from them run the same code on both machines.
"""

from __future__ import annotations

import functools

import torch

from ..measure import results as _results
from ..measure import probes, roofline
from ..core import stages
from ..core.problem import Problem, make_workload

GPU = torch.cuda.is_available()
ARTICLE_PREFIXES = (256, 1024, 4096, 16384, 65536)


# ---- which GPU, and its entry in the device table ---------------------------------

def device_here() -> tuple[roofline.DeviceSpec | None, str]:
    """The device table's entry for the GPU this process runs on, and a note; ``None`` for a GPU the
    table lacks (or without a GPU), never another model's figures (:func:`roofline.device_spec_for`)."""
    return roofline.device_spec_for_current_gpu()


@functools.lru_cache(maxsize=None)
def _ceilings():
    from ..measure.timing import measure_ceilings

    return measure_ceilings()


def ceilings() -> tuple[dict | None, str]:
    """The copy and matmul ceilings: measured now on a GPU, else the latest recorded run's."""
    if GPU:
        return _ceilings(), f"measured now on {torch.cuda.get_device_name(0)}"
    rec = _results.load()
    if rec is None or not rec.runs:
        return None, "no GPU here and no recorded results"
    run = rec.runs[-1]
    return run["ceilings"], f"recorded on {run['gpu']} by `mla-lab bench` ({run['date'][:10]}); no GPU here"


def floor_from_ceilings(p: Problem, measured: dict, spec: roofline.DeviceSpec | None) -> roofline.Floor:
    """The floors of ``p`` at rates measured in one run.

    The CUDA-core floor uses the datasheet fp32 rate of ``spec``; for a GPU the
    table lacks, the fp32 matmul rate measured in the same run.
    """
    f, b = roofline.flops(p), roofline.min_bytes(p)
    fp32 = spec.fp32_rate() if spec else measured["fp32_matmul_tflops"] * 1e12
    return roofline.Floor(flops=f, bytes=b, compute_us=f / (measured["bf16_matmul_tflops"] * 1e12) * 1e6,
                          memory_us=b / (measured["copy_tbs"] * 1e12) * 1e6, cuda_core_us=f / fp32 * 1e6)


# ---- measurements ---------------------------------------------------------------

def measure(stage_ids, problems, *, rep_ms: float = 25.0, num_splits: dict | None = None) -> list[dict]:
    """Check then time each stage on each problem, now, on this GPU (graph replay, L2 flushed)."""
    from ..core import ops
    from ..core.reference import reference_attention
    from ..measure.timing import time_call
    from ..core.verify import compare

    c = _ceilings()
    spec, note = device_here()
    if spec is None:
        print(note)
    out = []
    for i, p in enumerate(problems):
        w = make_workload(p, device="cuda", seed=7000 + i)
        ref = reference_attention(*w.args(), check=False)
        fl = floor_from_ceilings(p, c, spec)
        for sid in stage_ids:
            rec = dict(stage=sid, streams=p.streams, q_len=p.q_len, heads=p.heads, prefix=p.prefixes[0],
                       page_size=p.page_size, scattered=p.scattered, floor_us=fl.floor_us,
                       cuda_core_floor_us=fl.cuda_core_floor_us)
            if sid in probes.PROBES:  # a floor: timed, not checked (it computes nothing)
                call = probes.probe_runner(sid, w)
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


def recorded_records(stage_ids, problems) -> tuple[list[dict], str]:
    """The recorded results for these stages and problems, and where they come from."""
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


def results_for(stage_ids, problems) -> tuple[list[dict], str]:
    """Measure now on a GPU, else take the recorded results; returns (records, where they come from)."""
    if GPU:
        name = torch.cuda.get_device_name(0)
        return measure(stage_ids, problems), f"measured now on {name}"
    return recorded_records(stage_ids, problems)


# ---- what a chapter measures that the bench does not ---------------------------------

CHAPTER_RESULTS = _results.RESULTS / "chapters"


def kept_measurement(chapter: str, name: str, measure_now) -> tuple[object | None, str]:
    """A chapter's own measurement (an ablation, a batch of mixed lengths: nothing ``mla-lab bench`` records).

    On a GPU, ``measure_now()`` runs now and its result (numbers, lists and
    dicts with string keys) is kept in ``results/chapters/<chapter>.json`` under
    ``name``, with the GPU, the date and the code it measured, so that a reader
    without a GPU sees what the chapter measured when it was executed.  Without
    a GPU, the kept result.  Returns (the result or None, where it comes from).
    """
    import datetime as _dt
    import json

    from ..measure import provenance

    path = CHAPTER_RESULTS / f"{chapter}.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if GPU:
        value = measure_now()
        gpu = torch.cuda.get_device_name(0)
        kept[name] = dict(gpu=gpu, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                          chapter=chapter, **provenance.run_record(), value=value)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
        return value, f"measured now on {gpu}; kept in results/chapters/{chapter}.json"
    entry = kept.get(name)
    if entry is None:
        return None, (f"no GPU here, and results/chapters/{chapter}.json holds no {name!r}: "
                      "executing the chapter on a GPU records it")
    return entry["value"], recorded_where(entry, chapter)


def recorded_where(entry: dict, chapter: str) -> str:
    """Where a kept measurement comes from: the GPU, the date, the commit and the chapter whose execution made it."""
    made_by = entry.get("chapter", chapter)
    by = "this chapter" if made_by == chapter else f"chapter {made_by}"
    return (f"recorded on {entry['gpu']} on {entry['date'][:10]} at commit {entry.get('commit') or 'unknown'} "
            f"by executing {by}; no GPU here")


def kept_rounds_spread(rounds) -> float:
    """The run-to-run spread of repeated timings of one call: (largest - smallest) / median."""
    import statistics

    rounds = [float(r) for r in rounds]
    return (max(rounds) - min(rounds)) / statistics.median(rounds)


SPREAD_SHAPES = (Problem(streams=1, q_len=9, heads=8, prefix=1024, page_size=64),
                 Problem(streams=8, q_len=9, heads=64, prefix=16384, page_size=64))


def run_to_run_spread(chapter: str, stage: str = "hopper", rounds: int = 5) -> tuple[float | None, str]:
    """How much one execution's timings of the same call differ: the largest (max - min) / median over
    :data:`SPREAD_SHAPES` of ``rounds`` graph-replay timings of ``stage`` each.  A timing verdict asks only about
    an effect at least three times this.  On a GPU it is measured now and kept as ``spread`` in the chapter's
    results; without one, the kept value, else the PDL rounds that chapter 10 kept in the same execution."""
    import json

    def measure_now():
        from ..core import ops
        from ..measure.timing import time_call

        out = []
        for i, p in enumerate(SPREAD_SHAPES):
            call = ops.runner(stage, make_workload(p, device="cuda", seed=8000 + i))
            out.append(dict(label=p.label(), rounds=[time_call(call, graph=True, rep_ms=25.0) for _ in range(rounds)]))
        return out

    path = CHAPTER_RESULTS / f"{chapter}.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if GPU or "spread" in kept:
        value, where = kept_measurement(chapter, "spread", measure_now)
        return (max(kept_rounds_spread(r["rounds"]) for r in value) if value else None), where
    pdl_file = CHAPTER_RESULTS / "10_wgmma.json"
    pdl = json.loads(pdl_file.read_text()).get("pdl") if pdl_file.is_file() else None
    if pdl is None:
        return None, "no GPU here and no kept repeats to take the spread from"
    spread = max(kept_rounds_spread(r[k]) for r in pdl["value"] for k in ("on_rounds", "off_rounds"))
    return spread, f"from the PDL section's five rounds at two prefixes ({recorded_where(pdl, chapter)})"


# ---- reading records ------------------------------------------------------------

def find(records: list[dict], stage: str, **config) -> dict | None:
    """The record of ``stage`` at ``config`` (keys of a record: heads, prefix, streams, ...), if measured."""
    return next((r for r in records if r["stage"] == stage and all(r.get(k) == v for k, v in config.items())), None)


def time_us(records: list[dict], stage: str, **config) -> float | None:
    """Graph-replay time of ``stage`` at ``config``; ``None`` if not measured or it cannot run there."""
    r = find(records, stage, **config)
    return None if r is None or r.get("unsupported") else r["us_graph"]


def ratio(records: list[dict], a: str, b: str, **config) -> float | None:
    """time(b) / time(a) at one configuration: how many times faster ``a`` is than ``b``."""
    ta, tb = time_us(records, a, **config), time_us(records, b, **config)
    return tb / ta if ta and tb else None


def speedups(records: list[dict], fast: str, slow: str, *, min_prefix: int = 0, max_prefix: int | None = None,
             **config) -> dict[tuple[int, int], float]:
    """time(slow) / time(fast) for every (heads, prefix) where both ran, prefix within the bounds.

    ``config`` narrows the records (``heads=8``, ``streams=1``, ...).  A value
    above 1 means ``fast`` is faster.
    """
    out = {}
    for r in records:
        if r["stage"] != fast or r.get("unsupported") or not all(r.get(k) == v for k, v in config.items()):
            continue
        if r["prefix"] < min_prefix or (max_prefix is not None and r["prefix"] > max_prefix):
            continue
        x = ratio(records, fast, slow, **{k: r[k] for k in _results.CONFIG_KEYS})
        if x is None:
            continue
        if (r["heads"], r["prefix"]) in out:
            raise ValueError("records of several stream counts, draft lengths or layouts share a (heads, prefix): "
                             "narrow them with streams=, q_len=, page_size= or scattered=")
        out[(r["heads"], r["prefix"])] = x
    return out
