"""The CPU parts of `mla-lab check`: the fuzz generator against the stages' CPU models, the bad-input
table through the public API, the raw ops and check=False, the extreme values on the models, the
parsing of compute-sanitizer's output, and the README section generated from a check record."""

import json
import re

import pytest
import torch

from mla_lab.check import badinput, suite as check, extremes, fuzz, sanitize
from mla_lab.core import stages
from mla_lab.core.problem import D_QK

ALL = list(stages.STAGES)
CUDA = list(stages.cuda_stages())
TRITON = stages.get("triton")
CPU_CASES = 120  # distinct cases for the models; the Triton interpreter takes the first few
TRITON_CASES = 10

pytestmark = [pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]


# ---- the generator --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_cases():
    return fuzz.generate_for(fuzz.GPU_LIMITS, ALL, 1000, seed=0)


def test_generator_is_deterministic():
    a = fuzz.generate(fuzz.CPU_LIMITS, 30, seed=3)
    assert a == fuzz.generate(fuzz.CPU_LIMITS, 30, seed=3)
    assert a != fuzz.generate(fuzz.CPU_LIMITS, 30, seed=4)
    assert len(set(a)) == len(a)


@pytest.mark.parametrize("limits", [fuzz.GPU_LIMITS, fuzz.CPU_LIMITS], ids=lambda l: l.name)
def test_cases_stay_within_their_limits(limits):
    for c in fuzz.generate(limits, 300, seed=1):
        assert 1 <= c.streams <= limits.max_streams and len(c.kv_lens) == c.streams
        assert 1 <= c.q_len <= limits.max_q_len and c.heads in limits.heads
        assert all(c.q_len <= L <= limits.max_len for L in c.kv_lens)
        assert c.work <= limits.max_work and c.page_size in limits.page_sizes
        assert c.num_splits is None or 1 <= c.num_splits <= limits.max_splits


def test_gpu_cases_cover_the_ranges(gpu_cases):
    """The full mode's cases reach every corner the check promises."""
    cs = gpu_cases
    assert {c.streams for c in cs} >= {1, 16} and {c.q_len for c in cs} >= {1, 16}
    assert {c.heads for c in cs} == set(fuzz.GPU_LIMITS.heads)
    assert {c.page_size for c in cs} == set(fuzz.GPU_LIMITS.page_sizes)
    assert max(max(c.kv_lens) for c in cs) > 60000
    assert any(L == c.q_len for c in cs for L in c.kv_lens)  # a stream holding only its draft
    assert {c.scattered for c in cs} == {True, False}
    for attr, views in (("q_view", fuzz.Q_VIEWS), ("kv_view", fuzz.KV_VIEWS), ("table_view", fuzz.TABLE_VIEWS),
                        ("out_view", fuzz.OUT_VIEWS), ("lse_view", fuzz.LSE_VIEWS)):
        assert {getattr(c, attr) for c in cs} == set(views)
    assert any(c.num_splits is None for c in cs) and any(c.num_splits for c in cs)


H200_SMS = 132


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_the_full_fuzz_reaches_every_kernel(gpu_cases, st):
    """The full check's fuzz (seed 0, 1000 cases a stage) launches each of a stage's kernels many times on an H200:
    stage 10's tensor copy and seesaw kernels run only where the table gives each block enough tiles."""
    assert check.FULL.fuzz_per_stage == 1000
    counts = fuzz.kernels_reached(st, gpu_cases, H200_SMS)
    assert set(counts) == set(st.kernels), counts
    assert min(counts.values()) >= 10, counts


def test_every_stage_gets_its_thousand_cases(gpu_cases):
    for st in ALL:
        assert sum(fuzz.admitted(st, c) for c in gpu_cases) >= 1000, st.id
    cap = fuzz.SLOW_STAGE_CAPS["naive"]
    assert all(cap.admits(c) == fuzz.admitted(stages.get("naive"), c) for c in gpu_cases[:200])


