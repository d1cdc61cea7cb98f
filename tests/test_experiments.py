"""The experiments (csrc/experiments/): each a Hopper stage with one piece swapped, held to that piece.

The compile-marked tests read the SASS of the stage files and experiment files, compiled for sm_90a on the CPU
(``python -m pytest -m compile``); the GPU tests run the experiments beside the stages on compute capability 9.0.
"""

import difflib
import functools
import re

import pytest
import torch

from mla_lab.book import experiments
from mla_lab.book.experiments import EXPERIMENTS, STAMPING
from mla_lab.core import stages
from mla_lab.core.extension import CSRC
from mla_lab.core.problem import Problem, make_workload
from mla_lab.core.validate import InputError

from conftest import needs_gpu

# The experiments run where the Hopper stages do: compute capability 9.0 (skipped on any other GPU).
sm90_only = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                               reason="the Hopper stages run on compute capability 9.0 only")

HOPPER_STAGES = ("wgmma", "tensor_copy", "seesaw", "hopper")


# ---- the compiled code: one cubin per stage file or experiment file, each kernel's SASS by name ----------------

def _source(where):
    """The file of a stage (its id) or an experiment file (its name)."""
    return experiments.source(where) if where in experiments.FILES else CSRC / stages.get(where).source


@pytest.fixture(scope="module")
def built():
    """Every stage file and experiment file compiled for sm_90a and read (:func:`_kernels`), one per CPU at a time."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(_kernels, HOPPER_STAGES + experiments.FILES))


@pytest.fixture(autouse=True)
def _build_first(request):
    if request.node.get_closest_marker("compile"):
        request.getfixturevalue("built")


@functools.lru_cache(maxsize=None)
def _kernels(where) -> dict:
    """Each kernel's SASS (as kernel_sass gives it: its symbol's line, then its body) in a stage's file (``where``:
    its id) or an experiment file, by the kernel's own name."""
    from mla_lab.book.sass import cubin_sass
    from mla_lab.measure.resources import compile_cubin, kernel_name

    text = cubin_sass(compile_cubin(_source(where), "9.0"))
    return {kernel_name(p.splitlines()[0].strip()): p for p in re.split(r"\n\s*Function : ", text)[1:]}


def _where(name):
    """(file, kernel) of an experiment's main kernel, or of a stage's first main kernel; a tuple passes through."""
    if isinstance(name, tuple):
        return name
    if name in EXPERIMENTS:
        return EXPERIMENTS[name].file, EXPERIMENTS[name].kernel
    return name, stages.get(name).kernel


def _sass(name):
    """The SASS of an experiment's main kernel, a stage's first main kernel, or (file or stage id, kernel)."""
    where, kernel = _where(name)
    return _kernels(where)[kernel]


def _counts(name):
    return experiments.work_counts(_sass(name))


def _shapes(name):
    from mla_lab.book.sass import hgmma_shapes

    return hgmma_shapes(_sass(name))


def _mix(name):
    from mla_lab.book.sass import instruction_mix

    return instruction_mix(_sass(name))


def _body(sass_text):
    """A kernel's SASS without its symbol's line, addresses, anonymous-namespace hashes and column padding: one
    kernel compiled in two files compares equal."""
    out = []
    for line in sass_text.splitlines()[1:]:
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)
        line = re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "_ANON_", line)
        line = " ".join(line.split())
        if line:
            out.append(line)
    return out


def _work_counts(sass_text):
    """work_counts of a kernel's SASS, and its stmatrix stores and named-barrier operations."""
    from mla_lab.book.sass import count_opcodes, instruction_mix

    mix = instruction_mix(sass_text)
    return dict(experiments.work_counts(sass_text), STSM=count_opcodes(mix, "STSM"), BAR=count_opcodes(mix, "BAR"))


# ---- the source: what a kernel is built from ----------------------------------------------------------------------

def _pieces(where, kernel):
    """The names in the one statement ``kernel`` runs (``tile_n_block<NoSeesaw, CpAsyncLoader, false>(p, kv)``),
    the file's aliases (``using Boxes = ...;``) spelt out."""
    src = _source(where).read_text()
    m = re.search(rf"__global__ void __launch_bounds__\([^)]*\) {kernel}\([^{{]*\{{\n", src)
    assert m, (where, kernel)
    body = "\n".join(line for line in src[m.end():].splitlines() if not line.lstrip().startswith("#"))
    statement = body[:body.index(";")]
    aliases = dict(re.findall(r"^using (\w+) = ([^;]+);$", src, re.M))
    for _ in range(3):
        statement = re.sub(r"\w+", lambda w: aliases.get(w.group(0), w.group(0)), statement)
    return re.findall(r"\w+", statement)


