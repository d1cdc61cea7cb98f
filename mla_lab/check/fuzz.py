"""Property-based fuzzing of valid inputs: random shapes, layouts and views, every stage against the reference.

One generator (a hypothesis strategy) draws a :class:`FuzzCase`: streams,
``q_len``, heads, one length per stream, the page size, scattered or
contiguous pages, which inputs are non-contiguous (but valid) views, whether
the caller passes ``out`` and ``lse`` (and how they are laid out), the split
count and the seed of the values.  :func:`build` turns a case into tensors,
poisoned as everywhere in this project: NaN in the cache past each stream's
length, in spare pages and in the padding of every view, huge ids in unused
block-table slots, NaN in the given outputs.

The same generator serves two sizes (:data:`GPU_LIMITS`, :data:`CPU_LIMITS`):
on a GPU every stage runs each case through ``attention()``; on the CPU the
stages' CPU models (``models.py``) and the Triton baseline in its interpreter
take the small cases.  A case that fails prints as one line that reproduces it:

    python -m mla_lab.check.fuzz tensor_core '{"streams": 3, ...}'
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from ..core import stages as _stages
from ..core.problem import D_V, POISON_PAGE_ID, Problem, Workload, make_workload
from ..core.stages import Stage
from ..core.verify import DEFAULT_TOL, compare

# The production baseline is held to 3e-3, the CUDA stages to 5e-3 (as in the GPU test grid).
TOLERANCE = {"triton": 3e-3}
ODD_PAGE_SIZE = 37  # a page size that divides no tile
PAD = 8  # elements of padding in a padded view: keeps rows on 16-byte boundaries

Q_VIEWS = ("dense", "padded", "heads_major")
KV_VIEWS = ("dense", "padded", "every_other_page")
TABLE_VIEWS = ("dense", "padded")
OUT_VIEWS = ("none", "dense", "padded", "heads_major")  # "none": attention() allocates it
LSE_VIEWS = ("none", "dense", "heads_major")


@dataclass(frozen=True)
class Limits:
    """The ranges the generator draws from."""

    name: str
    max_streams: int
    max_q_len: int
    heads: tuple[int, ...]
    max_len: int  # longest stream (tokens in the cache, draft included)
    page_sizes: tuple[int, ...]
    # Sum over streams of kv_len x q_len x heads: bounds one case's work, so that
    # 128 heads come with short caches and long caches with few heads.
    max_work: int
    max_splits: int = 64

    def describe(self) -> str:
        return (f"streams 1-{self.max_streams}, q_len 1-{self.max_q_len}, heads {{{', '.join(map(str, self.heads))}}}, "
                f"lengths q_len-{self.max_len}, pages {'/'.join(map(str, self.page_sizes))}, "
                f"work (sum of kv_len x q_len x heads) <= {self.max_work:,}, num_splits default or 1-{self.max_splits}")


GPU_LIMITS = Limits("gpu", max_streams=16, max_q_len=16, heads=(1, 2, 4, 8, 16, 32, 64, 128), max_len=70000,
                    page_sizes=(1, 16, 64, ODD_PAGE_SIZE), max_work=4_000_000)
CPU_LIMITS = Limits("cpu", max_streams=3, max_q_len=5, heads=(1, 2, 4, 8), max_len=100,
                    page_sizes=(1, 16, 64, ODD_PAGE_SIZE), max_work=3_000, max_splits=8)


@dataclass(frozen=True)
class SlowCap:
    """Stages with one block walking a row's whole cache take milliseconds per thousand keys: they get smaller cases."""

    max_len: int
    max_work: int

    def admits(self, case: "FuzzCase") -> bool:
        return max(case.kv_lens) <= self.max_len and case.work <= self.max_work


SLOW_STAGE_CAPS = {"naive": SlowCap(max_len=4096, max_work=1_000_000),
                   "flash_ht8": SlowCap(max_len=4096, max_work=1_000_000)}


