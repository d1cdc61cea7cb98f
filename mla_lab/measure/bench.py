"""``mla-lab bench``: check, then time, every stage over a grid of shapes.

For each configuration it builds one poisoned workload and its fp32
reference; for each stage it first checks the output (and stops loudly if it
is wrong), then times it eagerly and as a CUDA-graph replay (median of many
runs, L2 flushed before each).  It prints the table (time, speedups over the
naive kernel and Triton, TB/s, TFLOP/s, the roofline floor) and adds the run
to ``results/<gpu>.json`` with a plot, ``results/<gpu>.png``; each run records
its date, GPU, versions, the ceilings it measured, and the commit and source
digests of the code it measured.

Without a GPU it measures nothing: it prints the recorded results of the
reference GPU (the H200's, which the chapters read), narrowed to the stages
and shapes the options ask for, and says which options it cannot apply.
"""

from __future__ import annotations

import argparse
import os
import datetime as _dt
import platform
import sys
import time

import torch

from . import results as _results
from . import probes, provenance, roofline
from ..core import argtypes as T
from ..core import stages
from ..core.problem import Problem, make_workload
from ..core.reference import reference_attention
from ..core.verify import DEFAULT_TOL, compare

DEFAULT_PREFIXES = (256, 1024, 4096, 16384, 65536)
TRITON_MAX_SPLITS = 1024  # the Triton baseline's limit (triton_baseline.MAX_SPLITS; not imported: it imports triton)
DEFAULT_HEADS = (64, 8)
QUICK_PREFIXES = (1024, 16384)


class WrongAnswer(SystemExit):
    pass


def _peers() -> dict:
    """Other libraries' MLA kernels, measured beside ours when importable."""
    found = {}
    try:
        import flash_mla  # noqa: F401

        found["flashmla"] = "flash_mla"
    except Exception:
        pass
    try:
        import flashinfer  # noqa: F401

        found["flashinfer"] = "flashinfer"
    except Exception:
        pass
    return found


def _peer_runner(name: str, w):
    """A call of a peer library on the same problem, in its own layout.

    FlashMLA (its April 2025 sm90 kernel) wants pages of 64 and takes the
    draft as extra query rows with ``causal=True``; it returns lse as
    [streams, heads, q_len] in natural log, which the closure turns into our
    [streams, q_len, heads].  Its scheduler metadata depends on the lengths,
    so it is computed once here, as a serving engine does per step, and the
    timed call is the attention kernel and its combine.
    """
    if name == "flashmla":
        import flash_mla

        p = w.problem
        if p.page_size != 64:
            raise RuntimeError("FlashMLA needs pages of 64 tokens (use --page-size 64)")
        B, T, H = p.streams, p.q_len, p.heads
        cache = w.kv_cache.view(-1, 64, 1, 576)
        meta, splits = flash_mla.get_mla_metadata(w.kv_lens, T * H, 1)
        q = w.q.view(B, T, H, 576)

        def call():
            o, lse = flash_mla.flash_mla_with_kvcache(q, cache, w.block_table, w.kv_lens, 512, meta, splits,
                                                      softmax_scale=p.scale, causal=True)
            return o, lse.transpose(1, 2) if lse.dim() == 3 else lse

        return call
    raise RuntimeError(f"no adapter for peer {name}")


def _versions() -> dict:
    v = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import flash_mla

        # the peer's build: its version string and where it was imported from (set MLA_LAB_FLASHMLA_COMMIT to
        # record the commit it was built from, which a build outside its git checkout cannot know)
        v["flash_mla"] = {"version": getattr(flash_mla, "__version__", None), "path": str(flash_mla.__file__),
                          "commit": os.environ.get("MLA_LAB_FLASHMLA_COMMIT")}
    except Exception:
        pass
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception:
        v["triton"] = None
    try:
        import subprocess

        v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        v["driver"] = None
    return v


def grid(args) -> list[Problem]:
    out = []
    for streams in args.streams:
        for q_len in args.q_len:
            for heads in args.heads:
                for prefix in args.prefix:
                    out.append(Problem(streams=streams, q_len=q_len, heads=heads, prefix=prefix,
                                       page_size=args.page_size, scattered=not args.contiguous))
    return out