def _swapped(a, b):
    """What kernel ``a`` is built from in place of kernel ``b``'s pieces (names as :func:`_where` takes them):
    ``[(a's names, b's names)]``, one pair a difference."""
    x, y = _pieces(*_where(a)), _pieces(*_where(b))
    ops = difflib.SequenceMatcher(a=x, b=y, autojunk=False).get_opcodes()
    return [(tuple(x[i1:i2]), tuple(y[j1:j2])) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def _block(src, opening):
    """The text of the braces that follow ``opening`` in ``src``."""
    i = src.index("{", src.index(opening))
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return src[i:j + 1]
    raise ValueError(opening)


def _variants_in(file):
    src = experiments.source(file).read_text()
    table = re.search(r"const char\* const kVariants\[\] = \{(.*?)\};", src, re.S)
    return re.findall(r'"(\w+)"', table[1])


# ---- the table of experiments --------------------------------------------------------------------------------------

def test_every_variant_of_a_file_is_an_experiment_of_that_file():
    for file in experiments.FILES:
        assert _variants_in(file) == [n for n, e in EXPERIMENTS.items() if e.file == file], file
    assert sorted(f.stem for f in (CSRC / "experiments").glob("*.cu")) == sorted(experiments.FILES)
    for e in EXPERIMENTS.values():
        assert e.stage in HOPPER_STAGES and e.stage != "hopper", e.name  # each swaps a piece of stages 10 to 12
        assert (e.stamps is not None) == e.name.endswith("timeline"), e.name
    assert STAMPING == tuple(n for n, e in EXPERIMENTS.items() if e.stamps == "tiles")
    assert experiments.STAGE_OF_BUILD == {"cp_async": "wgmma", "loader_choice": "tensor_copy",
                                          "fill_eighth": "seesaw", "op": "hopper"}


@pytest.mark.compile
def test_every_experiments_kernels_are_in_its_files_sass():
    for e in EXPERIMENTS.values():
        kernels = _kernels(e.file)
        assert e.kernel in kernels, e.name
        assert e.tile_n is None or e.tile_n in kernels, e.name
    for stage in HOPPER_STAGES:
        assert set(stages.get(stage).hopper.kernels) == set(_kernels(stage)), stage


@pytest.mark.compile
def test_main_sass_reads_the_kernel_it_names():
    """main_sass takes an experiment, a stage id or an old build's name, and reads that kernel and no other (the
    experiment timeline's kernel name is the end of pingpong_timeline's)."""
    from mla_lab.measure.resources import kernel_name

    for name, file, kernel in [("timeline", "wgmma_timeline", "timeline_kernel"),
                               ("seesaw", "seesaw_uncrossed", "seesaw_kernel"),  # the experiment, not stage 12
                               ("no_combine", "short_call", "main_kernel"),
                               ("cp_async", "wgmma", "wgmma_kernel"),
                               ("fill_eighth", "seesaw", "seesaw_gather_kernel"),
                               ("op", "hopper", "hopper_kernel")]:
        text = experiments.main_sass(name)
        assert kernel_name(text.splitlines()[0].strip()) == kernel, name
        assert text == _kernels(file)[kernel], name
    assert experiments.sass_counts("no_math") == _counts("no_math")
    assert experiments.hgmma_shapes("rows") == _shapes("rows")
    assert experiments.main_sass("tensor_copy", "tensor_copy_kernel") == _sass(("tensor_copy", "tensor_copy_kernel"))


def test_no_experiment_holds_a_stages_choice_of_kernel():
    """Every experiment runs its variant's kernel on every call (or the seesaw wherever it fits): no file of
    csrc/experiments/ holds a stage's rule or its line for the tensor copy."""
    for f in (CSRC / "experiments").iterdir():
        src = f.read_text()
        for rule in ("tma_pays(", "SeesawAnEighth", "SeesawAThird"):
            assert rule not in src, (f.name, rule)


# ---- stage 10 with its work taken away ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def counts(built):
    names = ["wgmma", "no_copies", "no_math", "neither", "tma", "tma_no_math", "tma_first", "tma_fewer_fences",
             "launch_only", "scheduler_only", "no_combine", "no_q"]
    return {n: _counts(n) for n in names}


@pytest.mark.compile
def test_each_variant_takes_away_what_it_says(counts):
    op = counts["wgmma"]
    assert op["HGMMA"] > 0 and op["LDGSTS"] > 1
    # no math: not one product left; the copies all there
    assert counts["no_math"]["HGMMA"] == 0 and counts["no_math"]["LDGSTS"] == op["LDGSTS"]
    # no copies: every product there; only Q's copy left (one cp.async in its loop)
    assert counts["no_copies"]["HGMMA"] == op["HGMMA"] and counts["no_copies"]["LDGSTS"] == 1
    assert dict(counts["neither"], WAIT=0) == dict(counts["no_copies"], HGMMA=0, WAIT=0)  # no product: none to wait for


def test_the_variants_swap_stage_10s_loader_or_its_math():
    assert _swapped("no_copies", "wgmma") == [(("NoCopiesLoader",), ("CpAsyncLoader",))]
    assert _swapped("no_math", "wgmma") == [(("NoMathParts",), ())]
    assert _swapped("neither", "no_math") == [(("NoCopiesLoader",), ("CpAsyncLoader",))]
    for n in ("no_copies", "no_math", "neither"):
        assert EXPERIMENTS[n].stage == "wgmma" and not EXPERIMENTS[n].right, n


# ---- the tensor-copy loader -------------------------------------------------------------------------------------

@pytest.mark.compile
def test_the_tma_build_copies_keys_by_tma_and_keeps_the_rest(counts):
    tma, op = counts["tma"], counts["wgmma"]
    assert op["UTMALDG"] == 0 and tma["UTMALDG"] > 0  # stage 10's kernel never uses TMA
    assert tma["HGMMA"] == op["HGMMA"]
    assert tma["LDGSTS"] >= op["LDGSTS"]  # the gathers stay, for the tiles TMA cannot copy


def test_the_tma_loaders_are_stage_11s_loader_with_one_piece_swapped():
    stage11 = ("tensor_copy", "tensor_copy_kernel")
    assert _swapped("tma_fewer_fences", stage11) == []  # stage 11's kernel as it is
    assert _swapped("tma", stage11) == [(("false",), ("true",))]  # the fence before every chunk's products
    assert _swapped("tma_first", "tma") == [(("TmaFirstLoader",), ("TmaLoader",))]
    assert _swapped("tma_no_math", "tma") == [(("NoMathParts",), ())]
    assert _swapped("tma_first_no_math", "tma_first") == [(("NoMathParts",), ())]
    assert {EXPERIMENTS[n].stage for n in ("tma", "tma_first", "tma_fewer_fences", "tma_no_math")} == {"tensor_copy"}
    assert EXPERIMENTS["tma"].right and not EXPERIMENTS["tma_no_math"].right


@pytest.mark.compile
def test_the_first_tma_loader_also_copies_by_tma(counts):
    first, tma = counts["tma_first"], counts["tma"]
    assert first["UTMALDG"] > 0 and first["HGMMA"] == counts["wgmma"]["HGMMA"]
    # the first loader issues its boxes from a loop; the other has every box of a chunk written out
    assert first["UTMALDG"] < tma["UTMALDG"]
    assert _body(_sass("tma_first")) != _body(_sass("tma"))


@pytest.mark.compile
def test_the_fewer_fences_build_is_the_tma_build_with_its_fences_chosen(counts):
    # the same products and copies as the TMA build; only whether a chunk's fence runs differs
    assert counts["tma_fewer_fences"] == counts["tma"]
    assert _body(_sass("tma_fewer_fences")) != _body(_sass("tma"))


@pytest.mark.compile
def test_the_tma_loader_alone_is_the_tma_build_without_math(counts):
    alone = counts["tma_no_math"]
    assert alone["HGMMA"] == 0 and alone["UTMALDG"] == counts["tma"]["UTMALDG"]


# ---- the stages' kernels, each the one it freezes ------------------------------------------------------------------

@pytest.mark.compile
def test_each_stage_freezes_the_kernels_of_the_one_before_and_of_its_experiments():
    """Stage 10's kernel is short_call's main_kernel; stage 11's are stage 10's and tma_fewer_fences'; stage 12's two
    seesaw kernels are seesaw_crossed's seesaw_whole and seesaw_cross_boxes kernels, and stage 13's are stage 12's
    (the seesaw kernel is launched only where the seesaw runs: it never asks the rule).  Instruction for
    instruction; the comparison tells two kernels apart."""
    same = [(("wgmma", "wgmma_kernel"), ("short_call", "main_kernel")),
            (("tensor_copy", "tensor_copy_gather_kernel"), ("wgmma", "wgmma_kernel")),
            (("tensor_copy", "tensor_copy_kernel"), ("tensor_copy_loaders", "tma_fewer_fences_kernel")),
            (("seesaw", "seesaw_kernel"), ("seesaw_crossed", "seesaw_whole_kernel")),
            (("seesaw", "seesaw_any_pages_kernel"), ("seesaw_crossed", "seesaw_cross_boxes_kernel")),
            (("hopper", "hopper_seesaw_kernel"), ("seesaw", "seesaw_kernel")),
            (("hopper", "hopper_seesaw_any_pages_kernel"), ("seesaw", "seesaw_any_pages_kernel"))]
    for a, b in same:
        assert _body(_sass(a)) == _body(_sass(b)), (a, b)
    any_pages = _body(_sass(("hopper", "hopper_seesaw_any_pages_kernel")))
    assert any_pages != _body(_sass("seesaw_cross_steps"))
    assert any_pages != _body(_sass(("hopper", "hopper_seesaw_kernel")))
    # stage 11's file has no seesaw kernel; stage 13's has
    assert not any("seesaw" in k for k in _kernels("tensor_copy")) and "hopper_seesaw_kernel" in _kernels("hopper")


@pytest.mark.compile
def test_the_tile_on_n_of_the_stages_with_a_seesaw_does_the_work_of_the_stages_without():
    """Stages 12 and 13's tile on N (gathering, and fed by the tensor copy) do stage 10's and stage 11's work,
    product for product and copy for copy, but are not their kernels: they also work out whether the seesaw runs,
    so that every kernel of a call agrees on its units."""
    for stage, gather, tma in (("seesaw", "seesaw_gather_kernel", "seesaw_tma_kernel"),
                               ("hopper", "hopper_kernel", "hopper_tma_kernel")):
        for mine, theirs in (((stage, gather), ("wgmma", "wgmma_kernel")),
                             ((stage, tma), ("tensor_copy", "tensor_copy_kernel"))):
            a, b = _sass(mine), _sass(theirs)
            assert _work_counts(a) == _work_counts(b), mine
            assert _body(a) != _body(b), mine  # the rule is there
            assert abs(len(_body(a)) - len(_body(b))) < 0.05 * len(_body(b)), mine


def test_stage_11_is_stage_10_with_the_tensor_copy_and_no_seesaw():
    assert _swapped(("tensor_copy", "tensor_copy_gather_kernel"), "wgmma") == []
    assert _swapped(("tensor_copy", "tensor_copy_kernel"), "wgmma") == [(("TmaLoader", "true"),
                                                                          ("CpAsyncLoader", "false"))]
    assert stages.get("tensor_copy").hopper.seesaw is None and stages.get("tensor_copy").hopper.tma
    assert stages.get("wgmma").hopper.tma is None
    # each stage's seesaw kernels, compiled for whole tiles and for any pages, are the stage's own parts
    for stage, prefix in (("seesaw", ""), ("hopper", "hopper_")):
        assert _pieces(stage, f"{prefix}seesaw_kernel") == ["seesaw_block", "SeesawParts", "true", "p", "kv"]
        assert _pieces(stage, f"{prefix}seesaw_any_pages_kernel") == ["seesaw_block", "SeesawParts", "false", "p", "kv"]


@pytest.mark.compile
def test_the_combine_has_four_pieces_in_flight_per_thread():
    import itertools

    # Each of the merge's variants (one slice; four slices in blocks of 256 or of 128 threads) loads four pieces
    # before its first multiply-add; loaded and added one at a time, every load waited for the one before.
    for stage in HOPPER_STAGES:
        kernel = stages.get(stage).hopper.combine
        order = re.findall(r"\b(LDG\.E\.128|FFMA)\b", _sass((stage, kernel)))
        runs = [len(list(run)) for op, run in itertools.groupby(order) if op == "LDG.E.128"]
        assert runs == [4, 4, 4], stage


# ---- a short call taken apart, and stage 10's end as first written -----------------------------------------------

@pytest.mark.compile
def test_the_call_parts_stop_the_main_kernel_where_they_say(counts):
    # stopped before the work: no product and no key copy is left in the main kernel
    for part in ("launch_only", "scheduler_only"):
        assert counts[part]["HGMMA"] == 0 and counts[part]["LDGSTS"] == 0, part
    # no_combine changes only the host's launches: the main kernel is stage 10's
    assert counts["no_combine"] == counts["wgmma"]
    # no_q: the one cp.async of Q's copy loop is gone, every product and key copy is there
    assert counts["no_q"] == dict(counts["wgmma"], LDGSTS=counts["wgmma"]["LDGSTS"] - 1)


def test_the_call_parts_are_stage_10_with_its_end_or_its_q_swapped():
    short = {n for n, e in EXPERIMENTS.items() if e.file == "short_call"}
    assert short == {"launch_only", "scheduler_only", "no_combine", "no_q", "direct_out", "wide_combine",
                     "block_per_pair_merge"}
    assert {EXPERIMENTS[n].stage for n in short} == {"wgmma"}
    for n in ("no_combine", "wide_combine", "block_per_pair_merge"):  # only the host's launches differ
        assert EXPERIMENTS[n].kernel == "main_kernel" and _swapped(n, "wgmma") == [], n
    assert _swapped("no_q", "wgmma") == [(("NoQParts",), ())]
    assert _swapped("direct_out", "wgmma") == [(("DirectOutParts",), ())]
    assert [EXPERIMENTS[n].right for n in EXPERIMENTS if n in short] == [False] * 4 + [True] * 3


@pytest.mark.compile
def test_stage_10_writes_a_whole_unit_through_shared_memory_and_direct_out_from_the_fragments(counts):
    from mla_lab.book.sass import count_opcodes

    op, direct = _mix("wgmma"), _mix("direct_out")
    # stage 10: each warp's 40 pairs x 512 dims as 20 stmatrix of four transposed 8x8 blocks, then 16-byte stores
    assert op["STSM.16.MT88.4"] == 20 and count_opcodes(op, "STG.E.128") > 0
    # direct_out: two bf16 stores of each of 8 chunks for each of 10 columns, and none of that
    assert count_opcodes(direct, "STG.E.U16") - count_opcodes(op, "STG.E.U16") == 2 * 8 * 10
    assert direct["STSM.16.MT88.4"] == 0 and count_opcodes(direct, "STG.E.128") == 0
    # the rest is the same: the products and the copies of the keys
    assert _counts("direct_out") == counts["wgmma"]


# ---- the pairs on M with a loader ---------------------------------------------------------------------------------

@pytest.mark.compile
def test_the_rows_build_puts_the_pairs_on_m_and_keeps_its_products_in_flight(counts):
    # two warpgroups, each 36 products of scores (64 x 64 x 16) and 2 x 4 of P V, a
    # warpgroup's 256 dims in one product per k-step (64 x 256 x 16)
    assert _shapes("rows") == {"64x64x16": 72, "64x256x16": 16}
    assert _shapes("wgmma") == {"64x40x16": counts["wgmma"]["HGMMA"]} == {"64x40x16": 68}
    rows = _counts("rows")
    # ptxas puts a wait after every wgmma (and says C7515) when an instruction seems to write
    # an accumulator while a product is in flight: the waits must stay the few the source asks for
    assert 0 < rows["WAIT"] < rows["HGMMA"] // 8
    assert 0 < counts["wgmma"]["WAIT"] < counts["wgmma"]["HGMMA"] // 4
    # its halves taken away as stage 10's are
    assert _counts("rows_no_math")["HGMMA"] == 0
    alone = _counts("rows_no_copies")
    assert alone["HGMMA"] == rows["HGMMA"] and alone["LDGSTS"] == 1


@pytest.mark.compile
def test_the_rows_tma_build_is_the_rows_kernel_with_the_tma_loader(counts):
    rows, rows_tma = _counts("rows"), _counts("rows_tma")
    # the rows kernel's products and waits, untouched; its keys copied by the tensor copy, as the tma build's are
    assert _shapes("rows_tma") == _shapes("rows")
    assert rows_tma["WAIT"] == rows["WAIT"] and rows["UTMALDG"] == 0
    assert rows_tma["UTMALDG"] == counts["tma"]["UTMALDG"]
    alone = _counts("rows_tma_no_math")
    assert alone["HGMMA"] == 0 and alone["UTMALDG"] == rows_tma["UTMALDG"]


def test_the_rows_builds_are_one_layout_with_its_loader_or_its_math_swapped():
    rows = [n for n, e in EXPERIMENTS.items() if e.file == "rows_layout"]
    assert rows == ["rows", "rows_no_copies", "rows_no_math", "rows_tma", "rows_tma_no_math"]
    for n in rows:  # the pairs on M where they fill the tiles, else stage 10's tile on N in the same units
        assert EXPERIMENTS[n].kernel == f"{n}_kernel" and EXPERIMENTS[n].tile_n == f"{n}_tile_n_kernel", n
        assert _pieces("rows_layout", f"{n}_kernel")[0] == "ROWS_BODY", n
    assert _swapped("rows_no_copies", "rows") == [(("NoCopiesLoader",), ("CpAsyncLoader",))]
    assert _swapped("rows_no_math", "rows") == [(("false",), ("true",))]
    assert _swapped("rows_tma", "rows") == [(("TmaLoader",), ("CpAsyncLoader",))]
    assert _swapped("rows_tma_no_math", "rows_tma") == [(("false",), ("true",))]
    # elsewhere stage 10's tile on N, with the same loader and work taken away, in the rows layout's units
    assert _pieces("rows_layout", "rows_tile_n_kernel") == ["TILE_N_BODY", "CpAsyncLoader", "false", "TileNParts"]
    assert _pieces("rows_layout", "rows_no_math_tile_n_kernel")[-1] == "NoMathParts"
    assert re.search(r"#define TILE_N_BODY\(Loader, kFences, Parts\) tile_n_block<RowsWhereTheyFill, Loader, kFences, "
                     r"Parts>\(p, kv\)", experiments.source("rows_layout").read_text())


# ---- the order of a tile's work in stage 10 ------------------------------------------------------------------------

@pytest.mark.compile
def test_the_early_scores_build_issues_a_second_copy_of_the_scores_and_waits_per_v_chunk(counts):
    early, op = _counts("early_scores"), counts["wgmma"]
    # stage 10's 68 products, and the next tile's 36 products of scores issued behind the products of P V
    assert early["HGMMA"] == op["HGMMA"] + 36 == 68 + 36
    assert _shapes("early_scores") == {"64x40x16": early["HGMMA"]}
    # a wait for each of the eight V chunks handed back before the next tile's chunk goes in (wait_group 7), and
    # one wait_group 0 more where the compiled loop joins: far fewer than one per product
    assert early["WAIT"] == op["WAIT"] + 9 and early["WAIT"] < early["HGMMA"] // 4
    assert early["LDGSTS"] == op["LDGSTS"]
    stamped = _counts("early_scores_timeline")
    assert stamped["HGMMA"] == early["HGMMA"] and stamped["LDGSTS"] == early["LDGSTS"]
    assert EXPERIMENTS["early_scores"].right and "early_scores" not in STAMPING


def test_early_scores_swaps_stage_10s_compute_loop():
    assert _swapped("early_scores", "wgmma") == [(("EarlyScoresParts",), ())]
    assert _swapped("early_scores_timeline", "early_scores") == [(("EarlyScoresTimelineParts",),
                                                                   ("EarlyScoresParts",))]


@pytest.mark.compile
def test_the_pingpong_build_adds_only_the_turns(counts):
    from mla_lab.book.sass import count_opcodes

    pp, op = _counts("pingpong"), counts["wgmma"]
    assert {k: pp[k] for k in ("HGMMA", "WAIT", "LDGSTS")} == {k: op[k] for k in ("HGMMA", "WAIT", "LDGSTS")}
    assert _shapes("pingpong") == _shapes("wgmma")
    op_mix, pp_mix = _mix("wgmma"), _mix("pingpong")
    # a turn taken before the scores and before the products, and warpgroup 0's last one after the loop; a turn
    # passed after each, and warpgroup 1's first before the loop
    assert count_opcodes(pp_mix, "BAR.SYNC") == count_opcodes(op_mix, "BAR.SYNC") + 3
    assert count_opcodes(pp_mix, "BAR.ARV") == count_opcodes(op_mix, "BAR.ARV") + 3
    assert _counts("pingpong_no_copies")["HGMMA"] == pp["HGMMA"]
    assert "pingpong_timeline" in STAMPING and "pingpong" not in STAMPING


def test_the_pingpong_turns_are_balanced_in_the_source():
    # Every arrival at a turn's barrier must meet a wait, or a later use of the barrier id would complete early:
    # warpgroup 1 passes the first turn before its loop, warpgroup 0 takes the last one after its loop, and
    # within a tile each warpgroup takes and passes two.
    tile_n = (CSRC / "hopper" / "tile_n.cuh").read_text()
    body = _block(tile_n, "__device__ void compute(")
    assert re.search(r"if \(group == 1\) turns\.pass\(\);", body)
    assert re.search(r"if \(group == 0\) turns\.take\(\);", body)
    assert body.count("turns.take();") == 3 and body.count("turns.pass();") == 3
    loop = _block(body, "for (int tile = t0; tile < t1;")
    assert loop.count("turns.take();") == 2 and loop.count("turns.pass();") == 2
    # the op's turns are none; pingpong's wait on its own barrier and arrive at the other's, where both compute
    assert re.search(r"using Turns = NoTurns;", tile_n)
    turns = _block((CSRC / "experiments" / "wgmma_timeline.cu").read_text(), "struct PingPongTurns")
    assert re.search(r"named_barrier\(kBarTurn \+ group, 256\)", turns)
    assert re.search(r"named_barrier_arrive\(kBarTurn \+ 1 - group, 256\)", turns)
    assert re.search(r"on\(sh\.per_group > kPairsPerGroup\)", turns)  # both warpgroups compute, or no turns
    assert _swapped("pingpong", "wgmma") == [(("PingPongParts",), ())]
    assert _swapped("pingpong_no_copies", "pingpong") == [(("NoCopiesLoader",), ("CpAsyncLoader",))]


# ---- the seesaw, one piece at a time ------------------------------------------------------------------------------

@pytest.mark.compile
def test_the_seesaw_build_has_no_loader_and_asks_the_tensor_copy_for_every_tile():
    # the unit's first scores (one code path for both warpgroups), then warpgroup 0's scores of the next A in
    # two parts (chunks 0..3, 4..8) and warpgroup 1's of the next B: 36 + 36 + 36 products of 64 x 64 x 16; four
    # products of P V (A and B, in registers and from shared memory), each 4 k-steps of 64 x 256 x 16
    assert _shapes("seesaw") == {"64x64x16": 108, "64x256x16": 16}
    c = _counts("seesaw")
    assert c["UTMALDG"] > 0  # every tile by the tensor copy, issued by the compute warpgroups
    assert 0 < c["WAIT"] <= 8  # only the waits the source asks for: ptxas serialised no product
    tl = _counts("seesaw_timeline")
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (c["HGMMA"], c["UTMALDG"], c["WAIT"])


@pytest.mark.compile
def test_the_crossed_seesaw_is_the_seesaw_with_the_same_products_and_copies():
    # the same products as the seesaw (only their order and the hand-overs change), and the same copies
    assert _shapes("seesaw_cross") == _shapes("seesaw")
    assert _body(_sass("seesaw_cross")) != _body(_sass("seesaw"))  # each file's own loop
    c, see = _counts("seesaw_cross"), _counts("seesaw")
    assert c["UTMALDG"] == see["UTMALDG"]
    assert 0 < c["WAIT"] <= 8  # only the waits the source asks for: ptxas serialised no product
    tl = _counts("seesaw_cross_timeline")
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (c["HGMMA"], c["UTMALDG"], c["WAIT"])
    assert "seesaw_cross_timeline" in STAMPING and "seesaw_cross" not in STAMPING
    assert [len(e) for e in experiments.SEESAW_CROSS_STAMP_EVENTS] == [6, 6]


def test_the_seesaw_experiments_swap_one_piece_each():
    """The seesaw's files, each its loop as it stood at one step, and within a file one piece swapped a variant:
    the pages found by steps (PagesBySteps) instead of by division, the tile stamps, the softmax as first written,
    the plan's unit starts and order of shares; seesaw_whole is seesaw_cross_boxes compiled for whole tiles."""
    for n, e in EXPERIMENTS.items():
        if e.file.startswith("seesaw"):
            assert e.stage == "seesaw" and e.tile_n == "tile_n_kernel", n
            assert _pieces(e.file, "tile_n_kernel") == ["tile_n_block", "SeesawWhereItFits", "CpAsyncLoader",
                                                        "false", "p", "kv"], n
    # seesaw_block runs the loop its Parts name: stage 12's (SeesawParts), or an experiment file's own
    assert "Parts::template run<Parts>(" in _block((CSRC / "hopper" / "seesaw.cuh").read_text(), "void seesaw_block(")
    for file, loop in (("seesaw_uncrossed", "seesaw_uncrossed<Self>"),
                       ("seesaw_chunk_copies", "seesaw_chunk_copies<Self, false>"),
                       ("seesaw_copies_behind", "seesaw_chunk_copies<Self, true>")):
        assert re.search(rf"void run\([^)]*\) \{{\s*{re.escape(loop)}\(", experiments.source(file).read_text()), file
    # chunk copies and copies behind share one loop; kCopiesBehind moves the two places where copies are asked
    shared = (CSRC / "experiments" / "seesaw_chunk_copies.cuh").read_text()
    assert shared.count("if constexpr (kCopiesBehind)") == 2 and shared.count("if constexpr (!kCopiesBehind)") == 2
    steps = [(("PagesBySteps",), ("PagesByDivision",))]
    stamped = [(("TileStamps",), ("NoStamps",))]
    assert _swapped("seesaw_steps", "seesaw") == _swapped("seesaw_cross_steps", "seesaw_cross") == steps
    for n in ("seesaw", "seesaw_cross", "seesaw_cross_steps", "seesaw_cross_behind", "seesaw_cross_boxes",
              "softmax_fmul"):
        assert _swapped(f"{n}_timeline", n) == stamped, n
    # seesaw_cross_boxes: stage 12's parts for any pages, its softmax and stamps named
    assert _pieces("seesaw_crossed", "seesaw_cross_boxes_kernel") == [
        "seesaw_block", "CrossedParts", "SoftmaxFfma", "NoStamps", "true", "true", "p", "kv"]
    crossed = experiments.source("seesaw_crossed").read_text()
    assert re.search(r"struct CrossedParts : SeesawParts<kWholeTiles>", crossed)
    assert _swapped(("seesaw_crossed", "seesaw_whole_kernel"), "seesaw_cross_boxes") == [(("true",), ())]
    assert _swapped("softmax_fmul", "seesaw_cross_boxes") == [(("SoftmaxFmul",), ("SoftmaxFfma",))]
    assert _swapped("even_starts", "seesaw_cross_boxes") == [(("false",), ("true",))]  # no slots for a unit's start
    assert _pieces("seesaw_crossed", "shares_apart_kernel")[-4:] == ["true", "false", "p", "kv"]  # shares apart
    # seesaw_whole runs seesaw_cross_boxes's kernel where the tiles are not whole
    table = re.findall(r"\w+", re.search(r"const MainKernel kSeesaw\[\] = \{(.*?)\};", crossed, re.S)[1])
    assert dict(zip(_variants_in("seesaw_crossed"), table))["seesaw_whole"] == "seesaw_cross_boxes_kernel"
    assert EXPERIMENTS["seesaw_whole"].kernel == "seesaw_whole_kernel"


@pytest.mark.compile
@pytest.mark.parametrize("steps, dividing", [("seesaw_steps", "seesaw"), ("seesaw_cross_steps", "seesaw_cross")])
def test_the_page_steps_builds_change_only_how_a_tile_finds_its_pages(steps, dividing):
    # the same products, copies and waits as the build that divides
    assert _shapes(steps) == _shapes(dividing)
    c, d = _counts(steps), _counts(dividing)
    assert (c["HGMMA"], c["UTMALDG"], c["WAIT"]) == (d["HGMMA"], d["UTMALDG"], d["WAIT"])
    assert "seesaw_cross_steps_timeline" in STAMPING and steps not in STAMPING
    tl, cross = _counts("seesaw_cross_steps_timeline"), _counts("seesaw_cross_steps")
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (cross["HGMMA"], cross["UTMALDG"], cross["WAIT"])


@pytest.mark.compile
def test_the_behind_build_moves_only_where_the_copies_are_asked_for():
    """seesaw_cross_behind: the crossed order with steps, each warpgroup's copies asked for behind products it has
    issued.  The same products, copies and waits as seesaw_cross_steps, in another order (one wait now lets two
    groups of products run on, not one), and not serialised (a wait for each product would show as many waits as
    products: ptxas does that where the copies sit between a product and its wait across a branch); and its
    timeline build likewise."""
    behind, steps = "seesaw_cross_behind", "seesaw_cross_steps"
    assert _shapes(behind) == _shapes(steps)
    b, c = _counts(behind), _counts(steps)
    assert (b["HGMMA"], b["UTMALDG"], b["WAIT"]) == (c["HGMMA"], c["UTMALDG"], c["WAIT"])
    behind_sass, steps_sass = _sass(behind), _sass(steps)
    assert _body(behind_sass) != _body(steps_sass)
    wait_2 = "WARPGROUP.DEPBAR.LE gsb0, 0x2"  # a wait that lets two groups of products run on
    assert behind_sass.count(wait_2) == steps_sass.count(wait_2) + 1
    assert b["WAIT"] < b["HGMMA"] / 10
    assert "seesaw_cross_behind_timeline" in STAMPING and behind not in STAMPING
    tl = _counts("seesaw_cross_behind_timeline")
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])


