"""Chapter 7's measurements: what launching costs, what CUDA graphs save, and whole model steps.

``mla-lab graphs`` runs every section below on a GPU and writes them to
``results/graphs/<gpu>.json``; chapter 7 runs the same functions live on a
GPU and reads that file without one.  The timing here differs from the
bench's on purpose.  The bench flushes the L2 before every run and keeps the
GPU's queue full, which hides the host.  A decode loop does neither: it
issues call after call, so when a call's kernels take less time than the
host needs to launch them, the GPU waits.  Three ways of timing:

* :func:`per_call_us`: calls back to back, no flush, CUDA events around many
  of them: what a decode loop sees, host and GPU together.
* :func:`host_us`: the host's time per call alone, with a sleeping kernel
  queued ahead of the calls so that none of them waits for the GPU (checked:
  the sleep must still be running when the last call returns).
* :func:`graph_per_call_us`: the same calls captured in one CUDA graph
  (61 of them, one per layer of Kimi K2.x) and replayed.

Sections (each a key of the record):

``launch``      host µs per call at prefix 256: each stage's bare op (or the
                Triton kernels' launcher), ``attention(check=False)`` with and
                without given outputs, and a tiny torch op.
``best``        each stage's attention at prefix 16384 (graph replay, L2
                flushed): the fastest is the "best stage" of later sections.
``loop``        per call, eager against 61 captured, at prefixes 256, 1024, 16384.
``prediction``  kernels per layer and per step (counted by the profiler) and
                the host time of one eager layer: the graphs' saving predicted.
``steps``       the 61-layer model step (:mod:`mla_lab.serving.model_step`), eager and
                captured, for Triton, ``float4`` and the best stage at prefixes
                1024, 16384, 65536; and one layer at 1024.
``verify_step`` :class:`~mla_lab.serving.verify_step.VerifyStep` replays with changing
                lengths, tables and stream counts against eager calls, every stage.
``defrag``      scattered pages of one token against defragmented ones at
                prefix 16384: the defragmentation's cost, kernel and step times
                before and after, outputs compared.
``acceptance``  the 100-step speculative loop on the GPU (:mod:`mla_lab.serving.decode_loop`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ..core import ops, stages
from ..core.problem import Problem, make_workload
from ..measure.results import RESULTS, gpu_slug
from ..measure.timing import events_us, per_call_us

GRAPHS = RESULTS / "graphs"
Q_LEN, HEADS = 9, 8
LAUNCH_PREFIX = 256
BEST_PREFIX = 16384
LOOP_PREFIXES = (256, 1024, 16384)
STEP_PREFIXES = (1024, 16384, 65536)
LAYER_PREFIX = 1024  # one layer, and the prediction, at this prefix
ACCEPTANCE_STEPS = 100
CALLS_IN_GRAPH = 61  # one per layer of Kimi K2.x
ARTICLE_STAGE = "float4"  # the article's final design
BASELINE = "triton"
SECTIONS = ("launch", "best", "loop", "prediction", "steps", "verify_step", "defrag", "acceptance")
DEVICE = "cuda"  # the measurements run on the current CUDA device


# ---- timing ------------------------------------------------------------------------------

def adaptive_per_call_us(fn, budget_s: float = 0.3, most: int = 50, repeats: int = 3) -> float:
    """:func:`per_call_us` for calls of any length: as many calls as fit ``budget_s`` (at least 2)."""
    fn()
    torch.cuda.synchronize()
    once = events_us(fn, 1)
    n = max(2, min(most, int(budget_s * 1e6 / max(once, 1.0))))
    return per_call_us(fn, calls=n, repeats=repeats, warmup=1)


def graph_per_call_us(fn, calls_in_graph: int = CALLS_IN_GRAPH, replays: int = 5) -> float:
    """``fn`` captured ``calls_in_graph`` times in one graph; time per call over back-to-back replays."""
    from ..measure.timing import cuda_graph

    def many():
        for _ in range(calls_in_graph):
            fn()

    g = cuda_graph(many, warmup_calls=1)
    us = per_call_us(g.replay, calls=replays, repeats=3, warmup=1) / calls_in_graph
    del g
    return us


_CYCLES_PER_US: list[float] = []


def _sleep_cycles_per_us() -> float:
    """How many cycles ``torch.cuda._sleep`` spins per microsecond on this GPU (measured once)."""
    if not _CYCLES_PER_US:
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        n = 2_000_000
        us = statistics.median(events_us(lambda: torch.cuda._sleep(n), 1) for _ in range(3))
        _CYCLES_PER_US.append(n / us)
    return _CYCLES_PER_US[0]


def host_us(fn, calls: int = 100, repeats: int = 5) -> tuple[float, bool]:
    """Median host time per call with the GPU kept busy; and whether it stayed busy throughout.

    A sleep kernel long enough to outlast the calls goes first, so no call
    waits for the GPU; an event recorded after it must still be pending when
    the last call returns, else the GPU ran dry and the figure is flagged.
    Keep ``calls`` x launches per call well under ~1000: the launch queue
    has room for about that many, and a full queue makes the host wait.
    """
    (times,), busy = host_us_runs([fn], calls, repeats)
    return statistics.median(times), busy


def host_us_runs(fns, calls: int = 100, repeats: int = 5) -> tuple[list[list[float]], bool]:
    """Host µs per call of each of ``fns`` (as :func:`host_us`), ``repeats`` runs each, taken in turn.

    Run i of every function comes before run i + 1 of any, so a stretch of
    time in which the host is slower (another process, a clock change) falls
    on all of them alike: compare them run by run (:func:`median_difference`),
    not median against median.
    """
    for fn in fns:
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    cycles = []
    for fn in fns:
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        estimate_us = (time.perf_counter() - t0) / 5 * 1e6
        torch.cuda.synchronize()
        cycles.append(int(_sleep_cycles_per_us() * max(2000.0, 3 * calls * estimate_us)))
    times, busy = [[] for _ in fns], True
    for _ in range(repeats):
        for fn, n, out in zip(fns, cycles, times):
            torch.cuda.synchronize()
            torch.cuda._sleep(n)
            after_sleep = torch.cuda.Event()
            after_sleep.record()
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter_ns()
            busy = busy and not after_sleep.query()
            out.append((t1 - t0) / calls / 1e3)
    torch.cuda.synchronize()
    return times, busy


def median_difference(a: list[float], b: list[float]) -> float:
    """The median of the run-by-run differences a[i] - b[i]."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need two equally long, non-empty lists of runs, got {len(a)} and {len(b)}")
    return statistics.median(x - y for x, y in zip(a, b))