# The grid when an option is not given: the article's, or with --quick one that takes about a minute.
FULL = dict(streams=[1], q_len=[9], heads=list(DEFAULT_HEADS), prefix=list(DEFAULT_PREFIXES), rep_ms=100.0)
QUICK = dict(streams=[1], q_len=[9], heads=[8], prefix=list(QUICK_PREFIXES), rep_ms=20.0)
# Options that pick which measurements (they filter recorded results without a GPU), and those that only
# change how a run measures or where it writes (nothing to apply without a GPU).
SELECTING = ("stages", "streams", "q_len", "heads", "prefix", "page_size", "contiguous", "quick", "probes", "no_peers")
MEASURING = ("triton_splits", "rep_ms", "no_graph", "no_ceilings", "peers", "out", "no_save")
# The grid a recorded listing shows when no selecting option is given: the README's (the full grid's shapes,
# pages of one token at scattered ids); --all lists every record.
DEFAULT_LISTING = dict(streams=FULL["streams"], q_len=FULL["q_len"], heads=FULL["heads"], prefix=FULL["prefix"],
                       page_size=[1], scattered=[True])


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``mla-lab bench`` (each grid option left None here means: the grid's default)."""
    ids = [s.id for s in stages.STAGES]
    ap.add_argument("--stages", nargs="+", default=None, choices=ids, metavar="STAGE",
                    help=f"stages to measure, in the order given (default: all: {' '.join(ids)})")
    ap.add_argument("--quick", action="store_true",
                    help=f"a small grid that takes about a minute: 8 heads, prefixes "
                         f"{' '.join(map(str, QUICK_PREFIXES))}, {QUICK['rep_ms']:.0f} ms per measurement; "
                         "prints the table and writes nothing unless --out is given")
    ap.add_argument("--streams", nargs="+", type=T.positive_int, default=None, metavar="B", help="streams (default 1)")
    ap.add_argument("--q-len", nargs="+", type=T.positive_int, default=None, metavar="T",
                    help="query rows per stream: the draft plus one (default 9)")
    ap.add_argument("--heads", nargs="+", type=T.positive_int, default=None, metavar="H",
                    help=f"query heads (default {' '.join(map(str, DEFAULT_HEADS))})")
    ap.add_argument("--prefix", nargs="+", type=T.nonnegative_int, default=None, metavar="TOKENS",
                    help=f"cached tokens before the draft (default {' '.join(map(str, DEFAULT_PREFIXES))})")
    ap.add_argument("--page-size", type=T.positive_int, default=None, metavar="TOKENS",
                    help="tokens per page (default 1)")
    ap.add_argument("--contiguous", action="store_true", help="page ids 0, 1, 2, ... instead of scattered")
    ap.add_argument("--triton-splits", type=T.int_in(1, TRITON_MAX_SPLITS), default=stages.TRITON_DEFAULT_SPLITS,
                    metavar="N", help=f"KV splits of the Triton baseline (default {stages.TRITON_DEFAULT_SPLITS})")
    ap.add_argument("--rep-ms", type=T.positive_float, default=None, metavar="MS",
                    help="repetition time of each measurement (default 100; 20 with --quick)")
    ap.add_argument("--no-graph", action="store_true", help="time eager calls only")
    ap.add_argument("--no-probes", dest="probes", action="store_false",
                    help="skip the float4_reads probe (timed beside float4 when float4 is benched)")
    ap.add_argument("--peers", action="store_true",
                    help="require the peer kernels (FlashMLA) and time them beside ours; without this flag they are "
                         "timed when importable (see README: FlashMLA, built from its own repository, on PYTHONPATH)")
    ap.add_argument("--no-peers", action="store_true", help="skip FlashMLA / FlashInfer even if importable")
    ap.add_argument("--no-ceilings", action="store_true",
                    help="take the bandwidth and matrix rate from the device table instead of measuring them")
    ap.add_argument("--out", default=None, metavar="FILE",
                    help="results file to add this run to (default results/<gpu>.json)")
    ap.add_argument("--no-save", action="store_true", help="print the table, write nothing")
    ap.add_argument("--all", action="store_true",
                    help="without a GPU: list every recorded measurement (default: the default grid's, or what "
                         "the options above select)")


EXAMPLES = """\
examples:
  mla-lab bench --quick                                   # about a minute: is this GPU set up?
  mla-lab bench                                           # the article's grid, every stage
  mla-lab bench --heads 8 --prefix 16384 65536 --q-len 9 16 --streams 1 8
  mla-lab bench --stages triton float4 --page-size 64 --contiguous
  mla-lab bench --stages tensor_core --heads 8            # without a GPU: the recorded ones only
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mla-lab bench", description=__doc__, epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return ap


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset from the full grid, or the quick one."""
    base = QUICK if args.quick else FULL
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, list(value) if isinstance(value, list) else value)
    if args.stages is None:
        args.stages = [s.id for s in stages.STAGES]
    if args.page_size is None:
        args.page_size = 1
    return args


