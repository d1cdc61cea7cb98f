"""Extreme values: inputs chosen so that the answer is known exactly, or the arithmetic is pushed to its range.

* ``huge_positive``: every query element is 2^118 and one key per stream (the
  "planted" key, visible to every row) has all elements in [0.4, 0.6], the others
  in [-0.25, 0.25].  Unscaled scores reach 1.15e38, a third of the largest bf16
  (and fp32) number; the planted key's score beats every other by more than 1e35,
  so softmax is one-hot: ``out`` must equal the planted key's value exactly, and
  ``lse`` (the planted score) must match the reference to 1e-5 relative.  A
  kernel whose running maximum or sum overflows, or that adds scores before
  subtracting the maximum, gives inf or NaN.
* ``huge_negative``: the same with every score hugely negative (q = -2^118; the
  planted key in [0.05, 0.1], the others in [0.2, 0.6]): a kernel that starts its
  running maximum at 0 instead of -inf underflows every exp to 0 and divides 0 by 0.
* ``identical_keys``: every key of a stream is one vector, so every row's
  softmax is uniform and ``out`` must be that vector's value exactly (a weighted
  mean of equal values), whatever the lengths, splits and tiles; ``lse`` within
  the usual 1e-2.
* ``draft_only``: streams whose cache holds only the draft (prefix 0: row t sees
  t + 1 keys), beside longer ones; held to the usual tolerances.

On a GPU each stage's kernels run through ``attention()``; on the CPU the
stages' CPU models (and the Triton baseline in its interpreter) run instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.problem import D_V, Problem, Workload, make_workload
from ..core.stages import Stage
from ..core.verify import DEFAULT_TOL, LSE_TOL, compare

KINDS = ("huge_positive", "huge_negative", "identical_keys", "draft_only")
HUGE_Q = 2.0 ** 118  # exact in bf16; 576 products of it with keys <= 0.6 stay below 3.4e38
HUGE_LSE_REL_TOL = 1e-5
TOLERANCE = {"triton": 3e-3}  # out's relative L2 error for draft_only (the CUDA stages: DEFAULT_TOL)

# On a GPU; the CPU models take the same with shorter streams (they are Python loops).
HUGE_PROBLEM = Problem(streams=2, q_len=5, heads=4, prefix=(40, 700), page_size=16)
IDENTICAL_PROBLEM = Problem(streams=3, q_len=4, heads=3, prefix=(0, 37, 600), page_size=1)
DRAFT_ONLY_PROBLEMS = (
    Problem(streams=3, q_len=16, heads=8, prefix=(0, 300, 0), page_size=16),
    Problem(streams=1, q_len=1, heads=1, prefix=0, page_size=1),
    Problem(streams=2, q_len=9, heads=64, prefix=0, page_size=64, scattered=False),
)
# The Hopper stages have main kernels besides the gather the shapes above reach (wgmma_kernel, hopper_kernel, ...):
# from stage 11 the tensor copy's, and in stages 12 and 13 the seesaw's two (64 pairs on wgmma's M, with a softmax and
# an exchange of maxima of their own).  A stage takes them only where the table gives each block enough tiles (12; 15
# for the seesaw, 56 with pages of 16), so with FEW_BLOCKS blocks: HUGE_PROBLEM reaches the tensor copy's kernel
# (tensor_copy_kernel, seesaw_tma_kernel, hopper_tma_kernel), the two below the seesaw's kernels, the one for whole
# tiles (pages of 64: seesaw_kernel, hopper_seesaw_kernel) and the one for any pages (pages of 16), each long stream
# cut between the blocks and merged.  The other split stages run these with as many splits.
FEW_BLOCKS = 2
HUGE_SEESAW_PROBLEM = Problem(streams=2, q_len=8, heads=8, prefix=(40, 1100), page_size=64)
IDENTICAL_SEESAW_PROBLEM = Problem(streams=2, q_len=4, heads=16, prefix=(3600, 37), page_size=16)
CPU_SIZE = {HUGE_PROBLEM: dict(prefix=(40, 150)), IDENTICAL_PROBLEM: dict(prefix=(0, 37, 150)),
            DRAFT_ONLY_PROBLEMS[0]: dict(prefix=(0, 60, 0)), DRAFT_ONLY_PROBLEMS[2]: dict(heads=16),
            HUGE_SEESAW_PROBLEM: dict(prefix=(40, 150)), IDENTICAL_SEESAW_PROBLEM: dict(prefix=(150, 37))}


def _sized(p: Problem, device) -> Problem:
    return p.with_(**CPU_SIZE[p]) if torch.device(device).type == "cpu" and p in CPU_SIZE else p


@dataclass
class ExtremeCase:
    kind: str
    workload: Workload
    expected_out: torch.Tensor | None  # exact bf16 answer, where one is known
    num_splits: int | None = None  # for the split stages; None: the stage's own count


def _positions(w: Workload, b: int, length: int):
    P = w.kv_cache.shape[1]
    pos = torch.arange(length, device=w.device)
    return w.block_table[b].long()[pos // P], pos % P


def _uniform(shape, lo, hi, gen, device):
    return (lo + (hi - lo) * torch.rand(shape, generator=gen)).to(torch.bfloat16).to(device)


def _planted(kind: str, device, seed: int, problem: Problem = HUGE_PROBLEM,
             num_splits: int | None = None) -> ExtremeCase:
    w = make_workload(_sized(problem, device), device=device, seed=seed, poison=True)
    gen = torch.Generator().manual_seed(seed)
    sign, (lo, hi), (plo, phi) = {"huge_positive": (1.0, (-0.25, 0.25), (0.4, 0.6)),
                                  "huge_negative": (-1.0, (0.2, 0.6), (0.05, 0.1))}[kind]
    w.q.fill_(sign * HUGE_Q)
    B, T, H, _ = w.q.shape
    expected = torch.empty(B, T, H, D_V, dtype=torch.bfloat16, device=device)
    for b in range(B):
        L = int(w.kv_lens[b])
        keys = _uniform((L, w.kv_cache.shape[2]), lo, hi, gen, device)
        planted = (L - T) // 2  # before the draft: every row sees it
        keys[planted] = _uniform((w.kv_cache.shape[2],), plo, phi, gen, device)
        pages, slots = _positions(w, b, L)
        w.kv_cache[pages, slots] = keys
        expected[b] = keys[planted, :D_V]
    return ExtremeCase(kind, w, expected, num_splits)


def _identical(device, seed: int, problem: Problem = IDENTICAL_PROBLEM,
               num_splits: int | None = None) -> ExtremeCase:
    w = make_workload(_sized(problem, device), device=device, seed=seed, poison=True)
    gen = torch.Generator().manual_seed(seed)
    B, T, H, _ = w.q.shape
    expected = torch.empty(B, T, H, D_V, dtype=torch.bfloat16, device=device)
    for b in range(B):
        L = int(w.kv_lens[b])
        key = torch.randn(w.kv_cache.shape[2], generator=gen).to(torch.bfloat16).to(device)
        pages, slots = _positions(w, b, L)
        w.kv_cache[pages, slots] = key
        expected[b] = key[:D_V]
    return ExtremeCase("identical_keys", w, expected, num_splits)


def cases(device="cpu", seed: int = 7) -> list[ExtremeCase]:
    out = [_planted("huge_positive", device, seed), _planted("huge_negative", device, seed + 1),
           _identical(device, seed + 2)]
    for i, problem in enumerate((HUGE_PROBLEM, HUGE_SEESAW_PROBLEM)):
        out += [_planted("huge_positive", device, seed + 10 + 2 * i, problem, FEW_BLOCKS),
                _planted("huge_negative", device, seed + 11 + 2 * i, problem, FEW_BLOCKS)]
    out += [_identical(device, seed + 14, IDENTICAL_SEESAW_PROBLEM, FEW_BLOCKS)]
    out += [ExtremeCase("draft_only", make_workload(_sized(p, device), device=device, seed=seed + 3 + i, poison=True), None)
            for i, p in enumerate(DRAFT_ONLY_PROBLEMS)]
    return out


@dataclass
class Verdict:
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return dict(ok=self.ok, detail=self.detail)


def judge(case: ExtremeCase, stage_id: str, out, lse, ref_out, ref_lse) -> Verdict:
    out_bf16 = out.to(torch.bfloat16)  # the CPU models answer in fp32; a kernel writes bf16
    finite = bool(torch.isfinite(out.float()).all() and torch.isfinite(lse).all())
    if case.kind == "draft_only":
        c = compare(out, lse, ref_out, ref_lse, tol=TOLERANCE.get(stage_id, DEFAULT_TOL))
        return Verdict(c.ok, f"rel_err {c.rel_err:.1e}, lse_err {c.lse_err:.1e}, nonfinite {c.nonfinite}")
    wrong = int((out_bf16 != case.expected_out.to(out.device)).sum())
    if case.kind == "identical_keys":
        lse_err = float((lse.float() - ref_lse.to(lse.device).float()).abs().max())
        return Verdict(finite and wrong == 0 and lse_err <= LSE_TOL,
                       f"{wrong} of {out.numel()} out elements differ from the keys' value; lse_err {lse_err:.1e}")
    rel = float(((lse.double() - ref_lse.to(lse.device).double()).abs() / ref_lse.to(lse.device).double().abs()).max())
    ok = finite and wrong == 0 and rel <= HUGE_LSE_REL_TOL
    return Verdict(ok, f"{wrong} of {out.numel()} out elements differ from the planted key's value; "
                       f"lse relative error {rel:.1e} (lse ~ {float(ref_lse.flatten()[0]):.2e})")


def kernels_reached(st: Stage, sms: int) -> list[str]:
    """The kernels of CUDA stage ``st`` that these cases launch on a GPU of ``sms`` SMs (the GPU's sizes)."""
    from ..core.stages import kernels_reached as reached

    calls = [(HUGE_PROBLEM, None), (IDENTICAL_PROBLEM, None), *((p, None) for p in DRAFT_ONLY_PROBLEMS),
             *((p, FEW_BLOCKS) for p in (HUGE_PROBLEM, HUGE_SEESAW_PROBLEM, IDENTICAL_SEESAW_PROBLEM))]
    return reached(st, [(p, ns if st.takes_num_splits else None) for p, ns in calls], sms)


def run(stages: list[Stage], device="cpu", models: bool = False) -> dict:
    """{stage id: {kind: Verdict}}; several problems of one kind must all pass."""
    from ..core.ops import attention
    from ..core.reference import reference_attention

    results: dict = {st.id: {} for st in stages}
    for case in cases(device):
        w = case.workload
        ref_out, ref_lse = reference_attention(*w.args())
        if case.expected_out is not None:  # the reference itself must give the known answer
            assert torch.equal(ref_out.to(torch.bfloat16), case.expected_out), f"reference fails {case.kind}"
        for st in stages:
            try:
                splits = case.num_splits if st.takes_num_splits else None
                if models and st.is_cuda:
                    from ..models import run_model

                    out, lse, _ = run_model(st.id, w, (splits or 3) if st.splits else None)
                else:
                    out, lse = w.new_outputs(poison=True)
                    attention(st, *w.args(), out=out, lse=lse, num_splits=splits)
                v = judge(case, st.id, out, lse, ref_out, ref_lse)
            except Exception as e:  # noqa: BLE001 - reported
                v = Verdict(False, f"raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            prev = results[st.id].get(case.kind)
            if prev is None or (prev.ok and not v.ok):
                results[st.id][case.kind] = v
    return results
