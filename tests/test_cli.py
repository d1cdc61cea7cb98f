"""The `mla-lab` command as a newcomer meets it: help, errors, and what it does without a GPU."""

import json
import shutil

import pytest
import torch

from mla_lab import cli
from mla_lab.core import extension, verify
from mla_lab.core.extension import ROOT
from mla_lab.core.validate import InputError

NAMES = [c.name for c in cli.COMMANDS]


def run(capsys, *argv):
    """(exit status, stdout, stderr) of `mla-lab argv...`, whether it returns or exits."""
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (print(e.code) or 1)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def nothing_builds(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("help must not build the extension")

    monkeypatch.setattr(extension, "load", refuse)


def test_top_level_help_lists_every_command(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for c in cli.COMMANDS:
        assert c.name in out and c.summary.split()[0] in out
    assert "mla-lab bench --quick" in out


def test_no_command_prints_help_and_fails(capsys):
    rc, _, err = run(capsys)
    assert rc == 2 and "commands:" in err


def test_unknown_command_says_so(capsys):
    rc, _, err = run(capsys, "benchmark")
    assert rc == 2
    assert f"mla-lab: unknown command 'benchmark'; the commands are {', '.join(NAMES)}" in err


@pytest.mark.parametrize("argv", [[n] for n in NAMES] + [["chapters", "execute"]], ids=lambda a: "-".join(a))
def test_every_command_has_real_help(capsys, nothing_builds, argv):
    rc, out, _ = run(capsys, *argv, "--help")
    assert rc == 0
    assert out.startswith(f"usage: mla-lab {' '.join(argv)}")
    assert "examples:" in out and "options:" in out
    body = out.split("\n\n", 2)[1]  # the description: a sentence, not just the usage line
    assert len(body.split()) >= 8, body


def test_build_help_does_not_build(capsys, nothing_builds):
    rc, out, _ = run(capsys, "build", "--help")
    assert rc == 0 and "--verbose" in out


@pytest.mark.parametrize("argv", [["sweep"], ["kernel-times"], ["profile-target", "tensor_core", "1", "9", "8", "64"]],
                         ids=lambda a: a[0])
def test_gpu_commands_refuse_without_a_gpu(capsys, no_gpu, nothing_builds, argv):
    rc, out, err = run(capsys, *argv)
    assert rc == 1
    assert f"mla-lab {argv[0]}: needs a CUDA GPU, and this machine has none" in out + err


def test_sweep_refuses_a_stage_without_splits(capsys, monkeypatch):
    from mla_lab.book import explore

    monkeypatch.setattr(explore, "_require_gpu", lambda what: None)
    rc, out, err = run(capsys, "sweep", "--stages", "naive")
    assert rc == 1 and "stage naive does not split the keys" in out + err


# ---- verify without a GPU --------------------------------------------------------------

def test_verify_without_gpu_names_what_it_skips(capsys, no_gpu, monkeypatch):
    calls = []
    monkeypatch.setattr(verify, "verify_attention", lambda *a, **k: calls.append((a, k)) or [])
    rc, out, _ = run(capsys, "verify", "--stages", "float4", "tensor_core", "--quick")
    assert rc == 1 and calls == []
    assert "No CUDA GPU here: the CUDA stages cannot run. Skipped: float4 tensor_core." in out
    assert "Ignored here: --quick" in out
    assert "only the Triton baseline runs here (--stages triton)" in out
    rc, out, _ = run(capsys, "verify")
    assert rc == 0 and len(calls) == 1
    (args, kw), = calls
    assert args[0] == "triton" and kw["device"] == "cpu"
    assert "Skipped: naive flash_ht8" in out and "Verifying the Triton baseline on the CPU grid" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="what verify_attention does without a GPU")
def test_verify_attention_on_cpu():
    from mla_lab import verify_attention
    from mla_lab.core.problem import Problem

    checks = verify_attention("triton", [Problem(streams=2, q_len=3, heads=2, prefix=(5, 17), page_size=4)])
    assert len(checks) == 1 and checks[0].ok
    with pytest.raises(InputError, match="stage 'float4' is a CUDA kernel and runs on a GPU only"):
        verify_attention("float4")
    with pytest.raises(InputError, match="this machine has no CUDA GPU; pass device='cpu' to check stage 'triton'"):
        verify_attention("triton", device="cuda")


# ---- chapters execute ----------------------------------------------------------------

def test_chapters_execute_refuses_without_gpu(capsys, no_gpu, monkeypatch):
    import mla_lab.book.chapters as chapters

    monkeypatch.setattr(chapters, "execute", lambda *a, **k: pytest.fail("executed without a GPU"))
    rc, _, err = run(capsys, "chapters", "execute")
    assert rc == 1 and "no CUDA GPU here" in err and "--force" in err


def test_chapters_execute_force_stamps_a_cpu_run(capsys, no_gpu, monkeypatch, tmp_path):
    import mla_lab.book.chapters as chapters
    from mla_lab.measure import provenance

    nb = tmp_path / "03_kv_split.ipynb"
    shutil.copy(ROOT / "chapters" / "03_kv_split.ipynb", nb)
    ran = []
    monkeypatch.setattr(chapters, "execute", lambda paths, timeout: ran.append((paths, timeout)) or 0)
    rc, out, _ = run(capsys, "chapters", "execute", "--force", "--timeout", "60", str(nb))
    assert rc == 0 and ran == [([str(nb)], 60)]
    assert json.loads(nb.read_text())["metadata"]["mla_lab"]["provenance"]["gpu"] is None
    assert "from a run without a GPU" in provenance.chapter_staleness(nb)
    assert "executed without a GPU" in out


def test_chapters_execute_reports_failures(capsys, monkeypatch, tmp_path):
    import mla_lab.book.chapters as chapters

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    nbs = []
    for name in ("01_naive.ipynb", "02_flash_ht8.ipynb"):
        shutil.copy(ROOT / "chapters" / name, tmp_path / name)
        nbs.append(str(tmp_path / name))
    before = (tmp_path / "02_flash_ht8.ipynb").read_text()
    monkeypatch.setattr(chapters, "execute", lambda paths, timeout: 1 if "02_" in paths[0] else 0)
    rc, out, _ = run(capsys, "chapters", "execute", *nbs)
    assert rc == 1 and "1 of 2 chapters failed: 02_flash_ht8.ipynb" in out
    stamped = json.loads((tmp_path / "01_naive.ipynb").read_text())["metadata"]["mla_lab"]["provenance"]
    assert stamped["gpu"] == "NVIDIA H200"
    assert (tmp_path / "02_flash_ht8.ipynb").read_text() == before  # a failed chapter is not stamped