@pytest.mark.compile
def test_the_boxes_build_copies_a_pair_of_tiles_in_six_copies():
    """seesaw_cross_boxes: the same products and waits as seesaw_cross_steps; where a tile is one page's 64 keys the
    six groups of a pair of tiles are copied by four-dimensional boxes (six UTMALDG.4D in the kernel: the unit's
    first two tiles and the loop's four groups of four), and each group's barrier is armed once; not serialised;
    and its timeline build likewise."""
    from mla_lab.book.sass import count_opcodes

    boxes, steps = "seesaw_cross_boxes", "seesaw_cross_steps"
    assert _shapes(boxes) == _shapes(steps)
    b, c = _counts(boxes), _counts(steps)
    assert (b["HGMMA"], b["WAIT"]) == (c["HGMMA"], c["WAIT"]) and b["WAIT"] < b["HGMMA"] / 10
    sass = _sass(boxes)
    assert sass.count("UTMALDG.4D") == 6  # one in each of the unit's two first tiles' loops, the pairs' four groups
    assert "UTMALDG.4D" not in _sass(steps)
    assert count_opcodes(_mix(boxes), "SYNCS.ARRIVE.TRANS64") < count_opcodes(_mix(steps), "SYNCS.ARRIVE.TRANS64")
    assert "seesaw_cross_boxes_timeline" in STAMPING and boxes not in STAMPING
    tl = _counts("seesaw_cross_boxes_timeline")
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])


