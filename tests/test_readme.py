"""The README's stage table is generated from the registry and the recorded results."""

from mla_lab.book import readme
from mla_lab.core import stages


def test_readme_table_is_up_to_date():
    # fails after a change to the registry or to results/ until `python -m mla_lab.book.readme` is run
    assert readme.main(["--check"]) == 0


def test_readme_table_lists_every_stage_in_order():
    lines = [l for l in readme.table().splitlines() if l.startswith("| ") and "`" in l]
    assert [l.split("`")[1] for l in lines] == [s.id for s in stages.STAGES]


def _record(stage, run, us, **config):
    base = dict(streams=1, q_len=9, heads=8, prefix=16384, page_size=64, scattered=True)
    base.update(config)
    return dict(base, stage=stage, run=run, us_graph=us, floor_us=10.0)


def test_peers_table_pairs_only_records_of_one_run(tmp_path):
    from mla_lab.measure.results import Recorded

    runs = [dict(gpu="NVIDIA H200", date="2026-12-01T00:00:00", command="mla-lab bench --peers A", commit="abc",
                 flash_mla=dict(commit="c2067be")),
            dict(gpu="NVIDIA H200", date="2026-12-02T00:00:00", command="mla-lab bench --peers B", commit="def")]
    records = [_record("hopper", 0, 20.0), _record("flashmla", 0, 40.0),             # grid: a win
               _record("hopper", 0, 50.0, heads=64), _record("flashmla", 0, 25.0, heads=64),  # grid: a loss
               _record("hopper", 1, 30.0, heads=128, q_len=1, prefix=777),               # beyond the grid
               _record("flashmla", 1, 30.0, heads=128, q_len=1, prefix=777),             # a tie counts as a win
               _record("hopper", 0, 5.0, streams=8), _record("flashmla", 1, 9.0, streams=8),  # two runs: left out
               _record("flashmla", 1, 9.0, streams=4)]                                   # no record of the op
    text = readme.peers_table(Recorded(tmp_path / "x.json", runs, records))
    rows = [l for l in text.splitlines() if l.startswith("| ") and l[2].isdigit()]
    assert len(rows) == 3
    assert "Part III's grid, the shapes its targets name: `hopper` takes at most FlashMLA's time at 1 of 2 shapes" \
        in text
    assert "Beyond that grid: `hopper` takes at most FlashMLA's time at 1 of 1 shapes" in text
    assert "| 1 | 9 | 8 | 16384 | 64 | 20.0 | 40.0 | 0.50 | 50% | 25% |" in rows
    assert "`mla-lab bench --peers A` at commit abc (FlashMLA c2067be)" in text
    assert "`mla-lab bench --peers B` at commit def (FlashMLA ?)" in text


def test_peers_table_without_a_peer_run(tmp_path):
    from mla_lab.measure.results import Recorded

    text = readme.peers_table(Recorded(tmp_path / "x.json", [], []))
    assert text.startswith("No run with FlashMLA recorded yet")