def parse_args(argv=None):
    return resolve(parser().parse_args(argv))


def given_options(ap: argparse.ArgumentParser, argv) -> set[str]:
    """The destinations of the options present in ``argv`` (defaults left out)."""
    saved = {a.dest: a.default for a in ap._actions}
    try:
        for a in ap._actions:
            a.default = argparse.SUPPRESS
        return set(vars(ap.parse_args(argv)))
    finally:
        for a in ap._actions:
            a.default = saved[a.dest]


def _matches(r: dict, args, given: set[str]) -> bool:
    """Whether recorded record ``r`` is one the given options ask for."""
    if "stages" in given and r["stage"] not in args.stages and not (
            r.get("kind") == "probe" and "float4" in args.stages):
        return False
    if r.get("kind") == "probe" and not args.probes:
        return False
    if r.get("kind") == "peer" and args.no_peers:
        return False
    grid_keys = {"streams": "streams", "q_len": "q_len", "heads": "heads", "prefix": "prefix"}
    for opt, key in grid_keys.items():
        if (opt in given or "quick" in given) and r[key] not in getattr(args, opt):
            return False
    if "page_size" in given and r["page_size"] != args.page_size:
        return False
    if "contiguous" in given and r["scattered"]:
        return False
    return True


def _option(dest: str) -> str:
    return {"probes": "--no-probes"}.get(dest, "--" + dest.replace("_", "-"))


def _in_default_listing(r: dict) -> bool:
    return all(r[k] in values for k, values in DEFAULT_LISTING.items())


