"""The compiled code: each kernel's SASS (``cuobjdump -sass`` of a cubin built on the CPU), and the counts the
chapters and tests read from it (instructions by opcode, products by shape, the length of a tile loop)."""

from __future__ import annotations

import functools
import re
import subprocess
from collections import Counter
from pathlib import Path

from ..core import stages
from ..core.extension import CSRC


@functools.lru_cache(maxsize=None)
def cuobjdump() -> str | None:
    """Path of ``cuobjdump`` (the CUDA toolkit's, else the copy Triton ships), or ``None``."""
    import shutil

    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.exists() else None
    except Exception:
        return None


def sass(stage_id: str, arch: str = "9.0") -> str:
    """The disassembly (SASS) of the stage's main kernel, compiled for ``arch``."""
    from ..measure.resources import cubin_path, ptxas_report

    ptxas_report(arch)  # makes sure build/ptxas/<file>.sm<arch>.cubin exists
    st = stages.get(stage_id)
    return kernel_sass(cubin_path(CSRC / st.source, arch), st.kernel)


def cubin_sass(cubin: Path) -> str:
    """The disassembly (SASS) of every kernel in a compiled ``cubin``."""
    tool = cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (it comes with the CUDA toolkit, or with Triton's package)")
    return subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def kernel_sass(cubin: Path, kernel: str) -> str:
    """The disassembly of one kernel (its function body) in a compiled ``cubin``: the kernel whose own name is
    ``kernel`` (``timeline_kernel``, not ``pingpong_timeline_kernel``), else the first whose symbol holds it."""
    from ..measure.resources import kernel_name

    text = cubin_sass(cubin)
    parts = re.split(r"\n\s*Function : ", text)
    own = next((p for p in parts[1:] if kernel_name(p.splitlines()[0].strip()) == kernel), None)
    return own or next((p for p in parts if kernel in p.splitlines()[0]), text)


def sass_memory_ops(stage_id: str, arch: str = "9.0") -> Counter:
    """Memory instructions in the compiled kernel (SASS), by opcode and width."""
    return Counter(re.findall(r"\b((?:LDG|STG|LDS|STS|LDL|STL)(?:\.[A-Z0-9_]+)*)\b", sass(stage_id, arch)))


def sass_instruction_mix(stage_id: str, arch: str = "9.0") -> Counter:
    """Every instruction of the compiled kernel (SASS), counted by opcode with its modifiers.

    A static count: each instruction once, however often it runs.  A predicate
    (``@P0``, ``@!UP1``) is not part of the opcode.
    """
    return instruction_mix(sass(stage_id, arch))


def instruction_mix(text: str) -> Counter:
    """The opcodes of a SASS listing, counted as :func:`sass_instruction_mix` counts them.

    An address has four hex digits or more: a kernel longer than 64 KB has five.
    """
    return Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", text))


def hgmma_shapes(text: str) -> dict[str, int]:
    """The ``HGMMA`` (wgmma) instructions of a SASS listing, by shape: ``{"64x40x16": 68, ...}``."""
    return dict(Counter(re.findall(r"\bHGMMA\.(\d+x\d+x\d+)\b", text)))


def tile_loop_instructions(text: str, min_products: int = 40) -> int:
    """The instructions of a kernel's innermost loop that holds ``min_products`` wgmma (``HGMMA``) or more: the
    shortest span from a conditional backward branch (``@P0 BRA`` to a lower address) back to its target that
    encloses that many.  A static count, 16 bytes an instruction; 0 where no loop holds them."""
    ins = [(int(a, 16), body) for a, body in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    products = [a for a, body in ins if "HGMMA" in body]
    best = 0
    for a, body in ins:
        m = re.match(r"@!?U?P\w+\s+BRA(?:\.\w+)*\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", body)
        if not m or int(m.group(1), 16) >= a:
            continue
        target = int(m.group(1), 16)
        if sum(1 for h in products if target <= h <= a) >= min_products:
            span = (a - target) // 16 + 1
            best = span if best == 0 else min(best, span)
    return best


def count_opcodes(mix: Counter, *prefixes: str) -> int:
    """How many instructions of ``mix`` start with any of ``prefixes`` (``"FFMA"``, ``"LDS"``, ...)."""
    return sum(v for k, v in mix.items() if k.startswith(prefixes))