@pytest.mark.compile
def test_the_softmax_fmul_build_scales_and_hides_every_score_in_every_tile():
    """softmax_fmul: the four-chunk seesaw with its softmax as first written.  The same products, copies and waits;
    each warpgroup's softmax multiplies its 32 scores by the scale (the stages fold the scale into the exponent's
    fused multiply-add, and keep the subtraction there), and the stages' hiding of keys past a row's end sits
    behind a branch: the build's selects run in every tile, in line."""
    from mla_lab.book.sass import count_opcodes

    fmul, boxes = "softmax_fmul", "seesaw_cross_boxes"
    assert _shapes(fmul) == _shapes(boxes)
    f, b = _counts(fmul), _counts(boxes)
    assert (f["HGMMA"], f["UTMALDG"], f["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])
    fm, bm = _mix(fmul), _mix(boxes)
    # two softmaxes in the loop (one a warpgroup), 32 scores each: at least 64 multiplies and subtractions fewer
    assert count_opcodes(fm, "FMUL") - count_opcodes(bm, "FMUL") >= 60
    assert count_opcodes(fm, "FADD") - count_opcodes(bm, "FADD") >= 60
    assert count_opcodes(bm, "FFMA") - count_opcodes(fm, "FFMA") >= 60
    assert count_opcodes(bm, "MUFU.EX2") == count_opcodes(fm, "MUFU.EX2")
    assert "softmax_fmul_timeline" in STAMPING and fmul not in STAMPING
    tl = _counts("softmax_fmul_timeline")
    assert (tl["HGMMA"], tl["UTMALDG"], tl["WAIT"]) == (f["HGMMA"], f["UTMALDG"], f["WAIT"])


@pytest.mark.compile
def test_the_shares_apart_build_differs_from_stage_12_only_in_its_blocks_order():
    """shares_apart: the four-chunk seesaw with block c taking share c.  The same products, copies, waits and
    softmax; only the plan's order of shares differs (a division and a few integer instructions, which ptxas then
    schedules around), so the kernel's length stays within 2%."""
    from mla_lab.book.sass import count_opcodes

    apart, boxes = "shares_apart", "seesaw_cross_boxes"
    assert _shapes(apart) == _shapes(boxes)
    a, b = _counts(apart), _counts(boxes)
    assert (a["HGMMA"], a["UTMALDG"], a["WAIT"]) == (b["HGMMA"], b["UTMALDG"], b["WAIT"])
    am, bm = _mix(apart), _mix(boxes)
    for op in ("FFMA", "FMUL", "MUFU.EX2", "STS", "LDS"):
        assert count_opcodes(am, op) == count_opcodes(bm, op), op
    assert abs(sum(am.values()) - sum(bm.values())) < 0.02 * sum(am.values())


@pytest.mark.compile
def test_the_whole_tiles_kernel_drops_the_other_answers_and_its_loop_is_a_third_shorter():
    """seesaw_whole_kernel knows that a tile is one box of 64 keys copied four chunks at once; seesaw_cross_boxes's
    kernel asks.  The same products, waits, softmax and four-chunk copies; what goes is the code of the other
    answers (copies of one, two and four boxes a chunk, chunk by chunk), and the tile loop is at most 70% of the one
    that asks."""
    from mla_lab.book.sass import count_opcodes, tile_loop_instructions

    whole, boxes = ("seesaw_crossed", "seesaw_whole_kernel"), "seesaw_cross_boxes"
    w, b = _sass(whole), _sass(boxes)
    assert _shapes(whole) == _shapes(boxes)
    sw, sb = _counts(whole), _counts(boxes)
    assert (sw["HGMMA"], sw["WAIT"]) == (sb["HGMMA"], sb["WAIT"])
    wm, bm = _mix(whole), _mix(boxes)
    for op in ("FFMA", "MUFU.EX2", "STS"):
        assert count_opcodes(wm, op) == count_opcodes(bm, op), op
    # (the unit's first two tiles' loop of copies is unrolled where it knows its boxes: 8 four-chunk copies, not 6)
    assert count_opcodes(wm, "UTMALDG.4D") >= count_opcodes(bm, "UTMALDG.4D") == 6
    assert count_opcodes(wm, "UTMALDG") < count_opcodes(bm, "UTMALDG") / 2  # the copies box by box are gone
    assert count_opcodes(wm, "LDS") < count_opcodes(bm, "LDS")  # and the reads of the other boxes' page ids
    assert 0 < tile_loop_instructions(w) < 0.7 * tile_loop_instructions(b)


# ---- the stamps --------------------------------------------------------------------------------------------------

def test_the_stamps_sizes_are_the_ones_python_reads():
    tiles = (CSRC / "experiments" / "tile_stamps.cuh").read_text()
    found = re.search(r"constexpr int kStampTiles = (\d+), kStampEvents = (\d+);", tiles)
    assert found and (int(found[1]), int(found[2])) == (experiments.STAMP_TILES, len(experiments.STAMP_EVENTS))
    assert {len(e) for e in experiments.SEESAW_STAMP_EVENTS + experiments.SEESAW_CROSS_STAMP_EVENTS} == {
        len(experiments.STAMP_EVENTS)}
    merge = (CSRC / "experiments" / "merge_stamps.cuh").read_text()
    found = re.search(r"constexpr int kMergeEvents = (\d+), kMergeStampBlocks = 4 \* 80;", merge)
    assert found and int(found[1]) == len(experiments.MERGE_EVENTS) and experiments.MERGE_STAMP_BLOCKS == 4 * 80
    assert re.search(r"constexpr int kBlock0Events = (\d+);", merge)[1] == str(len(experiments.BLOCK0_EVENTS))
    assert "main_stamps[kMaxSplitsHere][2]" in merge
    common = (CSRC / "hopper" / "common.cuh").read_text()
    assert re.search(r"constexpr int kMaxSplitsHere = (\d+);", common)[1] == str(experiments.MAIN_STAMP_BLOCKS)
    assert EXPERIMENTS["merge_timeline"].stamps == "merge" and "merge_timeline" not in STAMPING


def test_the_stamps_are_hooks_the_stages_leave_empty():
    assert _swapped("timeline", "wgmma") == [(("TimelineParts",), ())]
    assert _swapped("merge_timeline", "wgmma") == [(("MergeTimelineParts",), ())]
    src = experiments.source("wgmma_timeline").read_text()
    assert re.search(r"struct TimelineParts : TileNParts \{\s*using Stamps = TileStamps;\s*\};", src)
    assert "using Stamps = NoStamps;" in (CSRC / "hopper" / "tile_n.cuh").read_text()
    assert EXPERIMENTS["timeline"].right and EXPERIMENTS["timeline"].stamps == "tiles"


@pytest.mark.compile
def test_the_timeline_build_only_adds_clock_reads(counts):
    timeline = _counts("timeline")
    assert timeline["HGMMA"] == counts["wgmma"]["HGMMA"] and timeline["LDGSTS"] == counts["wgmma"]["LDGSTS"]


@pytest.mark.compile
def test_the_merge_timeline_build_only_adds_timer_reads(counts):
    # the main kernel: stage 10's products, copies, barriers and waits, two reads of the timer for every block and
    # one at each of block 0's events (the first chunk's and the last chunk's in the unrolled loop over chunks)
    assert _counts("merge_timeline") == counts["wgmma"]
    timer = lambda text: len(re.findall(r"SR_GLOBALTIMER", text))
    assert timer(_sass("wgmma")) == 0
    assert timer(_sass("merge_timeline")) == 2 + len(experiments.BLOCK0_EVENTS)
    # the merge: three reads in the kernel and two in each of its three variants of combine_slice
    assert timer(_sass(("merge_timeline", "combine_kernel"))) == 3 + 2 * 3
    assert timer(_sass(("wgmma", "wgmma_combine_kernel"))) == 0


def test_only_the_stamping_experiments_give_a_timeline():
    w = make_workload(Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=64), device="cpu", seed=0)
    with pytest.raises(ValueError, match="does not stamp"):
        experiments.timeline(w, variant="early_scores")


def test_the_timeline_summary_reads_phases_and_overlap():
    import numpy as np

    st = np.zeros((2, experiments.STAMP_TILES, len(experiments.STAMP_EVENTS)))
    for g in (0, 1):
        for t in range(10):  # the second warpgroup 50 cycles behind
            base = 1000 * t + 50 * g + 1
            st[g, t] = [base, base + 400, base + 500, base + 700, base + 900, base + 950]
    s = experiments.timeline_summary(st)
    assert s["tiles"] == 7 and s["tile"] == pytest.approx(1000)  # tiles 2..8 (9 has no successor)
    assert (s["scores"], s["softmax pass"], s["P to shared memory"]) == pytest.approx((400, 100, 200))
    assert s["overlap"] == pytest.approx(0.25)  # [400, 700] and [450, 750] share 250 cycles
    with pytest.raises(ValueError, match="no complete tile"):
        experiments.timeline_summary(st[:, :3])


def test_the_timeline_median_takes_each_field_over_the_calls():
    import numpy as np

    def stamps(lag):  # the second warpgroup `lag` cycles behind the first
        st = np.zeros((2, experiments.STAMP_TILES, len(experiments.STAMP_EVENTS)))
        for g in (0, 1):
            for t in range(10):
                base = 1000 * t + lag * g + 1
                st[g, t] = [base, base + 400, base + 500, base + 700, base + 900, base + 950]
        return st

    m = experiments.timeline_median([stamps(0), stamps(50), stamps(300)])  # overlaps 0.3, 0.25, 0.0
    assert m["calls"] == 3 and m["overlap"] == pytest.approx(0.25)
    assert m["overlap_range"] == pytest.approx((0.0, 0.3)) and m["tile"] == pytest.approx(1000)
    with pytest.raises(ValueError, match="no call"):
        experiments.timeline_median([])


def test_the_seesaw_summary_reads_its_pairs_of_tiles():
    import numpy as np

    st = np.zeros((2, experiments.STAMP_TILES, 6))
    for t in range(6):  # a pair every 8000 cycles; each phase 1000 cycles in warpgroup 0, 1500 in warpgroup 1
        st[0, t] = [8000 * t + 1 + 1000 * e for e in range(6)]
        st[1, t] = [8000 * t + 2 + 1500 * e for e in range(6)]
    out = experiments.seesaw_timeline_summary(st)
    assert out["period"] == 8000 and out["pairs"] == 3  # pairs 2, 3, 4 (5 has no successor)
    assert all(v == 1000 for v in out["phases"][0].values()) and all(v == 1500 for v in out["phases"][1].values())
    assert out["over_tensor"] == 8000 / experiments.SEESAW_PAIR_TENSOR_CYCLES
    assert experiments.SEESAW_PAIR_TENSOR_CYCLES == 4352
    assert out["scores_end_apart"] == 2501 / 8000  # warpgroup 1's last stamp 2501 cycles after warpgroup 0's
    assert out["to_next_pair"] == [3000, 500]  # 8000 - 5 x 1000 and 8000 - 5 x 1500
    with pytest.raises(ValueError, match="no complete pair"):
        experiments.seesaw_timeline_summary(np.zeros((2, experiments.STAMP_TILES, 6)))
    crossed = experiments.seesaw_timeline_summary(st, events=experiments.SEESAW_CROSS_STAMP_EVENTS)
    assert list(crossed["phases"][0]) == ["pair start -> P_A handed over", "P_A handed over -> A's products done",
                                          "A's products done -> P_B known", "P_B known -> next A's scores issued",
                                          "next A's scores issued -> next A's scores done"]
    assert list(crossed["phases"][0].values()) == list(out["phases"][0].values())


# ---- the source tree ----------------------------------------------------------------------------------------------

def test_the_ops_files_hold_no_experiment_switch():
    """No file the extension compiles names an MLA_HOPPER_ switch (the architecture guard is MLA_SM90A)."""
    files = [*CSRC.glob("stage*.cu"), *(CSRC / "hopper").glob("*.cuh"), *CSRC.glob("*.cuh"), *CSRC.glob("*.h"),
             CSRC / "bindings.cpp"]
    assert len(files) > 20
    for f in files:
        assert "MLA_HOPPER_" not in f.read_text(), f.name
    assert "#if MLA_SM90A" in (CSRC / "stage13_hopper.cu").read_text()


def test_every_source_file_is_under_600_lines_or_says_why():
    """A file of csrc/ longer than 600 lines says why in its first comment lines (mentioning "600 lines")."""
    for f in sorted(p for p in CSRC.rglob("*") if p.is_file()):
        lines = f.read_text().splitlines()
        if len(lines) > 600:
            head = " ".join(l for l in lines[:next((i for i, l in enumerate(lines) if not l.startswith("//")), 0)])
            assert "600 lines" in head, f"{f.relative_to(CSRC)}: {len(lines)} lines"


# ---- the runner and profile-target's checks --------------------------------------------------------------------

def test_the_runner_checks_arguments_as_the_op_does():
    w = make_workload(Problem(streams=1, q_len=2, heads=2, prefix=10), seed=0)  # on the CPU
    with pytest.raises(InputError, match="experiment no_math"):
        experiments.runner("no_math", w)


def test_an_unknown_experiment_is_refused():
    with pytest.raises(KeyError, match="no_copies, no_math, neither"):
        experiments.get("no_softmax")
    with pytest.raises(KeyError, match="wgmma_ablation"):
        experiments.load("no_softmax")


def test_profile_target_takes_an_experiment_of_the_stage_it_swaps_a_piece_of(monkeypatch):
    from mla_lab.book import explore
    from mla_lab.book.explore import profile_target

    class PastTheChecks(Exception):
        pass

    def no_gpu_work(what):
        raise PastTheChecks(what)

    monkeypatch.setattr(explore, "_require_gpu", no_gpu_work)
    p = Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=64)
    for stage, build in (("wgmma", "no_math"), ("tensor_copy", "tma_first"), ("seesaw", "seesaw_whole"),
                         ("hopper", None)):
        with pytest.raises(PastTheChecks):
            profile_target(stage, p, build=build)
    with pytest.raises(ValueError, match="stage wgmma"):
        profile_target("tensor_core", p, build="no_math")
    with pytest.raises(ValueError, match="stage wgmma"):
        profile_target("hopper", p, build="no_math")
    with pytest.raises(KeyError, match="the experiments are no_copies, no_math"):
        profile_target("hopper", p, build="no_softmax")


