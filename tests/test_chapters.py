"""The chapters as a book: conclusions checked in compared cells, predictions before measurements,
only earlier stages listed, self-contained text; and the helpers the chapters call (chapters.py)."""

import json
import re

import pytest

from mla_lab.book import chapters as ch
from mla_lab.measure import roofline
from mla_lab.core import stages
from mla_lab.core.problem import Problem

NOTEBOOKS = sorted(ch.CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
IGNORED = "NBVAL_IGNORE_OUTPUT"
COMPARED_SHARE = 0.60
ARTICLE_LAST_STAGE = "float4"  # the article's path ends here; chapter 00's map lists it


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _code(path):
    return [c for c in _cells(path) if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def _source(cell):
    return "".join(cell["source"])


def _with_output(path):
    """Code cells that show something: those with stored outputs; in a notebook stored without any
    outputs (cleared, waiting to be executed on a GPU), every code cell, since each chapter cell prints."""
    code = _code(path)
    if not any(c.get("outputs") for c in code):
        return code
    return [c for c in code if c.get("outputs")]


def _compared(cells):
    return [c for c in cells if IGNORED not in _source(c) and "NBVAL_SKIP" not in _source(c)]


def _number(path) -> int:
    return int(path.name[:2])


def test_there_are_chapters():
    assert [p.name[:2] for p in NOTEBOOKS][:7] == ["00", "01", "02", "03", "04", "05", "06"]


def test_every_chapter_of_the_map_is_a_notebook():
    """One notebook per chapter the registry lists (a stage's and those without one), and no other."""
    assert [p.name for p in NOTEBOOKS] == [notebook for _, _, notebook, _ in stages.chapter_map()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_most_cells_with_output_are_compared(path):
    cells = _with_output(path)
    share = len(_compared(cells)) / len(cells)
    assert share >= COMPARED_SHARE, f"{path.name}: {len(_compared(cells))} of {len(cells)} cells compared"


def test_most_cells_with_output_are_compared_over_the_book():
    cells = [c for p in NOTEBOOKS for c in _with_output(p)]
    assert len(_compared(cells)) / len(cells) >= COMPARED_SHARE


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_conclusions_are_compared(path):
    """A cell that prints a verdict is compared: a conclusion that flips must fail nbval."""
    for c in _code(path):
        src = _source(c)
        if "ch.verdict(" in src or "article.verdicts(" in src:
            assert IGNORED not in src, f"{path.name}: a verdict cell is not compared:\n{src[:300]}"


MEASURING = [p for p in NOTEBOOKS if any("results_for(" in _source(c) for c in _code(p))]


@pytest.mark.parametrize("path", MEASURING, ids=lambda p: p.stem)
def test_predict_then_measure(path):
    """A prediction in numbers (a compared cell that prints one) before the first measurement,
    and a compared verdict on the measurements after it."""
    cells = [c for c in _cells(path) if c["cell_type"] == "code"]
    first = next(i for i, c in enumerate(cells) if "results_for(" in _source(c))
    before, after = cells[:first], cells[first:]
    assert any("prediction" in _source(c).lower() and IGNORED not in _source(c) for c in before), \
        f"{path.name}: no compared cell states a prediction before the first measurement"
    assert any("ch.verdict(" in _source(c) for c in _compared(after)), \
        f"{path.name}: no compared verdict after the measurements"


def _stage_ids_later_than(path):
    own = _number(path)
    allowed = set(ch.stages_upto(ARTICLE_LAST_STAGE)) if own == 0 else {s.id for s in stages.STAGES if s.number <= own}
    return [s.id for s in stages.STAGES if s.id not in allowed]


# Stored outputs that may name a later stage, and why: neither changes when a stage is added after them.
NAMED_ON_PURPOSE = {
    # the article's 70 KB is for the head-tile layout that stages 2 and 3 share; the claim's label names both
    "02_flash_ht8": lambda text: "(flash_ht8, kv_split)" in text,
    # chapter 7 measures the 61-layer step with the fastest stage of the registry (the article's end-to-end
    # claim is about the best kernel); its timing cells, not compared by nbval, name the stage they ran
    "07_cuda_graphs": lambda text: "step " in text,
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_chapter_lists_no_later_stage(path):
    """A new stage never changes an earlier chapter's stored outputs: no chapter's code names a later
    stage, and no stored output shows one (but for the two uses in NAMED_ON_PURPOSE)."""
    later = _stage_ids_later_than(path)
    on_purpose = NAMED_ON_PURPOSE.get(path.stem, lambda text: False)
    for c in _code(path):
        src = _source(c)
        for sid in later:
            assert not re.search(rf"[\"']{sid}[\"']", src), f"{path.name} names the later stage {sid}:\n{src[:300]}"
        assert "print_occupancy(" not in src or "stage_ids=" in src, f"{path.name}: an occupancy table of every stage"
        for out in c.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            for line in text.splitlines():
                if on_purpose(line):
                    continue
                for sid in later:
                    # a folder of that name (csrc/hopper/, the pieces the Hopper stages share) is no stage
                    assert not re.search(rf"\b{sid}\b(?!/)", line), f"{path.name}: stored output shows the later stage {sid}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_text_is_self_contained(path):
    text = path.read_text()
    for cell in _cells(path):
        src = _source(cell)
        assert not re.search(r"\b[Ii]ssue \d", src), f"{path.name}: refers to an issue"
        assert "workplace" not in src and "/work/" not in src and "shared/" not in src, path.name
    assert "measured while developing" not in text


# ---- the helpers -----------------------------------------------------------------

REC = [
    dict(stage="a", streams=1, q_len=9, heads=8, prefix=256, page_size=1, scattered=True, us_graph=10.0),
    dict(stage="b", streams=1, q_len=9, heads=8, prefix=256, page_size=1, scattered=True, us_graph=30.0),
    dict(stage="a", streams=1, q_len=9, heads=8, prefix=4096, page_size=1, scattered=True, us_graph=20.0),
    dict(stage="b", streams=1, q_len=9, heads=8, prefix=4096, page_size=1, scattered=True, us_graph=10.0),
    dict(stage="a", streams=1, q_len=9, heads=64, prefix=4096, page_size=1, scattered=True, unsupported="too big"),
    dict(stage="b", streams=1, q_len=9, heads=64, prefix=4096, page_size=1, scattered=True, us_graph=10.0),
]


def test_speedups_ratio_and_time():
    assert ch.speedups(REC, "a", "b") == {(8, 256): 3.0, (8, 4096): 0.5}  # H64: a cannot run there
    assert ch.speedups(REC, "a", "b", min_prefix=1024) == {(8, 4096): 0.5}
    assert ch.speedups(REC, "a", "b", heads=64) == {}
    assert ch.ratio(REC, "a", "b", heads=8, prefix=256) == 3.0
    assert ch.time_us(REC, "a", heads=64, prefix=4096) is None and ch.time_us(REC, "c", heads=8) is None
    twice = REC + [dict(REC[0], streams=8), dict(REC[1], streams=8)]
    with pytest.raises(ValueError, match="narrow them"):
        ch.speedups(twice, "a", "b")
    assert ch.speedups(twice, "a", "b", streams=8) == {(8, 256): 3.0}


def test_verdicts_never_pass_on_nothing(capsys):
    assert ch.every({}, lambda x: True) is None and ch.every([], lambda x: True) is None
    assert ch.every({1: 2.0, 2: 3.0}, lambda x: x > 1) is True and ch.every([2.0, 0.5], lambda x: x > 1) is False
    ch.verdict("a holds", True)
    ch.verdict("b holds", ch.every([], lambda x: x > 1))
    ch.verdict("c holds", False)
    assert capsys.readouterr().out.splitlines() == ["a holds: True", "b holds: not measured", "c holds: False"]


def test_stages_upto():
    assert ch.stages_upto("triton") == ["triton"]
    assert ch.stages_upto("per_head") == ["triton", "naive", "flash_ht8", "kv_split", "per_head"]
    assert ch.stages_upto(stages.STAGES[-1].id) == [s.id for s in stages.STAGES]


def test_floor_from_ceilings():
    p = Problem(streams=1, q_len=9, heads=8, prefix=16384)
    measured = dict(copy_tbs=4.0, bf16_matmul_tflops=700.0, fp32_matmul_tflops=50.0)
    spec = roofline.DEVICES["h200"]
    a = ch.floor_from_ceilings(p, measured, spec)
    b = roofline.floor(p, spec, bandwidth=4.0e12, matrix_rate=700e12)
    assert a == b
    # a GPU the device table lacks: the measured fp32 rate, not another GPU's datasheet
    c = ch.floor_from_ceilings(p, measured, None)
    assert c.cuda_core_us == pytest.approx(roofline.flops(p) / 50e12 * 1e6)
    assert (c.memory_us, c.compute_us) == (a.memory_us, a.compute_us)


def test_show_lines_says_when_a_marker_is_gone():
    with pytest.raises(ValueError, match="no line containing"):
        ch.show_lines("naive", "no such line in the kernel")
    with pytest.raises(ValueError, match="no line containing"):
        ch.show_lines("naive", "__global__", "no such end marker")


def test_sass_instruction_mix():
    if ch.cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's copy)")
    mix = ch.sass_instruction_mix("float4", "9.0")
    assert ch.count_opcodes(mix, "FFMA") > 0 and ch.count_opcodes(mix, "LDG.E.128") > 0
    assert ch.count_opcodes(mix, "FFMA", "LDG") == ch.count_opcodes(mix, "FFMA") + ch.count_opcodes(mix, "LDG")
    assert sum(ch.sass_memory_ops("float4", "9.0").values()) <= sum(mix.values())


def test_the_product_names_no_issue_and_no_file_outside_it():
    """Text a reader of the repository can follow: no issue numbers, no paths outside the repository."""
    root = ch.ROOT
    files = [root / "README.md"] + [p for d in ("mla_lab", "csrc", "chapters", "tests", "scripts", "docs")
                                    for p in sorted((root / d).rglob("*")) if p.is_file()]
    me = root / "tests" / "test_chapters.py"
    for path in files:
        if path == me or path.suffix not in (".py", ".cu", ".cuh", ".h", ".cpp", ".ipynb", ".md", ".sh", ".cfg"):
            continue
        text = path.read_text(errors="replace")
        assert not re.search(r"\b[Ii]ssue \d", text), f"{path.relative_to(root)} refers to an issue by number"
        for outside in ("/work/", "shared/anchors", "shared/seed", "this workplace"):
            assert outside not in text, f"{path.relative_to(root)} names {outside!r}, outside the repository"


def test_read_profile(tmp_path, monkeypatch):
    """A recorded Nsight Compute report, read kernel by kernel: its table rows and its stall advice."""
    from mla_lab.book import display as chapter_display

    (tmp_path / "gpu-stage-B1.txt").write_text(
        "[1] python3\n"
        "  void mla::plan_kernel(MlaParams) (1, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
        "    Compute (SM) Throughput           %         1.50\n"
        "  void mla::main_kernel(MlaParams) (132, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
        "    Compute (SM) Throughput           %        35.20\n"
        "    Elapsed Cycles                cycle      415,857\n"
        "    Issued Warp Per Scheduler                        0.36\n"
        "    Memory Throughput                 %        54.28\n"
        "    Memory Throughput           Gbyte/s        68.24\n"
        "    smsp__pcsamp_warps_issue_stalled_wait        14.5\n"
        "    OPT   Est. Speedup: 39.58%\n"
        "          On average, each warp of this workload spends 2.8 cycles being stalled waiting for a barrier\n"
        "          to be released. This stall type represents about 39.6% of the total average of 7.0 cycles\n")
    monkeypatch.setattr(chapter_display, "PROFILES", tmp_path)
    p = ch.read_profile("*stage-B1*", "main_kernel")
    assert p.metrics["Compute (SM) Throughput"] == 35.2 and p.metrics["Elapsed Cycles"] == 415857
    assert p.metrics["Issued Warp Per Scheduler"] == 0.36 and p.metrics["Memory Throughput"] == 54.28
    assert p.stall_metrics() == {"smsp__pcsamp_warps_issue_stalled_wait": 14.5}
    assert p.stalls == [("waiting for a barrier to be released", 39.6)]
    assert ch.read_profile("*stage-B1*", "plan_kernel").metrics == {"Compute (SM) Throughput": 1.5}
    assert ch.read_profile("*stage-B1*", "combine_kernel") is None and ch.read_profile("*nothing*", "x") is None
    # a templated kernel (FlashMLA's) is found by its name
    (tmp_path / "gpu-peer-B1.txt").write_text(
        "  void flash_fwd_kernel<Traits<cutlass::bfloat16_t>, TmaParams<cute::tuple<int, int>>>(Params, T2) "
        "(9, 1, 14)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n"
        "    Elapsed Cycles                cycle      421,360\n")
    assert ch.read_profile("*peer-B1*", "flash_fwd_kernel").metrics == {"Elapsed Cycles": 421360}


def test_kept_measurement(tmp_path, monkeypatch):
    """A chapter's own measurement: taken and kept on a GPU, read back without one, None if never kept."""
    from mla_lab.book import measure as chapter_measure

    monkeypatch.setattr(chapter_measure, "CHAPTER_RESULTS", tmp_path)
    monkeypatch.setattr(chapter_measure, "GPU", False)
    value, said = ch.kept_measurement("10_x", "ablation", lambda: pytest.fail("measured without a GPU"))
    assert value is None and "holds no 'ablation'" in said
    monkeypatch.setattr(chapter_measure, "GPU", True)
    monkeypatch.setattr(chapter_measure.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    value, said = ch.kept_measurement("10_x", "ablation", lambda: [{"on": 30.5, "off": 33.0}])
    assert value == [{"on": 30.5, "off": 33.0}] and said.startswith("measured now on NVIDIA H200")
    monkeypatch.setattr(chapter_measure, "GPU", False)
    value, said = ch.kept_measurement("10_x", "ablation", lambda: pytest.fail("measured without a GPU"))
    assert value == [{"on": 30.5, "off": 33.0}] and said.startswith("recorded on NVIDIA H200 on ")
    assert " at commit " in said and "by executing this chapter" in said


def test_part_iiis_experiments_are_compiled_side_by_side_before_it_runs_on_hopper(monkeypatch):
    """`mla-lab chapters execute` compiles every experiment file and probe Part III loads first, in parallel, and
    only for Part III's chapters and appendix."""
    from mla_lab.book import experiments, load_rate, wgmma_rate

    built = []
    monkeypatch.setattr(experiments, "load", lambda name: built.append(name))
    monkeypatch.setattr(load_rate, "load", lambda: built.append("load_rate"))
    monkeypatch.setattr(wgmma_rate, "load", lambda: built.append("wgmma_rate"))
    monkeypatch.setattr(ch, "hopper_here", lambda: True)
    assert ch.prebuild_for([ch.CHAPTERS / "09_tensor_cores.ipynb"]) == 0 and built == []
    part3 = sorted(ch.CHAPTERS.glob("1[0-3]_*.ipynb")) + [ch.CHAPTERS / ch.HOPPER_APPENDIX]
    for path in part3:
        built.clear()
        n = ch.prebuild_for([path])
        assert sorted(built) == sorted([*experiments.FILES, "load_rate", "wgmma_rate"]) and n == len(built)
    # every experiment the cells name is one of them
    src = "".join("".join(c["source"]) for p in part3 for c in json.loads(p.read_text())["cells"]
                  if c["cell_type"] == "code")
    named = set(re.findall(r"(?:experiments|ex)\.(?:runner|build|main_sass|sass_counts|hgmma_shapes)\(\"(\w+)\"", src))
    assert named and named <= set(experiments.EXPERIMENTS) | set(experiments.FILES) | {
        "wgmma", "tensor_copy", "seesaw", "hopper"}, named - set(experiments.EXPERIMENTS)
    monkeypatch.setattr(ch, "hopper_here", lambda: False)  # no Hopper GPU: the chapters show recorded results
    built.clear()
    assert ch.prebuild_for(part3) == 0 and built == []