def _kernel_count(fn) -> int | None:
    """CUDA kernels (and memory operations) one call of ``fn`` puts on the GPU, by the profiler."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        return n or None  # none seen: the profiler could not trace the GPU here
    except Exception:  # a profiler that cannot start here: say so rather than guess
        return None


# ---- the sections --------------------------------------------------------------------------

def _workload(prefix: int, seed: int = 0):
    return make_workload(Problem(streams=1, q_len=Q_LEN, heads=HEADS, prefix=prefix, page_size=1, scattered=True),
                         device=DEVICE, seed=seed, poison=False)


def measure_launch(prefix: int = LAUNCH_PREFIX) -> dict:
    """Host µs per call of every stage, bare and through ``attention()``, with the GPU busy."""
    from ..core import triton_baseline

    w = _workload(prefix)
    out, lse = w.new_outputs(poison=False)
    a, b, c = (torch.zeros(16, device=DEVICE) for _ in range(3))
    tiny, tiny_busy = host_us(lambda: torch.add(a, b, out=c))
    rows = []
    for st in stages.STAGES:
        if st.kind == "triton":
            ns = stages.TRITON_DEFAULT_SPLITS
            R = Q_LEN
            ws_out = torch.empty(R, HEADS, ns, 512, device=DEVICE)
            ws_lse = torch.empty(R, HEADS, ns, device=DEVICE)

            def bare(ws_out=ws_out, ws_lse=ws_lse, ns=ns):
                triton_baseline.launch(*w.args(), out, lse, ws_out, ws_lse, num_splits=ns)

            launches, what = 2, "Triton's launcher, two kernels, workspace given"
        else:
            ops.load_ops()
            op = getattr(torch.ops.mla_lab, st.id)
            scale = float(w.scale)
            ns = ops.default_num_splits(st, w.q, w.kv_cache, w.block_table) if st.splits else 1
            if st.splits:
                def bare(op=op, ns=ns):
                    op(w.q, w.kv_cache, w.block_table, w.kv_lens, scale, ns, out, lse)
            else:
                def bare(op=op):
                    op(w.q, w.kv_cache, w.block_table, w.kv_lens, scale, out, lse)
            launches = len(st.launches(1, Q_LEN, HEADS, w.block_table.shape[1], w.kv_cache.shape[1], ns))
            what = f"the op: {launches} kernel{'s' if launches > 1 else ''}"
        # The three in turn, run by run: what attention() adds is the difference within each run.
        (bare_t, given_t, alloc_t), busy = host_us_runs(
            [bare, lambda st=st: ops.attention(st, *w.args(), out=out, lse=lse, check=False),
             lambda st=st: ops.attention(st, *w.args(), check=False)], repeats=7)
        rows.append(dict(stage=st.id, launches=launches, bare=what, bare_us=statistics.median(bare_t),
                         attention_us=statistics.median(given_t), attention_alloc_us=statistics.median(alloc_t),
                         overhead_us=median_difference(given_t, bare_t),
                         alloc_overhead_us=median_difference(alloc_t, bare_t), busy=busy))
    return dict(prefix=prefix, streams=1, q_len=Q_LEN, heads=HEADS, tiny_op_us=tiny, tiny_op_busy=tiny_busy,
                rows=rows)


def measure_best(prefix: int = BEST_PREFIX) -> dict:
    """Each stage's attention at ``prefix`` (graph replay, L2 flushed, median); the fastest is the best."""
    from ..measure.timing import time_call

    w = _workload(prefix, seed=1)
    out, lse = w.new_outputs(poison=False)
    times = {}
    for st in stages.STAGES:
        try:
            times[st.id] = time_call(ops.runner(st, w, out=out, lse=lse), graph=True, rep_ms=20)
        except RuntimeError as e:  # a stage this GPU or shape cannot run (shared memory, compute capability)
            times[st.id] = None
            print(f"  {st.id}: cannot run here: {str(e).splitlines()[0]}", file=sys.stderr)
    best = min((t, s) for s, t in times.items() if t is not None)[1]
    return dict(prefix=prefix, kernel_us=times, best=best)