def test_profile_target_checks_its_peer_before_any_gpu_work():
    from mla_lab.book.explore import profile_target

    p64 = Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=64)
    with pytest.raises(ValueError, match="not both"):
        profile_target("wgmma", p64, build="no_math", peer="flashmla")
    with pytest.raises(ValueError, match="no peer 'flashinfer'"):
        profile_target("hopper", p64, peer="flashinfer")
    with pytest.raises(ValueError, match="pages of 64"):
        profile_target("hopper", Problem(streams=1, q_len=1, heads=8, prefix=64, page_size=16), peer="flashmla")


# ---- on the GPU --------------------------------------------------------------------------------------------------

def _right(call, ref):
    """``call`` (a runner), called once, matches the reference."""
    from mla_lab.core.verify import compare

    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *ref).ok


def _right_again_in_a_graph(call, ref):
    """``call``, captured in a graph and replayed into an output of NaN, matches the reference."""
    from mla_lab.core.verify import compare
    from mla_lab.measure.timing import cuda_graph

    call.out.fill_(float("nan"))
    g = cuda_graph(call)
    g.replay()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *ref).ok


def _right_on_two_grids(name, w, ref, few_blocks=7):
    """Experiment ``name`` matches the reference with one block per SM and with ``few_blocks`` blocks (long shares,
    units cut), and again replayed in a graph."""
    for splits in (None, few_blocks):
        call = experiments.runner(name, w, num_splits=splits)
        _right(call, ref)
    _right_again_in_a_graph(call, ref)


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("name", [n for n, e in EXPERIMENTS.items() if e.right])
def test_every_right_experiment_computes_what_its_stage_does(name):
    from mla_lab.core.reference import reference_attention

    # 576 pairs a stream: units of 80 on the tile on N, of 64 where the seesaw runs
    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), device="cuda",
                      seed=4, poison=True)
    _right_on_two_grids(name, w, reference_attention(*w.args(), check=False))


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_timeline_build_computes_what_stage_10_does_and_stamps_in_order():
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), device="cuda",
                      seed=6, poison=True)
    call = experiments.runner("timeline", w)
    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok
    st = experiments.timeline(w)
    tiles = [t for t in range(st.shape[1]) if (st[:, t, 0] > 0).all()]
    assert len(tiles) >= 3
    for g in (0, 1):
        for t in tiles:
            assert (st[g, t, 1:] >= st[g, t, :-1]).all()  # the six points in order
        for t in tiles[:-1]:
            assert st[g, t + 1, 0] >= st[g, t, 5]  # a tile starts after the last one ended
    assert experiments.timeline_summary(st)["tile"] > 0


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("name", [n for n, e in EXPERIMENTS.items() if e.file == "wgmma_ablation"])
def test_every_variant_runs_and_replays_in_a_graph(name):
    from mla_lab.measure.timing import cuda_graph

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), device="cuda",
                      seed=5, poison=True)
    call = experiments.runner(name, w)
    call()
    g = cuda_graph(call)
    g.replay()
    torch.cuda.synchronize()
    if name == "no_copies":  # keys all zero: every score 0, every output the mean of zeros
        assert torch.isfinite(call.out.float()).all() and call.out.float().abs().max() == 0


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # TMA tiles and a last one gathered
    Problem(streams=2, q_len=9, heads=8, prefix=(1, 4096), page_size=16),           # four boxes per chunk
    Problem(streams=3, q_len=2, heads=16, prefix=(5000, 127, 129), page_size=128),  # two tiles per page
    Problem(streams=2, q_len=4, heads=8, prefix=(700, 33), page_size=32, scattered=True),
    Problem(streams=4, q_len=1, heads=16, prefix=(63, 64, 65, 130), page_size=1),   # no TMA: every tile gathered
    # several units per block, each ending in a gathered tile after many whole ones: the gathering warps
    # skip whole tiles, and a version that let them run more than a ring ahead broke here
    Problem(streams=2, q_len=9, heads=64, prefix=(16384, 9001), page_size=64, scattered=True),
    Problem(streams=8, q_len=9, heads=8, prefix=(6000, 77, 5000, 4097, 3000, 64, 7000, 1), page_size=32),
    # streams shorter than a tile between long ones: gathered tiles in a row, which the issuing warp skips
    Problem(streams=7, q_len=2, heads=8, prefix=(3000, 10, 20, 30, 40, 50, 5000), page_size=64),
], ids=lambda p: p.label())
@pytest.mark.parametrize("name", ["tma", "tma_first", "tma_fewer_fences"])
def test_the_tma_builds_compute_what_the_op_does_and_replay(problem, name):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=7, poison=True)
    # one block per SM, and one block walking every tile
    _right_on_two_grids(name, w, reference_attention(*w.args(), check=False), few_blocks=1)


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("name", ["tma", "tma_first", "tma_fewer_fences", "rows_tma"])
@pytest.mark.parametrize("splits", [None, 1])
def test_pages_outside_the_pool_poison_only_their_stream_in_the_tma_builds(name, splits):
    heads = 64 if name == "rows_tma" else 8  # the rows kernel takes a stream that fills tiles of 64
    w = make_workload(Problem(streams=3, q_len=9, heads=heads, prefix=(3000, 2000, 777), page_size=64), device="cuda",
                      seed=11, poison=True)
    call = experiments.runner(name, w, num_splits=splits)  # the checks run here, on the good table
    w.block_table[0, 5:9] = 1 << 30  # then four used slots of stream 0 go bad (gathered tiles in a row),
    call()                           # as a graph replay would see them
    torch.cuda.synchronize()
    assert torch.isnan(call.out[0].float()).all() and torch.isfinite(call.out[1:].float()).all()


