"""The README's API sections and docs/api.md against the code: the examples run on the CPU as far as a CPU
can take them (their imports, the error that names what runs without a GPU, the Triton baseline in its
interpreter), and the architecture table is the registry's."""

import re

import pytest
import torch

import mla_lab
from mla_lab.book import readme
from mla_lab.core import stages
from mla_lab.core.extension import ROOT, SUPPORTED_ARCHS
from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.validate import InputError

README = (ROOT / "docs" / "using.md").read_text()  # the README's "Read more" points here
API = ROOT / "docs" / "api.md"


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_api_sections_are_there_and_link_the_reference():
    for title in ("Using the kernels", "A FlashMLA drop-in", "Which GPUs"):
        section(title)
    assert "](api.md)" in section("Using the kernels") and API.is_file()
    assert "[docs/using.md](docs/using.md)" in (ROOT / "README.md").read_text()
    api = API.read_text()
    for name in ("attention", "reference_attention", "verify_attention", "load_ops", "VerifyStep", "VerifySteps",
                 "make_workload", "Problem", "STAGES", "get_mla_metadata", "flash_mla_with_kvcache", "PageTable"):
        assert f"{name}" in api, name
    from mla_lab.flash_mla import flash_mla_with_kvcache

    for documented in (mla_lab, mla_lab.attention, mla_lab.VerifyStep, flash_mla_with_kvcache):
        assert "CPU" in documented.__doc__, documented


# ---- "Using the kernels": what runs on a CPU, and the one error for the rest ------------------------

def _workload():
    return make_workload(Problem(streams=2, q_len=3, heads=4, prefix=(5, 20), page_size=16), "cpu", seed=3)


def test_the_cpu_calls_the_readme_names_run():
    ns = {}
    exec(code_blocks(section("Using the kernels"))[0].splitlines()[2], ns)  # the import line
    w = _workload()
    ref_out, ref_lse = ns["reference_attention"](*w.args())
    out, lse = ns["attention"]("triton", *w.args())
    assert out.shape == (2, 3, 4, 512) and lse.shape == (2, 3, 4)
    assert ((out.float() - ref_out).norm() / ref_out.norm()).item() < 1e-2
    assert (lse - ref_lse).abs().max().item() < 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the errors a machine without a GPU gives")
def test_what_needs_a_gpu_raises_one_error_naming_what_runs_without_one():
    w = _workload()
    with pytest.raises(InputError) as e:
        mla_lab.attention("tensor_core", *w.args())
    assert "stage 'triton' runs in Triton's interpreter and mla_lab.reference_attention" in str(e.value)
    for stage, graph in (("tensor_core", False), ("triton", True)):
        with pytest.raises(InputError) as e:
            mla_lab.VerifyStep(stage, w.kv_cache, streams=2, q_len=3, heads=4, max_pages=4, graph=graph)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("VerifyStep ")
        assert "needs kv_cache on a CUDA GPU, got it on cpu" in msg
        assert "VerifyStep(\"triton\", ..., graph=False)" in msg and "mla_lab.reference_attention" in msg
    steps = mla_lab.VerifySteps("tensor_core", w.kv_cache, q_len=3, heads=4)
    with pytest.raises(InputError, match="needs kv_cache on a CUDA GPU"):
        steps(w.q, w.block_table, w.kv_lens)


# ---- "A FlashMLA drop-in": both examples, as far as a CPU takes them ---------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's path through the README's example")
def test_the_drop_in_example_runs_to_the_cpu_error_and_with_triton_gives_its_shapes():
    example = code_blocks(section("A FlashMLA drop-in"))[0]
    assert "from mla_lab.flash_mla import get_mla_metadata, flash_mla_with_kvcache" in example
    assert len(example.strip().splitlines()) <= 12
    on_cpu = example.replace('device="cuda"', 'device="cpu"')
    with pytest.raises(InputError, match=r"mla_lab.flash_mla: the CUDA stages need tensors on a CUDA GPU, got q on "
                                         r"cpu\. Without a GPU, mla_lab.reference_attention"):
        exec(on_cpu, {})
    ns = {}
    exec(on_cpu.replace("causal=True)", 'causal=True, stage="triton")'), ns)
    shapes = re.search(r"# \((\d+), (\d+), (\d+), (\d+)\), \((\d+), (\d+), (\d+)\)", example).groups()
    assert tuple(ns["out"].shape) == tuple(map(int, shapes[:4])) and ns["out"].dtype == torch.bfloat16
    assert tuple(ns["lse"].shape) == tuple(map(int, shapes[4:])) and ns["lse"].dtype == torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's path through the README's example")
def test_the_serving_example_imports_and_names_what_runs_without_a_gpu():
    ns = {}
    exec(code_blocks(section("A FlashMLA drop-in"))[1], ns)
    w = _workload()
    with pytest.raises(InputError, match="get_mla_metadata: the CUDA stages need tensors on a CUDA GPU, got "
                                         "cache_seqlens on cpu"):
        ns["build_decode_metadata"](w.kv_lens, 3, 4)
    with pytest.raises(InputError, match="the CUDA stages need tensors on a CUDA GPU, got q on cpu"):
        ns["forward_decode"](w.q, w.kv_cache, w.block_table, w.kv_lens, (None, None), 0.1)


# ---- "Which GPUs": the registry's table ----------------------------------------------------------------

def test_the_architecture_table_is_the_registry_s():
    block = README[README.index(readme.ARCH_BEGIN) + len(readme.ARCH_BEGIN):README.index(readme.ARCH_END)]
    assert block.strip() == readme.arch_table()  # `python -m mla_lab.book.readme` rewrites it
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.strip().splitlines()[2:]]
    header = [c.strip() for c in block.strip().splitlines()[0].strip("|").split("|")]
    assert [h.split()[0] for h in header[1:-1]] == [f"sm_{a.replace('.', '')}" for a in SUPPORTED_ARCHS]
    by_stage = {r[0].replace("`", ""): r for r in rows}
    for st in stages.STAGES:
        cells = by_stage[st.id][1:len(SUPPORTED_ARCHS) + 1]
        for arch, cell in zip(SUPPORTED_ARCHS, cells):
            runs = not st.is_cuda or st.runs_on(*map(int, arch.split(".")))
            assert cell.startswith("yes") == runs, (st.id, arch, cell)
    assert [c.strip("`") for c in by_stage["mla_lab.flash_mla runs"][1:-1]] == [
        "tensor_core", "tensor_core", "tensor_core", "hopper", "tensor_core"]
    # measured on two Hopper parts so far, as the section says
    measured = {gpu.strip() for r in rows[:-1] for gpu in r[-1].split(",")}
    assert measured <= {"H200", "H100 80GB HBM3", "—"}
    assert "two\nHopper parts so far: an H200 and an H100" in section("Which GPUs")
