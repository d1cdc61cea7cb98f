"""The README's stage table is generated from the registry and the recorded results."""

from mla_lab import readme, stages


def test_readme_table_is_up_to_date():
    # fails after a change to the registry or to results/ until `python -m mla_lab.readme` is run
    assert readme.main(["--check"]) == 0


def test_readme_table_lists_every_stage_in_order():
    lines = [l for l in readme.table().splitlines() if l.startswith("| ") and "`" in l]
    assert [l.split("`")[1] for l in lines] == [s.id for s in stages.STAGES]