# The seesaw's experiments: both orders, dividing by the page size and by steps, and the pieces of stage 12's.
SEESAW_BUILDS = ["seesaw", "seesaw_cross", "seesaw_steps", "seesaw_cross_steps", "seesaw_cross_behind",
                 "seesaw_cross_boxes", "softmax_fmul", "shares_apart", "seesaw_whole"]
# Their shapes: pages of 16 to 256 keys (192: tiles a page not a power of two), empty and short streams, mixed
# lengths, and shapes the seesaw leaves to the tile on N.
SEESAW_PROBLEMS = [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # 9 units of 64 pairs a stream
    Problem(streams=2, q_len=16, heads=128, prefix=(0, 700), page_size=16),         # an empty stream; 4 boxes a chunk
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=64),  # one unit, a tile or two
    Problem(streams=3, q_len=2, heads=128, prefix=(5000, 127, 129), page_size=128),  # two tiles per page
    Problem(streams=3, q_len=9, heads=64, prefix=(5000, 130, 1999), page_size=192),  # three (not a power of two)
    Problem(streams=2, q_len=4, heads=64, prefix=(4099, 256), page_size=256),         # four
    Problem(streams=2, q_len=5, heads=128, prefix=(3000, 20000), page_size=32),     # two boxes a chunk
    Problem(streams=2, q_len=16, heads=8, prefix=(5000, 1), page_size=64, scattered=True),  # 128 pairs: two units
    Problem(streams=40, q_len=2, heads=64, prefix=tuple(range(0, 4000, 100)), page_size=64),  # mixed lengths
    Problem(streams=2, q_len=9, heads=64, prefix=(16384, 9001), page_size=64),       # many tiles a block
    Problem(streams=2, q_len=9, heads=16, prefix=(3001, 129), page_size=64),        # 144 pairs: three units of 48
    Problem(streams=2, q_len=9, heads=16, prefix=(3001, 129), page_size=16),        # 144, pages of 16: the tile on N
    Problem(streams=2, q_len=9, heads=8, prefix=(3001, 129), page_size=64),         # 72 pairs: the tile on N
    Problem(streams=2, q_len=4, heads=16, prefix=(700, 33), page_size=1),           # pages of 1: the tile on N
    # a unit a stream, of lengths mixed so that many blocks end (and start) in a stream's last tiles
    Problem(streams=40, q_len=4, heads=16, prefix=tuple((7919 * i) % 9000 for i in range(40)), page_size=64),
]


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", SEESAW_PROBLEMS, ids=lambda p: p.label())
@pytest.mark.parametrize("name", SEESAW_BUILDS)
def test_the_seesaw_build_computes_what_the_op_does_and_replays(problem, name):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=13, poison=True)
    _right_on_two_grids(name, w, reference_attention(*w.args(), check=False), few_blocks=3)