def test_views_hold_the_same_values_and_poison_their_padding():
    dense = fuzz.FuzzCase(streams=2, q_len=3, heads=4, kv_lens=(20, 41), page_size=16, scattered=True, seed=5)
    strided = fuzz.FuzzCase(**{**dense.__dict__, "q_view": "padded", "kv_view": "every_other_page",
                               "table_view": "padded"})
    a, b = fuzz.build(dense), fuzz.build(strided)
    assert not b.workload.q.is_contiguous() and not b.workload.kv_cache.is_contiguous()
    assert b.workload.block_table.stride(0) > b.workload.block_table.shape[1]
    assert torch.equal(a.workload.q, b.workload.q)
    assert torch.equal(a.workload.kv_cache.nan_to_num(7), b.workload.kv_cache.nan_to_num(7))
    assert torch.equal(a.workload.block_table, b.workload.block_table)
    assert torch.isnan(b.buffers["q"][..., D_QK:].float()).all()
    assert torch.isnan(b.buffers["kv"][1::2].float()).all()  # the pages in between are not ours
    major = fuzz.build(fuzz.FuzzCase(**{**dense.__dict__, "q_view": "heads_major"}))
    assert major.workload.q.stride(2) > major.workload.q.stride(1) and torch.equal(major.workload.q, a.workload.q)
    out, lse, bufs = fuzz.new_outputs(fuzz.FuzzCase(**{**dense.__dict__, "out_view": "padded",
                                                      "lse_view": "heads_major"}), "cpu")
    assert out.shape == (2, 3, 4, 512) and torch.isnan(out.float()).all() and torch.isnan(lse).all()
    assert lse.stride(2) > lse.stride(1) and bufs["out"].shape[-1] == 512 + fuzz.PAD


def test_case_round_trips_through_its_reproducer():
    c = fuzz.generate(fuzz.GPU_LIMITS, 5, seed=2)[-1]
    line = c.reproducer("tensor_core")
    assert line.startswith("python -m mla_lab.check.fuzz tensor_core '") and "\n" not in line
    assert fuzz.FuzzCase.from_json(line.split("'")[1]) == c


# ---- the same generator at small sizes, against the CPU models ------------------------------

@pytest.fixture(scope="module")
def cpu_tallies():
    cases = fuzz.generate(fuzz.CPU_LIMITS, CPU_CASES, seed=0)
    return len(cases), fuzz.fuzz(ALL, cases, device="cpu", models=True, stage_case_limit={"triton": TRITON_CASES})


@pytest.mark.slow
@pytest.mark.parametrize("stage", [s.id for s in ALL])
def test_fuzz_against_the_models(cpu_tallies, stage):
    n, tallies = cpu_tallies
    t = tallies[stage]
    assert t.mismatches == 0 and t.refused == 0, "\n".join(t.failures + t.refusals)
    assert t.cases == (TRITON_CASES if stage == "triton" else n)


def test_fuzz_reports_a_wrong_answer_with_its_reproducer(monkeypatch):
    """A model that drops each stream's last key is caught, and its line re-runs the case."""
    from mla_lab import models

    right = models.MODELS["per_head"]

    def drops_last_key(w, num_splits=None):
        lens = w.kv_lens.clone()
        w2 = type(w)(problem=w.problem, q=w.q, kv_cache=w.kv_cache, block_table=w.block_table,
                     kv_lens=torch.where(lens > w.q.shape[1], lens - 1, lens))
        return right(w2, num_splits)

    monkeypatch.setitem(models.MODELS, "per_head", drops_last_key)
    lines = []
    cases = fuzz.generate(fuzz.CPU_LIMITS, 20, seed=0)
    t = fuzz.fuzz([stages.get("per_head")], cases, device="cpu", models=True, log=lines.append)["per_head"]
    assert t.mismatches > 0 and len(lines) == t.mismatches
    case = fuzz.FuzzCase.from_json(lines[0].split("'")[1])
    assert case in cases
    assert fuzz.main(["per_head", case.to_json(), "--model"]) == 1
    monkeypatch.setitem(models.MODELS, "per_head", right)
    assert fuzz.main(["per_head", case.to_json(), "--model"]) == 0


