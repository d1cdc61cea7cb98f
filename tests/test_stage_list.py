"""One stage list: the Python registry (mla_lab/core/stages.py) against the C++ one (csrc/stage_list.h),
read as text and as compiled, and what adding a stage takes."""

import re

import pytest

from mla_lab.core import stages
from mla_lab.core.extension import CSRC, STAGE_FIELDS, _macro_arguments, declared_stages

CUDA = stages.cuda_stages()
COMPARED = ("id", "splits", "align_bytes", "min_cc", "max_cc")


def registry_row(st):
    return {k: getattr(st, k) for k in COMPARED}


def test_header_lists_the_registry_cuda_stages_in_order():
    declared = declared_stages()
    assert [d["id"] for d in declared] == [s.id for s in CUDA]
    for d, st in zip(declared, CUDA):
        assert {k: d[k] for k in COMPARED} == registry_row(st), st.id


def test_hints_say_what_to_do():
    for d in declared_stages():
        if d["align_bytes"] > 4:
            assert "use stage" in d["input_hint"] and f"{d['align_bytes']}-byte" in d["input_hint"], d["id"]
        if d["min_cc"] or d["max_cc"]:
            assert "use stage" in d["gpu_hint"], d["id"]
        else:
            assert d["gpu_hint"] == "", d["id"]


def test_compiled_table_equals_the_registry(ext):
    compiled = list(ext.stage_table())
    assert list(ext.stage_ids()) == [row["id"] for row in compiled] == [s.id for s in CUDA]
    for row, st in zip(compiled, CUDA):
        assert {k: row[k] for k in COMPARED} == registry_row(st), st.id
        # the kernels one call launches, in order, as the stage's own <id>_kernels() lists them
        assert tuple(row["kernels"]) == st.kernels, st.id


@pytest.mark.parametrize("cc", [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)])
def test_gpu_support_agrees_with_runs_on(ext, cc):
    for st in CUDA:
        said = ext.gpu_support(st.id, *cc)
        assert (said == "") == st.runs_on(*cc), (st.id, cc, said)


def test_gpu_refusal_message(ext):
    msg = ext.gpu_support("tensor_core", 7, 5)
    assert msg == ("mla_lab::tensor_core: needs a GPU of compute capability 8.0 or newer, and this one is 7.5: "
                   "it uses cp.async, ldmatrix and bf16 mma.sync; use stage shared_rows there")
    assert ext.gpu_support("naive", 5, 0) == ""
    with pytest.raises(RuntimeError, match="no stage named 'nope'"):
        ext.gpu_support("nope", 9, 0)


def test_runs_on_bounds():
    only_hopper = stages.Stage("x", 99, "", "", "", "cuda", min_cc=90, max_cc=90)
    assert [only_hopper.runs_on(*cc) for cc in ((8, 9), (9, 0), (10, 0), (12, 0))] == [False, True, False, False]
    up_to = stages.Stage("x", 99, "", "", "", "cuda", max_cc=89)
    assert [up_to.runs_on(*cc) for cc in ((7, 0), (8, 9), (9, 0))] == [True, True, False]
    assert stages.get("triton").runs_on(7, 0) and stages.get("naive").runs_on(5, 0)
    assert not stages.get("tensor_core").runs_on(7, 5) and stages.get("tensor_core").runs_on(12, 0)


# ---- what adding a stage touches ----------------------------------------------------

def test_every_stage_file_is_a_registry_stage_and_defines_its_two_functions():
    files = sorted(p.name for p in CSRC.glob("stage[0-9][0-9]_*.cu"))
    assert files == sorted(s.source for s in CUDA), "a kernel file without a registry entry, or the reverse"
    for st in CUDA:
        text = (CSRC / st.source).read_text()
        assert re.search(rf"\bcudaError_t {st.id}_launch\(const MlaParams& p, cudaStream_t stream\)", text), st.id
        assert re.search(rf"\bint {st.id}_kernels\(const KernelHandle\*\* handles\)", text), st.id


def test_bindings_name_no_stage():
    """bindings.cpp takes its stages from stage_list.h only: no stage id appears in it as a word."""
    text = re.sub(r"//[^\n]*", "", (CSRC / "bindings.cpp").read_text())
    assert [s.id for s in CUDA if re.search(rf"\b{s.id}\b", text)] == []
    # by index, only the float4 probe, which is float4's reads checked by float4's argument rules
    assert re.findall(r"kStage_(\w+)", text) == ["float4"]


# ---- the header reader ----------------------------------------------------------------

def test_macro_arguments_respect_strings_and_parentheses():
    text = 'MLA_STAGE(a, 1, f(2, 3), "x, (y" "z\\"", "")'
    args, end = _macro_arguments(text, text.index("("))
    assert args == ["a", "1", "f(2, 3)", '"x, (y" "z\\""', '""'] and end == len(text)


def test_declared_stages_reads_a_synthetic_list(tmp_path):
    header = tmp_path / "stage_list.h"
    header.write_text('// MLA_STAGE(in_a_comment, 0, 4, 0, 0, "", "")\n'
                      'MLA_STAGE(alpha, 0, 4, 0, 0, "", "")\n'
                      'MLA_STAGE(beta, 1, 16, 90, 90,\n          "two " "parts, joined",\n          "sm_90a only")\n')
    assert declared_stages(header) == [
        dict(id="alpha", splits=False, align_bytes=4, min_cc=0, max_cc=0, input_hint="", gpu_hint=""),
        dict(id="beta", splits=True, align_bytes=16, min_cc=90, max_cc=90, input_hint="two parts, joined",
             gpu_hint="sm_90a only"),
    ]
    header.write_text('MLA_STAGE(gamma, 0, 4, 0, "", "")\n')
    with pytest.raises(ValueError, match=rf"MLA_STAGE takes {len(STAGE_FIELDS)} arguments"):
        declared_stages(header)
