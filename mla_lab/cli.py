"""The ``mla-lab`` command: ``bench``, ``verify``, ``build``, ``resources``, ``chapters``."""

from __future__ import annotations

import argparse
import sys


def _verify(argv) -> int:
    ap = argparse.ArgumentParser(prog="mla-lab verify",
                                 description="Check stages against the fp32 reference over the test grid.")
    ap.add_argument("--stages", nargs="+", default=None)
    ap.add_argument("--quick", action="store_true", help="skip the largest shapes")
    args = ap.parse_args(argv)
    import torch

    from . import stages
    from .verify import cpu_grid, gpu_grid, verify_attention

    if not torch.cuda.is_available():
        print("No CUDA GPU: verifying the Triton baseline only, on small shapes, in Triton's interpreter.")
        verify_attention("triton", cpu_grid(), device="cpu", verbose=True)
        return 0
    ids = args.stages or [s.id for s in stages.STAGES]
    failed = 0
    for sid in ids:
        checks = verify_attention(sid, gpu_grid(full=not args.quick), raise_on_failure=False)
        bad = [c for c in checks if not c.ok]
        worst = max(c.rel_err for c in checks)
        print(f"{sid:<13} {len(checks) - len(bad)}/{len(checks)} ok, worst rel_err {worst:.2e}", flush=True)
        for c in bad[:10]:
            print("   ", c)
        failed += len(bad)
    return 1 if failed else 0


def _resources(argv) -> int:
    ap = argparse.ArgumentParser(prog="mla-lab resources", description="ptxas resource report per kernel.")
    ap.add_argument("--arch", nargs="+", default=["9.0", "12.0"])
    args = ap.parse_args(argv)
    from .resources import ptxas_report

    print(f"{'arch':>5} {'kernel':<24} {'regs':>5} {'smem':>6} {'stack':>6} {'spills':>7}")
    for arch in args.arch:
        for r in ptxas_report(arch):
            print(f"{arch:>5} {r.kernel:<24} {r.registers:>5} {r.static_smem_bytes:>6} {r.stack_bytes:>6} "
                  f"{r.spill_store_bytes + r.spill_load_bytes:>7}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("bench", "verify", "build", "resources", "chapters")
    if not argv or argv[0] not in commands:
        print(f"usage: mla-lab {{{','.join(commands)}}} [options]   (mla-lab <command> --help for more)")
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        from .bench import main as bench

        return bench(rest)
    if cmd == "verify":
        return _verify(rest)
    if cmd == "build":
        from .extension import build_dir, load, target_archs

        mod = load(verbose="-v" in rest)
        print(f"built for sm {', '.join(target_archs())} in {build_dir()}; stages: {', '.join(mod.stage_ids())}")
        return 0
    if cmd == "resources":
        return _resources(rest)
    if cmd == "chapters":
        from .chapters import main as chapters

        return chapters(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
