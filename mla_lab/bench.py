"""``mla-lab bench``: check, then time, every stage over a grid of shapes.

For each configuration it builds one poisoned workload and its fp32
reference; for each stage it first checks the output (and stops loudly if it
is wrong), then times it eagerly and as a CUDA-graph replay (median of many
runs, L2 flushed before each).  It prints the table, writes
``results/<gpu>.json`` and ``results/<gpu>.png``.  Without a GPU it measures
nothing and prints the most recent recorded results instead.

    mla-lab bench                                   # the article's grid
    mla-lab bench --heads 8 --prefix 16384 65536 --q-len 9 16 --streams 1 8
    mla-lab bench --stages triton float4 --page-size 64
"""

from __future__ import annotations

import argparse
import datetime as _dt
import platform
import sys
import time

import torch

from . import results as _results
from . import roofline, stages
from .problem import Problem, make_workload
from .reference import reference_attention
from .verify import DEFAULT_TOL, compare

DEFAULT_PREFIXES = (256, 1024, 4096, 16384, 65536)
DEFAULT_HEADS = (64, 8)


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

    FlashMLA wants pages of 64 and takes the draft as extra query rows with
    ``causal=True``; the returned closure writes (out, lse) in our layout.
    Not yet exercised: neither library is installed on the H200 this project
    was measured on, so no recorded result comes from this adapter.
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


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="mla-lab bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=[s.id for s in stages.STAGES],
                    choices=[s.id for s in stages.STAGES])
    ap.add_argument("--streams", nargs="+", type=int, default=[1])
    ap.add_argument("--q-len", nargs="+", type=int, default=[9])
    ap.add_argument("--heads", nargs="+", type=int, default=list(DEFAULT_HEADS))
    ap.add_argument("--prefix", nargs="+", type=int, default=list(DEFAULT_PREFIXES))
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--contiguous", action="store_true", help="page ids 0, 1, 2, ... instead of scattered")
    ap.add_argument("--triton-splits", type=int, default=stages.TRITON_DEFAULT_SPLITS, help="KV splits of the Triton baseline")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="do_bench repetition time per measurement")
    ap.add_argument("--no-graph", action="store_true", help="time eager calls only")
    ap.add_argument("--no-probes", dest="probes", action="store_false",
                    help="skip the float4_reads probe (timed beside float4 when float4 is benched)")
    ap.add_argument("--no-peers", action="store_true", help="skip FlashMLA / FlashInfer even if importable")
    ap.add_argument("--no-ceilings", action="store_true", help="use the device table's ceilings instead of measuring")
    ap.add_argument("--out", default=None, help="results file (default results/<gpu>.json)")
    ap.add_argument("--no-save", action="store_true")
    return ap.parse_args(argv)


def show_recorded() -> int:
    rec = _results.load()
    print("No CUDA GPU here: mla-lab bench measures nothing without one.")
    if rec is None:
        print("No recorded results in results/ either.")
        return 0
    print(f"Most recent recorded results, {rec.describe()}:\n")
    print(_results.format_table(rec.records, [s.id for s in stages.STAGES] + ["flashmla", "flashinfer"]))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        return show_recorded()

    from . import ops
    from .timing import measure_ceilings, time_call

    props = torch.cuda.get_device_properties(0)
    gpu = props.name
    slug = _results.gpu_slug(gpu)
    started = time.time()
    print(f"mla-lab bench on {gpu} ({props.multi_processor_count} SMs)", flush=True)
    if args.no_ceilings:
        ceilings = None
    else:
        ceilings = measure_ceilings()
        print(f"ceilings measured now: copy {ceilings['copy_tbs']:.2f} TB/s, bf16 matmul "
              f"{ceilings['bf16_matmul_tflops']:.0f} TFLOP/s, fp32 matmul {ceilings['fp32_matmul_tflops']:.1f} TFLOP/s",
              flush=True)
    spec = next((d for d in roofline.DEVICES.values() if d.arch == f"{props.major}.{props.minor}"),
                roofline.DEVICES["h200"])

    wanted = [stages.get(s) for s in args.stages]
    if any(s.is_cuda for s in wanted):
        ops.extension()
    peers = {} if args.no_peers else _peers()
    problems = grid(args)
    total = len(problems) * (len(wanted) + len(peers))
    records, n = [], 0
    for p in problems:
        w = make_workload(p, device="cuda", seed=1000 + n, poison=True)
        ref_out, ref_lse = reference_attention(*w.args(), check=False)
        fl = roofline.floor(p, spec, bandwidth=ceilings["copy_tbs"] * 1e12 if ceilings else None,
                            matrix_rate=ceilings["bf16_matmul_tflops"] * 1e12 if ceilings else None)
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
                if "shared memory" in str(e) or "FlashMLA needs" in str(e):
                    rec["unsupported"] = str(e).splitlines()[0]
                    records.append(rec)
                    print(f"{tag} n/a: {rec['unsupported'][:90]}", flush=True)
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
            call = ops.probe_runner("float4_reads", w)
            us = time_call(call, graph=True, rep_ms=args.rep_ms)
            records.append(dict(base, stage="float4_reads", order=len(entries), kind="probe", us_graph=us,
                                num_splits=call.num_splits, kv_bytes=call.kv_bytes, tbs=call.kv_bytes / us / 1e6))
            print(f"[probe] float4_reads  {p.label():<34} {us:9.1f} us graph  {call.kv_bytes / us / 1e6:5.2f} TB/s of key reads",
                  flush=True)
        del w, ref_out, ref_lse
        torch.cuda.empty_cache()

    print()
    print(_results.format_table(records, [s.id for s in wanted] + list(peers)))
    print(f"\n{n} measurements in {time.time() - started:.0f} s")
    if args.no_save:
        return 0
    run = dict(gpu=gpu, sms=props.multi_processor_count, date=_dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), command="mla-lab bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        ceilings=ceilings, **_versions())
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