# ---- bad inputs -------------------------------------------------------------------------------

def test_the_table_covers_every_kind_the_promise_names():
    keys = {c.key for c in badinput.BAD_INPUTS}
    for need in ("q_dtype", "cpu_tensors", "two_devices", "q_rank", "out_shape", "q_strided", "q_align8",
                 "empty_batch", "len_short", "len_negative", "len_past_table", "page_past_pool", "page_negative",
                 "scale_nan", "scale_zero", "scale_negative", "out_dtype", "lse_shape", "num_splits_zero",
                 "num_splits_many", "lens_size", "out_overlap"):
        assert need in keys
    assert len(keys) == len(badinput.BAD_INPUTS)
    table = badinput.markdown_table()
    assert all(f"| {c.what}" in table for c in badinput.BAD_INPUTS)


API_CASES = [(st, c) for st in ALL for c in badinput.BAD_INPUTS if c.applies_to(st) and not (c.content and st.is_cuda)]


@pytest.mark.parametrize("st, case", API_CASES, ids=[f"{s.id}-{c.key}" for s, c in API_CASES])
def test_public_api_raises_input_error(st, case):
    o = badinput.api_outcome(case, st, "cpu")
    assert o.ok, o.got


@pytest.mark.parametrize("case", [c for c in badinput.BAD_INPUTS if c.content], ids=lambda c: c.key)
@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_checks_of_contents_name_the_stream(st, case):
    """attention() runs these after the device check, which CPU tensors fail; the same functions, named by stage."""
    assert re.match(case.api, badinput.python_message(case, st)), badinput.python_message(case, st)


OP_CASES = [(st, c) for st in CUDA for c in badinput.BAD_INPUTS if not c.content and c.op_applies_to(st)]


@pytest.mark.parametrize("st, case", OP_CASES, ids=[f"{s.id}-{c.key}" for s, c in OP_CASES])
def test_raw_op_raises_with_the_same_words(ext, st, case):
    o = badinput.op_outcome(case, st, "cpu")
    assert o.ok, o.got


@pytest.fixture(scope="module")
def triton_unchecked():
    """The Triton baseline (it runs here, in its interpreter) with check=False, in processes of its own."""
    return badinput.unchecked_isolated(TRITON, "cpu")


# The Triton baseline's check=False path checks shapes with a quick test of its own first, which
# predates the rule against outputs that overlap themselves: it lets them through to the kernels.
TRITON_CASES_UNCHECKED = [c.key for c in badinput.BAD_INPUTS if c.applies_to(TRITON)]


@pytest.mark.parametrize("key", TRITON_CASES_UNCHECKED)
def test_triton_keeps_the_promise_unchecked(triton_unchecked, key):
    """check=False: bad metadata still raises; a bad length or page id gives that stream NaN, the other exact."""
    assert "_process" not in triton_unchecked, triton_unchecked.get("_process")
    o = triton_unchecked[key]
    assert o.ok, o.got


# ---- extreme values ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def extreme_results():
    return extremes.run(ALL, "cpu", models=True)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [s.id for s in ALL])
def test_extreme_values_on_the_models(extreme_results, stage):
    r = extreme_results[stage]
    assert set(r) == set(extremes.KINDS)
    bad = {k: v.detail for k, v in r.items() if not v.ok}
    assert not bad, bad


@pytest.mark.parametrize("cross", [False, True], ids=["seesaw", "crossed"])
def test_extreme_values_on_the_seesaws_model(cross):
    """The extreme cases built for the seesaw (stages 12 and 13), on its tile loop's CPU model in both orders (the
    kernels take them on a GPU; at the CPU's sizes the stages' own rules would not pick the seesaw, so the model is
    asked directly): a lazy reference still gives the planted key's value exactly, and equal keys their value."""
    from mla_lab.models import model_seesaw
    from mla_lab.core.reference import reference_attention

    seen = set()
    for case in extremes.cases("cpu"):
        p = case.workload.problem
        if case.num_splits is None or p.q_len * p.heads != stages.HOPPER_ROWS_PAIRS:
            continue
        out, lse, _ = model_seesaw(case.workload, case.num_splits, cross=cross)
        v = extremes.judge(case, "hopper", out, lse, *reference_attention(*case.workload.args()))
        assert v.ok, (case.kind, v.detail)
        seen.add(case.kind)
    assert seen == {"huge_positive", "huge_negative", "identical_keys"}


