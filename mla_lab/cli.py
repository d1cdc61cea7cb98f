"""The ``mla-lab`` command.

    mla-lab --help               the commands, one line each
    mla-lab <command> --help     what a command does, its options, examples

Every command is one entry of :data:`COMMANDS`: a name, a one-line summary,
a description, examples, a function that adds its options and one that runs it.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .core import argtypes as T

Raw = argparse.RawDescriptionHelpFormatter


@dataclass(frozen=True)
class Command:
    name: str
    summary: str  # one line, in `mla-lab --help`
    description: str | Callable[[], str]  # what it does, in `mla-lab <name> --help`
    examples: str | Callable[[], str]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list], int]  # (parsed options, the arguments after the command name)
    # what the options cannot say one at a time (a combination, a name only a later layer knows): why the
    # parsed options are refused, or None; main() prints it as argparse prints a bad value
    validate: Callable[[argparse.Namespace], str | None] | None = None


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- build ---------------------------------------------------------------------------

def _build_args(ap):
    ap.add_argument("-v", "--verbose", action="store_true", help="show the compiler's commands and output")


def _build(args, argv) -> int:
    from .core.extension import build_dir, load, target_archs

    mod = load(verbose=args.verbose)
    print(f"built for sm {', '.join(target_archs())} in {build_dir()}; stages: {', '.join(mod.stage_ids())}")
    return 0


# ---- bench -----------------------------------------------------------------------------

def _bench_args(ap):
    from .measure.bench import add_arguments

    add_arguments(ap)


def _bench(args, argv) -> int:
    from .measure.bench import main

    return main(argv)


# ---- verify ------------------------------------------------------------------------------

def _stage_ids():
    from .core.stages import STAGES

    return [s.id for s in STAGES]


def _verify_args(ap):
    ap.add_argument("--stages", nargs="+", default=None, choices=_stage_ids(), metavar="STAGE",
                    help=f"stages to check (default: all: {' '.join(_stage_ids())})")
    ap.add_argument("--quick", action="store_true", help="leave out the largest shapes of the GPU grid")


def _verify(args, argv) -> int:
    from .core import stages
    from .core.verify import cpu_grid, gpu_grid, verify_attention

    ids = args.stages or [s.id for s in stages.STAGES]
    if not _has_gpu():
        cuda = [s for s in ids if stages.get(s).is_cuda]
        print("No CUDA GPU here: the CUDA stages cannot run." + (f" Skipped: {' '.join(cuda)}." if cuda else ""))
        if args.quick:
            print("Ignored here: --quick (it trims the GPU grid; the CPU grid is small already).")
        if "triton" not in ids:
            print("Nothing to verify without a GPU: only the Triton baseline runs here (--stages triton).")
            return 1 if cuda else 0
        print("Verifying the Triton baseline on the CPU grid, in Triton's interpreter:")
        checks = verify_attention("triton", cpu_grid(), device="cpu", verbose=True, raise_on_failure=False)
        return 0 if all(c.ok for c in checks) else 1
    import torch

    major, minor = torch.cuda.get_device_capability()
    failed = 0
    for sid in ids:
        st = stages.get(sid)
        if not st.runs_on(major, minor):
            cc = (lambda v: f"{v // 10}.{v % 10}")
            runs = (f"{cc(st.min_cc)} only" if st.min_cc == st.max_cc else f"{cc(st.min_cc)} and newer"
                    if not st.max_cc else f"up to {cc(st.max_cc)}" if not st.min_cc
                    else f"{cc(st.min_cc)} to {cc(st.max_cc)}")
            print(f"{sid:<13} skipped: this GPU is sm_{major}{minor}; the stage runs on compute capability {runs}",
                  flush=True)
            continue
        checks = verify_attention(sid, gpu_grid(full=not args.quick), raise_on_failure=False)
        bad = [c for c in checks if not c.ok]
        worst = max(c.rel_err for c in checks)
        print(f"{sid:<13} {len(checks) - len(bad)}/{len(checks)} ok, worst rel_err {worst:.2e}", flush=True)
        for c in bad[:10]:
            print("   ", c)
        failed += len(bad)
    return 1 if failed else 0


# ---- resources -------------------------------------------------------------------------------

def _resources_args(ap):
    ap.add_argument("--arch", nargs="+", default=["9.0", "12.0"], metavar="CC", type=T.arch,
                    help="compute capabilities to compile for, as 9.0 (default: 9.0 12.0)")


def _resources_validate(args) -> str | None:
    from .core.extension import ToolkitNotFound
    from .measure.resources import nvcc_archs

    try:
        known = nvcc_archs()
    except ToolkitNotFound as e:
        return str(e)
    unknown = [a for a in args.arch if a not in known]
    if unknown:
        return (f"argument --arch: this toolkit's nvcc does not compile for {', '.join(unknown)}; it takes "
                f"{' '.join(sorted(known, key=lambda a: tuple(map(int, a.split('.')))))}")
    return None


def _resources(args, argv) -> int:
    from .measure.resources import ptxas_report

    print(f"{'arch':>5} {'kernel':<24} {'regs':>5} {'smem':>6} {'stack':>6} {'spills':>7}")
    for arch in args.arch:
        for r in ptxas_report(arch):
            print(f"{arch:>5} {r.kernel:<24} {r.registers:>5} {r.static_smem_bytes:>6} {r.stack_bytes:>6} "
                  f"{r.spill_store_bytes + r.spill_load_bytes:>7}")
    return 0


# ---- experiments ---------------------------------------------------------------------------

def _experiments_args(ap):
    ap.add_argument("--stage", default=None, choices=("wgmma", "tensor_copy", "seesaw", "hopper"), metavar="STAGE",
                    help="only the experiments on this Hopper stage")


def _experiments(args, argv) -> int:
    from .book import experiments

    print(f"{'experiment':<30} {'stage':<12} {'file':<42} what it swaps")
    for e in experiments.EXPERIMENTS.values():
        if args.stage in (None, e.stage):
            print(f"{e.name:<30} {e.stage:<12} {'csrc/experiments/' + e.file + '.cu':<42} {e.what}")
    return 0


# ---- chapters ------------------------------------------------------------------------------

def _chapters_args(ap):
    sub = ap.add_subparsers(dest="action", metavar="ACTION", title="actions")
    ex = sub.add_parser(
        "execute", formatter_class=Raw, help="run chapters top to bottom and store their outputs",
        description=textwrap.fill(
            "Run the chapters (all, or the ones named) top to bottom in a Jupyter kernel and write their outputs "
            "back into the notebooks, the way the stored outputs were made. Each chapter that runs to the end "
            "is stamped (in its notebook metadata) with the GPU and the digests of the sources it measures, "
            "which the tests check. Without a GPU this would replace measured outputs by recorded ones, so it "
            "refuses unless --force.", 100),
        epilog="examples:\n  mla-lab chapters execute\n  mla-lab chapters execute chapters/03_kv_split.ipynb\n"
               "  mla-lab chapters execute --force chapters/00_problem_and_baseline.ipynb   # CPU: does it run?")
    ex.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", type=T.existing_file,
                    help="chapters/NN_name.ipynb (default: every chapter, then the appendix)")
    ex.add_argument("--force", action="store_true",
                    help="execute even without a GPU (to see that the chapters run; the outputs are not for keeping)")
    ex.add_argument("--timeout", type=T.positive_int, default=1200, metavar="S",
                    help="seconds a cell may take (default 1200)")
    ap.set_defaults(chapters_parser=ap)


def _chapters(args, argv) -> int:
    if args.action is None:
        args.chapters_parser.print_help(sys.stderr)
        return 2
    if args.action == "execute":
        return _chapters_execute(args)
    return 2


def _chapters_execute(args) -> int:
    from .measure import provenance

    gpu = None
    if _has_gpu():
        import torch

        gpu = torch.cuda.get_device_name(0)
    elif not args.force:
        print("mla-lab chapters execute: no CUDA GPU here. Executing would replace the chapters' stored GPU "
              "outputs with CPU ones (recorded numbers instead of measurements). Run it on a GPU, or pass "
              "--force to execute anyway (to check that the chapters run; do not keep those outputs).",
              file=sys.stderr)
        return 1
    from .book.chapters import execute

    paths = [Path(p) for p in args.notebooks] or [*provenance.all_chapters(),
                                                  *sorted(provenance.CHAPTERS.glob("appendix_*.ipynb"))]
    failed = []
    for path in paths:
        if execute([str(path)], timeout=args.timeout) == 0:
            if path.name[:2].isdigit():  # an appendix measures no stage of its own: nothing to stamp
                provenance.stamp(path, gpu)
        else:
            failed.append(path.name)
    if gpu is None:
        print("executed without a GPU: these outputs are stamped as such and the tests will say so")
    if failed:
        print(f"{len(failed)} of {len(paths)} chapters failed: {', '.join(failed)}")
    return 1 if failed else 0


# ---- exploration on a GPU ------------------------------------------------------------------

def _shape_args(ap, *, heads=(8,), prefix=(1024, 16384, 65536)):
    ap.add_argument("--streams", nargs="+", type=T.positive_int, default=[1], metavar="B", help="streams (default 1)")
    ap.add_argument("--q-len", nargs="+", type=T.positive_int, default=[9], metavar="T",
                    help="query rows per stream (default 9)")
    ap.add_argument("--heads", nargs="+", type=T.positive_int, default=list(heads), metavar="H",
                    help=f"query heads (default {' '.join(map(str, heads))})")
    ap.add_argument("--prefix", nargs="+", type=T.nonnegative_int, default=list(prefix), metavar="TOKENS",
                    help=f"cached tokens before the draft (default {' '.join(map(str, prefix))})")
    ap.add_argument("--page-size", type=T.positive_int, default=1, metavar="TOKENS", help="tokens per page (default 1)")
    ap.add_argument("--contiguous", action="store_true", help="page ids 0, 1, 2, ... instead of scattered")


def _problems(args):
    from .core.problem import Problem

    return [Problem(streams=b, q_len=t, heads=h, prefix=p, page_size=args.page_size, scattered=not args.contiguous)
            for b in args.streams for t in args.q_len for h in args.heads for p in args.prefix]


def _sweep_args(ap):
    from .book.explore import DEFAULT_SPLITS

    ap.add_argument("--stages", nargs="+", default=["tensor_core"], choices=_stage_ids(), metavar="STAGE",
                    help="split stages (or triton) to sweep (default tensor_core)")
    ap.add_argument("--splits", nargs="+", type=T.positive_int, default=list(DEFAULT_SPLITS), metavar="N",
                    help=f"split counts to time, besides the stage's own (default {' '.join(map(str, DEFAULT_SPLITS))})")
    _shape_args(ap)
    ap.add_argument("--rep-ms", type=T.positive_float, default=40.0, metavar="MS",
                    help="repetition time per timing (default 40)")


def _sweep(args, argv) -> int:
    from .book.explore import sweep

    sweep(args.stages, _problems(args), args.splits, rep_ms=args.rep_ms)
    return 0


def _kernel_times_args(ap):
    ap.add_argument("--stages", nargs="+", default=["tensor_core"], choices=_stage_ids(), metavar="STAGE",
                    help="stages to profile (default tensor_core)")
    _shape_args(ap, heads=(8, 64), prefix=(16384,))
    ap.add_argument("--calls", type=T.positive_int, default=20, metavar="N", help="calls to average over (default 20)")


def _kernel_times(args, argv) -> int:
    from .book.explore import kernel_times

    kernel_times(args.stages, _problems(args), calls=args.calls)
    return 0


def _profile_target_args(ap):
    from .book.explore import PROFILE_PEERS

    ap.add_argument("stage", choices=_stage_ids(), metavar="STAGE", help="the stage to run")
    for name, what, kind in (("streams", "streams", T.positive_int), ("q_len", "query rows per stream", T.positive_int),
                             ("heads", "query heads", T.positive_int),
                             ("prefix", "cached tokens before the draft", T.nonnegative_int)):
        ap.add_argument(name, type=kind, metavar=name.upper(), help=what)
    ap.add_argument("--splits", type=T.positive_int, default=None, metavar="N",
                    help="split count (default: the stage's rule; split stages and triton only)")
    ap.add_argument("--page-size", type=T.positive_int, default=1, metavar="TOKENS", help="tokens per page (default 1)")
    ap.add_argument("--contiguous", action="store_true", help="page ids 0, 1, 2, ... instead of scattered")
    ap.add_argument("--calls", type=T.positive_int, default=3, metavar="N", help="calls to make (default 3)")
    ap.add_argument("--build", default=None, metavar="NAME",
                    help="a Hopper stage only: one of its experiments (the stage with one piece swapped, "
                         "`mla-lab experiments` lists them), e.g. no_math with wgmma, instead of the stage")
    ap.add_argument("--peer", default=None, choices=PROFILE_PEERS,
                    help="call that library on the same workload instead (FlashMLA: pages of 64), to profile beside")


def _profile_target_validate(args) -> str | None:
    from .core import stages

    st = stages.get(args.stage)
    if args.splits is not None:
        if not st.takes_num_splits:
            return f"argument --splits: stage {st.id} takes no split count (it does not split the keys)"
        from .measure.bench import TRITON_MAX_SPLITS

        most = TRITON_MAX_SPLITS if st.kind == "triton" else stages.MAX_SPLITS
        if args.splits > most:
            return f"argument --splits: stage {st.id} takes 1 .. {most}, got {args.splits}"
    if args.build is not None and args.peer is not None:
        return "argument --build: takes --build or --peer, not both"
    if args.build is not None:
        from .book import experiments

        e = experiments.EXPERIMENTS.get(args.build)
        if e is None:
            return f"argument --build: no experiment named {args.build!r}; `mla-lab experiments` lists them"
        if e.stage != st.id:
            return f"argument --build: {args.build} swaps a piece of stage {e.stage}, not of {st.id}"
    if args.peer == "flashmla" and args.page_size != 64:
        return f"argument --peer: FlashMLA needs pages of 64 tokens (--page-size 64), not {args.page_size}"
    return None


def _profile_target(args, argv) -> int:
    from .book.explore import profile_target
    from .core.problem import Problem

    p = Problem(streams=args.streams, q_len=args.q_len, heads=args.heads, prefix=args.prefix,
                page_size=args.page_size, scattered=not args.contiguous)
    profile_target(args.stage, p, num_splits=args.splits, calls=args.calls, build=args.build, peer=args.peer)
    return 0


def _bench_text(name: str) -> Callable[[], str]:
    def text():
        from .measure import bench

        return getattr(bench, name)

    return text


def _check_module():
    from .check import suite as check  # its options, texts and run live with the check itself

    return check


def _graphs_module():
    from .serving import graphs  # chapter 7's measurements: options, texts and run live there

    return graphs


COMMANDS: tuple[Command, ...] = (
    Command("build", "compile the CUDA extension now (otherwise it is compiled on first use)",
            "Compile every kernel stage of csrc/ into one extension under build/, for this machine's GPU, or "
            "without one for sm_90 and sm_120 (MLA_LAB_CUDA_ARCHS=\"9.0;12.0\" chooses). Later calls reuse it "
            "and rebuild only what changed. Needs the CUDA toolkit; set CUDA_HOME if the nvcc on the PATH is a "
            "wrapper.",
            "examples:\n  mla-lab build\n  MLA_LAB_CUDA_ARCHS=\"9.0\" mla-lab build -v",
            _build_args, _build),
    Command("bench", "check, then time every stage over a grid of shapes; record the results",
            _bench_text("__doc__"), _bench_text("EXAMPLES"), _bench_args, _bench),
    Command("verify", "hold stages to the fp32 reference over the test grid (poisoned inputs)",
            "Check each stage against the fp32 reference over a grid of shapes (streams 1 and 3, q_len 1, 9 "
            "and 16, heads 1, 8 and 64, prefixes up to 16384, three page layouts), with NaN poisoned into "
            "everything a kernel must not read. Without a GPU only the Triton baseline runs, on a small CPU "
            "grid in Triton's interpreter, and the CUDA stages are named as skipped.",
            "examples:\n  mla-lab verify --quick\n  mla-lab verify --stages tensor_core shared_rows",
            _verify_args, _verify),
    Command("resources", "registers, shared memory and spills of every kernel, from the compiler (no GPU)",
            "Compile each kernel file for the given architectures with ptxas -v and print its resource report: "
            "registers, static shared memory, stack and spills per kernel. Needs nvcc, not a GPU.",
            "examples:\n  mla-lab resources\n  mla-lab resources --arch 8.6 12.0",
            _resources_args, _resources, _resources_validate),
    Command("chapters", "execute the chapters and store their outputs (on a GPU)",
            "Work with the chapters of the workbook (chapters/*.ipynb).",
            "examples:\n  mla-lab chapters execute\n  mla-lab chapters execute chapters/09_tensor_cores.ipynb",
            _chapters_args, _chapters),
    Command("experiments", "the Hopper stages' experiments: a stage with one piece swapped (no GPU)",
            "List the experiments of Part III: each is a Hopper stage with one piece swapped (a loader, a "
            "compute loop, the seesaw's order, the merge...), compiled beside the extension into a module of its "
            "own and never an op. `mla-lab profile-target STAGE ... --build NAME` runs one.",
            "examples:\n  mla-lab experiments\n  mla-lab experiments --stage seesaw",
            _experiments_args, _experiments),
    Command("sweep", "time split stages at several split counts (GPU)",
            "Time each given stage at each split count on each shape (CUDA-graph replay, L2 flushed), after "
            "checking its answer, with the count the stage's own rule picks marked '*' and the fastest named. "
            "Writes nothing.",
            "examples:\n  mla-lab sweep --stages tensor_core --heads 8 64 --prefix 16384\n"
            "  mla-lab sweep --stages triton float4 --splits 4 16 64 --prefix 4096 65536",
            _sweep_args, _sweep),
    Command("kernel-times", "GPU time of each kernel one call launches (GPU)",
            "Run each stage on each shape and report, from CUDA's activity records (torch.profiler), the time "
            "each of its kernels takes per call: the main kernel, the combine kernel, any other.",
            "examples:\n  mla-lab kernel-times --stages tensor_core shared_rows --heads 8 64",
            _kernel_times_args, _kernel_times),
    Command("profile-target", "a few calls of one stage on one shape, for a profiler (GPU)",
            "Make a few calls of STAGE on one shape (STREAMS, Q_LEN, HEADS, PREFIX) and nothing else: a process "
            "for Nsight Compute or Nsight Systems to attach to.",
            "examples:\n  mla-lab profile-target tensor_core 1 9 64 16384\n"
            "  ncu -k regex:tensor_core --launch-skip 2 --launch-count 1 --section SpeedOfLight \\\n"
            "      mla-lab profile-target tensor_core 1 9 64 16384\n"
            "  mla-lab profile-target tensor_copy 8 9 64 16384 --page-size 64 --build tma_no_math\n"
            "  mla-lab profile-target hopper 8 9 64 16384 --page-size 64 --peer flashmla",
            _profile_target_args, _profile_target, _profile_target_validate),
    Command("check", "how far to trust the kernels: sanitizers, fuzzing, graph soak, two streams, bad inputs",
            lambda: _check_module().DESCRIPTION, lambda: _check_module().EXAMPLES,
            lambda ap: _check_module().add_arguments(ap), lambda args, argv: _check_module().run(args)),
    Command("graphs", "chapter 7: launch costs, CUDA graphs per call and per 61-layer model step, defragmentation",
            lambda: _graphs_module().DESCRIPTION, lambda: "examples:\n" + _graphs_module().EXAMPLES,
            lambda ap: _graphs_module().add_arguments(ap), lambda args, argv: _graphs_module().run(args, argv)),
)

EPILOG = """\
first steps:
  mla-lab bench --quick        on a GPU: build, check and time every stage in about a minute
  mla-lab bench                without a GPU: the recorded results
  mla-lab <command> --help     a command's options and examples
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mla-lab", formatter_class=Raw, epilog=EPILOG,
        description="A workbook of CUDA kernels for MLA verify attention: build, check, time and explore them.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for c in COMMANDS:
        text = [t() if callable(t) else t for t in (c.description, c.examples)]
        if "\n" not in text[0]:
            text[0] = textwrap.fill(text[0], 100)
        p = sub.add_parser(c.name, help=c.summary, description=text[0], epilog=text[1], formatter_class=Raw)
        c.add_arguments(p)
    return ap


