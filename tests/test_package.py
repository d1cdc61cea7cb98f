"""The package as a newcomer meets it: what importing costs, and the README's raw-op line on its own."""

import ast
import os
import subprocess
import sys

from mla_lab.core.extension import ROOT

PACKAGE = ROOT / "mla_lab"


def _imports(path):
    """Modules a file imports, at any depth (inside functions too), relative ones as '.name'."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.add(base)
            if node.level and not node.module:
                found.update("." + a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_extension_does_not_import_ops():
    """core/extension.py builds and loads; core/ops.py calls it.  The reverse import made a circle."""
    assert not {".ops", "mla_lab.core.ops"} & _imports(PACKAGE / "core" / "extension.py")


def _run(code):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)


def test_importing_the_package_builds_nothing():
    done = _run("import sys, mla_lab, mla_lab.core.ops, mla_lab.core.stages, mla_lab.flash_mla\n"
                "print(sorted(m for m in sys.modules if m.startswith(('mla_lab_C', 'triton'))))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_readme_raw_op_line_works_on_its_own(ext):
    """A fresh interpreter: import mla_lab, load_ops(), then the raw op; CPU tensors reach the op's own checks."""
    code = """
import torch, mla_lab
from mla_lab.core.problem import Problem, make_workload
w = make_workload(Problem(streams=1, q_len=2, heads=1, prefix=3, page_size=1), seed=0)
out, lse = w.new_outputs()
mla_lab.load_ops()
try:
    torch.ops.mla_lab.tensor_core(w.q, w.kv_cache, w.block_table, w.kv_lens, w.scale, 4, out, lse)
except RuntimeError as e:
    print(str(e).splitlines()[0])
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("mla_lab::tensor_core: runs on CUDA tensors; got tensors on cpu")


def test_readme_documents_load_ops():
    readme = (ROOT / "docs" / "using.md").read_text()
    at = readme.index("torch.ops.mla_lab.tensor_core(")
    assert "mla_lab.load_ops()" in readme[:at], "docs/using.md must load the ops before its raw-op line"


def test_no_committed_file_is_ignored():
    """.gitignore names only what is never committed (results/ is committed, for one)."""
    import shutil

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        import pytest

        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-from=.gitignore"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed == []


def test_license_is_an_spdx_expression():
    import re

    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license = "MIT"$', text, re.M)
    # setuptools reads an SPDX string from 77 on (older ones want the deprecated table)
    (least,) = re.findall(r'^requires = \["setuptools>=(\d+)', text, re.M)
    assert int(least) >= 77