def test_extreme_judge_rejects_a_near_miss():
    case = next(c for c in extremes.cases("cpu") if c.kind == "huge_positive")
    from mla_lab.core.reference import reference_attention

    ref_out, ref_lse = reference_attention(*case.workload.args())
    assert extremes.judge(case, "x", ref_out, ref_lse, ref_out, ref_lse).ok
    assert abs(float(ref_lse.flatten()[0])) > 1e36  # scores far beyond where exp overflows
    nudged = ref_out.bfloat16()
    nudged.view(-1)[5] = (nudged.view(-1)[5:6].view(torch.int16) + 1).view(torch.bfloat16)[0]  # the next bf16
    assert not extremes.judge(case, "x", nudged.float(), ref_lse, ref_out, ref_lse).ok
    assert not extremes.judge(case, "x", ref_out, ref_lse * (1 + 1e-4), ref_out, ref_lse).ok
    assert not extremes.judge(case, "x", ref_out, ref_lse.clone().fill_(float("nan")), ref_out, ref_lse).ok


# ---- compute-sanitizer's output -----------------------------------------------------------------

DRIVER_OK = sanitize.DRIVER_TAG + json.dumps({"stage": "float4", "ok": True, "workloads": [
    {"label": "w", "num_splits": None, "ok": True, "detail": "rel_err 1e-3"}]})


def test_parse_a_clean_run():
    out = f"========= COMPUTE-SANITIZER\n{DRIVER_OK}\n========= ERROR SUMMARY: 0 errors\n"
    r = sanitize.parse("float4", "memcheck", out, 0, 3.0)
    assert (r.status, r.findings) == ("clean", 0)


def test_parse_findings_and_hazards():
    out = (f"========= Invalid __global__ read of size 16 bytes\n=========     at float4_kernel(mla::MlaParams)\n"
           f"{DRIVER_OK}\n========= ERROR SUMMARY: 3 errors\n")
    r = sanitize.parse("float4", "memcheck", out, 0, 3.0)
    assert (r.status, r.findings) == ("findings", 3) and "Invalid __global__ read" in r.first_findings[0]
    race = (f"{DRIVER_OK}\n========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n"
            "========= ERROR SUMMARY: 1 error\n")
    r = sanitize.parse("float4", "racecheck", race, 0, 3.0)
    assert (r.status, r.findings, r.warnings) == ("findings", 1, 1)


def test_parse_a_run_that_never_finished():
    r = sanitize.parse("float4", "initcheck", "Segmentation fault\n", -11, 1.0)
    assert r.status == "failed" and "no sanitizer summary" in r.reason
    wrong = DRIVER_OK.replace('"ok": true', '"ok": false')
    r = sanitize.parse("float4", "memcheck", wrong + "\n========= ERROR SUMMARY: 0 errors\n", 0, 1.0)
    assert r.status == "wrong answer"


@pytest.mark.parametrize("st", CUDA, ids=lambda s: s.id)
def test_the_sanitizer_and_the_extreme_values_reach_every_kernel(st):
    """Each tool sees only the kernels that run: on an H200 the driver's workloads launch every kernel of every
    stage (the tensor copy's and the seesaw's kernels of stages 11 to 13 among them, with two or four blocks), and so
    do the extreme values."""
    assert set(sanitize.kernels_reached(st, H200_SMS)) == set(st.kernels)
    assert set(extremes.kernels_reached(st, H200_SMS)) == set(st.kernels)
    assert "every kernel of every CUDA stage" in check.reach_sentence()


@pytest.mark.parametrize("stage, second", [("wgmma", "gather"), ("tensor_copy", "tma"), ("seesaw", "seesaw_kernel"),
                                           ("hopper", "seesaw_kernel")])