# The op runs the crossed seesaw where the table's width gives each block 15 tiles of 64-pair units (pages of 64
# keys or a multiple) or 56 (pages of 16 or 32): over the seesaw's shapes with one block per SM (most below that
# line), with three blocks and with one (all above it, where the pairs fill tiles of 64 and the pages suit the tensor
# copy), poisoned, and replayed in a graph.
@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", SEESAW_PROBLEMS, ids=lambda p: p.label())
def test_the_op_runs_the_seesaw_where_it_pays_and_is_right(problem):
    from mla_lab.core import ops
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    w = make_workload(problem, device="cuda", seed=17, poison=True)
    ref = reference_attention(*w.args(), check=False)
    kernels = set()
    for splits in (None, 3, 1):
        call = ops.runner("hopper", w, num_splits=splits)
        (main, *_) = stages.get("hopper").launches(problem.streams, problem.q_len, problem.heads,
                                                   w.block_table.shape[1], problem.page_size, call.num_splits)
        kernels.add(main.kernel)
        call()
        torch.cuda.synchronize()
        assert compare(call.out, call.lse, *ref).ok, (splits, main.kernel)
    _right_again_in_a_graph(call, ref)
    one_block = stages.hopper_seesaw_pays(problem.streams, problem.q_len, problem.heads, w.block_table.shape[1],
                                          problem.page_size, 1)
    # (either seesaw kernel: for whole tiles, or for pages of 16 or 32)
    assert any(k.startswith("hopper_seesaw") for k in kernels) == one_block, kernels


def test_the_ops_seesaw_problems_reach_the_seesaw():
    """Most of the seesaw's problems cross the op's line to the seesaw with three blocks or one, 144 pairs (a third
    of padding) with pages of 64 among them, and the ones it leaves to the op's other kernels (72 pairs, 144 with
    pages of 16, pages of 1) never do."""
    def reaches(p, splits):
        return stages.hopper_seesaw_pays(p.streams, p.q_len, p.heads, max(p.pages_per_stream) + 1, p.page_size, splits)

    assert sum(reaches(p, 1) for p in SEESAW_PROBLEMS) >= 9
    assert sum(reaches(p, 3) for p in SEESAW_PROBLEMS) >= 7
    assert any(reaches(p, 1) for p in SEESAW_PROBLEMS if p.q_len * p.heads == 144 and p.page_size == 64)
    assert not any(reaches(p, 1) for p in SEESAW_PROBLEMS
                   if p.q_len * p.heads == 72 or p.page_size == 1 or (p.q_len * p.heads == 144 and p.page_size == 16))


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("splits", [None, 2])
@pytest.mark.parametrize("name", SEESAW_BUILDS + [None])  # None: the op, which runs the seesaw here with 2 blocks
def test_pages_outside_the_pool_poison_only_their_stream_in_the_seesaw(splits, name):
    from mla_lab.core import ops

    w = make_workload(Problem(streams=3, q_len=9, heads=64, prefix=(3000, 2000, 777), page_size=64), device="cuda",
                      seed=11, poison=True)
    # the checks run here, on the good table
    call = ops.runner("hopper", w, num_splits=splits) if name is None else experiments.runner(name, w,
                                                                                               num_splits=splits)
    w.block_table[0, 5:9] = 1 << 30  # then four used slots of stream 0 go bad, as a graph replay would see them
    w.block_table[2, 3] = -7
    call()
    torch.cuda.synchronize()
    assert torch.isnan(call.out[0].float()).all() and torch.isnan(call.out[2].float()).all()
    assert torch.isfinite(call.out[1].float()).all() and torch.isfinite(call.lse[1]).all()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("name", ["seesaw_timeline", "seesaw_cross_timeline", "seesaw_cross_steps_timeline",
                                  "seesaw_cross_behind_timeline", "seesaw_cross_boxes_timeline",
                                  "softmax_fmul_timeline"])
def test_the_seesaw_timeline_stamps_in_order_and_its_answers_are_right(name):
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    w = make_workload(Problem(streams=8, q_len=16, heads=64, prefix=4096, page_size=64), device="cuda", seed=5,
                      poison=True)
    st = experiments.timeline(w, variant=name)
    call = experiments.runner(name, w)
    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok
    out = experiments.seesaw_timeline_summary(st)
    assert out["pairs"] >= 20 and out["over_tensor"] > 1.0  # no pair faster than the tensor cores' own time
    for g in (0, 1):
        t = [i for i in range(st.shape[1]) if st[g, i, 5] > 0]
        assert all((st[g, i, 1:] >= st[g, i, :-1]).all() for i in t)  # each pair's stamps in order


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # 9 units of 64 pairs a stream
    Problem(streams=2, q_len=16, heads=128, prefix=(0, 700), page_size=16),         # an empty stream
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=1),   # one unit, a tile or two
    Problem(streams=3, q_len=2, heads=128, prefix=(5000, 127, 129), page_size=128),
    Problem(streams=2, q_len=16, heads=8, prefix=(5000, 1), page_size=64, scattered=True),  # 128 pairs: two units
    Problem(streams=40, q_len=2, heads=64, prefix=tuple(range(0, 4000, 100)), page_size=64),  # mixed lengths
    Problem(streams=2, q_len=9, heads=16, prefix=(3001, 129), page_size=16),        # 144 pairs: three units of 48
    Problem(streams=2, q_len=9, heads=8, prefix=(3001, 129), page_size=16),         # 72 pairs: the tile on N
], ids=lambda p: p.label())
@pytest.mark.parametrize("name", ["rows", "rows_tma"])
def test_the_rows_builds_compute_what_the_op_does_and_replay(problem, name):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=9, poison=True)
    _right_on_two_grids(name, w, reference_attention(*w.args(), check=False))


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # several units, one tile long
    Problem(streams=5, q_len=4, heads=8, prefix=(5000, 1, 33, 640, 2047), page_size=64),
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=1),   # a tile or two per unit
    Problem(streams=1, q_len=1, heads=1, prefix=777, page_size=16, scattered=True),
], ids=lambda p: p.label())
def test_the_early_scores_build_computes_what_the_op_does_and_replays(problem):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=10, poison=True)
    _right_on_two_grids("early_scores", w, reference_attention(*w.args(), check=False))
    st = experiments.timeline(w, num_splits=7, variant="early_scores_timeline")
    tiles = [t for t in range(st.shape[1]) if (st[:, t, 0] > 0).all()]
    for g in (0, 1):
        for t in tiles:
            assert (st[g, t, 1:] >= st[g, t, :-1]).all()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # several units, cut and whole
    Problem(streams=5, q_len=16, heads=8, prefix=(5000, 1, 33, 640, 2047), page_size=16),
    Problem(streams=2, q_len=9, heads=8, prefix=(65531, 3), page_size=64),          # long shares: many turns
    Problem(streams=4, q_len=1, heads=64, prefix=(63, 64, 65, 130), page_size=1),   # 64 pairs: both warpgroups
    Problem(streams=2, q_len=3, heads=5, prefix=(17, 300), page_size=1),           # 15 pairs: no turns taken
], ids=lambda p: p.label())
def test_the_pingpong_build_gives_stage_10s_bits_and_replays(problem):
    from mla_lab.core import ops
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=12, poison=True)
    _right_on_two_grids("pingpong", w, reference_attention(*w.args(), check=False))
    for splits in (None, 7):
        mine, op = experiments.runner("pingpong", w, num_splits=splits), ops.runner("wgmma", w, num_splits=splits)
        mine(), op()
        torch.cuda.synchronize()
        assert torch.equal(mine.out, op.out) and torch.equal(mine.lse, op.lse)  # the same products in the same order
    st = experiments.timeline(w, num_splits=7, variant="pingpong_timeline")
    for g in (0, 1):
        for t in [t for t in range(st.shape[1]) if (st[g, t, 0] > 0)]:
            assert (st[g, t, 1:] >= st[g, t, :-1]).all()


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem", [
    Problem(streams=1, q_len=9, heads=8, prefix=55, page_size=64),                 # one tile: the unit is whole
    Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64),  # whole units and cut ones
    Problem(streams=2, q_len=3, heads=5, prefix=(17, 300), page_size=1),           # 15 pairs: part of a warpgroup
], ids=lambda p: p.label())
def test_the_direct_out_build_computes_what_the_op_does(problem):
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=12, poison=True)
    _right_on_two_grids("direct_out", w, reference_attention(*w.args(), check=False))


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem,splits", [
    (Problem(streams=4, q_len=9, heads=8, prefix=(5000, 70, 3000, 1), page_size=16), None),  # 4 units, sliced
    (Problem(streams=8, q_len=9, heads=8, prefix=4096, page_size=64), None),                 # 8 even units, sliced
    (Problem(streams=3, q_len=9, heads=8, prefix=(65536, 1, 5), page_size=64), 256),         # >128 pieces: two lse a thread
    (Problem(streams=2, q_len=9, heads=8, prefix=(9000, 3000), page_size=64), None),         # 2 units: blocks of 256
], ids=lambda x: x.label() if isinstance(x, Problem) else str(x))
def test_the_narrow_merge_and_wide_combine_both_compute_what_the_reference_does(problem, splits):
    """The stages' merge in blocks of 128 threads (a sliced grid of more than two units) and the experiment that
    keeps every block at 256 threads, against the reference, on the grid the stage chooses and in a graph."""
    from mla_lab.core import ops
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=31, poison=True)
    ref = reference_attention(*w.args(), check=False)
    ns = splits or torch.cuda.get_device_properties(0).multi_processor_count
    for stage in ("wgmma", "hopper"):
        (_, comb) = stages.get(stage).launches(problem.streams, problem.q_len, problem.heads, w.block_table.shape[1],
                                               problem.page_size, ns)
        assert comb.block[0] == (256 if problem.streams <= 2 else 128)
        op = ops.runner(stage, w, num_splits=splits)
        _right(op, ref)
        _right_again_in_a_graph(op, ref)
    wide = experiments.runner("wide_combine", w, num_splits=splits)
    _right(wide, ref)
    _right_again_in_a_graph(wide, ref)


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem,splits", [
    (Problem(streams=8, q_len=9, heads=64, prefix=1024, page_size=64), None),                # 64 units of 2 pieces
    (Problem(streams=4, q_len=16, heads=128, prefix=(1500, 77, 4000, 9), page_size=64), 37),  # 104 units, odd splits
    (Problem(streams=6, q_len=3, heads=40, prefix=(900, 2, 3000, 17, 640, 1), page_size=1), 18),  # a partial group
    (Problem(streams=3, q_len=1, heads=1, prefix=(100, 5000, 1), page_size=16), 3),          # one pair a unit
], ids=lambda x: x.label() if isinstance(x, Problem) else str(x))
def test_the_merge_by_warps_and_a_block_per_pair_both_compute_what_the_reference_does(problem, splits):
    """Where the units are cut into a few pieces each, the stages merge a pair with one warp; the experiment
    block_per_pair_merge keeps a block a pair. Both against the reference, eagerly and in a graph."""
    from mla_lab.core import ops
    from mla_lab.core.reference import reference_attention

    w = make_workload(problem, device="cuda", seed=37, poison=True)
    ref = reference_attention(*w.args(), check=False)
    ns = splits or torch.cuda.get_device_properties(0).multi_processor_count
    units = problem.streams * stages.hopper_groups(problem.q_len, problem.heads)
    assert stages.hopper_combine_by_warps(ns, units)
    for call in (ops.runner("wgmma", w, num_splits=splits), ops.runner("hopper", w, num_splits=splits),
                 experiments.runner("block_per_pair_merge", w, num_splits=splits)):
        _right(call, ref)
        _right_again_in_a_graph(call, ref)


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_merge_timeline_stamps_in_order_and_its_answers_are_right():
    import numpy as np

    from mla_lab.core.reference import reference_attention

    w = make_workload(Problem(streams=8, q_len=9, heads=8, prefix=1024, page_size=64), device="cuda", seed=5, poison=True)
    _right_on_two_grids("merge_timeline", w, reference_attention(*w.args(), check=False))
    t = experiments.merge_timeline(w)
    main, merge = t["main"], t["merge"]
    assert main.shape == (torch.cuda.get_device_properties(0).multi_processor_count, 2)
    assert np.all(main[:, 0] >= 0) and main[:, 0].min() == 0  # every block starts; the first at 0
    busy = main[np.isfinite(main[:, 1])]  # the blocks with a share (the others return before their end stamp)
    assert len(busy) > 8 and np.all(busy[:, 1] > busy[:, 0])
    # the first cut unit's merge: a block a pair (80, 72 of them with a pair to merge), the five points in order
    assert np.isfinite(merge[:80, :3]).all() and np.isnan(merge[80:]).all()
    whole = merge[np.isfinite(merge[:, 4])]
    assert len(whole) == 72 and np.all(np.diff(whole, axis=1) >= 0)
    # no merge block passes its wait before the main kernel's last block has written its units
    assert merge[:80, 1].min() >= busy[:, 1].max()
    # nothing cut: the merge's blocks stop after reading the plan
    one = make_workload(Problem(streams=1, q_len=9, heads=8, prefix=55, page_size=64), device="cuda", seed=6)
    t1 = experiments.merge_timeline(one)
    m = t1["merge"]
    assert np.isfinite(m[:80, :2]).all() and np.isnan(m[:, 2:]).all()
    # block 0's way to its one tile: every event stamped, each after those it waits for, all before its end
    e = dict(zip(experiments.BLOCK0_EVENTS, t1["block0"]))
    assert np.isfinite(t1["block0"]).all(), e
    chain = ("past the wait", "cut known", "first page id", "first chunk landed", "tile landed", "first scores")
    assert all(e[a] <= e[b] for a, b in zip(chain, chain[1:])), e
    assert e["cut known"] <= e["Q landed"] <= e["first scores"] <= t1["main"][0, 1], e


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_call_parts_do_what_they_say():
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    # One tile per stream and a block for each: no unit is cut, so without the combine the answer is whole.
    w = make_workload(Problem(streams=5, q_len=9, heads=8, prefix=55, page_size=64), device="cuda", seed=8, poison=True)
    call = experiments.runner("no_combine", w)
    call()
    torch.cuda.synchronize()
    assert compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok
    # Returning at once, the main kernel writes nothing: the poisoned output stays NaN.
    for part in ("launch_only", "scheduler_only"):
        call = experiments.runner(part, w)
        call()
        torch.cuda.synchronize()
        assert torch.isnan(call.out.float()).all(), part
    # Without Q the scores are of whatever shared memory held: the answer is not the reference's.
    call = experiments.runner("no_q", w)
    call()
    torch.cuda.synchronize()
    assert not compare(call.out, call.lse, *reference_attention(*w.args(), check=False)).ok