def measure_loop(stage_ids, prefixes=LOOP_PREFIXES) -> list[dict]:
    """Per call, back to back: eager ``attention(check=False)`` against 61 calls captured in one graph."""
    rows = []
    for prefix in prefixes:
        w = _workload(prefix, seed=2)
        out, lse = w.new_outputs(poison=False)
        for sid in stage_ids:
            st = stages.get(sid)

            def call(st=st):
                ops.attention(st, *w.args(), out=out, lse=lse, check=False)

            rows.append(dict(stage=sid, prefix=prefix, eager_us=per_call_us(call, calls=100),
                             graph_us=graph_per_call_us(call), calls_in_graph=CALLS_IN_GRAPH))
    return rows


class _Model:
    """Kimi K2.x TP8 weights, made once per session (about 3 GB)."""

    def __init__(self, cfg):
        from .model_step import random_weights

        self.cfg = cfg
        self.weights = random_weights(cfg, device=DEVICE, seed=0)

    def paged(self, prefix: int, seed: int):
        """One stream of ``prefix`` tokens at scattered pages of one token, random rows in every layer,
        ready for a step of Q_LEN rows: (page table, cache, block table, kv_lens, x)."""
        from ..core.paging import PageTable

        table = PageTable(prefix + Q_LEN + 2, 1, prefix + Q_LEN, 1, scatter_seed=seed)
        table.add_prefix(0, prefix)
        table.begin_step(Q_LEN)
        cache = torch.empty(self.cfg.layers, table.num_pages, 1, 576, dtype=torch.bfloat16, device=DEVICE).normal_()
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        x = torch.randn(Q_LEN, self.cfg.hidden, generator=gen, device=DEVICE).to(torch.bfloat16)
        return table, cache, table.block_table(DEVICE), table.kv_lens(DEVICE), x

    def step(self, stage, cache, block_table, kv_lens, x, layers: int | None = None):
        from .model_step import ModelStep

        n = layers or self.cfg.layers
        s = ModelStep(self.cfg.with_(layers=n), self.weights[:n], cache[:n], stage, streams=1, q_len=Q_LEN,
                      max_pages=block_table.shape[1])
        s.load(x, block_table, kv_lens)
        return s