def show_recorded(args=None, given: set[str] = frozenset()) -> int:
    """Without a GPU: the recorded results (:func:`results.load`), narrowed to what the options ask for (without
    any, the default grid's; with --all, every one)."""
    print("No CUDA GPU here: mla-lab bench measures nothing without one.")
    ignored = [_option(d) for d in MEASURING if d in given]
    if ignored:
        print(f"Ignored here (they change how a run measures or where it writes, and nothing is measured): "
              f"{' '.join(ignored)}.")
    rec = _results.load()
    if rec is None:
        print("No recorded results in results/ either.")
        return 0
    selecting = [d for d in SELECTING if d in given]
    listing_all = args is not None and getattr(args, "all", False)
    if selecting:
        records = [r for r in rec.records if _matches(r, args, given)]
        narrowed = f", only those {' '.join(_option(d) for d in selecting)} asks for"
    elif listing_all:
        records, narrowed = rec.records, ""
    else:
        records = [r for r in rec.records if _in_default_listing(r)]
        narrowed = (f"; the default grid's {len(records)} (one stream, q_len 9, 64 and 8 heads, prefixes 256 to "
                    "65536, pages of one token at scattered ids)")
    if not records:
        print(f"Most recent recorded results, {rec.describe()}: none of them is one "
              f"{' '.join(_option(d) for d in selecting) or 'the default grid'} asks for.")
        return 0
    print(f"Most recent recorded results, {rec.describe()}{narrowed}:\n")
    order = args.stages if "stages" in given else [s.id for s in stages.STAGES]
    print(_results.format_table(records, list(order) + ["float4_reads", "flashmla", "flashinfer"]))
    print()
    print(_results.legend())
    if not selecting and not listing_all:
        print(f"\n`mla-lab bench --all` lists all {len(rec.records)}; the options of `mla-lab bench --help` "
              "(--stages, --streams, --q-len, --heads, --prefix, --page-size, --contiguous) select others.")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = parser()
    args = resolve(ap.parse_args(argv))
    if not torch.cuda.is_available():
        return show_recorded(args, given_options(ap, argv))

    from ..core import ops
    from .timing import measure_ceilings, time_call

    props = torch.cuda.get_device_properties(0)
    gpu = props.name
    slug = _results.gpu_slug(gpu)
    started = time.time()
    print(f"mla-lab bench on {gpu} ({props.multi_processor_count} SMs)", flush=True)
    spec, spec_note = roofline.device_spec_for_current_gpu()
    print(f"device table: {spec_note}", flush=True)
    if args.no_ceilings:
        if spec is None:
            raise SystemExit("mla-lab bench: --no-ceilings takes the ceilings from the device table, which has no "
                             f"entry for {gpu}; run without --no-ceilings to measure them")
        ceilings = None
    else:
        ceilings = measure_ceilings()
        print(f"ceilings measured now: copy {ceilings['copy_tbs']:.2f} TB/s, bf16 matmul "
              f"{ceilings['bf16_matmul_tflops']:.0f} TFLOP/s, fp32 matmul {ceilings['fp32_matmul_tflops']:.1f} TFLOP/s",
              flush=True)

    if args.all:
        print("--all lists recorded results without a GPU; here it changes nothing", flush=True)
    wanted = [stages.get(s) for s in args.stages]
    if any(s.is_cuda for s in wanted):
        ops.load_ops()
    peers = {} if args.no_peers else _peers()
    if args.peers and "flashmla" not in peers:
        print("mla-lab bench --peers: FlashMLA is not importable here (import flash_mla failed). Build it from "
              "its repository (docs/benchmark.md, 'Peers') and put it on PYTHONPATH.", file=sys.stderr)
        return 2
    problems = grid(args)
    total = len(problems) * (len(wanted) + len(peers))
    records, n = [], 0
    for p in problems:
        w = make_workload(p, device="cuda", seed=1000 + n, poison=True)
        ref_out, ref_lse = reference_attention(*w.args(), check=False)
        fl = roofline.floor(p, spec, bandwidth=ceilings["copy_tbs"] * 1e12 if ceilings else None,
                            matrix_rate=ceilings["bf16_matmul_tflops"] * 1e12 if ceilings else None,
                            fp32_rate=ceilings["fp32_matmul_tflops"] * 1e12 if ceilings and spec is None else None)
        base = dict(streams=p.streams, q_len=p.q_len, heads=p.heads, prefix=p.prefixes[0], page_size=p.page_size,
                    scattered=p.scattered, floor_us=fl.floor_us, cuda_core_floor_us=fl.cuda_core_floor_us,
                    flops=fl.flops, bytes=fl.bytes)
        entries = [(s.id, s, None) for s in wanted] + [(name, None, name) for name in peers]
        for order, (sid, st, peer) in enumerate(entries):
            n += 1
            rec = dict(base, stage=sid, order=order, kind="peer" if peer else st.kind)
            tag = f"[{n}/{total}] {sid:<13} {p.label():<34}"
            try:
                if peer:
                    call = _peer_runner(peer, w)
                    out, lse = call()
                    splits = None
                else:
                    ns = args.triton_splits if st.kind == "triton" else None
                    call = ops.runner(st, w, num_splits=ns)
                    call()
                    out, lse = call.out, call.lse
                    splits = (ns if st.kind == "triton" else
                              ops.default_num_splits(st, w.q, w.kv_cache, w.block_table) if st.splits else None)
            except RuntimeError as e:
                said = str(e)
                if "shared memory" in said or "FlashMLA needs" in said or "needs a GPU of compute capability" in said:
                    rec["unsupported"] = said.splitlines()[0]  # the message; the lines after are a C++ trace
                    records.append(rec)
                    print(f"{tag} n/a: {rec['unsupported']}", flush=True)
                    continue
                raise
            torch.cuda.synchronize()
            chk = compare(out, lse, ref_out, ref_lse, label=p.label(), tol=DEFAULT_TOL)
            rec.update(rel_err=chk.rel_err, lse_err=chk.lse_err, num_splits=splits)
            if not chk.ok:
                raise WrongAnswer(f"mla-lab bench: stage {sid} is WRONG on {p.label()}: {chk}. Nothing was timed.")
            rec["us_eager"] = time_call(call, graph=False, rep_ms=args.rep_ms)
            rec["us_graph"] = rec["us_eager"] if args.no_graph else time_call(call, graph=True, rep_ms=args.rep_ms)
            rec["tbs"], rec["tflops"] = roofline.achieved(p, rec["us_graph"])
            records.append(rec)
            print(f"{tag} {rec['us_graph']:9.1f} us graph  {rec['us_eager']:9.1f} us eager  "
                  f"{100 * fl.floor_us / rec['us_graph']:5.1f}% of floor  err {chk.rel_err:.1e}", flush=True)
        if args.probes and any(s.id == "float4" for s in wanted):
            # The floor of stage 6's design, in the same run: its reads and nothing else.
            call = probes.probe_runner("float4_reads", w)
            us = time_call(call, graph=True, rep_ms=args.rep_ms)
            records.append(dict(base, stage="float4_reads", order=len(entries), kind="probe", us_graph=us,
                                num_splits=call.num_splits, kv_bytes=call.kv_bytes, tbs=call.kv_bytes / us / 1e6))
            print(f"[probe] float4_reads  {p.label():<34} {us:9.1f} us graph  {call.kv_bytes / us / 1e6:5.2f} TB/s of key reads",
                  flush=True)
        del w, ref_out, ref_lse
        torch.cuda.empty_cache()

    print()
    print(_results.format_table(records, [s.id for s in wanted] + ["float4_reads"] + list(peers)))
    print()
    print(_results.legend())
    print(f"\n{n} measurements in {time.time() - started:.0f} s")
    if args.no_save or (args.quick and args.out is None):
        if args.quick and not args.no_save:
            print("--quick writes nothing (add --out FILE to keep its results)")
        return 0
    run = dict(gpu=gpu, sms=props.multi_processor_count, date=_dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), command="mla-lab bench " + " ".join(argv), ceilings=ceilings, device_table=spec_note,
        **_versions(), **provenance.run_record())
    path = _results.RESULTS / f"{slug}.json" if args.out is None else _results.Path(args.out)
    rec = _results.save(path, run, records)
    png = path.with_suffix(".png")
    plot(rec, png)
    print(f"wrote {path} and {png}")
    return 0


