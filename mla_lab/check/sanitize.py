"""compute-sanitizer over every stage: memcheck, racecheck, synccheck and initcheck on small, varied workloads.

Each (tool, stage) pair is one process::

    compute-sanitizer --tool memcheck python -m mla_lab.check.sanitize drive tensor_core

The driver (:func:`drive`) builds each workload on the CPU (values, poison,
the fp32 reference) and copies it to the GPU, so that nearly every kernel that
runs under the tool is the stage's own: its main kernel and whatever else it
launches (the combine kernel, a scheduler).  It disables PyTorch's caching
allocator (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) so that every tensor is an
allocation of its own size and memcheck sees a read one element past it.
It also checks the answers, so a run proves the stage was really exercised:
the valid streams must match the reference and the spoiled streams of the
last workload (a page id outside the pool inside a stream's length, a length
beyond its block table, a negative page id, a negative length) must be NaN.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch

from ..core import stages as _stages
from ..core.problem import POISON_PAGE_ID, Problem, make_workload
from ..core.stages import Stage

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
DRIVER_TAG = "MLA_LAB_SANITIZE "

# (label, problem, split counts to run: None is the stage's own rule).  Lengths of
# 1 and lengths that are no multiple of any tile; pages of 1, 16 and 64; q_len
# 1 to 16; heads 1 to 128.  Small, because a tool slows a kernel 10-100x.
WORKLOADS = (
    ("lengths 1..1000, pages of 1", Problem(streams=4, q_len=1, heads=1, prefix=(0, 36, 128, 999), page_size=1),
     (None,)),
    ("q_len 9, 8 heads, pages of 16", Problem(streams=3, q_len=9, heads=8, prefix=(0, 91, 512), page_size=16,
                                               scattered=False), (None, 3)),
    ("q_len 16, 4 heads, pages of 64", Problem(streams=2, q_len=16, heads=4, prefix=(1, 283), page_size=64),
     (None, 64)),
    ("128 heads, q_len 2, pages of 64", Problem(streams=1, q_len=2, heads=128, prefix=75, page_size=64), (None,)),
    # with 4 blocks each has 12 tiles: stages 11 to 13 copy them by TMA (tensor_copy_kernel, seesaw_tma_kernel, ...)
    ("q_len 9, 8 heads, pages of 16, 4 blocks", Problem(streams=2, q_len=9, heads=8, prefix=(700, 1500), page_size=16),
     (4,)),
    # The seesaw of stages 12 and 13 (64 pairs on wgmma's M) runs where the table gives each block 15 tiles or more
    # (56 with pages of 16 or 32): with two blocks, these short streams reach its two kernels, the one for whole tiles
    # (pages of 64: seesaw_kernel, hopper_seesaw_kernel) and the one for any pages (pages of 16), and the long stream
    # is cut between the blocks.
    ("q_len 8, 8 heads, pages of 64, 2 blocks", Problem(streams=2, q_len=8, heads=8, prefix=(1100, 517), page_size=64),
     (2,)),
    ("q_len 4, 16 heads, pages of 16, 2 blocks", Problem(streams=2, q_len=4, heads=16, prefix=(3600, 37),
                                                          page_size=16), (2,)),
)
# The spoiled workloads: stream 0 valid; 1: a page id past the pool inside its length;
# 2: a length beyond its block table; 3: a negative page id; 4: a negative length.
SPOILED = Problem(streams=5, q_len=4, heads=8, prefix=(100, 60, 80, 40, 20), page_size=16)
# ... and the same spoils in the seesaw of stages 12 and 13 (seesaw_kernel, hopper_seesaw_kernel, with two blocks).
SPOILED_SEESAW = Problem(streams=5, q_len=8, heads=8, prefix=(1100, 900, 1000, 800, 700), page_size=64)
SPOILED_WORKLOADS = (("spoiled streams (NaN expected for streams 1-4)", SPOILED, (None, 5)),
                     ("spoiled streams, q_len 8, 8 heads, pages of 64, 2 blocks", SPOILED_SEESAW, (2,)))


def spoil(bt: torch.Tensor, lens: torch.Tensor, num_pages: int,
          page_size: int = SPOILED.page_size) -> tuple[torch.Tensor, torch.Tensor]:
    bt, lens = bt.clone(), lens.clone()
    bt[1, 1] = num_pages  # one past the pool, inside stream 1's length (two pages or more)
    lens[2] = bt.shape[1] * page_size + 5
    bt[3, 0] = -1
    lens[4] = -7
    bt[0, -1] = POISON_PAGE_ID  # an unused slot of a valid stream: must not be read
    return bt, lens


# ---- the driver (runs under the tool) ------------------------------------------------------

def _call(st: Stage, q, kv, bt, lens, scale, out, lse, ns):
    from ..core.ops import attention

    attention(st, q, kv, bt, lens, scale, out=out, lse=lse, num_splits=ns, check=False)


def drive(stage_id: str, device: str = "cuda", spoiled_only: bool = False) -> dict:
    """Every workload on the stage; returns what was checked (printed as one JSON line).

    ``device="cpu"`` runs the Triton baseline in its interpreter (the driver's own
    test, with ``spoiled_only``: the last workload, at the stage's own split count).
    """
    from ..core.reference import reference_attention
    from ..core.verify import compare

    st = _stages.get(stage_id)
    report = {"stage": stage_id, "workloads": [], "ok": True}
    items = [] if spoiled_only else [(label, p, splits, False) for label, p, splits in WORKLOADS]
    if spoiled_only:  # the first spoiled workload, at the stage's own split count
        items.append((SPOILED_WORKLOADS[0][0], SPOILED_WORKLOADS[0][1], (None,), True))
    else:
        items += [(label, p, splits, True) for label, p, splits in SPOILED_WORKLOADS]
    for label, p, splits, spoiled in items:
        w = make_workload(p, device="cpu", seed=11, poison=True)
        ref_out, ref_lse = reference_attention(*w.args())
        bt, lens = (spoil(w.block_table, w.kv_lens, w.kv_cache.shape[0], p.page_size) if spoiled
                    else (w.block_table, w.kv_lens))
        args = [t.to(device) for t in (w.q, w.kv_cache, bt, lens)]
        for ns in splits:
            if ns is not None and not st.takes_num_splits:
                continue
            out_cpu, lse_cpu = w.new_outputs(poison=True)
            out, lse = out_cpu.to(device), lse_cpu.to(device)  # poisoned by copy, not by a fill kernel
            _call(st, *args, w.scale, out, lse, ns)
            if out.is_cuda:
                torch.cuda.synchronize()
            out, lse = out.cpu(), lse.cpu()
            if spoiled:
                chk = compare(out[:1], lse[:1], ref_out[:1], ref_lse[:1])
                nan_rows = (torch.isnan(out[1:].float()).any(-1) | torch.isnan(lse[1:])).all(-1).all(-1)
                ok = chk.ok and bool(nan_rows.all())
                detail = f"stream 0 rel_err {chk.rel_err:.1e}; streams 1-4 all NaN: {nan_rows.tolist()}"
            else:
                chk = compare(out, lse, ref_out, ref_lse, tol=3e-3 if st.kind == "triton" else 5e-3)
                ok, detail = chk.ok, f"rel_err {chk.rel_err:.1e}"
            report["workloads"].append({"label": label, "num_splits": ns, "ok": ok, "detail": detail})
            report["ok"] &= ok
    return report


def kernels_reached(st: Stage, sms: int) -> list[str]:
    """The kernels of CUDA stage ``st`` that the driver's workloads launch on a GPU of ``sms`` SMs (each tool sees
    only what runs), by the registry's account of every launch (:func:`stages.kernels_of_call`)."""
    calls = [(p, ns) for _, p, splits in WORKLOADS + SPOILED_WORKLOADS for ns in splits
             if ns is None or st.takes_num_splits]  # as drive() skips them
    return _stages.kernels_reached(st, calls, sms)