@dataclass(frozen=True)
class FuzzCase:
    streams: int
    q_len: int
    heads: int
    kv_lens: tuple[int, ...]
    page_size: int
    scattered: bool
    q_view: str = "dense"
    kv_view: str = "dense"
    table_view: str = "dense"
    out_view: str = "none"
    lse_view: str = "none"
    num_splits: int | None = None  # None: the stage's own rule
    seed: int = 0

    @property
    def work(self) -> int:
        return sum(self.kv_lens) * self.q_len * self.heads

    @property
    def problem(self) -> Problem:
        return Problem(streams=self.streams, q_len=self.q_len, heads=self.heads,
                       prefix=tuple(L - self.q_len for L in self.kv_lens), page_size=self.page_size,
                       scattered=self.scattered)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "FuzzCase":
        d = json.loads(text)
        d["kv_lens"] = tuple(d["kv_lens"])
        return cls(**d)

    def reproducer(self, stage: str) -> str:
        return f"python -m mla_lab.check.fuzz {stage} '{self.to_json()}'"

    def label(self) -> str:
        lens = "/".join(map(str, self.kv_lens)) if len(self.kv_lens) <= 4 else \
            f"{min(self.kv_lens)}..{max(self.kv_lens)}"
        return (f"B{self.streams} T{self.q_len} H{self.heads} lens {lens} page{self.page_size}"
                f"{'s' if self.scattered else 'c'} q:{self.q_view} kv:{self.kv_view} table:{self.table_view} "
                f"out:{self.out_view} lse:{self.lse_view} splits:{self.num_splits}")


# ---- the generator ------------------------------------------------------------------

