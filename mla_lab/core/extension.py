"""Building and loading the one CUDA extension that holds every kernel stage.

The extension is compiled just in time with ``torch.utils.cpp_extension.load``
(ninja): the first ``import`` of it builds ``csrc/`` into ``build/ext-<archs>/``
beside the package, later imports reuse that build, and a changed source file
triggers a rebuild of what changed.  ``python -m mla_lab.core.extension`` builds it
ahead of time and prints where.

Target architectures: the local GPU's when there is one; with none, sm_90 and
sm_120 (H100/H200, and the RTX PRO 6000 Blackwell of the seed article).  Set
``MLA_LAB_CUDA_ARCHS="9.0;12.0"`` (the format of ``TORCH_CUDA_ARCH_LIST``) to
choose; :data:`SUPPORTED_ARCHS` is every architecture the stages are built and
compiled for in CI (``MLA_LAB_CUDA_ARCHS="8.0;8.6;8.9;9.0;12.0"``).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: csrc/ and build/ sit beside mla_lab/
CSRC = ROOT / "csrc"
DEFAULT_ARCHS = ("9.0", "12.0")
# Ampere (A100: 8.0; RTX 30xx, A10, A40: 8.6), Ada (L4, L40, RTX 40xx: 8.9), Hopper (9.0), Blackwell RTX (12.0).
# CI compiles them all: the default build 9.0 and 12.0, the compile-only test every kernel file for the others.
SUPPORTED_ARCHS = ("8.0", "8.6", "8.9", "9.0", "12.0")
EXTENSION_NAME = "mla_lab_C"


class ToolkitNotFound(RuntimeError):
    """No CUDA toolkit (nvcc with its headers) was found."""


class ArchError(ValueError):
    """MLA_LAB_CUDA_ARCHS holds something that is not a list of compute capabilities."""


def _has_headers(home: Path) -> bool:
    return (home / "include" / "cuda_runtime_api.h").is_file() and (home / "bin" / "nvcc").exists()


def find_cuda_home() -> Path:
    """The CUDA toolkit to build with.

    torch guesses CUDA_HOME from the ``nvcc`` on the PATH; where that is a
    wrapper script with no headers beside it (as on this project's CI
    machines) the guess is wrong and the build fails on a missing
    ``cuda_runtime_api.h``.  So: take CUDA_HOME or CUDA_PATH when it holds a
    toolkit, else the first of /usr/local/cuda, /usr/local/cuda-*, /opt/cuda
    and the folder above ``nvcc`` that does.
    """
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]))
    candidates.append(Path("/usr/local/cuda"))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    candidates.append(Path("/opt/cuda"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    for home in candidates:
        if _has_headers(home):
            return home
    tried = ", ".join(str(c) for c in candidates)
    raise ToolkitNotFound(
        "mla_lab needs the CUDA toolkit (nvcc and its headers) to build its kernels; none found in: "
        f"{tried}. Install the toolkit or set CUDA_HOME to it."
    )


def target_archs() -> tuple[str, ...]:
    """Compute capabilities to compile for, as "9.0"-style strings."""
    env = os.environ.get("MLA_LAB_CUDA_ARCHS")
    if env:
        from .argtypes import arch_error

        archs = tuple(a.strip() for a in env.replace(",", ";").split(";") if a.strip())
        bad = [why for why in map(arch_error, archs) if why]
        if bad or not archs:
            raise ArchError(f"MLA_LAB_CUDA_ARCHS={env!r}: {bad[0] if bad else 'no architecture in it'}; "
                            f"write them separated by ';', e.g. \"{';'.join(SUPPORTED_ARCHS)}\"")
        return archs
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return (f"{major}.{minor}",)
    return DEFAULT_ARCHS


def arch_target(arch: str) -> str:
    """The target a "9.0"-style arch is compiled for.

    Compute capability 9.0 (H100, H200) is built as ``sm_90a``: the Hopper stages'
    ``wgmma``, ``setmaxnreg`` and ``griddepcontrol`` exist only in that
    architecture-specific target, and code built for it runs on every 9.0 GPU.
    Every other arch is built as itself.
    """
    return "9.0a" if arch == "9.0" else arch


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.cu")) + [CSRC / "bindings.cpp"]


def nvcc_flags() -> list[str]:
    # -lineinfo keeps source lines in SASS for the chapters that read it.
    return ["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "--expt-relaxed-constexpr"]


def build_dir(archs: tuple[str, ...] | None = None) -> Path:
    archs = archs or target_archs()
    tag = "-".join(a.replace(".", "") for a in archs)
    return ROOT / "build" / f"ext-sm{tag}"


@functools.lru_cache(maxsize=None)
def load(verbose: bool | None = None):
    """Build (if needed) and import the extension; returns the pybind module.

    Importing it registers the ops in ``torch.ops.mla_lab``.  Their fake
    (shape-only) implementations, which ``torch.compile`` needs, live in
    :mod:`mla_lab.core.ops`: call :func:`mla_lab.load_ops` to get both.
    """
    cpp = cpp_extension()
    archs = target_archs()
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(arch_target(a) for a in archs)
    out = build_dir(archs)
    out.mkdir(parents=True, exist_ok=True)
    if verbose is None:
        verbose = os.environ.get("MLA_LAB_VERBOSE_BUILD") == "1"
    module = cpp.load(
        name=EXTENSION_NAME,
        sources=[str(s) for s in sources()],
        extra_cflags=["-O3"],
        extra_cuda_cflags=nvcc_flags(),
        extra_include_paths=[str(CSRC)],
        build_directory=str(out),
        verbose=verbose,
    )
    return module


def cpp_extension():
    """``torch.utils.cpp_extension``, set to build with the toolkit :func:`find_cuda_home` finds."""
    home = find_cuda_home()
    os.environ["CUDA_HOME"] = str(home)
    import logging

    # Without a GPU, cpp_extension warns on import that it found no CUDA runtime;
    # building for a GPU that is elsewhere is what we mean to do.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    import torch.utils.cpp_extension as cpp

    # torch computed its CUDA_HOME when cpp_extension was first imported.
    cpp.CUDA_HOME = str(home)
    return cpp


_ARCH_LIST_LOCK = threading.Lock()
_arch_list_users = [0, None]  # builds inside load_sm90a now, and TORCH_CUDA_ARCH_LIST before the first


def load_sm90a(name: str, sources: list, build_subdir: str, defines=(), verbose: bool = False):
    """Build (with nvcc, for sm_90a only) and import a small module of its own, beside the extension.

    For what exists only on Hopper and is never an op: the experiment builds of
    the Hopper stages, the wgmma probe.  ``defines`` go to both compilers.
    cpp_extension reads the target from ``TORCH_CUDA_ARCH_LIST``; builds may
    run side by side in threads, so the variable is set while any of them runs
    and put back when the last one ends.
    """
    cpp = cpp_extension()
    out = ROOT / "build" / build_subdir
    out.mkdir(parents=True, exist_ok=True)
    with _ARCH_LIST_LOCK:
        if _arch_list_users[0] == 0:
            _arch_list_users[1] = os.environ.get("TORCH_CUDA_ARCH_LIST")
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch_target("9.0")
        _arch_list_users[0] += 1
    try:
        return cpp.load(name=name, sources=[str(s) for s in sources], extra_cflags=["-O3", *defines],
                        extra_cuda_cflags=nvcc_flags() + list(defines), extra_include_paths=[str(CSRC)],
                        build_directory=str(out), verbose=verbose)
    finally:
        with _ARCH_LIST_LOCK:
            _arch_list_users[0] -= 1
            if _arch_list_users[0] == 0:
                if _arch_list_users[1] is None:
                    os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
                else:
                    os.environ["TORCH_CUDA_ARCH_LIST"] = _arch_list_users[1]


STAGE_LIST = CSRC / "stage_list.h"
STAGE_FIELDS = ("id", "splits", "align_bytes", "min_cc", "max_cc", "input_hint", "gpu_hint")


def _macro_arguments(text: str, start: int) -> tuple[list[str], int]:
    """The comma-separated arguments of a macro call whose '(' is at ``start``, and where it ends.

    String literals may hold commas and parentheses; adjacent literals are joined, as the compiler does.
    """
    args, current, depth, i = [], "", 0, start + 1
    while True:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            current += text[i:j + 1]
            i = j + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                args.append(current)
                return [" ".join(a.split()) for a in args], i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(current)
            current = ""
            i += 1
            continue
        current += ch
        i += 1


def _literal(arg: str):
    if arg.startswith('"'):
        import ast

        return "".join(ast.literal_eval(part) for part in re.findall(r'"(?:[^"\\]|\\.)*"', arg))
    return int(arg) if re.fullmatch(r"-?\d+", arg) else arg


def declared_stages(path: Path = STAGE_LIST) -> list[dict]:
    """The CUDA stages ``csrc/stage_list.h`` declares, in order, read without a compiler.

    One dict per ``MLA_STAGE(...)`` line with the fields of :data:`STAGE_FIELDS`
    (``splits`` as a bool); the comments above the list are skipped.
    """
    text = re.sub(r"//[^\n]*", "", path.read_text())
    found = []
    for m in re.finditer(r"\bMLA_STAGE\s*\(", text):
        args, _ = _macro_arguments(text, m.end() - 1)
        if len(args) != len(STAGE_FIELDS):
            raise ValueError(f"{path.name}: MLA_STAGE takes {len(STAGE_FIELDS)} arguments "
                             f"({', '.join(STAGE_FIELDS)}), got {len(args)}: {args}")
        entry = dict(zip(STAGE_FIELDS, (_literal(a) for a in args)))
        entry["splits"] = bool(entry["splits"])
        found.append(entry)
    return found


def source_digest() -> str:
    h = hashlib.sha256()
    for s in sources() + sorted(CSRC.glob("*.h")) + sorted(CSRC.glob("*.cuh")):
        h.update(s.read_bytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    mod = load(verbose=True)
    print(f"built {EXTENSION_NAME} for sm {', '.join(target_archs())} in {build_dir()}", file=sys.stderr)
    print("stages:", ", ".join(mod.stage_ids()))
