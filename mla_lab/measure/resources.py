"""What the compiler says each kernel costs: registers, shared memory, stack, spills.

``ptxas -v`` prints, for every kernel it assembles, lines such as::

    ptxas info    : Compiling entry function '_ZN3mla..12naive_kernel..' for 'sm_90'
    ptxas info    : Function properties for _ZN3mla..
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 38 registers, used 1 barriers, 64 bytes smem, 928 bytes cmem[0]

:func:`ptxas_report` compiles each kernel file of ``csrc/`` to a cubin for one
architecture with the extension's own flags, parses those lines, and caches
the table in ``build/`` keyed by the sources' digest.  It needs ``nvcc`` but no
GPU, so CI reads the same numbers a GPU machine would.  The dynamic shared
memory of a launch is not the compiler's business: it comes from the stage's
launch geometry (``stages.py``).
"""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.extension import CSRC, ROOT, arch_target, find_cuda_home, nvcc_flags, source_digest

# Defines torch's extension build passes to nvcc; kept so register counts match.
TORCH_NVCC_DEFINES = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                      "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]


@dataclass(frozen=True)
class KernelResources:
    kernel: str
    arch: str  # "9.0"
    source: str  # file in csrc/
    registers: int
    static_smem_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    barriers: int


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for 'sm_(\d+)[af]?'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


def kernel_name(mangled: str) -> str:
    """The last identifier of an Itanium-mangled nested name: the kernel's own name."""
    names = []
    nested = mangled.startswith("_ZN")
    i = 3 if nested else 2
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        n = int(mangled[i:j])
        names.append(mangled[j:j + n])
        i = j + n
        if not nested:  # _Z<len><name><parameter types>: the name is the first identifier
            break
    return names[-1] if names else mangled


def parse_ptxas(text: str, source: str) -> list[KernelResources]:
    """The kernels of one ``ptxas -v`` log."""
    found, current, props = [], None, (0, 0, 0)
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current, arch, props = kernel_name(m.group(1)), f"{m.group(2)[:-1]}.{m.group(2)[-1]}", (0, 0, 0)
            continue
        m = _PROPS.search(line)
        if m and current:
            props = tuple(int(x) for x in m.groups())
            continue
        m = _USED.search(line)
        if m and current:
            smem = _SMEM.search(line)
            bars = _BARRIERS.search(line)
            found.append(KernelResources(
                kernel=current, arch=arch, source=source, registers=int(m.group(1)),
                static_smem_bytes=int(smem.group(1)) if smem else 0, stack_bytes=props[0],
                spill_store_bytes=props[1], spill_load_bytes=props[2],
                barriers=int(bars.group(1)) if bars else 0))
            current = None
    return found


def kernel_sources():
    return sorted(CSRC.glob("*.cu"))


def _compile(src, arch: str, nvcc: str, defines=(), tag: str = "") -> tuple[str, str]:
    """Compile ``src`` to build/ptxas/<stem><tag>.sm<arch>.cubin; returns (its name, ptxas's report)."""
    sm = arch.replace(".", "")
    target = arch_target(arch).replace(".", "")  # 9.0 is built as sm_90a, as the extension is
    out = cubin_path(src, arch, tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, "-cubin", f"-gencode=arch=compute_{target},code=sm_{target}", *nvcc_flags(), *TORCH_NVCC_DEFINES,
           *defines, "-Xptxas", "-v", "-I", str(CSRC), "-o", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src.name}{tag} for sm_{sm}:\n{done.stderr}")
    return src.name, done.stderr + done.stdout


def cubin_path(src, arch: str, tag: str = "") -> Path:
    return ROOT / "build" / "ptxas" / f"{Path(src).stem}{tag}.sm{arch.replace('.', '')}.cubin"


def compile_cubin(src, arch: str = "9.0", defines=(), tag: str = "") -> Path:
    """Compile one source as the report does (an experiment, a probe outside the extension); its cubin's path.

    The cubin is kept beside a digest of every file in csrc/ and the flags: a later call with the same sources
    reads it again instead of compiling (a test run from a warm build compiles nothing twice).
    """
    out = cubin_path(src, arch, tag)
    stamp = out.with_suffix(".digest")
    digest = _sources_digest(list(defines) + [arch, *nvcc_flags()])
    if out.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return out
    _compile(Path(src), arch, str(find_cuda_home() / "bin" / "nvcc"), defines, tag)
    stamp.write_text(digest)
    return out


def _sources_digest(extra) -> str:
    import hashlib

    h = hashlib.sha256("\0".join(extra).encode())
    for f in sorted(CSRC.rglob("*")):
        if f.is_file() and f.suffix in (".cu", ".cuh", ".h", ".cpp"):
            h.update(str(f.relative_to(CSRC)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def ptxas_report(arch: str = "9.0", *, refresh: bool = False) -> list[KernelResources]:
    """Resources of every kernel in csrc/ for one architecture (compiles once, then cached)."""
    cache = ROOT / "build" / "ptxas" / f"report-{source_digest()}-sm{arch.replace('.', '')}.json"
    if cache.is_file() and not refresh:
        return [KernelResources(**r) for r in json.loads(cache.read_text())]
    nvcc = str(find_cuda_home() / "bin" / "nvcc")
    with ThreadPoolExecutor(max_workers=4) as pool:
        logs = list(pool.map(lambda s: _compile(s, arch, nvcc), kernel_sources()))
    table = [r for name, log in logs for r in parse_ptxas(log, name)]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps([asdict(r) for r in table], indent=1))
    return table


def compile_for(archs, out_dir, jobs: int = 2) -> list[Path]:
    """Compile every kernel file of csrc/ for ``archs`` ("8.0"-style) into one fat binary each under ``out_dir``,
    with the extension's flags: the device code an ``MLA_LAB_CUDA_ARCHS`` build of those archs compiles, with
    nothing linked or loaded.  Raises RuntimeError with nvcc's words on the first file that fails."""
    nvcc = str(find_cuda_home() / "bin" / "nvcc")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gencode = [f"-gencode=arch=compute_{t},code=sm_{t}" for t in (arch_target(a).replace(".", "") for a in archs)]

    def one(src: Path) -> Path:
        out = out_dir / f"{src.stem}.fatbin"
        done = subprocess.run([nvcc, "-fatbin", *gencode, *nvcc_flags(), *TORCH_NVCC_DEFINES, "-I", str(CSRC),
                               "-o", str(out), str(src)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name} for {', '.join(archs)}:\n{done.stderr}")
        return out

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, kernel_sources()))


def nvcc_archs() -> set[str]:
    """The compute capabilities this toolkit's nvcc compiles for ("8.0"-style), from ``nvcc --list-gpu-code``."""
    done = subprocess.run([str(find_cuda_home() / "bin" / "nvcc"), "--list-gpu-code"], capture_output=True, text=True)
    return {f"{m[:-1]}.{m[-1]}" for m in re.findall(r"sm_(\d+)", done.stdout)}


def resources_by_kernel(arch: str = "9.0") -> dict[str, KernelResources]:
    return {r.kernel: r for r in ptxas_report(arch)}