def test_the_hopper_stages_seesaw_and_tensor_copy_are_in_the_soak(stage, second):
    """The soak's first shape runs a Hopper stage's gather; its second (soaked for every Hopper stage) the seesaw
    in stages 12 and 13 and the tensor copy in stage 11."""
    from mla_lab.check import stress

    hop = stages.get(stage)
    for shape, role in ((stress.SOAK, "gather"), (stress.SEESAW_SOAK, second)):
        launched = stages.kernels_of_call(hop, shape.streams, shape.q_len, shape.heads, shape.table_pages, shape.page,
                                          shape.num_splits, H200_SMS)
        assert launched[0] == getattr(hop.hopper, role), (shape, launched)


def test_kernels_no_record_has_checked_are_named():
    rec = dict(_path="a.json", date="2030-01-01", stages=["hopper"], commit="abc",
               sanitizer=dict(kernels={"hopper": ["hopper_kernel", "hopper_tma_kernel"]}))
    line, blank = check._kernels_never_checked(rec, others=[])
    hop = stages.get("hopper")
    for k in hop.kernels:
        assert (f"`{k}`" in line) == (k not in ("hopper_kernel", "hopper_tma_kernel")), line
    assert blank == "" and "commit abc" in line
    rec["sanitizer"]["reached"] = {"hopper": list(hop.kernels)}
    assert check._kernels_never_checked(rec, others=[]) == []


@pytest.mark.parametrize("label,problem,splits", sanitize.SPOILED_WORKLOADS, ids=["pages16", "seesaw"])
def test_spoiled_workload_spoils_what_it_says(label, problem, splits):
    from mla_lab.core.problem import make_workload

    w = make_workload(problem, seed=0)
    bt, lens = sanitize.spoil(w.block_table, w.kv_lens, w.kv_cache.shape[0], problem.page_size)
    P = problem.page_size
    assert int(bt[1, 1]) == w.kv_cache.shape[0] and 1 * P < int(lens[1])  # a used slot points past the pool
    assert int(lens[2]) > bt.shape[1] * P and int(bt[3, 0]) == -1 and int(lens[4]) < 0
    assert torch.equal(bt[0, :-1], w.block_table[0, :-1]) and int(lens[0]) == int(w.kv_lens[0])


def test_driver_checks_the_spoiled_streams():
    """The driver the sanitizer runs, on the Triton baseline in its interpreter: streams 1-4 NaN, stream 0 exact."""
    report = sanitize.drive("triton", "cpu", spoiled_only=True)
    assert report["ok"] and len(report["workloads"]) == 1, report
    assert "streams 1-4 all NaN: [True, True, True, True]" in report["workloads"][0]["detail"]


# ---- the command and its record -------------------------------------------------------------------

def test_check_quick_on_the_cpu_says_what_needs_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this is the CPU mode")
    rc = check.main(["--quick", "--parts", "fuzz", "soak", "--stages", "kv_split", "--no-record", "--jobs", "3"])
    text = capsys.readouterr().out
    assert "Needs a GPU, not run here: " in text and "the graph soak" in text
    assert "Ignored here: --jobs (the CPU parts run in this process)." in text
    n = len(fuzz.generate(fuzz.CPU_LIMITS, check.QUICK.cpu_fuzz_cases, 0))
    assert re.search(rf"kv_split\s+{n}\s+0\s+0", text)
    assert "ok   fuzz" in text and rc == 0


