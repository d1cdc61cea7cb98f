"""Recorded results (results.py) and the bench command without a GPU (bench.py)."""

import json
import os

import pytest
import torch

from mla_lab.measure import bench, results
from mla_lab.measure.results import CONFIG_KEYS, Recorded, format_table, gpu_slug, record_key, save

CONFIG = dict(streams=1, q_len=9, heads=8, prefix=1024, page_size=1, scattered=True)


def rec(stage, us_graph, order=0, **kw):
    r = dict(CONFIG, stage=stage, order=order, us_eager=us_graph * 1.5, us_graph=us_graph, tbs=1.0, tflops=2.0,
             floor_us=5.0, rel_err=1e-3, num_splits=None)
    r.update(kw)
    return r


def run(name):
    return dict(gpu="NVIDIA H200", date=f"2026-11-{name}T00:00:00+00:00", command=f"mla-lab bench #{name}")


def test_gpu_slug():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("  nvidia H100 80GB HBM3 ") == "h100_80gb_hbm3"
    assert gpu_slug("NVIDIA RTX PRO 6000 Blackwell Server Edition") == "rtx_pro_6000_blackwell_server_edition"
    assert gpu_slug("Tesla V100-SXM2-16GB") == "tesla_v100_sxm2_16gb"


def test_save_merges_replaces_and_renumbers(tmp_path):
    path = tmp_path / "sub" / "h200.json"
    # run 0: naive and float4 at prefix 1024, naive at prefix 4096
    first = save(path, run("01"), [rec("naive", 100.0), rec("float4", 10.0, order=1),
                                   rec("naive", 300.0, prefix=4096)])
    assert path.is_file() and len(first.runs) == 1 and len(first.records) == 3
    assert {r["run"] for r in first.records} == {0}
    # run 1 re-measures float4 at 1024 only: it replaces that record, the others stay with run 0
    second = save(path, run("02"), [rec("float4", 8.0, order=1)])
    assert [r["command"] for r in second.runs] == ["mla-lab bench #01", "mla-lab bench #02"]
    assert len(second.records) == 3
    by_key = {record_key(r): r for r in second.records}
    f4 = by_key[("float4",) + tuple(CONFIG[k] for k in CONFIG_KEYS)]
    assert f4["us_graph"] == 8.0 and f4["run"] == 1
    assert second.run_of(f4)["command"] == "mla-lab bench #02"
    assert by_key[("naive",) + tuple(CONFIG[k] for k in CONFIG_KEYS)]["run"] == 0
    # run 2 replaces every record run 0 still had: run 0 is dropped, runs 1 and 2 become 0 and 1
    third = save(path, run("03"), [rec("naive", 90.0), rec("naive", 280.0, prefix=4096)])
    assert [r["command"] for r in third.runs] == ["mla-lab bench #02", "mla-lab bench #03"]
    assert sorted((r["stage"], r["prefix"], r["run"]) for r in third.records) == [
        ("float4", 1024, 0), ("naive", 1024, 1), ("naive", 4096, 1)]
    # sorted by configuration (prefix), then by the stage order within one
    assert [(r["prefix"], r["stage"]) for r in third.records] == [(1024, "naive"), (1024, "float4"), (4096, "naive")]
    # what was written is what load() reads back
    loaded = results.load(path)
    assert loaded.runs == third.runs and loaded.records == third.records
    assert json.loads(path.read_text())["records"] == third.records


def test_recorded_select_and_get(tmp_path):
    r = save(tmp_path / "x.json", run("01"), [rec("naive", 100.0), rec("float4", 10.0, order=1, heads=64)])
    assert [x["stage"] for x in r.select(heads=64)] == ["float4"]
    assert r.get("naive", prefix=1024)["us_graph"] == 100.0
    assert r.get("naive", prefix=4096) is None
    assert r.gpu == "NVIDIA H200" and r.date.startswith("2026-11-01")
    empty = Recorded(tmp_path / "none.json", [], [])
    assert empty.gpu == "?" and empty.date == "?"


