"""Every chapter keeps the shape a learner can finish (README, "How a chapter reads"): learning goals, a main
path of at most 45 cells before "## Exercises", 3-5 exercises with at least one prediction checked by a
measurement, a summary, at most 80 cells in all; and no markdown cell quotes another machine, since a
learner's run can never agree with a number measured elsewhere (measured values reach prose through code)."""

from __future__ import annotations

import json
import re

import pytest

from helpers.paths import REPO

CHAPTERS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = REPO / "helpers" / "course" / "exercises"
MAIN_PATH_CELLS, CHAPTER_CELLS = 45, 80

# a CPU family or model, or a sentence about the machine some outputs came from
NAMES_A_MACHINE = re.compile(
    r"\b(zen ?[0-9]|xeon|epyc|ryzen|sapphire rapids|skylake|graviton|threadripper|core i[3579])\b"
    r"|(course|outputs?|notebook) (was|were) (written|made|run) on\b|on (one of )?our machines|on another machine",
    re.IGNORECASE,
)


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _text(cell) -> str:
    return "".join(cell["source"])


def _headings(cells) -> list[tuple[int, str]]:
    return [
        (i, line.strip())
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown"
        for line in _text(c).splitlines()
        if line.startswith("## ")
    ]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:2])
def test_main_path_exercises_and_length(path):
    cells = _cells(path)
    exercises_at = [i for i, h in _headings(cells) if h == "## Exercises"]
    assert exercises_at, f"{path.name}: no '## Exercises' heading"
    assert exercises_at[0] <= MAIN_PATH_CELLS, (
        f"{path.name}: main path is {exercises_at[0]} cells (at most {MAIN_PATH_CELLS}); move the rest to Going deeper"
    )
    assert len(cells) <= CHAPTER_CELLS, f"{path.name}: {len(cells)} cells (at most {CHAPTER_CELLS})"
    code = "\n".join(_text(c) for c in cells if c["cell_type"] == "code")
    checks = set(re.findall(r"\bch\d\d\.check_(\d+)\(", code))
    assert 3 <= len(checks) <= 5, f"{path.name}: {len(checks)} exercises checked (want 3 to 5)"
    module = EXERCISES / f"ch{path.name[:2]}.py"
    assert "prediction(" in module.read_text(), f"{module.name}: no prediction checked by a measurement"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:2])
def test_goals_and_summary(path):
    cells = _cells(path)
    opening = " ".join(_text(c) for c in cells[:3] if c["cell_type"] == "markdown").lower()
    assert "goal" in opening or "you will" in opening, f"{path.name}: no learning goals at the top"
    summary = [i for i, c in enumerate(cells) if "## Summary" in _text(c)]
    assert summary, f"{path.name}: no '## Summary'"


@pytest.mark.parametrize(
    "path", CHAPTERS + sorted((REPO / "notebooks" / "solutions").glob("*.ipynb")), ids=lambda p: p.stem
)
def test_no_markdown_names_a_machine(path):
    hits = [
        (i, m.group(0))
        for i, c in enumerate(_cells(path))
        if c["cell_type"] == "markdown"
        for m in [NAMES_A_MACHINE.search(_text(c))]
        if m
    ]
    assert not hits, f"{path.name}: markdown cells name a CPU or another machine: {hits[:5]}"


def test_the_pattern_finds_what_it_should():
    # the check above can fail: these sentences are the kind the course once carried
    for sentence in (
        "on an AMD Zen 5 machine it made the step 1.7x faster",
        "the Intel Xeon gave 1.01x",
        "On the machine this course was written on",
        "outputs were made on a laptop",
    ):
        assert NAMES_A_MACHINE.search(sentence), sentence
    assert not NAMES_A_MACHINE.search("this run's CPU reads 13.5 GB/s")