# ---- the parent: one process per (tool, stage) ---------------------------------------------

def find_sanitizer() -> str | None:
    """compute-sanitizer on the PATH or in the CUDA toolkit, or None."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    try:
        from ..core.extension import find_cuda_home

        home = find_cuda_home()
    except Exception:  # noqa: BLE001 - no toolkit: no sanitizer
        return None
    for p in (home / "bin" / "compute-sanitizer", home / "compute-sanitizer" / "compute-sanitizer"):
        if p.exists():
            return str(p)
    return None


@dataclass
class Run:
    stage: str
    tool: str
    status: str  # "clean", "findings", "wrong answer", "failed", "skipped"
    findings: int | None = None  # the tool's error count
    warnings: int | None = None  # racecheck's warnings
    seconds: float = 0.0
    reason: str = ""
    first_findings: list = field(default_factory=list)
    driver: dict | None = None

    def as_dict(self) -> dict:
        return dict(stage=self.stage, tool=self.tool, status=self.status, findings=self.findings,
                    warnings=self.warnings, seconds=round(self.seconds, 1), reason=self.reason,
                    first_findings=self.first_findings[:6],
                    workloads=(self.driver or {}).get("workloads"))


def parse(stage: str, tool: str, output: str, returncode, seconds: float) -> Run:
    errors = re.findall(r"ERROR SUMMARY: (\d+) error", output)
    race = re.search(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)", output)
    driver = None
    for line in output.splitlines():
        if line.startswith(DRIVER_TAG):
            driver = json.loads(line[len(DRIVER_TAG):])
    # memcheck, synccheck and initcheck end with an ERROR SUMMARY; racecheck with a RACECHECK SUMMARY of its own
    findings = int(errors[-1]) if errors else int(race.group(1)) if race else None
    warnings = int(race.group(2)) if race else None
    first = [l.strip() for l in output.splitlines()
             if l.startswith("=========") and re.search(r"(Invalid|Race|hazard|Uninitialized|Barrier|error)", l)
             and "SUMMARY" not in l][:6]
    if findings is None or driver is None:
        tail = " | ".join(l.strip() for l in output.splitlines()[-4:])
        why = "no sanitizer summary" if findings is None else "the driver did not finish"
        return Run(stage, tool, "failed", findings, warnings, seconds, f"{why} (exit {returncode}): {tail[:400]}",
                   first, driver)
    if findings:
        return Run(stage, tool, "findings", findings, warnings, seconds, "", first, driver)
    if not driver["ok"]:
        return Run(stage, tool, "wrong answer", findings, warnings, seconds,
                   "; ".join(f"{w['label']} (splits {w['num_splits']}): {w['detail']}"
                             for w in driver["workloads"] if not w["ok"]), first, driver)
    return Run(stage, tool, "clean", findings, warnings, seconds, "", first, driver)


def run_one(exe: str, st: Stage, tool: str, *, timeout_s: float = 900) -> Run:
    """One (stage, tool) process; its log goes to build/check-logs/<stage>-<tool>.log."""
    from ..core.extension import ROOT

    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    logs = ROOT / "build" / "check-logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [exe, "--tool", tool, "--print-limit", "20"] + (["--racecheck-report", "all"] if tool == "racecheck" else [])
    cmd += [sys.executable, "-m", "mla_lab.check.sanitize", "drive", st.id]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout_s)
        text, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = f"timeout after {timeout_s:.0f} s"
    (logs / f"{st.id}-{tool}.log").write_text(text)
    return parse(st.id, tool, text, rc, time.perf_counter() - t0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "drive":
        report = drive(argv[1])
        print(DRIVER_TAG + json.dumps(report), flush=True)
        return 0
    print("usage: python -m mla_lab.check.sanitize drive STAGE   (run under compute-sanitizer; mla-lab check runs it)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