# The table's fixed-width columns (results.format_table), one space apart:
# B T H prefix page stage splits | eager graph x-naive x-triton TB/s TFLOP/s floor %floor rel_err
WIDTHS = (2, 3, 3, 6, 5, 13, 6, 9, 9, 8, 8, 6, 7, 8, 7, 8)


def cols(line):
    """The cells of one table line, stripped (an empty cell stays an empty string)."""
    out, at = [], 0
    for w in WIDTHS:
        out.append(line[at:at + w].strip())
        at += w + 1
    return out


def _rows(table):
    lines = table.split("\n\n", 1)[0].splitlines()  # the table, not the legend under it
    assert cols(lines[0])[:9] == ["B", "T", "H", "prefix", "page", "stage", "splits", "eager us", "graph us"]
    assert cols(lines[0])[9:] == ["x naive", "x triton", "TB/s", "TFLOP/s", "floor us", "% floor", "rel_err"]
    assert set(lines[1]) == {"-"}
    return {cols(line)[5]: cols(line) for line in lines[2:]}


def test_format_table_speedups():
    rs = [rec("naive", 100.0), rec("triton", 20.0, kind="triton", num_splits=4), rec("float4", 10.0, num_splits=11),
          rec("flash_ht8", 0.0, unsupported="mla_lab::flash_ht8: this call needs 300000 bytes of shared memory")]
    table = format_table(rs, ["triton", "naive", "flash_ht8", "float4", "not_there"])
    rows = _rows(table)
    assert list(rows) == ["triton", "naive", "flash_ht8", "float4"]  # the given order; absent stages skipped
    f4 = rows["float4"]
    assert f4[:7] == ["1", "9", "8", "1024", "1s", "float4", "11"]
    assert f4[7:9] == ["15.0", "10.0"]  # eager, graph
    assert f4[9] == "10.00"  # naive 100 us / float4 10 us
    assert f4[10] == "2.00"  # triton 20 us / float4 10 us
    assert f4[11:13] == ["1.00", "2.0"] and f4[13:] == ["5.0", "50.0%", "1.0e-03"]  # floor 5 us of 10 us
    assert rows["naive"][6] == "" and rows["naive"][9:11] == ["1.00", "0.20"]
    assert rows["triton"][6] == "4" and rows["triton"][9:11] == ["5.00", "1.00"]
    assert rows["flash_ht8"][7:9] == ["n/a", "n/a"]
    assert "(mla_lab::flash_ht8: this call needs" in table


def test_format_table_without_baselines_and_groups():
    rs = [rec("float4", 10.0), rec("float4", 40.0, prefix=4096)]
    table = format_table(rs)
    lines = table.splitlines()[2:]
    assert len(lines) == 2
    assert [cols(line)[3] for line in lines] == ["1024", "4096"]  # one group per configuration
    for line in lines:
        assert cols(line)[9:11] == ["-", "-"]  # no naive, no triton: no speedups
    # an unsupported naive gives no baseline either
    rows = _rows(format_table([rec("naive", 0.0, unsupported="too long"), rec("float4", 10.0)]))
    assert rows["float4"][9] == "-"