def _record():
    """A record shaped like a full GPU run's, with a finding and a fuzz failure in it."""
    runs = [dict(stage=s, tool=t, status="clean", findings=0, warnings=None, seconds=1.0, reason="",
                 first_findings=[], workloads=[]) for s in ("naive", "hopper") for t in check.FULL.tools]
    runs[-1].update(status="findings", findings=4, reason="", first_findings=["========= Uninitialized read"])
    tally = dict(cases=1234, mismatches=0, refused=0, skipped=0, worst_rel_err=2e-3, failures=[], refusals=[])
    bad = dict(tally, cases=1201, mismatches=1, failures=["FAIL hopper :: python -m mla_lab.check.fuzz hopper '{}'"])
    soak = dict(stage="hopper", replays=100000, compared=100, mismatches=0, bitwise_equal=100, seconds=3.0,
                memory_start=dict(allocated=1000, reserved=2048, device_free=1), memory_growth=0,
                memory_end=dict(allocated=1000, reserved=2048, device_free=1), shape="tiny", first_mismatches=[])
    return dict(mode="full", device="cuda", gpu="NVIDIA H200", date="2031-01-02T03:04:05+00:00", commit="abc123",
                seconds=241.0, command="mla-lab check", _path="results/check/h200.json", stages=["naive", "hopper"],
                stages_skipped={}, sanitizer=dict(tools=list(check.FULL.tools), runs=runs, workloads=["a"]),
                fuzz=dict(stages={"naive": tally, "hopper": bad}, problems=[]), soak=[soak],
                concurrency=[dict(stages=["naive", "hopper"], ok=True)],
                bad_inputs=dict(cases=3, stages={"naive": {"api": {"q_dtype": dict(ok=True, got="")}}}),
                extremes=dict(results={"naive": {k: dict(ok=True, detail="") for k in extremes.KINDS}}))


def test_readme_section_reads_its_figures_from_the_record():
    text = check.readme_section(_record())
    assert "NVIDIA H200 (2031-01-02, commit abc123, 241 s)" in text
    assert "| compute-sanitizer | 0 findings per tool and stage, right answers under the tool | " \
           "7/8 runs clean, 4 findings | **no** |" in text
    assert "1201-1234 cases per stage, 1 mismatches or refusals | **no** |" in text
    assert "100,000 replays" in text and "allocated memory 1,000 B before and 1,000 B after" in text
    assert "| `hopper` | 0 | 0 | 0 | 4 | 1201 | 1 |" in text
    assert "initcheck on `hopper`: findings, 4 findings" in text
    assert badinput.markdown_table() in text


def test_readme_section_names_a_stage_checked_again_later(tmp_path, monkeypatch):
    # a stage that changed after the full run is checked again alone: the README says so, from that record
    monkeypatch.setattr(check, "CHECKS", tmp_path)
    main = _record()
    later = dict(main, date="2031-02-03T00:00:00+00:00", commit="def456", stages=["hopper"],
                 parts=["sanitizer", "soak"], seconds=16.0)
    later["sanitizer"] = dict(main["sanitizer"], runs=[dict(r, status="clean", findings=0)
                                                        for r in main["sanitizer"]["runs"] if r["stage"] == "hopper"])
    for key in ("fuzz", "concurrency", "bad_inputs", "extremes"):
        later.pop(key)
    (tmp_path / "h200-hopper.json").write_text(json.dumps(later))
    (tmp_path / "h200-quick.json").write_text(json.dumps(dict(later, date="2032-01-01")))  # quick runs never count
    text = check.readme_section(main)
    assert ("`hopper` changed after that run and was checked again by `mla-lab check --stages hopper --parts "
            "sanitizer soak` on NVIDIA H200 (2031-02-03, commit def456)") in text
    assert "compute-sanitizer: 4/4 runs clean, 0 findings" in text and "its row comes from the earlier code" in text
    assert text.count("changed after that run") == 1
    earlier = dict(later, date="2030-01-01T00:00:00+00:00")  # a record older than the full run says nothing
    (tmp_path / "h200-hopper.json").write_text(json.dumps(earlier))
    assert "changed after that run" not in check.readme_section(main)


def test_readme_section_without_a_record(monkeypatch):
    monkeypatch.setattr(check, "load_record", lambda path=None: None)
    text = check.readme_section()
    assert text.startswith("No full `mla-lab check` has been recorded yet") and badinput.markdown_table() in text


def test_record_paths():
    assert check.record_path("NVIDIA H200", "full").name == "h200.json"
    assert check.record_path("NVIDIA H200", "quick").name == "h200-quick.json"
    assert check.record_path(None, "quick").name == "cpu-quick.json"
