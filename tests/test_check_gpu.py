"""On a GPU: the parts of `mla-lab check` at test size, over every stage the GPU runs. The full check
(`mla-lab check`) runs the same code at full size, and compute-sanitizer over it."""

import pytest
import torch

from conftest import needs_gpu
from mla_lab.check import badinput, extremes, fuzz, sanitize, stress
from mla_lab.core import stages

pytestmark = [needs_gpu, pytest.mark.gpu]


ALL = list(stages.STAGES)
IDS = [s.id for s in ALL]


@pytest.fixture(scope="module")
def runnable():
    """(stages this GPU runs, {stage: why not}), found by calling each once."""
    from mla_lab.check.suite import runnable_stages

    return runnable_stages()


def _here(runnable, st):
    ok, skipped = runnable
    if st not in ok:
        pytest.skip(f"{st.id} does not run on this GPU: {skipped.get(st.id)}")
    return st


def test_every_registered_stage_runs_or_says_why(runnable):
    ok, skipped = runnable
    for st in stages.STAGES:
        assert st in ok or skipped.get(st.id), st.id


CONTENT = [c for c in badinput.BAD_INPUTS if c.content]
META = [c for c in badinput.BAD_INPUTS if not c.content]


@pytest.mark.parametrize("case", CONTENT, ids=lambda c: c.key)
@pytest.mark.parametrize("st", ALL, ids=IDS)
def test_bad_contents_unchecked_give_that_stream_nan(runnable, st, case):
    _here(runnable, st)
    o = badinput.unchecked_outcome(case, st, "cuda")
    assert o.ok, o.got


@pytest.mark.parametrize("st", ALL, ids=IDS)
def test_bad_inputs_through_every_entry_point(runnable, st):
    _here(runnable, st)
    failures = []
    for c in badinput.BAD_INPUTS:
        if not c.applies_to(st):
            continue
        outcomes = {"api": badinput.api_outcome(c, st, "cuda")}
        if not c.content and c.op_applies_to(st):
            outcomes["op"] = badinput.op_outcome(c, st, "cuda")
        if not c.content:
            outcomes["check=False"] = badinput.unchecked_outcome(c, st, "cuda")
        failures += [f"{c.key} {part}: {o.got}" for part, o in outcomes.items() if not o.ok]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("st", ALL, ids=IDS)
def test_extreme_values_on_the_kernels(runnable, st):
    _here(runnable, st)
    r = extremes.run([st], "cuda")[st.id]
    bad = {k: v.detail for k, v in r.items() if not v.ok}
    assert not bad, bad


def test_fuzz_a_few_cases_on_every_stage(runnable):
    cases = fuzz.generate(fuzz.GPU_LIMITS, 40, seed=1)
    tallies = fuzz.fuzz(runnable[0], cases, device="cuda")
    failures = [line for t in tallies.values() for line in t.failures + t.refusals]
    assert not failures, "\n".join(failures)
    assert all(t.cases > 0 for t in tallies.values())


@pytest.mark.parametrize("st", ALL, ids=IDS)
def test_sanitizer_workloads_are_right_without_the_tool(runnable, st):
    _here(runnable, st)
    report = sanitize.drive(st.id)
    assert report["ok"], [w for w in report["workloads"] if not w["ok"]]


def test_graph_soak_short(runnable):
    st = [s for s in runnable[0] if s.is_cuda][-1]
    r = stress.soak(st, 2000, 200)
    assert r["compared"] == 10 and r["mismatches"] == 0, r["first_mismatches"]
    assert r["memory_growth"] == 0, (r["memory_start"], r["memory_end"])


@pytest.mark.parametrize("stage", [s.id for s in ALL if s.persistent])
def test_graph_soak_of_the_seesaw(runnable, stage):
    """The second soak of a Hopper stage in a graph, its lengths and tables rewritten between replays: the seesaw
    in stages 12 and 13, the tensor copy in stage 11, another cut in stage 10 (the soak above runs the op's gather)."""
    st = stages.get(stage)
    _here(runnable, st)
    r = stress.soak(st, 2000, 200, shape=stress.SEESAW_SOAK)
    assert r["compared"] == 10 and r["mismatches"] == 0 and r["bitwise_equal"] == 10, r["first_mismatches"]
    assert r["memory_growth"] == 0, (r["memory_start"], r["memory_end"])


def test_two_streams_equal_sequential(runnable):
    ok = runnable[0]
    a, b = ok[-1], ok[len(ok) // 2]
    r = stress.concurrency(a, b, 5)
    assert r["ok"], r


def test_device_cases_name_the_devices(runnable):
    st = [s for s in runnable[0] if s.is_cuda][-1]
    o = badinput.op_outcome(badinput.get("two_devices"), st, "cuda")
    assert o.ok and "cuda" in o.got and "cpu" in o.got, o.got
    assert torch.cuda.is_available()
