"""The article's claims (article.py): quotes, figures, the agreement rule, and the verdict table from records."""

import re

import pytest

from mla_lab.book import article
from mla_lab.measure import results
from mla_lab.book.article import NA, Claim, Evidence, agrees, parse_figure


def test_every_figure_is_part_of_its_quote_and_parses():
    assert len(article.CLAIMS) >= 30
    for c in article.CLAIMS:
        assert c.figure in c.quote, c
        parse_figure(c.figure)  # raises if no number
        assert c.chapter in (0, 1, 2, 3, 4, 5, 6), c  # the chapters of the article's path
        if c.approximate:  # the wider margin only where the article itself says the figure is rough
            assert "~" in c.figure or re.search(r"\b(roughly|approximately)\b", c.quote), c


def test_chapters_in_order_and_claim_lookup():
    chapters = [c.chapter for c in article.claims()]
    assert chapters == sorted(chapters)
    assert {c.chapter for c in article.CLAIMS} == {0, 1, 2, 3, 4, 5, 6}
    assert article.claim("~14 GB/s").chapter == 0
    with pytest.raises(KeyError):
        article.claim("no such figure")


@pytest.mark.parametrize("figure, value", [
    ("1.6–1.9×", (1.6, 1.9)), ("10^10 FMAs", 1e10), ("only one block", 1.0), ("n/a", NA), ("19602.0", 19602.0),
    ("2048 threads (64 warps)", (2048.0, 64.0)), ("BLOCK=256, HT=1, TK=8", (256.0, 1.0, 8.0)), ("~20ms", 20.0),
])
def test_parse_figure(figure, value):
    assert parse_figure(figure) == value


def _claim(figure, **kw):
    return Claim(0, f"it is {figure} here", figure, "a test figure", "", lambda ev: None, "test", **kw)


def test_agreement_rule():
    plain, rough = _claim("50×"), _claim("~50×", approximate=True)
    assert agrees(plain, 54.9) and agrees(plain, 45.1) and not agrees(plain, 55.1) and not agrees(plain, 44.9)
    assert agrees(rough, 62.4) and not agrees(rough, 62.6)
    ranged = _claim("1.6–1.9×")
    assert agrees(ranged, 1.45) and agrees(ranged, 2.08) and not agrees(ranged, 1.43) and not agrees(ranged, 2.1)
    counted = _claim("4 blocks", exact=True)
    assert agrees(counted, 4) and not agrees(counted, 3) and not agrees(counted, 5)
    pair = _claim("2048 threads (64 warps)", exact=True)
    assert agrees(pair, (2048, 64)) and not agrees(pair, (1536, 48))
    na = _claim("n/a")
    assert agrees(na, NA) and not agrees(na, 3.0) and not agrees(plain, NA)


def test_missing_records_are_not_measured_never_agreeing():
    rows = [article.evaluate(c, Evidence([], None)) for c in article.CLAIMS]
    measured = [r for r in rows if r.claim.how.startswith("measured")]
    assert measured and all(r.ours is None and r.ours_agrees is None for r in measured)


def test_verdict_table_from_the_recorded_results(capsys):
    rec = results.load()
    if rec is None:
        pytest.skip("no recorded results in results/")
    rows = article.verdict_table()
    out = capsys.readouterr().out
    assert len(rows) == len(article.CLAIMS)
    # every claim finds what it needs in the committed records: nothing left unmeasured
    assert all(r.ours is not None for r in rows), [r.claim.figure for r in rows if r.ours is None]
    assert f"{len(rows)} figures of the article" in out
    # figures that are the same on any GPU: ours and the sm_120 figure are one number
    for r in rows:
        if "the same on any GPU" in r.claim.how:
            assert r.sm120 == r.ours, r.claim.figure
    # a few verdicts that follow from arithmetic alone (no timing involved)
    by = {r.claim.figure: r for r in rows}
    assert by["67%"].sm120_agrees and not by["67%"].ours_agrees  # 4 x 256 of 1536 threads; 8 blocks on the H200
    assert by["only one block"].sm120_agrees and not by["only one block"].ours_agrees
    assert by["10^10 FMAs"].ours_agrees
    article.verdict_table(numbers=False)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(rows) + 1
    for line, r in zip(lines, rows):  # no measured number in the words-only table: only the article's figure
        assert line.startswith(f"{r.claim.chapter:02d} {r.claim.figure!r}: ours ")
        rest = line[len(f"{r.claim.chapter:02d} {r.claim.figure!r}"):].replace("sm_120", "")
        assert not re.search(r"\d", rest), line
