"""Every kind of bad input, what each entry point answers, and the checks that hold them to it.

Two kinds of bad input:

* **metadata**: dtypes, devices, ranks, shapes, strides, alignment, the scale,
  ``out``/``lse``, ``num_splits``.  Visible without reading GPU memory, so every
  entry point rejects them every time, ``check=False`` included:
  ``attention()`` raises :class:`~mla_lab.core.validate.InputError`, a raw op
  (``torch.ops.mla_lab.<stage>``) a ``RuntimeError``; both messages name what was
  expected and what came.
* **contents**: lengths and page ids.  ``attention()`` reads them (a host sync)
  and raises ``InputError``; with ``check=False``, or through a raw op (as in a
  CUDA-graph replay), nothing on the host can see them, and the kernels defend
  themselves: the bad stream's output and lse are NaN, the other streams are
  exact.

:data:`BAD_INPUTS` is the table; docs/trust.md's table is generated from it, and
the tests and ``mla-lab check`` run every entry through the public API, the raw
ops and ``check=False``.  All cases change one thing in :data:`BASE`.

``python -m mla_lab.check.badinput STAGE DEVICE`` runs the ``check=False`` half for one
stage in a process of its own (a stage that breaks the promise may crash its
process), one JSON line per case.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from ..core import stages as _stages
from ..core.problem import POISON_PAGE_ID, Problem, make_workload
from ..core.stages import Stage
from ..core.validate import InputError

# kv_lens (8, 23); pages of 16: stream 0 uses one page, stream 1 two; the block
# table has 3 columns (48 tokens); the pool holds 5 pages (3 used, 2 spare).
BASE = Problem(streams=2, q_len=3, heads=2, prefix=(5, 20), page_size=16)
BAD_STREAM = 1  # the stream a content case spoils; stream 0 must stay exact


def _misaligned(shape, offset, dtype=torch.bfloat16, device="cpu"):
    """A view of ``shape`` that starts ``offset`` elements into each row of a wider buffer."""
    big = torch.zeros(*shape[:-1], shape[-1] + offset, dtype=dtype, device=device)
    return big[..., offset:]


def _set(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _most_splits(st: Stage) -> int:
    if st.kind == "triton":
        from ..core.triton_baseline import MAX_SPLITS

        return MAX_SPLITS
    return _stages.MAX_SPLITS


@dataclass(frozen=True)
class BadInput:
    key: str
    what: str  # the bad input in words (the table's first column)
    change: Callable[[dict, Stage], dict]  # valid arguments -> bad ones
    api: str  # regex for attention()'s InputError, after "<stage>: "
    op: str | None  # regex for the raw op's error, after "mla_lab::<stage>: "; None: a content case
    applies: str = "all"  # "all", "cuda" (the CUDA stages), "align16" (the stages with 16-byte loads)

    @property
    def content(self) -> bool:
        return self.op is None

    def applies_to(self, st: Stage) -> bool:
        if self.applies == "cuda":
            return st.is_cuda
        if self.applies == "align16":
            return st.is_cuda and st.align_bytes >= 16
        return True

    def op_applies_to(self, st: Stage) -> bool:
        """The raw op sees this input (a stage without splits takes no num_splits)."""
        return st.is_cuda and self.applies_to(st) and not (self.key.startswith("num_splits") and not st.splits)


def _d(a: dict, **changes) -> dict:
    return dict(a, **changes)


BAD_INPUTS: tuple[BadInput, ...] = (
    # dtypes
    BadInput("q_dtype", "`q` in float32", lambda a, st: _d(a, q=a["q"].float()),
             r"q must be bfloat16, got torch\.float32", r"q must be bfloat16, got \[2, 3, 2, 576\] Float"),
    BadInput("kv_dtype", "`kv_cache` in float16", lambda a, st: _d(a, kv=a["kv"].half()),
             r"kv_cache must be bfloat16, got torch\.float16", r"kv_cache must be bfloat16, got \[5, 16, 576\] Half"),
    BadInput("table_dtype", "`block_table` in int64", lambda a, st: _d(a, bt=a["bt"].long()),
             r"block_table must be int32, got torch\.int64", r"block_table must be int32, got \[2, 3\] Long"),
    BadInput("lens_dtype", "`kv_lens` in int64", lambda a, st: _d(a, lens=a["lens"].long()),
             r"kv_lens must be int32, got torch\.int64", r"kv_lens must be int32, got \[2\] Long"),
    BadInput("out_dtype", "`out` in float32", lambda a, st: _d(a, out=a["out"].float()),
             r"out must be \[2, 3, 2, 512\] bfloat16, got \(2, 3, 2, 512\) float32",
             r"out must be \[2, 3, 2, 512\] bfloat16, got \[2, 3, 2, 512\] Float"),
    BadInput("lse_dtype", "`lse` in float64", lambda a, st: _d(a, lse=a["lse"].double()),
             r"lse must be \[2, 3, 2\] float32, got \(2, 3, 2\) float64",
             r"lse must be \[2, 3, 2\] float32, got \[2, 3, 2\] Double"),
    # ranks and shapes
    BadInput("q_rank", "`q` of rank 3", lambda a, st: _d(a, q=a["q"][0]),
             r"q must be \[streams, q_len, heads, 576\], got \(3, 2, 576\) bfloat16",
             r"q must be \[streams, q_len, heads, 576\], got \[3, 2, 576\] BFloat16"),
    BadInput("q_width", "`q` 512 wide (RoPE part missing)", lambda a, st: _d(a, q=a["q"][..., :512]),
             r"q must be \[streams, q_len, heads, 576\], got \(2, 3, 2, 512\) bfloat16",
             r"q must be \[streams, q_len, heads, 576\], got \[2, 3, 2, 512\] BFloat16"),
    BadInput("kv_rank", "`kv_cache` of rank 2", lambda a, st: _d(a, kv=a["kv"][0]),
             r"kv_cache must be \[num_pages, page_size, 576\], got \(16, 576\)",
             r"kv_cache must be \[num_pages, page_size, 576\], got \[16, 576\]"),
    BadInput("kv_empty", "an empty page pool", lambda a, st: _d(a, kv=a["kv"][:0]),
             r"kv_cache is empty: \(0, 16, 576\)", r"kv_cache is empty: \[0, 16, 576\]"),
    BadInput("table_streams", "`block_table` with a row per stream missing", lambda a, st: _d(a, bt=a["bt"][:1]),
             r"block_table must be \[streams=2, max_pages\], got \(1, 3\) int32",
             r"block_table must be \[streams=2, max_pages >= 1\], got \[1, 3\] Int"),
    BadInput("table_no_columns", "`block_table` with no columns", lambda a, st: _d(a, bt=a["bt"][:, :0]),
             r"block_table has no columns: \(2, 0\) int32",
             r"block_table must be \[streams=2, max_pages >= 1\], got \[2, 0\] Int"),
    BadInput("lens_size", "`kv_lens` with a length too many",
             lambda a, st: _d(a, lens=torch.cat([a["lens"], a["lens"][:1]])),
             r"kv_lens must be \[streams=2\], got \(3,\) int32", r"kv_lens must be \[streams=2\], got \[3\] Int"),
    BadInput("empty_batch", "an empty batch (no streams)",
             lambda a, st: _d(a, q=a["q"][:0], bt=a["bt"][:0], lens=a["lens"][:0], out=a["out"][:0], lse=a["lse"][:0]),
             r"empty batch: q is \(0, 3, 2, 576\) bfloat16 on \S+; streams, q_len and heads must all be >= 1",
             r"empty batch: q is \[0, 3, 2, 576\] BFloat16 on \S+; streams, q_len and heads must all be >= 1"),
    BadInput("out_shape", "`out` of the wrong shape", lambda a, st: _d(a, out=a["out"][:, :2]),
             r"out must be \[2, 3, 2, 512\] bfloat16, got \(2, 2, 2, 512\) bfloat16",
             r"out must be \[2, 3, 2, 512\] bfloat16, got \[2, 2, 2, 512\] BFloat16"),
    BadInput("lse_shape", "`lse` of the wrong shape", lambda a, st: _d(a, lse=a["lse"][..., :1]),
             r"lse must be \[2, 3, 2\] float32, got \(2, 3, 1\) float32",
             r"lse must be \[2, 3, 2\] float32, got \[2, 3, 1\] Float"),
    # strides
    BadInput("q_strided", "`q` with a strided last dimension",
             lambda a, st: _d(a, q=torch.zeros(2, 3, 2, 1152, dtype=torch.bfloat16, device=a["device"])[..., ::2]),
             r"q's last dimension must be contiguous \(stride 1\), got strides \(6912, 2304, 1152, 2\)",
             r"q's last dimension must be contiguous \(stride 1\), got strides \[6912, 2304, 1152, 2\]"),
    BadInput("kv_strided", "`kv_cache` with a strided last dimension",
             lambda a, st: _d(a, kv=torch.zeros(5, 16, 1152, dtype=torch.bfloat16, device=a["device"])[..., ::2]),
             r"kv_cache's last dimension must be contiguous, got strides \(18432, 1152, 2\)",
             r"kv_cache's last dimension must be contiguous, got strides \[18432, 1152, 2\]"),
    BadInput("table_strided", "`block_table` with strided rows",
             lambda a, st: _d(a, bt=torch.zeros(2, 6, dtype=torch.int32, device=a["device"])[:, ::2]),
             r"block_table's rows must be contiguous, got strides \(6, 2\)",
             r"block_table's rows must be contiguous, got strides \[6, 2\]"),
    BadInput("lens_strided", "`kv_lens` not contiguous",
             lambda a, st: _d(a, lens=torch.stack([a["lens"], a["lens"]], 1)[:, 0]),
             r"kv_lens must be contiguous, got strides \(2,\)", r"kv_lens must be contiguous"),
    BadInput("out_strided", "`out` with a strided last dimension",
             lambda a, st: _d(a, out=torch.zeros(2, 3, 2, 1024, dtype=torch.bfloat16, device=a["device"])[..., ::2]),
             r"out's last dimension must be contiguous, got strides \(6144, 2048, 1024, 2\)",
             r"out's last dimension must be contiguous, got strides \[6144, 2048, 1024, 2\]"),
    BadInput("out_overlap", "`out` whose streams share memory (`expand`)",
             lambda a, st: _d(a, out=a["out"][:1].expand(2, 3, 2, 512)),
             r"out must not have overlapping elements \(a stride of 0 over a size > 1\), got shape \(2, 3, 2, 512\) "
             r"with strides \(0, 1024, 512, 1\)",
             r"out must not have overlapping elements \(a stride of 0 over a size > 1\), got shape \[2, 3, 2, 512\] "
             r"with strides \[0, 1024, 512, 1\]"),
    BadInput("lse_overlap", "`lse` whose heads share memory (`expand`)",
             lambda a, st: _d(a, lse=a["lse"][..., :1].expand(2, 3, 2)),
             r"lse must not have overlapping elements .* got shape \(2, 3, 2\) with strides \(6, 2, 0\)",
             r"lse must not have overlapping elements .* got shape \[2, 3, 2\] with strides \[6, 2, 0\]"),
    # alignment
    BadInput("q_align2", "`q` starting 2 bytes off a 4-byte boundary",
             lambda a, st: _d(a, q=_misaligned((2, 3, 2, 576), 1, device=a["device"])),
             r"q must start on a (4|16)-byte boundary",
             r"needs q, kv_cache and out to start on (4|16)-byte boundaries .* got q at address offset 2",
             applies="cuda"),
    BadInput("q_align8", "`q` starting 8 bytes off a 16-byte boundary (16-byte stages)",
             lambda a, st: _d(a, q=_misaligned((2, 3, 2, 576), 4, device=a["device"])),
             r"q must start on a 16-byte boundary",
             r"needs q, kv_cache and out to start on 16-byte boundaries .* got q at address offset 8", applies="align16"),
    BadInput("kv_align8", "`kv_cache` starting 8 bytes off a 16-byte boundary (16-byte stages)",
             lambda a, st: _d(a, kv=_misaligned((5, 16, 576), 4, device=a["device"])),
             r"kv_cache must start on a 16-byte boundary",
             r"needs q, kv_cache and out to start on 16-byte boundaries .* got kv_cache at address offset 8",
             applies="align16"),
    BadInput("out_align8", "`out` starting 8 bytes off a 16-byte boundary (16-byte stages)",
             lambda a, st: _d(a, out=_misaligned((2, 3, 2, 512), 4, device=a["device"])),
             r"out must start on a 16-byte boundary",
             r"needs q, kv_cache and out to start on 16-byte boundaries .* got out at address offset 8",
             applies="align16"),
    # devices
    BadInput("cpu_tensors", "CPU tensors for a CUDA stage",
             lambda a, st: _d(a, **{k: a[k].cpu() for k in ("q", "kv", "bt", "lens", "out", "lse")}),
             r"needs cuda tensors, got tensors on cpu", r"runs on CUDA tensors; got tensors on cpu", applies="cuda"),
    BadInput("two_devices", "`out` on another device than the inputs",
             lambda a, st: _d(a, out=a["out"].to(a["other_device"])),
             r"all tensors must be on one device", r"all tensors must be on one device"),
    # the scale
    BadInput("scale_nan", "scale NaN", lambda a, st: _d(a, scale=float("nan")),
             r"scale must be a finite positive number, got nan", r"scale must be a finite positive number, got nan"),
    BadInput("scale_inf", "scale infinite", lambda a, st: _d(a, scale=float("inf")),
             r"scale must be a finite positive number, got inf", r"scale must be a finite positive number, got inf"),
    BadInput("scale_zero", "scale 0", lambda a, st: _d(a, scale=0.0),
             r"scale must be a finite positive number, got 0\.0", r"scale must be a finite positive number, got 0\.0*\b"),
    BadInput("scale_negative", "scale negative", lambda a, st: _d(a, scale=-0.5),
             r"scale must be a finite positive number, got -0\.5", r"scale must be a finite positive number, got -0\.50*\b"),
    # num_splits (the raw op of a stage without splits takes none)
    BadInput("num_splits_zero", "`num_splits` 0", lambda a, st: _d(a, ns=0),
             r"num_splits must be an int in 1\.\.\d+ \(or None for the stage's rule\), got 0",
             r"num_splits must be in 1\.\.256, got 0"),
    BadInput("num_splits_many", "`num_splits` one past the stage's limit", lambda a, st: _d(a, ns=_most_splits(st) + 1),
             r"num_splits must be an int in 1\.\.(\d+) \(or None for the stage's rule\), got \d+",
             r"num_splits must be in 1\.\.256, got 257"),
    # contents: the kernels answer NaN for the stream
    BadInput("len_short", "a stream shorter than its draft (`kv_len < q_len`)",
             lambda a, st: _d(a, lens=_set(a["lens"], BAD_STREAM, 2)),
             r"stream 1 has kv_len 2 < q_len 3: the draft's own keys must already be in the cache", None),
    BadInput("len_negative", "a negative length", lambda a, st: _d(a, lens=_set(a["lens"], BAD_STREAM, -5)),
             r"stream 1 has kv_len -5 < q_len 3", None),
    BadInput("len_past_table", "a length beyond its block table (3 pages x 16 = 48 tokens)",
             lambda a, st: _d(a, lens=_set(a["lens"], BAD_STREAM, 49)),
             r"stream 1 has kv_len 49, beyond its block table's capacity 3 pages x 16 = 48 tokens", None),
    BadInput("page_past_pool", "a page id one past the pool, inside a stream's length",
             lambda a, st: _d(a, bt=_set(a["bt"], (BAD_STREAM, 1), 5)),
             r"block_table\[1, 1\] = 5 is not a page of the pool \(0 \.\. 4\)", None),
    BadInput("page_far", "a page id far outside the pool (2^30)",
             lambda a, st: _d(a, bt=_set(a["bt"], (BAD_STREAM, 1), POISON_PAGE_ID)),
             r"block_table\[1, 1\] = 1073741824 is not a page of the pool \(0 \.\. 4\)", None),
    BadInput("page_negative", "a negative page id", lambda a, st: _d(a, bt=_set(a["bt"], (BAD_STREAM, 0), -1)),
             r"block_table\[1, 0\] = -1 is not a page of the pool \(0 \.\. 4\)", None),
)

_BY_KEY = {c.key: c for c in BAD_INPUTS}


def get(key: str) -> BadInput:
    return _BY_KEY[key]


# ---- arguments -----------------------------------------------------------------------------

def base_args(device: str | torch.device = "cpu", seed: int = 0) -> dict:
    """Valid arguments for BASE on ``device``, outputs NaN-filled (fresh tensors each call)."""
    device = torch.device(device)
    w = make_workload(BASE, device=device, seed=seed, poison=True)
    out, lse = w.new_outputs(poison=True)
    other = "meta" if device.type == "cpu" else "cpu"
    return dict(q=w.q, kv=w.kv_cache, bt=w.block_table, lens=w.kv_lens, scale=w.scale, out=out, lse=lse, ns=None,
                device=device, other_device=other)


def bad_args(case: BadInput, st: Stage, device="cpu", seed: int = 0) -> dict:
    return case.change(base_args(device, seed), st)


def _splits(st: Stage, a: dict):
    return a["ns"] if (st.takes_num_splits or a["ns"] is not None) else None


def call_api(st: Stage, a: dict, check: bool = True):
    from ..core.ops import attention

    return attention(st, a["q"], a["kv"], a["bt"], a["lens"], a["scale"], out=a["out"], lse=a["lse"],
                     num_splits=_splits(st, a), check=check)


def call_op(st: Stage, a: dict):
    from ..core.ops import load_ops

    load_ops()
    op = getattr(torch.ops.mla_lab, st.id)
    if st.splits:
        ns = a["ns"] if a["ns"] is not None else 2
        return op(a["q"], a["kv"], a["bt"], a["lens"], a["scale"], ns, a["out"], a["lse"])
    return op(a["q"], a["kv"], a["bt"], a["lens"], a["scale"], a["out"], a["lse"])


# ---- outcomes --------------------------------------------------------------------------------

@dataclass
class Outcome:
    ok: bool
    got: str  # what happened, in one line

    def as_dict(self) -> dict:
        return dict(ok=self.ok, got=self.got)


def _first_line(e: BaseException) -> str:
    lines = [l for l in str(e).splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _find_line(e: BaseException, pattern: str) -> bool:
    return any(re.search(pattern, l) for l in str(e).splitlines())


def api_outcome(case: BadInput, st: Stage, device="cpu") -> Outcome:
    """attention() with its checks on: InputError whose message starts with the stage and matches the table."""
    a = bad_args(case, st, device)
    try:
        call_api(st, a)
    except InputError as e:
        ok = re.match(rf"{re.escape(st.id)}: {case.api}", str(e)) is not None
        return Outcome(ok, _first_line(e))
    except Exception as e:  # noqa: BLE001 - reported as what it is
        return Outcome(False, _first_line(e))
    return Outcome(False, "no error")


def op_outcome(case: BadInput, st: Stage, device="cpu") -> Outcome:
    """The raw op: an error naming the op and matching the table (torch's own error at the boundary)."""
    a = bad_args(case, st, device)
    try:
        call_op(st, a)
    except (RuntimeError, InputError, ValueError, TypeError) as e:
        ok = _find_line(e, rf"mla_lab::{re.escape(st.id)}: {case.op}")
        return Outcome(ok, _first_line(e))
    return Outcome(False, "no error")


def unchecked_outcome(case: BadInput, st: Stage, device="cpu", ref=None) -> Outcome:
    """attention(check=False): metadata still raises; a content case gives NaN in the bad stream only."""
    from ..core.verify import compare

    a = bad_args(case, st, device)
    if not case.content:
        try:
            call_api(st, a, check=False)
            if a["q"].is_cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any Python error is a clean refusal here
            if "CUDA error" in str(e):
                return Outcome(False, _first_line(e))
            return Outcome(True, _first_line(e))
        return Outcome(False, "no error: ran on bad metadata")
    if ref is None:
        from ..core.reference import reference_attention

        ok_args = base_args(device)
        ref = reference_attention(ok_args["q"], ok_args["kv"], ok_args["bt"], ok_args["lens"], ok_args["scale"])
    try:
        out, lse = call_api(st, a, check=False)
        if out.is_cuda:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return Outcome(False, "raised " + _first_line(e))
    bad = out[BAD_STREAM].float()
    rows_nan = torch.isnan(bad).any(-1) | torch.isnan(lse[BAD_STREAM])  # [q_len, heads]
    good = [b for b in range(out.shape[0]) if b != BAD_STREAM]
    chk = compare(out[good], lse[good], ref[0][good], ref[1][good])
    got = (f"stream {BAD_STREAM}: {int(rows_nan.sum())}/{rows_nan.numel()} (row, head) outputs NaN; "
           f"stream 0: rel_err {chk.rel_err:.1e}, nonfinite {chk.nonfinite}")
    return Outcome(bool(rows_nan.all()) and chk.ok, got)


# ---- the check=False half in a process of its own ------------------------------------------------

LINE_TAG = "MLA_LAB_BADINPUT "


def _worker(stage_id: str, device: str, start_after: str | None) -> int:
    if device == "cpu":
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    st = _stages.get(stage_id)
    keys = [c.key for c in BAD_INPUTS if c.applies_to(st)]
    if start_after:
        keys = keys[keys.index(start_after) + 1:]
    for key in keys:
        print(LINE_TAG + json.dumps({"key": key, "started": True}), flush=True)
        o = unchecked_outcome(get(key), st, device)
        print(LINE_TAG + json.dumps({"key": key, **o.as_dict()}), flush=True)
        if "CUDA error" in o.got:
            return 3  # the context is gone: the parent starts a new process for the rest
    return 0


def unchecked_isolated(st: Stage, device: str = "cpu", timeout_s: float = 600) -> dict[str, Outcome]:
    """Every applicable case through attention(check=False), in child processes.

    A case that kills its process (a segfault, a CUDA fault) is reported as
    such and the next process starts after it.
    """
    import subprocess

    from ..core.extension import ROOT

    results: dict[str, Outcome] = {}
    start_after = None
    while True:
        cmd = [sys.executable, "-m", "mla_lab.check.badinput", st.id, device] + ([start_after] if start_after else [])
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
            out, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout"
        started = None
        for line in out.splitlines():
            if not line.startswith(LINE_TAG):
                continue
            d = json.loads(line[len(LINE_TAG):])
            if d.get("started"):
                started = d["key"]
            else:
                results[d["key"]] = Outcome(d["ok"], d["got"])
                started = None
        if started is not None:  # the process died inside this case
            how = "hung" if rc == "timeout" else (f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0
                                                  else f"exited with {rc}")
            results[started] = Outcome(False, f"process {how} (a crash, not an error)")
            start_after = started
            continue
        if rc == 3 and results:  # a CUDA fault was reported: go on after it
            start_after = list(results)[-1]
            continue
        if rc not in (0, 3):
            tail = " | ".join((p.stderr if rc != "timeout" else "").splitlines()[-3:])
            results.setdefault("_process", Outcome(False, f"exited with {rc}: {tail}"))
        return results


# ---- docs/trust.md's table ----------------------------------------------------------------------------

def python_message(case: BadInput, st: Stage) -> str:
    """The message attention() gives for ``case`` (the Python checks, run on the CPU), without the stage prefix."""
    from ..core.ops import _check_splits
    from ..core.validate import check_contents, check_metadata

    a = bad_args(case, st, "cpu")
    device_type = "cuda" if case.key == "cpu_tensors" else None
    try:
        _check_splits(st, a["ns"])
        check_metadata(a["q"], a["kv"], a["bt"], a["lens"], a["scale"], a["out"], a["lse"],
                       device_type=device_type, align_bytes=st.align_bytes if st.is_cuda else 1, name=st.id)
        check_contents(a["q"], a["kv"], a["bt"], a["lens"], name=st.id)
    except InputError as e:
        return str(e)[len(st.id) + 2:]
    return "(accepted)"


def markdown_table(st: Stage | None = None) -> str:
    """docs/trust.md's table of bad inputs, with the messages the Python checks give now (on CPU tensors)."""
    if st is None:  # a 16-byte CUDA stage, so that every row applies
        st = next(s for s in reversed(_stages.STAGES) if s.is_cuda and s.align_bytes >= 16)
    lens = ", ".join(map(str, BASE.kv_lens))
    lines = [f"Each row changes one thing in valid arguments ({BASE.streams} streams of {lens} tokens, q_len "
             f"{BASE.q_len}, {BASE.heads} heads, pages of {BASE.page_size}, a block table of "
             f"{max(BASE.pages_per_stream) + 1} columns, a pool of {sum(BASE.pages_per_stream) + 2} pages).", "",
             "| bad input | `attention()` raises `InputError`: | with `check=False`, through the raw op, in a graph |",
             "|---|---|---|"]
    for c in BAD_INPUTS:
        msg = python_message(c, st).replace("|", "\\|")
        if c.content:
            other = "stream 1's `out` and `lse` are NaN, stream 0 is exact"
        elif c.key.startswith("num_splits"):
            other = "raises (the split stages' ops: `RuntimeError`, same check)"
        else:
            other = "raises (the ops: `RuntimeError`, same check in C++)"
        scope = {"cuda": " (CUDA stages)"}.get(c.applies, "")
        lines.append(f"| {c.what}{scope} | `{msg}` | {other} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
