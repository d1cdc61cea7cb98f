"""The book's figures and sizes: every figure a chapter's prose quotes appears in a stored output of the same
chapter (no number typed by hand), and the chapters stay chapters (one idea each, readable in one sitting)."""

import json
import re
from pathlib import Path

import pytest

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"
NOTEBOOKS = sorted(CHAPTERS.glob("*.ipynb"))
LADDER = sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb"))
APPENDICES = [p for p in NOTEBOOKS if p not in LADDER]

# A figure: a number with a decimal point, or any number with a percent sign or a unit of time, rate or ratio.
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:%|µs|us\b|ns\b|ms\b|TB/s|GB/s|TFLOP/s|×|x\b|cycles)"
                    r"|(?<![\w.\-])(\d+\.\d+)(?![\w.])")
WORDS_PER_MINUTE = 250


def _cells(path: Path):
    return json.loads(path.read_text())["cells"]


def _outputs(cells) -> str:
    found = []
    for c in cells:
        for o in c.get("outputs", []) if c["cell_type"] == "code" else []:
            found.append("".join(o.get("text", "")))
            for kind in ("text/plain", "text/markdown", "text/html"):
                found.append("".join(o.get("data", {}).get(kind, "")))
    return "\n".join(found)


def _prose(cells) -> list[tuple[int, str]]:
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


def figures_missing(path: Path) -> list[tuple[int, str]]:
    """The figures of a notebook's prose (inline code left out) that none of its stored outputs shows."""
    cells = _cells(path)
    outputs = _outputs(cells)
    missing = []
    for i, text in _prose(cells):
        for m in FIGURE.finditer(re.sub(r"`[^`]*`", "", text)):
            if (m.group(1) or m.group(2)) not in outputs:
                missing.append((i, m.group(0)))
    return missing


def words(path: Path) -> int:
    return sum(len(re.findall(r"\S+", text)) for _, text in _prose(_cells(path)))


def code_cells(path: Path) -> int:
    return sum(1 for c in _cells(path) if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_the_prose_quotes_is_in_a_stored_output(path):
    assert figures_missing(path) == []


def test_the_figure_rule_finds_a_figure_typed_by_hand(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["It took 12.5 µs, 8% of the floor, 1.31x FlashMLA's."]},
                    {"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "text": ["12.5 us, 8%"]}]}]}
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb))
    assert [f for _, f in figures_missing(p)] == ["1.31x"]


@pytest.mark.parametrize("path", [p for p in LADDER if int(p.name[:2]) >= 10], ids=lambda p: p.name)
def test_a_part_iii_chapter_reads_in_twenty_minutes(path):
    assert words(path) <= 5000, f"{path.name}: {words(path)} words of prose"
    assert code_cells(path) <= 42, f"{path.name}: {code_cells(path)} code cells"


def test_the_ladder_reads_in_two_hours_and_the_appendix_stays_an_appendix():
    assert sum(words(p) for p in LADDER) <= 120 * WORDS_PER_MINUTE
    for p in APPENDICES:
        assert words(p) <= 10000, f"{p.name}: {words(p)} words"
