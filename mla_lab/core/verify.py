"""Holding a kernel to the reference: ``verify_attention`` and the test grids.

Every check draws fresh random inputs, poisons what the kernel must not read
(NaN in the cache past each stream's length and in unused pages, huge ids in
unused block-table slots), fills the outputs with NaN before the run so an
element left unwritten shows, and compares with the fp32 reference by
relative L2 error.  NaN never passes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .problem import Problem, make_workload
from .reference import reference_attention
from .validate import InputError

# bf16 inputs and output against an fp32 reference land near 2e-3.
DEFAULT_TOL = 5e-3
LSE_TOL = 1e-2  # absolute, in natural-log units


@dataclass(frozen=True)
class Check:
    label: str
    rel_err: float  # ||out - ref|| / ||ref|| over all finite-or-not elements
    lse_err: float  # max |lse - ref_lse|
    nonfinite: int  # NaN or inf elements in out and lse
    tol: float

    @property
    def ok(self) -> bool:
        return self.nonfinite == 0 and self.rel_err <= self.tol and self.lse_err <= LSE_TOL

    def __str__(self) -> str:
        state = "ok  " if self.ok else "FAIL"
        return f"{state} {self.label:<40} rel_err {self.rel_err:.2e}  lse_err {self.lse_err:.1e}  nonfinite {self.nonfinite}"


def compare(out, lse, ref_out, ref_lse, *, label: str = "", tol: float = DEFAULT_TOL) -> Check:
    """Relative L2 error of ``out`` and max abs error of ``lse`` against the reference."""
    o = out.float()
    r = ref_out.to(o.device).float()
    nonfinite = int((~torch.isfinite(o)).sum()) + int((~torch.isfinite(lse)).sum())
    rel = float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r))
    lse_err = float((lse.float() - ref_lse.to(lse.device).float()).abs().max())
    if math.isnan(rel):
        rel = math.inf
    if math.isnan(lse_err):
        lse_err = math.inf
    return Check(label=label, rel_err=rel, lse_err=lse_err, nonfinite=nonfinite, tol=tol)


AttentionFn = Callable[..., object]


def _as_fn(fn: AttentionFn | str, **kw) -> AttentionFn:
    if isinstance(fn, str):
        from .ops import attention

        stage = fn
        return lambda q, kv, bt, lens, scale, out, lse: attention(stage, q, kv, bt, lens, scale, out=out, lse=lse, **kw)
    return fn


def verify_attention(fn: AttentionFn | str, problems: Iterable[Problem] | None = None, *,
                     device: str | torch.device | None = None, tol: float = DEFAULT_TOL, seed: int | None = None,
                     raise_on_failure: bool = True, verbose: bool = False, **stage_kw) -> list[Check]:
    """Check an attention implementation against the fp32 reference.

    ``fn`` is a stage id (``"float4"``) or any callable
    ``fn(q, kv_cache, block_table, kv_lens, scale, out, lse)`` that writes its
    answer into ``out`` and ``lse``.  ``device`` defaults to ``"cuda"`` on a
    machine with a GPU and ``"cpu"`` elsewhere; ``problems`` defaults to
    :func:`gpu_grid` on a GPU and :func:`cpu_grid` on the CPU.  On the CPU the
    ``"triton"`` stage runs in Triton's interpreter; the CUDA stages need a
    GPU.  Returns one :class:`Check` per problem; raises ``AssertionError``
    listing the failures unless told not to.
    """
    device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    what = f"stage {fn!r}" if isinstance(fn, str) else "a callable"
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"verify_attention: device={str(device)!r} but this machine has no CUDA GPU; pass "
                         f"device='cpu' to check {what} on the CPU grid")
    if isinstance(fn, str):
        from . import stages

        st = stages.get(fn)
        if st.is_cuda and device.type != "cuda":
            raise InputError(f"verify_attention: stage {fn!r} is a CUDA kernel and runs on a GPU only (got device="
                             f"{str(device)!r}); on the CPU, verify 'triton' (in Triton's interpreter) or a callable")
    call = _as_fn(fn, **stage_kw)
    if problems is None:
        problems = gpu_grid() if device.type == "cuda" else cpu_grid()
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    checks = []
    for i, p in enumerate(problems):
        s = int(torch.randint(0, 2**31 - 1, (1,), generator=gen)) if gen is not None else None
        w = make_workload(p, device=device, seed=s, poison=True)
        ref_out, ref_lse = reference_attention(*w.args())
        out, lse = w.new_outputs(poison=True)
        call(*w.args(), out, lse)
        c = compare(out, lse, ref_out, ref_lse, label=p.label(), tol=tol)
        checks.append(c)
        if verbose:
            print(c, flush=True)
    bad = [c for c in checks if not c.ok]
    if bad and raise_on_failure:
        raise AssertionError(f"{len(bad)} of {len(checks)} problems failed:\n" + "\n".join(map(str, bad)))
    return checks


def _prefix_for(streams: int, prefix: int) -> int | tuple[int, ...]:
    if streams == 1:
        return prefix
    # streams of different lengths: the given one, a short one, a middle one
    return (prefix, prefix // 3 + 7, prefix // 2 + 1)[:streams]


def gpu_grid(full: bool = True) -> list[Problem]:
    """The grid every CUDA stage must pass on a GPU.

    streams 1 and 3 (different lengths), q_len 1, 9, 16, heads 1, 8, 64,
    prefixes 0, 1, 255, 1000, 4097, 16384, pages of 1 (scattered), 16 and 64.
    """
    out = []
    layouts = ((1, True), (16, False), (64, True))
    for streams, q_len, heads, prefix, (ps, sc) in itertools.product(
            (1, 3), (1, 9, 16), (1, 8, 64), (0, 1, 255, 1000, 4097, 16384), layouts):
        if not full and (prefix == 16384 and heads == 64 and streams == 3):
            continue
        out.append(Problem(streams=streams, q_len=q_len, heads=heads, prefix=_prefix_for(streams, prefix),
                           page_size=ps, scattered=sc))
    return out


def cpu_grid() -> list[Problem]:
    """Small odd shapes for CPU runs (the reference, the models, the Triton interpreter)."""
    return [
        Problem(streams=1, q_len=1, heads=1, prefix=0, page_size=1),
        Problem(streams=3, q_len=9, heads=8, prefix=(37, 5, 70), page_size=1, scattered=True),
        Problem(streams=2, q_len=16, heads=3, prefix=(33, 100), page_size=16, scattered=False),
        Problem(streams=1, q_len=4, heads=20, prefix=130, page_size=64, scattered=True),
    ]
