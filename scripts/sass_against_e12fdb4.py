"""Prove the Part III split behaviour-neutral: compile every build of stage10_hopper.cu as it stood at e12fdb4
(the op, and each -DMLA_HOPPER_* build that mla_lab/ablation.py made) and every kernel of today's stage files and
experiment files, for sm_90a on the CPU, and compare each kernel's SASS (cuobjdump -sass, addresses and symbol
hashes left out).

    python scripts/sass_against_e12fdb4.py [--jobs 2]

It needs the git history (e12fdb4) and nvcc; no GPU.  It prints one line a kernel: identical; the same
instructions with registers renamed (and a few lines in another order); or different.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REV = "e12fdb4"
FLAGS = ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr",
         "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
         "-D__CUDA_NO_HALF2_OPERATORS__"]

# Today's file and kernel -> the e12fdb4 build and kernel it freezes.
STAGES = {
    "stage10_wgmma": {"wgmma_kernel": ("cp_async", "hopper_kernel"),
                      "wgmma_combine_kernel": ("cp_async", "hopper_combine_kernel"),
                      "wgmma_merge_by_warps_kernel": ("cp_async", "hopper_merge_by_warps_kernel")},
    "stage11_tensor_copy": {"tensor_copy_gather_kernel": ("loader_choice", "hopper_kernel"),
                            "tensor_copy_kernel": ("loader_choice", "hopper_tma_kernel"),
                            "tensor_copy_combine_kernel": ("loader_choice", "hopper_combine_kernel"),
                            "tensor_copy_merge_by_warps_kernel": ("loader_choice", "hopper_merge_by_warps_kernel")},
    "stage12_seesaw": {"seesaw_gather_kernel": ("fill_eighth", "hopper_kernel"),
                       "seesaw_tma_kernel": ("fill_eighth", "hopper_tma_kernel"),
                       "seesaw_kernel": ("fill_eighth", "hopper_seesaw_kernel"),
                       "seesaw_any_pages_kernel": ("fill_eighth", "hopper_seesaw_any_pages_kernel"),
                       "seesaw_combine_kernel": ("fill_eighth", "hopper_combine_kernel"),
                       "seesaw_merge_by_warps_kernel": ("fill_eighth", "hopper_merge_by_warps_kernel")},
    "stage13_hopper": {k: ("op", k) for k in ("hopper_kernel", "hopper_tma_kernel", "hopper_seesaw_kernel",
                                               "hopper_seesaw_any_pages_kernel", "hopper_combine_kernel",
                                               "hopper_merge_by_warps_kernel")},
}

def experiment_map() -> dict[str, dict[str, tuple[str, str]]]:
    from mla_lab.book import experiments

    out: dict[str, dict[str, tuple[str, str]]] = {}
    for e in experiments.EXPERIMENTS.values():
        m = out.setdefault(e.file, {})
        main = "hopper_kernel"
        if e.file.startswith("seesaw"):
            main = "hopper_seesaw_kernel"
        elif e.file == "rows_layout":
            main = "hopper_rows_kernel"
        m[e.kernel] = (e.name, main)
        if e.tile_n and e.stamps is None and e.tile_n not in m:  # the old builds that stamped, stamped it too
            m[e.tile_n] = (e.name, "hopper_kernel")
    out["seesaw_crossed"]["seesaw_whole_kernel"] = ("seesaw_whole", "hopper_seesaw_kernel")
    out["seesaw_crossed"]["seesaw_cross_boxes_kernel"] = ("seesaw_whole", "hopper_seesaw_any_pages_kernel")
    return out


def kernel_name(mangled: str) -> str:
    names, i = [], 3 if mangled.startswith("_ZN") else 2
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        names.append(mangled[j:j + int(mangled[i:j])])
        i = j + int(mangled[i:j])
    return names[-1] if names else mangled


def sass_of(src: Path, include: Path, defines, work: Path, tag: str) -> dict[str, str]:
    from mla_lab.book.sass import cuobjdump
    from mla_lab.core.extension import find_cuda_home

    cubin = work / f"{tag}.cubin"
    subprocess.run([str(find_cuda_home() / "bin" / "nvcc"), "-cubin", "-gencode=arch=compute_90a,code=sm_90a",
                    *FLAGS, *defines, "-I", str(include), "-o", str(cubin), str(src)], check=True,
                   capture_output=True)
    text = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    out = {}
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        first, body = part.split("\n", 1)
        lines = []
        for line in body.splitlines():
            line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
            line = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "_ANON_", line)
            line = " ".join(line.split())
            if line:
                lines.append(line)
        out[kernel_name(first.strip())] = "\n".join(lines)
    return out


REG = re.compile(r"\b(?:UR|R|UP|P)\d+\b")


def compare(a: str, b: str) -> str:
    if a == b:
        return "identical"
    la = [re.sub(r"/\*.*?\*/", "", x).strip() for x in a.splitlines() if not x.startswith("/*")]
    lb = [re.sub(r"/\*.*?\*/", "", x).strip() for x in b.splitlines() if not x.startswith("/*")]
    if len(la) != len(lb):
        return f"different ({len(la)} against {len(lb)} instructions)"
    votes: dict[str, Counter] = {}
    for x, y in zip(la, lb):
        if REG.sub("#", x) == REG.sub("#", y):
            for ra, rb in zip(REG.findall(x), REG.findall(y)):
                votes.setdefault(ra, Counter())[rb] += 1
    mapping = {ra: c.most_common(1)[0][0] for ra, c in votes.items()}
    mapped = [REG.sub(lambda m: mapping.get(m.group(0), m.group(0)), x) for x in la]
    moved = sum(x != y for x, y in zip(mapped, lb))
    if moved == 0:
        return "the same instructions, registers renamed"
    if Counter(mapped) == Counter(lb) and moved <= 8:
        return f"the same instructions, registers renamed, {moved} lines in another order"
    return f"different ({moved} of {len(la)} instructions)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="these files only (stage or experiment file names, no .cu)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        old = tmp / "old"
        subprocess.run(f"git -C {ROOT} archive {REV} csrc mla_lab/ablation.py | tar -x -C {tmp} && mv {tmp}/csrc {old}",
                       shell=True, check=True)
        src = (tmp / "mla_lab" / "ablation.py").read_text()
        ns: dict = {}  # the old module's tables of builds, without its imports
        exec(compile(src.split("def build_defines")[0].replace("from .extension import CSRC, load_sm90a", "")
                     .replace("from .problem import Workload", ""), "ablation", "exec"), ns)
        pairs = {f: k for f, k in {**STAGES, **experiment_map()}.items() if not args.only or f in args.only}
        wanted = {b for k in pairs.values() for b, _ in k.values()}
        defines = {"op": []} if "op" in wanted else {}
        for name, own in {**ns["BUILDS"], **{v: [f"-DMLA_HOPPER_ABLATE={n}"] for v, n in ns["VARIANTS"].items()}}.items():
            own = list(own)
            if name not in wanted:
                continue
            defines[name] = own if any(d.startswith("-DMLA_HOPPER_DISPATCH=") for d in own) else own + [ns["NO_DISPATCH"]]
        work = tmp / "work"
        work.mkdir()
        with ThreadPoolExecutor(args.jobs) as pool:
            old_sass = dict(zip(defines, pool.map(
                lambda n: sass_of(old / "stage10_hopper.cu", old, defines[n], work, f"old-{n}"), defines)))
            new_files = {f: ROOT / "csrc" / ("" if f in STAGES else "experiments") / f"{f}.cu" for f in pairs}
            new_sass = dict(zip(new_files, pool.map(
                lambda f: sass_of(new_files[f], ROOT / "csrc", [], work, f"new-{f}"), new_files)))
    identical = total = 0
    for file, kernels in pairs.items():
        for kernel, (build, old_kernel) in kernels.items():
            verdict = compare(old_sass[build][old_kernel], new_sass[file][kernel])
            total += 1
            identical += verdict == "identical"
            print(f"{file}.cu {kernel:<38} <- {build} {old_kernel}: {verdict}")
    print(f"{identical} of {total} kernels identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