def test_bench_main_without_gpu_and_no_results(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(results, "RESULTS", tmp_path)  # an empty results/

    def must_not_run(*a, **k):
        raise AssertionError("bench measured something without a GPU")

    import mla_lab.measure.timing as timing

    monkeypatch.setattr(timing, "time_call", must_not_run)
    monkeypatch.setattr(timing, "measure_ceilings", must_not_run)
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "No CUDA GPU here: mla-lab bench measures nothing without one."
    assert "No recorded results in results/ either." in out
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_bench_main_without_gpu_shows_the_latest_results(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    # Recorded.describe() names the file relative to the repository root
    monkeypatch.setattr(results, "ROOT", tmp_path)
    old = save(tmp_path / "results" / "h100.json", dict(run("01"), gpu="NVIDIA H100"), [rec("naive", 123.0)])
    new = save(tmp_path / "results" / "h200.json", run("02"), [rec("naive", 100.0), rec("float4", 10.0, order=1)])
    os.utime(old.path, (1_000_000_000, 1_000_000_000))
    os.utime(new.path, (2_000_000_000, 2_000_000_000))
    before = {p: p.read_bytes() for p in (old.path, new.path)}
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "No CUDA GPU here" in out
    assert ("Most recent recorded results, recorded on NVIDIA H200 by `mla-lab bench` (2026-11-02), "
            "2 measurements in results/h200.json") in out
    rows = _rows(out.split(":\n\n", 1)[1])
    assert list(rows) == ["naive", "float4"] and rows["float4"][9] == "10.00"
    assert "123.0" not in out  # the older H100 file is not shown
    assert {p: p.read_bytes() for p in before} == before  # nothing rewritten


def test_without_gpu_the_reference_gpus_results_are_read_whatever_their_age(monkeypatch, tmp_path):
    # a fresh clone gives every file about the same age: the choice may not depend on it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    ref = save(tmp_path / "h200.json", run("01"), [rec("naive", 100.0)])
    other = save(tmp_path / "h100_80gb_hbm3.json", dict(run("02"), gpu="NVIDIA H100 80GB HBM3"), [rec("naive", 123.0)])
    for older, newer in ((other, ref), (ref, other)):
        os.utime(older.path, (1_000_000_000, 1_000_000_000))
        os.utime(newer.path, (2_000_000_000, 2_000_000_000))
        assert results.load().path == ref.path
    ref.path.unlink()
    assert results.load().path == other.path  # no reference file: the newest


def test_plot_writes_a_png(tmp_path):
    rs = [rec("naive", 100.0), rec("naive", 400.0, prefix=4096), rec("float4", 10.0, order=1),
          rec("float4", 30.0, order=1, prefix=4096, floor_us=12.0),
          rec("flash_ht8", 0.0, unsupported="too much shared memory")]
    r = Recorded(tmp_path / "h200.json", [run("01")], rs)
    png = tmp_path / "h200.png"
    assert bench.plot(r, png) == png
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_needs_two_prefixes(tmp_path):
    r = Recorded(tmp_path / "h200.json", [run("01")], [rec("naive", 100.0), rec("float4", 10.0)])
    assert bench.plot(r, tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()


def test_describe_a_file_outside_the_repository(tmp_path):
    # `mla-lab bench --out /elsewhere.json` writes outside the repository; describe() names the full path
    r = save(tmp_path / "elsewhere.json", run("01"), [rec("naive", 100.0)])
    assert f"1 measurements in {tmp_path / 'elsewhere.json'}" in r.describe()


def test_format_table_shows_a_probe_as_a_floor():
    probe = dict(CONFIG, stage="float4_reads", order=2, kind="probe", us_graph=40.0, tbs=3.5, floor_us=5.0,
                 num_splits=14)
    rows = _rows(format_table([rec("float4", 60.0), probe]))
    assert rows["float4_reads"][5:7] == ["float4_reads", "14"]
    assert rows["float4_reads"][7:11] == ["-", "40.0", "-", "-"] and rows["float4_reads"][11] == "3.50"
    assert "probe: key reads only" in format_table([probe])


# ---- without a GPU, the options apply to the recorded results ----------------------------

LONG = ("mla_lab::naive: this call needs 263748 bytes of shared memory per block and the GPU allows 232448 "
        "(block table of 65545 pages x 1 tokens); the naive stage keeps a score for every key the block table "
        "can address in shared memory; use a shorter block table or a later stage")


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(results, "ROOT", tmp_path)
    probe = dict(CONFIG, stage="float4_reads", order=2, kind="probe", us_graph=4.0, tbs=3.5, floor_us=5.0,
                 num_splits=14)
    save(tmp_path / "results" / "h200.json", run("02"), [
        rec("naive", 100.0), rec("float4", 10.0, order=1), probe,
        rec("naive", 0.0, heads=64, prefix=65536, unsupported=LONG),
        rec("float4", 30.0, order=1, heads=64, prefix=65536),
        rec("float4", 12.0, order=1, q_len=16)])


def _shown(out):
    table = out.split(":\n\n", 1)[1].split("\n\n", 1)[0]
    return [(c[5], c[1], c[2], c[3]) for c in (cols(line) for line in table.splitlines()[2:])]


def test_bench_without_gpu_applies_selecting_options(recorded, capsys):
    assert bench.main(["--stages", "float4", "--heads", "64"]) == 0
    out = capsys.readouterr().out
    assert "only those --stages --heads asks for" in out
    assert _shown(out) == [("float4", "9", "64", "65536")]
    assert "Ignored here" not in out


def test_bench_without_gpu_names_the_options_it_cannot_apply(recorded, capsys):
    assert bench.main(["--rep-ms", "5", "--no-graph", "--triton-splits", "8", "--q-len", "16"]) == 0
    out = capsys.readouterr().out
    assert ("Ignored here (they change how a run measures or where it writes, and nothing is measured): "
            "--triton-splits --rep-ms --no-graph.") in out
    assert _shown(out) == [("float4", "16", "8", "1024")]


def test_bench_without_gpu_quick_and_probes(recorded, capsys):
    # --quick: 8 heads, prefixes 1024 and 16384, one stream of 9 rows; the probe comes with float4
    assert bench.main(["--quick", "--stages", "float4"]) == 0
    assert _shown(capsys.readouterr().out) == [("float4", "9", "8", "1024"), ("float4_reads", "9", "8", "1024")]
    assert bench.main(["--quick", "--stages", "float4", "--no-probes"]) == 0
    assert _shown(capsys.readouterr().out) == [("float4", "9", "8", "1024")]


def test_bench_without_gpu_when_nothing_matches(recorded, capsys):
    assert bench.main(["--prefix", "777"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("none of them is one --prefix asks for.")


def test_bench_rows_keep_the_whole_message(recorded, capsys):
    assert bench.main(["--heads", "64"]) == 0
    assert f"({LONG})" in capsys.readouterr().out


def test_given_options():
    ap = bench.parser()
    assert bench.given_options(ap, ["--quick", "--heads", "8", "--no-probes"]) == {"quick", "heads", "probes"}
    assert bench.given_options(ap, []) == set()
    # and the parser's defaults are intact afterwards
    args = bench.resolve(ap.parse_args([]))
    assert args.heads == [64, 8] and args.rep_ms == 100.0 and args.probes and args.page_size == 1
    q = bench.resolve(ap.parse_args(["--quick", "--heads", "64"]))
    assert q.heads == [64] and q.prefix == [1024, 16384] and q.rep_ms == 20.0


def test_bench_without_gpu_lists_peers_among_what_it_cannot_apply(recorded, capsys):
    assert bench.main(["--peers", "--rep-ms", "5"]) == 0
    assert ("Ignored here (they change how a run measures or where it writes, and nothing is measured): "
            "--rep-ms --peers.") in capsys.readouterr().out


def test_bench_without_gpu_shows_the_default_grid_and_says_how_to_see_all(recorded, capsys):
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "the default grid's 5 (one stream, q_len 9, 64 and 8 heads, prefixes 256 to 65536" in out
    assert ("float4", "16", "8", "1024") not in _shown(out)  # q_len 16: not in the default grid
    assert len(_shown(out)) == 5
    assert "`mla-lab bench --all` lists all 6" in out
    assert bench.main(["--all"]) == 0
    out = capsys.readouterr().out
    assert ("float4", "16", "8", "1024") in _shown(out) and len(_shown(out)) == 6
    assert "--all` lists" not in out


def test_bench_prints_a_legend_under_its_table(recorded, capsys):
    assert bench.main(["--heads", "8"]) == 0
    out = capsys.readouterr().out
    table, rest = out.split(":\n\n", 1)[1].split("\n\n", 1)
    assert rest.startswith(results.legend())
    for column in ("B streams", "T query rows", "H query heads", "prefix", "s at scattered", "c at contiguous",
                   "splits", "eager us", "graph us", "x naive", "TB/s", "floor us", "% floor", "rel_err"):
        assert column in results.legend(), column


def test_triton_split_limit_is_the_baseline_s():
    from mla_lab.core.triton_baseline import MAX_SPLITS

    assert bench.TRITON_MAX_SPLITS == MAX_SPLITS


def test_every_option_is_one_a_cpu_listing_applies_or_names():
    dests = {a.dest for a in bench.parser()._actions if a.dest != "help"}
    assert dests == set(bench.SELECTING) | set(bench.MEASURING) | {"all"}
