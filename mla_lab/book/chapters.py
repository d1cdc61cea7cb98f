"""What the chapters call, and ``mla-lab chapters execute``.

A chapter measures live when it runs on a GPU; without one it shows the
results ``mla-lab bench`` recorded, and says which GPU and which day they
come from.  Every number a chapter prints is computed by a cell, from the
registry, the compiler's report, a model, a live run or the recorded file.

The chapters import this one module (``from mla_lab import chapters as ch``);
it gathers what they display (:mod:`mla_lab.book.display`) and what they
measure (:mod:`mla_lab.book.measure`), and runs them top to bottom.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .sass import count_opcodes, cuobjdump, sass, sass_instruction_mix, sass_memory_ops
from .verdicts import every, verdict
from .display import occupancy_rows, plot_prefix, print_occupancy, print_table, read_profile, show_diff, show_lines, source_of, stages_upto, where
from .measure import (ARTICLE_PREFIXES, GPU, article_problems, ceilings, device_here, find, floor_from_ceilings,
                      kept_measurement, kept_rounds_spread, measure, ratio, recorded_records, recorded_where,
                      results_for, run_to_run_spread, speedups, time_us)
from ..core.extension import ROOT

CHAPTERS = ROOT / "chapters"

__all__ = ["ARTICLE_PREFIXES", "CHAPTERS", "GPU", "ROOT", "article_problems", "ceilings", "count_opcodes",
           "cuobjdump", "device_here", "every", "execute", "find", "floor_from_ceilings", "kept_measurement",
           "kept_rounds_spread", "recorded_where", "run_to_run_spread",
           "measure", "occupancy_rows", "plot_prefix", "print_occupancy", "print_table", "ratio", "read_profile",
           "recorded_records", "results_for", "sass", "sass_instruction_mix", "sass_memory_ops", "show_diff",
           "show_lines", "source_of", "speedups", "stages_upto", "time_us", "verdict", "where"]


# ---- executing the chapters ------------------------------------------------------

def execute(paths=None, timeout: int = 1200) -> int:
    """Run every chapter top to bottom and write the outputs back into the files."""
    import nbformat
    from nbclient import NotebookClient

    paths = [Path(p) for p in paths] if paths else sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
    prebuild_for(paths)
    failed = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(CHAPTERS)}})
        try:
            client.execute()
            print(f"executed {path.name}", flush=True)
        except Exception as e:  # keep the partial outputs: they show where it stopped
            failed += 1
            print(f"FAILED {path.name}: {str(e).splitlines()[-1] if str(e) else e}", flush=True)
        nbformat.write(nb, path)
    return 1 if failed else 0


def prebuild_for(paths) -> int:
    """Before a Part III chapter runs on a Hopper GPU, compile the experiments side by side; returns how many."""
    if not any(Path(p).name[:2] in HOPPER_CHAPTERS or Path(p).name == HOPPER_APPENDIX for p in paths) \
            or not hopper_here():
        return 0
    import time

    from . import experiments

    t0 = time.perf_counter()
    n = experiments.prebuild()
    print(f"compiled the {n} experiment and probe modules side by side in {time.perf_counter() - t0:.0f} s", flush=True)
    return n


HOPPER_CHAPTERS = ("10", "11", "12", "13")
HOPPER_APPENDIX = "appendix_part3_experiments.ipynb"


def hopper_here() -> bool:
    """Whether this machine's GPU runs the Hopper stages (10 to 13; the registry's rule), so that their chapters
    measure live."""
    import torch

    from ..core import stages

    return torch.cuda.is_available() and stages.get("hopper").runs_on(*torch.cuda.get_device_capability(0))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "execute":
        print("usage: mla-lab chapters execute [chapters/NN_name.ipynb ...]")
        return 2
    return execute(argv[1:] or None)