def draw_prefix_panel(ax, records: list[dict], stage_ids, title: str) -> None:
    """One panel: time against prefix, a line per stage, the floor dashed (bench and chapters share it)."""
    for sid in stage_ids:
        pts = sorted((r["prefix"], r["us_graph"]) for r in records if r["stage"] == sid and not r.get("unsupported"))
        if pts:
            ax.plot(*zip(*pts), marker="o", label=sid)
    fl = sorted({(r["prefix"], r["floor_us"]) for r in records})
    if fl:
        ax.plot(*zip(*fl), "k--", label="floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prefix (tokens before the draft)")
    ax.set_ylabel("µs per call (CUDA graph replay)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def plot(rec: "_results.Recorded", path, stage_order=None):
    """Time against prefix, one line per stage, the floor dashed; a panel per shape family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams: dict = {}
    for r in rec.records:
        if r.get("unsupported"):
            continue
        fams.setdefault((r["streams"], r["q_len"], r["heads"], r["page_size"], r["scattered"]), []).append(r)
    fams = {k: v for k, v in fams.items() if len({r["prefix"] for r in v}) >= 2}
    if not fams:
        return None
    order = stage_order or [s.id for s in stages.STAGES] + ["flashmla", "flashinfer"]
    fig, axes = plt.subplots(1, len(fams), figsize=(6 * len(fams), 4.6), squeeze=False)
    for ax, (key, rs) in zip(axes[0], sorted(fams.items())):
        B, T, H, P, sc = key
        draw_prefix_panel(ax, rs, order, f"streams {B}, q_len {T}, heads {H}, pages of {P}{' scattered' if sc else ''}")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{rec.gpu}: {rec.path.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
