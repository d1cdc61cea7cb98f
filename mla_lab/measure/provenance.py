"""Which code produced a recorded result, so that a stale record can be found.

Every ``mla-lab bench`` run records, beside its date and GPU, the commit of
the checkout (:func:`git_commit`), the digest of the kernel sources
(``extension.source_digest()``) and the digest of the Python package
(:func:`package_digest`).

Every chapter that ``mla-lab chapters execute`` runs carries, in its notebook
metadata (``metadata.mla_lab.provenance``; nbval compares cell outputs, not
this), a digest of each file its outputs depend on: the kernel files of the
stages up to its own (a later stage never makes an earlier chapter stale),
the shared headers, the combine kernel and probe, the bindings, and the Triton
baseline.  :func:`chapter_staleness` recomputes them: a chapter whose stored
outputs come from other sources than those it measures now, or from a run
without a GPU, is named with the files that changed.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

from ..core.extension import CSRC, ROOT, source_digest

PACKAGE = ROOT / "mla_lab"
CHAPTERS = ROOT / "chapters"
TRITON_SOURCE = PACKAGE / "core" / "triton_baseline.py"
# Files in csrc/ no chapter's outputs depend on: the list of stages changes whenever a stage is added.
NOT_MEASURED = ("stage_list.h",)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def git_commit() -> str | None:
    """The checkout's commit, with ``-dirty`` if csrc/ or mla_lab/ has uncommitted changes.

    The environment variable ``MLA_LAB_COMMIT``, when set, names it and wins:
    a copy of the tree sent to a GPU machine may carry no git folder, or an
    older one than the files it holds (seen on this project's GPU machines,
    whose copies carried the git folder of an earlier commit).  The source and
    package digests recorded beside the commit say what code ran either way.
    """
    if os.environ.get("MLA_LAB_COMMIT"):
        return os.environ["MLA_LAB_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=20)
        if head.returncode != 0:
            raise OSError(head.stderr)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "csrc", "mla_lab"], cwd=ROOT,
                               capture_output=True, text=True, timeout=20).stdout.strip()
        return head.stdout.strip()[:12] + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("MLA_LAB_COMMIT") or None


def package_digest() -> str:
    """Digest of the package's Python files (the chapters' and the bench's own code)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def run_record() -> dict:
    """What a recorded run says about the code that produced it."""
    return dict(commit=git_commit(), source_digest=source_digest(), package_digest=package_digest())


# ---- chapters ----------------------------------------------------------------------

def chapter_number(notebook: str | Path) -> int:
    m = re.match(r"(\d\d)_", Path(notebook).name)
    if not m:
        raise ValueError(f"{notebook}: a chapter's file name starts with its two-digit number")
    return int(m.group(1))


def chapter_sources(notebook: str | Path) -> list[Path]:
    """The files chapter ``NN_*.ipynb``'s outputs depend on: csrc/ without the stages after NN, and Triton's.

    A header counts when a counted source includes it (directly or through
    other headers; headers anywhere under csrc/, named from there as the
    includes name them): one that only later stages include (``sm90_ptx.cuh``
    and ``hopper/*.cuh``, what the Hopper stages share) is not a source of the
    earlier chapters.  The sources counted are csrc/'s own files, not its
    folders' (the probes and the experiments are builds of their own).
    """
    n = chapter_number(notebook)
    units = []
    headers = {path.relative_to(CSRC).as_posix(): path for path in sorted(CSRC.rglob("*"))
               if path.suffix in (".cuh", ".h") and path.name not in NOT_MEASURED}
    for path in sorted(CSRC.iterdir()):
        if path.suffix not in (".cu", ".cpp") or path.name in NOT_MEASURED:
            continue
        m = re.match(r"stage(\d\d)_", path.name)
        if m and int(m.group(1)) > n:
            continue
        units.append(path)
    reached, todo = set(), list(units)
    while todo:
        for name in re.findall(r'#include\s+"([^"]+)"', todo.pop().read_text()):
            if name in headers and name not in reached:
                reached.add(name)
                todo.append(headers[name])
    return sorted(units + [headers[h] for h in reached]) + [TRITON_SOURCE]


def source_digests(files) -> dict[str, str]:
    """``{path relative to the repository: digest of its bytes}``."""
    return {str(Path(f).relative_to(ROOT)): _digest(Path(f).read_bytes()) for f in files}


def chapter_record(notebook: str | Path, gpu: str | None) -> dict:
    """The provenance a chapter executed now, on ``gpu`` (``None``: no GPU), carries."""
    return dict(files=source_digests(chapter_sources(notebook)), gpu=gpu,
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **run_record())


def stamp(notebook: str | Path, gpu: str | None) -> dict:
    """Write the provenance of outputs just produced into the notebook's metadata; returns it."""
    import nbformat

    path = Path(notebook)
    nb = nbformat.read(path, as_version=4)
    record = chapter_record(path, gpu)
    nb.metadata.setdefault("mla_lab", {})["provenance"] = record
    nbformat.write(nb, path)
    return record


def stored_record(notebook: str | Path) -> dict | None:
    nb = json.loads(Path(notebook).read_text())
    return nb.get("metadata", {}).get("mla_lab", {}).get("provenance")


def chapter_staleness(notebook: str | Path) -> str | None:
    """``None`` if the chapter's stored outputs come from a GPU run of the sources it measures now, else why not."""
    path = Path(notebook)
    rec = stored_record(path)
    fix = "re-execute it on a GPU: mla-lab chapters execute " + str(path.relative_to(ROOT) if path.is_relative_to(
        ROOT) else path)
    if rec is None:
        return f"{path.name}: its stored outputs carry no record of the code that produced them; {fix}"
    if not rec.get("gpu"):
        return f"{path.name}: its stored outputs come from a run without a GPU ({rec.get('date', '?')}); {fix}"
    now = source_digests(chapter_sources(path))
    then = rec.get("files", {})
    changed = sorted(f for f in now if f in then and now[f] != then[f])
    # A recorded file that still exists but is no longer a source of this
    # chapter (the rule that finds sources was refined) changes nothing it shows.
    added, gone = sorted(set(now) - set(then)), sorted(f for f in set(then) - set(now) if not (ROOT / f).exists())
    # A file that moved with its bytes unchanged (a new file with a gone file's digest) changes nothing it shows.
    moved = {now[f] for f in added} & {then[f] for f in gone}
    added, gone = [f for f in added if now[f] not in moved], [f for f in gone if then[f] not in moved]
    if not (changed or added or gone):
        return None
    parts = [f"changed: {', '.join(changed)}" if changed else "", f"new: {', '.join(added)}" if added else "",
             f"gone: {', '.join(gone)}" if gone else ""]
    return (f"{path.name}: its stored outputs come from older sources than those it measures "
            f"(executed {rec.get('date', '?')[:10]} on {rec['gpu']}, commit {rec.get('commit') or 'unknown'}; "
            f"{'; '.join(p for p in parts if p)}); {fix}")


def all_chapters() -> list[Path]:
    return sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