def _step_times(step) -> tuple[float, float]:
    """(eager µs, captured µs) of one model step, back to back."""
    eager = adaptive_per_call_us(step._run)
    step.capture()
    graph = adaptive_per_call_us(step.graph.replay)
    return eager, graph


def measure_prediction(model: _Model, stage: str, prefix: int = 1024) -> dict:
    """What predicts the graphs' saving: kernels per layer and per step, host cost per launch and per layer."""
    _, cache, bt, lens, x = model.paged(prefix, seed=3)
    one = model.step(stage, cache, bt, lens, x, layers=1)
    two = model.step(stage, cache, bt, lens, x, layers=2)
    n1, n2 = _kernel_count(one._run), _kernel_count(two._run)
    per_layer = None if n1 is None or n2 is None else n2 - n1
    per_step = None if per_layer is None else n1 - per_layer  # the step's own: slots, positions, RoPE table
    layer_host, busy = host_us(one._run, calls=10)
    return dict(stage=stage, prefix=prefix, layers=model.cfg.layers, kernels_per_layer=per_layer,
                kernels_per_step=per_step, one_layer_step_host_us=layer_host, host_busy=busy)


def measure_steps(model: _Model, stage_ids, prefixes=STEP_PREFIXES, layer_prefix: int = 1024,
                  layer_stage: str | None = None) -> dict:
    """The 61-layer step, eager and captured, per stage and prefix; one layer at ``layer_prefix``."""
    rows, layer = [], None
    for prefix in prefixes:
        _, cache, bt, lens, x = model.paged(prefix, seed=prefix)
        for sid in stage_ids:
            step = model.step(sid, cache, bt, lens, x)
            eager, graph = _step_times(step)
            rows.append(dict(stage=sid, prefix=prefix, layers=model.cfg.layers, eager_us=eager, graph_us=graph))
            print(f"  step {sid:<12} prefix {prefix:>6}: eager {eager / 1e3:8.2f} ms, captured {graph / 1e3:8.2f} ms",
                  file=sys.stderr, flush=True)
            del step
        if prefix == layer_prefix and layer_stage:
            one = model.step(layer_stage, cache, bt, lens, x, layers=1)
            eager, graph = _step_times(one)
            layer = dict(stage=layer_stage, prefix=prefix, eager_us=eager, graph_us=graph)
            del one
        del cache
        torch.cuda.empty_cache()
    return dict(rows=rows, one_layer=layer, hidden=model.cfg.hidden, heads=model.cfg.heads, q_len=Q_LEN,
                layer_bytes=model.cfg.layer_bytes())


