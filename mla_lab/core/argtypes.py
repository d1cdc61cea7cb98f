"""argparse types for the ``mla-lab`` command's options: a bad value is refused while parsing, with one line
that names the option and the value (argparse prints it under the command's usage, exit status 2).

The command's modules (bench, check, graphs, explore) live in layers above this one; their options share
these types so that every count, size, stage name, path and architecture is checked the same way.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

# A compute capability as MLA_LAB_CUDA_ARCHS and `mla-lab resources --arch` take it: major.minor.
ARCH_PATTERN = re.compile(r"[1-9][0-9]?\.[0-9]")


def _int(text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    """A count or a size: 1 or more."""
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return n


def nonnegative_int(text: str) -> int:
    """A length that may be empty (a prefix of 0 tokens: the cache holds only the draft)."""
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return n


def int_in(lo: int, hi: int):
    """An int in ``lo .. hi``."""
    def parse(text: str) -> int:
        n = _int(text)
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{text!r} must be in {lo} .. {hi}")
        return n

    parse.__name__ = f"int_in_{lo}_{hi}"
    return parse


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return x


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return path


def arch_error(text: str) -> str | None:
    """Why ``text`` is not a compute capability as the build takes it, or None."""
    if ARCH_PATTERN.fullmatch(text):
        return None
    return f"{text!r} is not a compute capability written major.minor, such as 8.0, 9.0 or 12.0"


def arch(text: str) -> str:
    why = arch_error(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def stage_ids() -> list[str]:
    from .stages import STAGES

    return [s.id for s in STAGES]