def _deepest(ap: argparse.ArgumentParser, argv) -> argparse.ArgumentParser:
    """The parser the leading words of ``argv`` name: a command's, or an action's within it (chapters execute)."""
    for word in argv:
        sub = next((a for a in ap._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        ap = sub.choices[word]
    return ap


def main(argv=None) -> int:
    from .core.extension import ArchError, ToolkitNotFound

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    names = [c.name for c in COMMANDS]
    if argv and not argv[0].startswith("-") and argv[0] not in names:
        ap.print_usage(sys.stderr)
        print(f"mla-lab: unknown command '{argv[0]}'; the commands are {', '.join(names)} "
              "(mla-lab --help says what each does)", file=sys.stderr)
        return 2
    # A bad value exits here (2), with the usage of the command it was given to; so does an unknown option,
    # which argparse would otherwise report under the top-level usage.
    args, unknown = ap.parse_known_args(argv)  # --help prints and exits 0
    if unknown:
        _deepest(ap, argv).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        ap.print_help(sys.stderr)
        return 2
    command = next(c for c in COMMANDS if c.name == args.command)
    why = command.validate(args) if command.validate else None
    if why:
        _deepest(ap, argv).error(why)
    try:
        return command.run(args, argv[1:])
    except ArchError as e:  # MLA_LAB_CUDA_ARCHS, read when the extension is built
        print(f"mla-lab {command.name}: error: {e}", file=sys.stderr)
        return 2
    except ToolkitNotFound as e:
        print(f"mla-lab {command.name}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