def measure_verify_step(replays: int = 12, seed: int = 0, page_size: int = 16, width: int = 160) -> list[dict]:
    """Per stage: a bucket of 4 streams captured once, replayed with new lengths, tables and 1-4 real
    streams; every replay's real streams compared bit for bit with an eager call (same split count)."""
    import random

    from .verify_step import VerifyStep

    rng = random.Random(seed)
    P, B = page_size, 4
    num_pages = B * width + 1
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    pool = torch.randn(num_pages, P, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    calls = []
    for _ in range(replays):
        b = rng.randint(1, B)
        lens = [rng.randint(Q_LEN, width * P) for _ in range(b)]
        pages = rng.sample(range(1, num_pages), b * width)
        table = torch.tensor(pages, dtype=torch.int32).view(b, width)
        q = torch.randn(b, Q_LEN, HEADS, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
        calls.append((q, table.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)))
    rows = []
    for st in stages.STAGES:
        step = VerifyStep(st, pool, streams=B, q_len=Q_LEN, heads=HEADS, max_pages=width)
        equal = padded_nan = True
        for q, table, lens in calls:
            out, lse = step(q, table, lens)
            eo, el = step.eager(q, table, lens)
            equal = equal and torch.equal(out, eo) and torch.equal(lse, el)
            b = q.shape[0]
            padded_nan = padded_nan and bool(torch.isnan(step.lse[b:]).all())
        rows.append(dict(stage=st.id, replays=len(calls), bit_equal=equal, padded_nan=padded_nan,
                         num_splits=step.num_splits, streams=B, max_pages=width, page_size=P))
        del step
    return rows


def measure_defrag(model: _Model, stage_ids, prefix: int = BEST_PREFIX) -> dict:
    """Pages of one token at scattered ids, then defragmented: the cost, kernel and step times, outputs."""
    from ..measure.timing import time_call

    table, cache, bt, lens, x = model.paged(prefix, seed=5)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    q = torch.randn(1, Q_LEN, HEADS, 576, generator=gen, device=DEVICE).to(torch.bfloat16)
    scale = model.cfg.scale

    def kernels(block_table):
        out = {}
        for sid in stage_ids:
            o, l = ops.attention(sid, q, cache[0], block_table, lens, scale, check=False)
            us = time_call(lambda sid=sid: ops.attention(sid, q, cache[0], block_table, lens, scale, check=False),
                           graph=True, rep_ms=50)
            out[sid] = (us, o.clone(), l.clone())
        return out

    def steps(block_table):
        out = {}
        for sid in stage_ids:
            s = model.step(sid, cache, block_table, lens, x)
            s.capture()
            us = adaptive_per_call_us(s.graph.replay)
            out[sid] = (us, s.y.clone())
            del s
        return out

    # Steps first: a step writes the draft's rows into the cache, and the attention calls after it
    # read those (the same rows in both rounds, so the outputs can be compared bit for bit).
    s0 = steps(bt)
    k0 = kernels(bt)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    plan = table.defragment(cache)
    torch.cuda.synchronize()
    cost_us = (time.perf_counter() - t0) * 1e6
    bt_after = table.block_table(DEVICE)
    assert table.is_contiguous()
    s1 = steps(bt_after)
    k1 = kernels(bt_after)
    moved_bytes = plan.moved * model.cfg.layers * cache.shape[2] * 576 * 2
    return dict(prefix=prefix, layers=model.cfg.layers, page_size=1, moved_pages=plan.moved,
                moved_bytes=moved_bytes, defrag_us=cost_us,
                kernel_us_before={s: k0[s][0] for s in stage_ids}, kernel_us_after={s: k1[s][0] for s in stage_ids},
                step_us_before={s: s0[s][0] for s in stage_ids}, step_us_after={s: s1[s][0] for s in stage_ids},
                kernel_same_output={s: torch.equal(k0[s][1], k1[s][1]) and torch.equal(k0[s][2], k1[s][2])
                                    for s in stage_ids},
                step_same_output={s: torch.equal(s0[s][1], s1[s][1]) for s in stage_ids})


def measure_acceptance(stage_ids, steps: int = 100, prefix=(5, 300, 1000)) -> list[dict]:
    from .decode_loop import acceptance_loop

    rows = []
    for sid in stage_ids:
        r = acceptance_loop(sid, steps=steps, streams=3, bucket_streams=4, q_len=Q_LEN, prefix=prefix,
                            page_size=16, device=DEVICE, graph=True, defrag_every=25, seed=7)
        rows.append(dict(stage=sid, steps=r.steps, appended=r.appended, accepted=r.accepted,
                         cache_checks=r.cache_checks, defrags=r.defrags, max_rel_err=r.max_rel_err,
                         summary=r.summary()))
    return rows


class Session:
    """The sections measured in order, sharing the model's weights and the best stage."""

    def __init__(self, quick: bool = False):
        self.quick = quick
        self.record: dict = {}
        self._model = None

    @property
    def model(self) -> _Model:
        if self._model is None:
            from .model_step import KIMI_K2_TP8

            self._model = _Model(KIMI_K2_TP8)
        return self._model

    @property
    def best(self) -> str:
        return self.run("best")["best"]

    def step_stages(self) -> list[str]:
        return list(dict.fromkeys([BASELINE, ARTICLE_STAGE, self.best]))

    def run(self, name: str):
        if name in self.record:
            return self.record[name]
        if name == "launch":
            r = measure_launch(LAUNCH_PREFIX)
        elif name == "best":
            r = measure_best(BEST_PREFIX)
        elif name == "loop":
            r = measure_loop(self.step_stages(), prefixes=LOOP_PREFIXES)
        elif name == "prediction":
            r = measure_prediction(self.model, self.best, prefix=LAYER_PREFIX)
        elif name == "steps":
            r = measure_steps(self.model, self.step_stages(), prefixes=STEP_PREFIXES[:2] if self.quick else
                              STEP_PREFIXES, layer_prefix=LAYER_PREFIX, layer_stage=self.best)
        elif name == "verify_step":
            r = measure_verify_step(replays=6 if self.quick else 12)
        elif name == "defrag":
            r = measure_defrag(self.model, list(dict.fromkeys([BASELINE, self.best])), prefix=BEST_PREFIX)
        elif name == "acceptance":
            r = measure_acceptance(list(dict.fromkeys([BASELINE, self.best])), steps=ACCEPTANCE_STEPS)
        else:
            raise KeyError(f"no section {name!r}; sections are {', '.join(SECTIONS)}")
        self.record[name] = r
        return r

    def run_all(self) -> dict:
        for name in SECTIONS:
            t0 = time.perf_counter()
            self.run(name)
            print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
        return self.record


# ---- recorded results ------------------------------------------------------------------------

def save(record: dict, path: Path | None = None, argv=None) -> Path:
    from ..measure.bench import _versions
    from ..measure.provenance import run_record

    name = torch.cuda.get_device_name(0)
    run = dict(gpu=name, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               command="mla-lab graphs " + " ".join(argv or []), **_versions(), **run_record())
    path = Path(path) if path else GRAPHS / f"{gpu_slug(name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(run=run, **record), indent=1) + "\n")
    return path


def load(path: Path | str | None = None) -> dict | None:
    """The given record, or the most recently written one in results/graphs/; None if there is none."""
    if path is None:
        files = sorted(GRAPHS.glob("*.json"), key=lambda p: p.stat().st_mtime)
        if not files:
            return None
        path = files[-1]
    return json.loads(Path(path).read_text())


def describe(record: dict) -> str:
    run = record["run"]
    return f"recorded on {run['gpu']} by `mla-lab graphs` ({run['date'][:10]})"


# ---- what the chapter shows ------------------------------------------------------------------

_LIVE: Session | None = None


def section(name: str):
    """A section: measured now on a GPU (once per session), else from the recorded file; None if neither."""
    global _LIVE
    if torch.cuda.is_available():
        if _LIVE is None:
            _LIVE = Session()
        return _LIVE.run(name)
    rec = load()
    return None if rec is None else rec.get(name)


def source() -> str:
    if torch.cuda.is_available():
        return f"measured now on {torch.cuda.get_device_name(0)}"
    rec = load()
    return f"{describe(rec)}; no GPU here" if rec else "no GPU here and nothing recorded by `mla-lab graphs` yet"


def _label(stage: str, only=None, alias=None) -> str | None:
    """How a table names ``stage``: its alias, itself if shown, else None (left out)."""
    if alias and stage in alias:
        return alias[stage]
    return stage if only is None or stage in only else None


def print_launch(r: dict, only=None) -> None:
    print(f"host time per call, GPU kept busy (one stream, q_len {r['q_len']}, {r['heads']} heads, "
          f"prefix {r['prefix']}); a tiny torch op (torch.add, 16 floats): {r['tiny_op_us']:.1f} us")
    print(f"{'stage':<13} {'launches':>8} {'bare us':>8} {'per launch':>10} {'attention us':>12} "
          f"{'+ outputs us':>12} {'overhead us':>11} {'+ outputs':>9}")
    for x in r["rows"]:
        if _label(x["stage"], only) is None:
            continue
        flag = "" if x["busy"] else "   (the GPU ran dry: an upper bound)"
        print(f"{x['stage']:<13} {x['launches']:>8} {x['bare_us']:>8.1f} {x['bare_us'] / x['launches']:>10.1f} "
              f"{x['attention_us']:>12.1f} {x['attention_alloc_us']:>12.1f} {x['overhead_us']:>11.1f} "
              f"{x['alloc_overhead_us']:>9.1f}{flag}")


def print_loop(rows: list[dict], only=None, alias=None) -> None:
    print(f"{'stage':<13} {'prefix':>6} {'eager us/call':>13} {'61 captured us/call':>19} {'ratio':>6}")
    for x in rows:
        name = _label(x["stage"], only, alias)
        if name is not None:
            print(f"{name:<13} {x['prefix']:>6} {x['eager_us']:>13.1f} {x['graph_us']:>19.1f} "
                  f"{x['eager_us'] / x['graph_us']:>5.1f}x")


def print_steps(r: dict, only=None, alias=None) -> None:
    print(f"{'stage':<13} {'prefix':>6} {'eager ms':>9} {'captured ms':>11} {'graphs gain':>11}")
    for x in r["rows"]:
        name = _label(x["stage"], only, alias)
        if name is not None:
            print(f"{name:<13} {x['prefix']:>6} {x['eager_us'] / 1e3:>9.2f} {x['graph_us'] / 1e3:>11.2f} "
                  f"{x['eager_us'] / x['graph_us']:>10.2f}x")


def step_stages_of(r: dict) -> list[str]:
    """The stages of a ``steps`` section, in the order they were measured."""
    return list(dict.fromkeys(x["stage"] for x in r["rows"]))


def step_row(r: dict, stage: str, prefix: int) -> dict | None:
    return next((x for x in r["rows"] if x["stage"] == stage and x["prefix"] == prefix), None)


def print_claim(r: dict, best: str, alias=None) -> None:
    """The article's end-to-end claim: captured steps, the baseline over each stage."""
    shown = list(dict.fromkeys([BASELINE, ARTICLE_STAGE, best]))
    names = [_label(s, None, alias) for s in shown]
    print(f"61-layer step, captured, one stream, q_len {r['q_len']}, {r['heads']} heads per rank:")
    print(f"{'prefix':>6} " + "".join(f"{n + ' ms':>16}" for n in names)
          + "".join(f"{BASELINE + '/' + n:>18}" for n in names[1:]))
    for prefix in sorted({x["prefix"] for x in r["rows"]}):
        rows = [step_row(r, s, prefix) for s in shown]
        line = f"{prefix:>6} " + "".join(f"{x['graph_us'] / 1e3:>16.2f}" if x else f"{'-':>16}" for x in rows)
        for x in rows[1:]:
            line += f"{rows[0]['graph_us'] / x['graph_us']:>17.2f}x" if x and rows[0] else f"{'-':>18}"
        print(line)


def print_verify_step(rows: list[dict], only=None) -> None:
    print(f"{'stage':<13} {'splits':>6} {'replays':>7}  replay == eager, bit for bit   padded streams NaN")
    for x in rows:
        if _label(x["stage"], only) is not None:
            print(f"{x['stage']:<13} {x['num_splits']:>6} {x['replays']:>7}  {str(x['bit_equal']):<30} "
                  f"{x['padded_nan']}")


def print_defrag(r: dict, only=None, alias=None) -> None:
    print(f"prefix {r['prefix']}, pages of {r['page_size']} token, {r['layers']} layers: defragmentation moved "
          f"{r['moved_pages']} pages per layer ({r['moved_bytes'] / 1e9:.2f} GB in all) in "
          f"{r['defrag_us'] / 1e3:.1f} ms (host planning included)")
    print(f"{'stage':<13} {'kernel us before':>16} {'after':>8} {'step ms before':>14} {'after':>8}  same output")
    for s in r["kernel_us_before"]:
        name = _label(s, only, alias)
        if name is not None:
            print(f"{name:<13} {r['kernel_us_before'][s]:>16.1f} {r['kernel_us_after'][s]:>8.1f} "
                  f"{r['step_us_before'][s] / 1e3:>14.2f} {r['step_us_after'][s] / 1e3:>8.2f}  "
                  f"kernel {r['kernel_same_output'][s]}, step {r['step_same_output'][s]}")


def readme_section() -> str:
    """docs/using.md's end-to-end lines, from the latest record of `mla-lab graphs`."""
    rec = load()
    if rec is None:
        return "No end-to-end results recorded yet: run `mla-lab graphs` on a GPU."
    lines = []
    steps, best = rec.get("steps"), (rec.get("best") or {}).get("best")
    if steps and best:
        shown = list(dict.fromkeys([BASELINE, ARTICLE_STAGE, best]))
        prefixes = sorted({x["prefix"] for x in steps["rows"]})
        head = ["stage"] + [f"prefix {p // 1024}k ms" for p in prefixes] + ["vs Triton (16k)", "graphs gain (1k)"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for s in shown:
            cells = [f"`{s}`" + (" (fastest)" if s == best else "")]
            for p in prefixes:
                x = step_row(steps, s, p)
                cells.append(f"{x['graph_us'] / 1e3:.2f}" if x else "—")
            t, x = step_row(steps, BASELINE, 16384), step_row(steps, s, 16384)
            cells.append(f"{t['graph_us'] / x['graph_us']:.2f}x" if t and x else "—")
            g = step_row(steps, s, 1024)
            cells.append(f"{g['eager_us'] / g['graph_us']:.2f}x" if g else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    facts = []
    launch = rec.get("launch")
    if launch:
        cuda = [r["overhead_us"] for r in launch["rows"] if r["stage"] != BASELINE]
        tri = [r["overhead_us"] for r in launch["rows"] if r["stage"] == BASELINE]
        facts.append(f"`attention(check=False)` adds at most {max(cuda):.1f} µs of host time to the bare op "
                     f"(CUDA stages) and {max(tri):.1f} µs to Triton's launcher, at prefix {launch['prefix']}")
    vs = rec.get("verify_step")
    if vs:
        facts.append(f"a `VerifyStep` replay equals the eager call bit for bit for "
                     f"{sum(r['bit_equal'] for r in vs)} of {len(vs)} stages")
    lines.append("The 61-layer MLA verify step at Kimi K2.x TP8 sizes (no MoE), captured in one CUDA graph, one "
                 "stream, `q_len` 9, 8 heads per rank, pages of one token at scattered ids" +
                 ("; " + "; ".join(facts) if facts else "") + f". {describe(rec)[0].upper() + describe(rec)[1:]}.")
    return "\n".join(lines)


# ---- the command -----------------------------------------------------------------------------

DESCRIPTION = (
    "Chapter 7's measurements, on this GPU, written to results/graphs/<gpu>.json (chapter 7 reads them without "
    "a GPU): the host's cost per launch for every stage, bare and through attention(check=False); each stage's "
    "attention at prefix 16384 (the fastest is the 'best stage'); per call, eager against 61 calls captured in "
    "one CUDA graph, with no L2 flush between calls; kernels per layer and the host time of one eager layer "
    "(the graphs' saving predicted); the 61-layer model step at Kimi K2.x TP8 sizes, eager and captured, for "
    "triton, float4 and the best stage at prefixes 1024, 16384 and 65536; a captured VerifyStep against eager "
    "calls, bit for bit, for every stage; KV defragmentation of scattered pages of one token; and a 100-step "
    "speculative acceptance loop. About a minute on an H200. Without a GPU it prints what is recorded.")
EXAMPLES = ("  mla-lab graphs                       # everything, recorded\n"
            "  mla-lab graphs --quick               # steps at 1024 and 16384 only; records nothing\n"
            "  mla-lab graphs --sections launch loop --out /tmp/graphs.json")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="model steps at prefixes 1024 and 16384 only, fewer "
                    "verify-step replays; writes nothing unless --out is given")
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS, metavar="SECTION",
                    help=f"what to measure (default: all: {' '.join(SECTIONS)})")
    ap.add_argument("--out", default=None, help="write the record here instead of results/graphs/<gpu>.json")
    ap.add_argument("--no-save", action="store_true", help="print only")


def run(args: argparse.Namespace, argv=None) -> int:
    if not torch.cuda.is_available():
        ignored = [o for o in ("--quick", "--sections", "--out", "--no-save")
                   if any(a == o or a.startswith(o + "=") for a in argv or ())]
        if ignored:
            print(f"Ignored here (nothing is measured without a GPU): {' '.join(ignored)}.")
        rec = load()
        if rec is None:
            print("No CUDA GPU here, and nothing recorded by `mla-lab graphs` yet.")
            return 0
        print(f"No CUDA GPU here: showing what was {describe(rec)}.")
        _print_all(rec)
        return 0
    s = Session(quick=args.quick)
    for name in args.sections:
        t0 = time.perf_counter()
        s.run(name)
        print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    _print_all(s.record)
    if args.no_save or (args.quick and not args.out):
        return 0
    path = save(s.record, args.out, argv)
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="mla-lab graphs", description=DESCRIPTION, epilog="examples:\n" + EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv), argv)


def _print_all(rec: dict) -> None:
    if rec.get("launch"):
        print()
        print_launch(rec["launch"])
    if rec.get("best"):
        print(f"\nbest stage at prefix {rec['best']['prefix']}: {rec['best']['best']}")
    if rec.get("loop"):
        print()
        print_loop(rec["loop"])
    if rec.get("steps"):
        print()
        print_steps(rec["steps"])
        if rec.get("best"):
            print()
            print_claim(rec["steps"], rec["best"]["best"])
    if rec.get("verify_step"):
        print()
        print_verify_step(rec["verify_step"])
    if rec.get("defrag"):
        print()
        print_defrag(rec["defrag"])
    for x in rec.get("acceptance") or []:
        print(x["summary"])


if __name__ == "__main__":
    sys.exit(main())