# The op's tensor-copy kernel's shapes (and blocks; None: one a SM of the H200), each where the host's rule picks it.
TMA_OP_PROBLEMS = [
    (Problem(streams=2, q_len=9, heads=8, prefix=(3001, 1500), page_size=16), 4),    # four boxes per chunk
    # whole tiles and gathered ones (120 blocks: 12.8 tiles a block of 80-pair units, past the tensor copy's 12, and
    # 14.4 of 64-pair units, short of the seesaw's 15)
    (Problem(streams=3, q_len=9, heads=64, prefix=(1000, 70, 4000), page_size=64), 120),
    (Problem(streams=4, q_len=1, heads=16, prefix=(6000, 63, 64, 65), page_size=128), 5),  # two tiles per page
    (Problem(streams=8, q_len=9, heads=8, prefix=16384, page_size=64), None),        # the grid's own: 15.5 tiles a block
]


def test_the_tma_kernels_problems_are_where_the_rule_picks_it():
    """Each of them past the tensor copy's line and short of the seesaw's, with its blocks (132 on the H200): the
    op and stage 11 both run their tensor-copy kernel."""
    for problem, splits in TMA_OP_PROBLEMS:
        width = max(problem.pages_per_stream) + 1  # make_workload's table: a page more than the longest stream
        for stage, kernel in (("hopper", "hopper_tma_kernel"), ("tensor_copy", "tensor_copy_kernel")):
            (main, *_) = stages.get(stage).launches(problem.streams, problem.q_len, problem.heads, width,
                                                    problem.page_size, splits or 132)
            assert main.kernel == kernel, (stage, problem.label())


@needs_gpu
@pytest.mark.gpu
@sm90_only
@pytest.mark.parametrize("problem, splits", TMA_OP_PROBLEMS)
def test_the_ops_tma_kernel_is_right_and_gives_stage_10s_bits(problem, splits):
    """Where the rule picks hopper_tma_kernel, the op matches the reference (cache past each length poisoned, unused
    table slots out of range, outputs poisoned), gives the same bits as stage 10 (and stage 11, on its tensor-copy
    kernel), and replays in a graph."""
    from mla_lab.core import ops
    from mla_lab.core.reference import reference_for
    from mla_lab.core.verify import compare
    from mla_lab.measure.timing import cuda_graph

    w = make_workload(problem, device="cuda", seed=31, poison=True)
    ref = reference_for(w)
    op = ops.runner("hopper", w, num_splits=splits)
    cp = ops.runner("wgmma", w, num_splits=splits)
    tc = ops.runner("tensor_copy", w, num_splits=splits)
    ns = cp.num_splits
    (main, _) = stages.get("hopper").launches(problem.streams, problem.q_len, problem.heads, w.block_table.shape[1],
                                              problem.page_size, ns)
    assert main.kernel == "hopper_tma_kernel"
    op()
    cp()
    tc()
    torch.cuda.synchronize()
    assert compare(op.out, op.lse, *ref).ok
    assert torch.equal(op.out, cp.out) and torch.equal(op.lse, cp.lse)
    assert torch.equal(op.out, tc.out) and torch.equal(op.lse, tc.lse)
    first = op.out.clone()
    op.out.fill_(float("nan"))
    g = cuda_graph(op)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(op.out, first)


@needs_gpu
@pytest.mark.gpu
@sm90_only
def test_the_ops_tma_kernel_gives_nan_only_in_streams_with_bad_pages():
    """check=False on a call the rule sends to hopper_tma_kernel: a page id past the pool inside one stream's
    length, a negative one in another; those streams' outputs are NaN, every other stream's is right."""
    from mla_lab.core import ops
    from mla_lab.core.reference import reference_attention
    from mla_lab.core.verify import compare

    p = Problem(streams=4, q_len=4, heads=8, prefix=(3000, 2000, 2500, 1000), page_size=16)
    w = make_workload(p, device="cuda", seed=41, poison=True)
    q, kv, bt, lens, scale = w.args()
    (main, _) = stages.get("hopper").launches(4, 4, 8, bt.shape[1], 16, 2)
    assert main.kernel == "hopper_tma_kernel"
    ref_out, ref_lse = reference_attention(q, kv, bt, lens, scale)
    bad_bt = bt.clone()
    bad_bt[1, 70] = kv.shape[0]  # one past the pool, inside stream 1's 2004 tokens (page 70 holds 1120..1135)
    bad_bt[3, 0] = -1
    out, lse = ops.attention("hopper", q, kv, bad_bt, lens, scale, num_splits=2, check=False)
    torch.cuda.synchronize()
    for b in (1, 3):
        assert (torch.isnan(out[b].float()).any(-1) | torch.isnan(lse[b])).all(), b
    good = [0, 2]
    assert compare(out[good], lse[good], ref_out[good], ref_lse[good]).ok
