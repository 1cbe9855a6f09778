"""Every committed figure is the very image stored in its notebook's output, byte for byte.

scripts/run_notebooks.py writes outputs and figures in one run, and helpers.course.plotting.save_figure
displays the PNG file it wrote, so a notebook and figures/ can only disagree when one of them was
regenerated without the other. Figures made outside the notebooks (the bench's, the browser test's
screenshot) are left out."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest

from helpers.paths import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NOT_FROM_NOTEBOOKS = ("bench_",)
SAVED = re.compile(r"save_figure\([^\n]*?,\s*[\"']([\w.-]+)[\"']")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored_pngs(nb_path: Path) -> set[str]:
    cells = json.loads(nb_path.read_text())["cells"]
    return {
        sha256(base64.b64decode("".join(out["data"]["image/png"])))
        for cell in cells
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    }


def saved_names(nb_path: Path) -> list[str]:
    cells = json.loads(nb_path.read_text())["cells"]
    return [name for cell in cells if cell["cell_type"] == "code" for name in SAVED.findall("".join(cell["source"]))]


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_saved_figure_is_the_stored_image(nb_path):
    names = saved_names(nb_path)
    stored = stored_pngs(nb_path)
    for name in names:
        figure = REPO / "figures" / f"{name}.png"
        assert figure.exists(), f"{nb_path.name} saves {name}.png, which is not in figures/"
        assert sha256(figure.read_bytes()) in stored, (
            f"figures/{name}.png is not the image stored in {nb_path.name}: "
            "regenerate both with scripts/run_notebooks.py"
        )


def test_every_figure_comes_from_a_notebook():
    saved = {name for nb in NOTEBOOKS for name in saved_names(nb)}
    figures = {p.stem for p in (REPO / "figures").glob("*.png") if not p.name.startswith(NOT_FROM_NOTEBOOKS)}
    assert figures - saved == set(), "figures no notebook saves (stale files?)"


def test_figure_check_finds_overlapping_and_escaping_labels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.course.figure_check import FigureTextError, check_figure_text, text_problems

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    ax.set_title("fine")
    fig.suptitle("suptitle")  # matplotlib also lists it among the figure texts: not a collision with itself
    assert text_problems(fig) == []
    check_figure_text(fig, "fine")  # no collision: no error
    ax.text(0.5, 0.5, "hello")
    ax.text(0.51, 0.5, "world")  # drawn over "hello"
    ax.annotate("outside", (1.2, 0.5))  # past the right edge of the axes
    ax.set_xticks([i / 100 for i in range(60)])  # 60 tick labels in one axes width run together
    problems = text_problems(fig)
    assert "text 'hello' overlaps text 'world'" in problems
    assert "text 'outside' leaves its axes" in problems
    assert any(p.startswith("tick label") and "overlaps tick label" in p for p in problems)
    with pytest.raises(FigureTextError, match="figure 'crowded'"):
        check_figure_text(fig, "crowded")
    plt.close(fig)


def test_figure_check_counts_a_suptitle_once_and_only_drawn_ticks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.course.figure_check import text_problems

    fig, (ax1, ax2) = plt.subplots(2, 1)  # matplotlib lists a suptitle in fig.texts too
    fig.suptitle("one title")
    ax1.axis("off")  # its tick labels are not drawn, however tightly they would be packed
    ax1.set_xticks([i / 100 for i in range(60)])
    ax1.text(0.5, 0.5, "inside")
    ax2.set_xticks([0, 1])
    assert text_problems(fig) == []
    plt.close(fig)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(6, 3), gridspec_kw={"wspace": 0.05})
    ax1.plot([0, 1050], [0, 1])
    ax1.set_xlim(0, 1050)  # matplotlib lists a '1200' tick label past the limit, but does not draw it
    ax2.plot([0, 1], [-100, 1150])
    assert not any("'1200'" in problem for problem in text_problems(fig))
    plt.close(fig)


def test_figure_check_ignores_ticks_the_locator_places_past_the_limits():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from helpers.course.figure_check import text_problems

    fig, axes = plt.subplots(2, 2, sharey="col")
    for ax in axes.flat:
        ax.plot([0.2, 0.4, 0.6], [0.1, 0.5, 0.9])
        ax.set_ylim(-0.03, 1.03)  # the locator also places ticks at -0.25 and 1.25, which are not drawn
    fig.suptitle("one title over all four")
    fig.tight_layout()
    assert text_problems(fig) == []
    plt.close(fig)