def case_strategy(limits: Limits):
    """A hypothesis strategy of valid cases within ``limits``."""
    from hypothesis import strategies as st

    @st.composite
    def cases(draw):
        q_len = draw(st.integers(1, limits.max_q_len))
        heads = draw(st.sampled_from(limits.heads))
        streams = draw(st.integers(1, limits.max_streams))
        # the work bound, shared out over the streams
        keys = max(q_len, limits.max_work // (q_len * heads) // streams)
        longest = max(q_len, min(limits.max_len, keys))
        # Three regimes of lengths: all short (a few keys: tails, single tiles, the draft
        # alone), medium (up to 4096), and long (up to the longest the work bound allows,
        # 70000 where heads and rows are few; one stream in three at the very top).
        short = st.integers(q_len, min(longest, q_len + 70))
        medium = st.integers(q_len, min(longest, 4096))
        top = max(q_len, longest - 100)
        regime = draw(st.sampled_from(("short", "medium", "medium", "long")))
        if regime == "short":
            one = short
        elif regime == "medium":
            one = st.one_of(short, medium)
        else:
            one = st.one_of(short, st.integers(q_len, longest), st.integers(top, longest))
        lens = tuple(draw(one) for _ in range(streams))
        return FuzzCase(
            streams=streams, q_len=q_len, heads=heads, kv_lens=lens,
            page_size=draw(st.sampled_from(limits.page_sizes)),
            scattered=draw(st.booleans()),
            q_view=draw(st.sampled_from(Q_VIEWS)),
            kv_view=draw(st.sampled_from(KV_VIEWS)),
            table_view=draw(st.sampled_from(TABLE_VIEWS)),
            out_view=draw(st.sampled_from(OUT_VIEWS)),
            lse_view=draw(st.sampled_from(LSE_VIEWS)),
            num_splits=draw(st.one_of(st.none(), st.integers(1, limits.max_splits))),
            seed=draw(st.integers(0, 2**31 - 1)),
        )

    return cases()


def generate(limits: Limits, count: int, seed: int = 0) -> list[FuzzCase]:
    """``count`` distinct cases, the same ones for the same (limits, count, seed, hypothesis version).

    Hypothesis only draws here (no shrinking: a failure is reported as its
    case, not raised), so every case runs, failing or not.
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    found: list[FuzzCase] = []
    seen: set[FuzzCase] = set()

    @hseed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case_strategy(limits))
    def collect(case):
        if case not in seen:
            seen.add(case)
            found.append(case)

    collect()
    return found


def kernels_reached(st: Stage, cases: list[FuzzCase], sms: int) -> dict[str, int]:
    """{kernel: cases that launch it} for CUDA stage ``st`` on a GPU of ``sms`` SMs, by the registry's account of
    each call (:func:`stages.kernels_of_call`; the tables as :func:`build` makes them)."""
    counts: dict[str, int] = {}
    for c in cases:
        if not admitted(st, c):
            continue
        for k in _stages.kernels_reached(st, [(c.problem, splits_for(st, c))], sms):
            counts[k] = counts.get(k, 0) + 1
    return counts


def admitted(st: Stage, case: FuzzCase) -> bool:
    cap = SLOW_STAGE_CAPS.get(st.id)
    return cap is None or cap.admits(case)


def generate_for(limits: Limits, stages: list[Stage], per_stage: int, seed: int = 0) -> list[FuzzCase]:
    """Cases until every stage admits at least ``per_stage`` of them (the slow stages take only small ones).

    Batches are drawn with seeds ``seed``, ``seed + 1``, ...: the list is the
    same every time for the same arguments and hypothesis version.
    """
    cases: list[FuzzCase] = []
    seen: set[FuzzCase] = set()
    batch_seed = seed
    while True:
        short = min((sum(admitted(st, c) for c in cases) for st in stages), default=per_stage)
        if short >= per_stage or batch_seed > seed + 50:
            return cases
        want = max(16, int((per_stage - short) * 1.6) if cases else int(per_stage * 1.15))
        for c in generate(limits, want, batch_seed):
            if c not in seen:
                seen.add(c)
                cases.append(c)
        batch_seed += 1


# ---- tensors of a case ---------------------------------------------------------------

@dataclass
class Built:
    case: FuzzCase
    workload: Workload  # its tensors are the (possibly strided) views a stage is given
    buffers: dict = field(default_factory=dict)  # the storage behind each padded view, to check it stays poisoned


def _padded(t: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` copied into rows PAD elements wider (the padding holds ``fill``); returns (view, storage)."""
    buf = torch.full((*t.shape[:-1], t.shape[-1] + PAD), fill, dtype=t.dtype, device=t.device)
    buf[..., : t.shape[-1]] = t
    return buf[..., : t.shape[-1]], buf


def _swap12(t: torch.Tensor) -> torch.Tensor:
    """The same values held with dimensions 1 and 2 swapped in memory (a transposed, valid view)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def build(case: FuzzCase, device: str | torch.device = "cpu") -> Built:
    w = make_workload(case.problem, device=device, seed=case.seed, poison=True)
    nan = float("nan")
    bufs = {}
    q, kv, table = w.q, w.kv_cache, w.block_table
    if case.q_view == "padded":
        q, bufs["q"] = _padded(q, nan)
    elif case.q_view == "heads_major":
        q = _swap12(q)
    if case.kv_view == "padded":
        kv, bufs["kv"] = _padded(kv, nan)
    elif case.kv_view == "every_other_page":
        pool = torch.full((2 * kv.shape[0], *kv.shape[1:]), nan, dtype=kv.dtype, device=kv.device)
        pool[::2] = kv
        kv, bufs["kv"] = pool[::2], pool
    if case.table_view == "padded":
        wide = torch.full((table.shape[0], table.shape[1] + 3), POISON_PAGE_ID, dtype=table.dtype, device=table.device)
        wide[:, : table.shape[1]] = table
        table = wide[:, : table.shape[1]]
    w = Workload(problem=w.problem, q=q, kv_cache=kv, block_table=table, kv_lens=w.kv_lens, poisoned=True)
    return Built(case=case, workload=w, buffers=bufs)


def new_outputs(case: FuzzCase, device) -> tuple[torch.Tensor | None, torch.Tensor | None, dict]:
    """NaN-filled ``out`` and ``lse`` in the case's layouts (None where attention() allocates)."""
    B, T, H = case.streams, case.q_len, case.heads
    nan = float("nan")
    bufs = {}
    out = None
    if case.out_view != "none":
        out = torch.full((B, T, H, D_V), nan, dtype=torch.bfloat16, device=device)
        if case.out_view == "padded":
            out, bufs["out"] = _padded(out, nan)
        elif case.out_view == "heads_major":
            out = _swap12(out)
    lse = None
    if case.lse_view != "none":
        lse = torch.full((B, T, H), nan, dtype=torch.float32, device=device)
        if case.lse_view == "heads_major":
            lse = _swap12(lse)
    return out, lse, bufs


def padding_untouched(bufs: dict, widths: dict) -> bool:
    """Nothing was written into the padding of a padded output."""
    for name, buf in bufs.items():
        if not torch.isnan(buf[..., widths[name]:].float()).all():
            return False
    return True


# ---- running cases --------------------------------------------------------------------

@dataclass
class StageTally:
    cases: int = 0
    mismatches: int = 0
    refused: int = 0  # raised an error on a valid case
    skipped: int = 0  # outside the stage's cap (SLOW_STAGE_CAPS)
    worst_rel_err: float = 0.0
    failures: list = field(default_factory=list)  # one-line reproducers (the first few)
    refusals: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(cases=self.cases, mismatches=self.mismatches, refused=self.refused, skipped=self.skipped,
                    worst_rel_err=self.worst_rel_err, failures=self.failures[:10], refusals=self.refusals[:5])


def splits_for(st: Stage, case: FuzzCase) -> int | None:
    """The split count a stage is given: the case's, where the stage takes one."""
    return case.num_splits if st.takes_num_splits else None


def run_stage(st: Stage, built: Built, ref_out, ref_lse):
    """One stage on one case through attention(); returns a Check (or raises what the stage raised)."""
    from ..core.ops import attention

    case, w = built.case, built.workload
    out, lse, bufs = new_outputs(case, w.device)
    o, l = attention(st, w.q, w.kv_cache, w.block_table, w.kv_lens, w.scale, out=out, lse=lse,
                     num_splits=splits_for(st, case))
    chk = compare(o, l, ref_out, ref_lse, label=st.id, tol=TOLERANCE.get(st.id, DEFAULT_TOL))
    wrote_in_place = (out is None or o is out) and (lse is None or l is lse)
    if not wrote_in_place or not padding_untouched(bufs, {"out": D_V}):
        chk = type(chk)(label=chk.label + " (wrote outside the given out/lse)", rel_err=math.inf,
                        lse_err=chk.lse_err, nonfinite=chk.nonfinite, tol=chk.tol)
    return chk


def run_model(st: Stage, built: Built, ref_out, ref_lse):
    """The stage's CPU model on one case (the Triton baseline runs in its interpreter instead)."""
    if st.kind == "triton":
        return run_stage(st, built, ref_out, ref_lse)
    from ..models import run_model as model

    out, lse, _ = model(st.id, built.workload, built.case.num_splits or 1)
    return compare(out, lse, ref_out, ref_lse, label=f"model {st.id}", tol=TOLERANCE.get(st.id, DEFAULT_TOL))


def fuzz(stages: list[Stage], cases: list[FuzzCase], *, device: str = "cuda", models: bool = False,
         stage_case_limit: dict | None = None, log=print) -> dict:
    """Run every case on every stage; returns {stage id: StageTally}.

    ``models``: run the CPU models instead of the kernels.  ``stage_case_limit``
    caps the cases a stage takes (the Triton interpreter is slow).  Each case's
    reference is computed once and shared by the stages.
    """
    from ..core.reference import reference_attention

    tallies = {st.id: StageTally() for st in stages}
    limit = stage_case_limit or {}
    for case in cases:
        takers = []
        for st in stages:
            cap = SLOW_STAGE_CAPS.get(st.id)
            if (cap and not cap.admits(case)) or tallies[st.id].cases + tallies[st.id].refused >= limit.get(st.id, math.inf):
                tallies[st.id].skipped += 1
            else:
                takers.append(st)
        if not takers:
            continue
        built = build(case, device)
        ref_out, ref_lse = reference_attention(*built.workload.args())
        for st in takers:
            t = tallies[st.id]
            try:
                chk = (run_model if models else run_stage)(st, built, ref_out, ref_lse)
            except Exception as e:  # a valid case refused: reported, not hidden
                t.refused += 1
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                t.refusals.append(f"{type(e).__name__}: {msg[:200]} :: {case.reproducer(st.id)}")
                if "CUDA error" in str(e):
                    raise  # the context is gone; nothing after this can be trusted
                continue
            t.cases += 1
            t.worst_rel_err = max(t.worst_rel_err, chk.rel_err)
            if not chk.ok:
                t.mismatches += 1
                line = f"{chk} :: {case.reproducer(st.id)}"
                t.failures.append(line)
                log(f"MISMATCH {line}")
        del built, ref_out, ref_lse
    return tallies


# ---- shards in worker processes ------------------------------------------------------------

TALLY_TAG = "MLA_LAB_FUZZ_TALLY "


def worker_main(argv) -> int:
    """``python -m mla_lab.check.fuzz worker I K PER_STAGE SEED STAGE,...``: shard I of K of the GPU cases."""
    i, k, per_stage, seed, ids = int(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), argv[4].split(",")
    sts = [_stages.get(s) for s in ids]
    cases = generate_for(GPU_LIMITS, sts, per_stage, seed)[i::k]
    tallies = fuzz(sts, cases, device="cuda", log=lambda line: print(line, flush=True))
    print(TALLY_TAG + json.dumps({sid: t.as_dict() for sid, t in tallies.items()}), flush=True)
    return 0


def merge(parts: list[dict]) -> dict:
    """Tallies of several shards, as one."""
    total: dict = {}
    for part in parts:
        for sid, t in part.items():
            m = total.setdefault(sid, dict(cases=0, mismatches=0, refused=0, skipped=0, worst_rel_err=0.0,
                                           failures=[], refusals=[]))
            for key in ("cases", "mismatches", "refused", "skipped"):
                m[key] += t[key]
            m["worst_rel_err"] = max(m["worst_rel_err"], t["worst_rel_err"])
            m["failures"] = (m["failures"] + t["failures"])[:10]
            m["refusals"] = (m["refusals"] + t["refusals"])[:5]
    return total


def run_shard(stages: list[Stage], per_stage: int, seed: int, shard: int, shards: int, *,
              timeout_s: float = 1200) -> tuple[dict | None, list[str], str]:
    """Shard ``shard`` of ``shards`` of the GPU fuzz, in a process of its own.

    Several shards share the GPU, and the Triton baseline (which compiles a
    kernel for every new signature of integer arguments) compiles on several
    CPU cores at once.  Returns (tallies or None, mismatch lines, a problem or "").
    """
    import subprocess

    from ..core.extension import ROOT

    cmd = [sys.executable, "-m", "mla_lab.check.fuzz", "worker", str(shard), str(shards), str(per_stage), str(seed),
           ",".join(st.id for st in stages)]
    try:
        p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout_s)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = f"timeout after {timeout_s:.0f} s"
    tally, lines = None, []
    for line in out.splitlines():
        if line.startswith(TALLY_TAG):
            tally = json.loads(line[len(TALLY_TAG):])
        elif line.startswith("MISMATCH"):
            lines.append(line)
    problem = ""
    if tally is None or rc != 0:
        problem = f"fuzz shard {shard}/{shards} exited with {rc}: " + " | ".join(out.splitlines()[-5:])
    return tally, lines, problem


def main(argv=None) -> int:
    """Re-run one case: ``python -m mla_lab.check.fuzz STAGE 'CASE_JSON' [--model]``."""
    import argparse

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])

    ap = argparse.ArgumentParser(prog="python -m mla_lab.check.fuzz",
                                 description="Re-run one fuzz case (as printed by mla-lab check) on one stage.")
    ap.add_argument("stage", help="stage id, e.g. tensor_core")
    ap.add_argument("case", help="the case as JSON, as printed")
    ap.add_argument("--model", action="store_true", help="run the stage's CPU model, not its kernel")
    args = ap.parse_args(argv)
    st = _stages.get(args.stage)
    case = FuzzCase.from_json(args.case)
    device = "cpu" if args.model or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and st.is_cuda and not args.model:
        print("no CUDA GPU: running the stage's CPU model (--model)")
        args.model = True
    from ..core.reference import reference_attention

    t0 = time.perf_counter()
    built = build(case, device)
    ref = reference_attention(*built.workload.args())
    chk = (run_model if args.model else run_stage)(st, built, *ref)
    print(f"{case.label()}\n{chk}  ({time.perf_counter() - t0:.2f} s)")
    return 0 if chk.ok else 1


if __name__ == "__main__":
    sys.exit(main())
