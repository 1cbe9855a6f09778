"""Figures: one style, saved as PNG and shown inline (into .cache/figures/, or figures/ when
scripts/run_notebooks.py regenerates the committed ones).

    fig, ax = plt.subplots()
    ...
    save_figure(fig, "05_latency_vs_position")     # writes figures/05_latency_vs_position.png and shows it

PNG rather than SVG: SVG embeds the date, so notebook outputs would change on every run. The PNG is
written with fixed metadata, so re-running a notebook leaves an unchanged figure byte-identical, and the
notebook shows the saved file itself.

Out of scope: interactive plots (see widgets.py).
"""

from __future__ import annotations

import os

import matplotlib

from ..paths import figures_dir
from .figure_check import check_figure_text


def use_course_style() -> None:
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.figsize": (7.5, 4.0),
            "figure.dpi": 100,
            "savefig.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "font.size": 10,
            "axes.titlesize": 11,
            "legend.frameon": False,
        }
    )


def save_figure(fig, name: str, show: bool = True) -> None:
    """Save `fig` as figures/<name>.png (deterministic bytes) and, in a notebook, display that very file.

    Displaying the saved PNG rather than re-rendering the figure makes the image stored in the
    notebook byte-identical to the one in figures/ (tests/test_figures.py checks it). Under the test suite
    and scripts/run_notebooks.py (LLM_COURSE_CHECK_FIGURES set) a figure whose labels overlap or leave
    their axes is refused with FigureTextError (figure_check.py)."""
    import matplotlib.pyplot as plt

    if os.environ.get("LLM_COURSE_CHECK_FIGURES"):
        check_figure_text(fig, name)

    folder = figures_dir()  # .cache/figures/, or LLM_COURSE_FIGURES (paths.figures_dir says why)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    fig.savefig(path, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    if show and in_notebook():
        from IPython.display import Image, display

        display(Image(filename=str(path)))


def in_notebook() -> bool:
    return "inline" in matplotlib.get_backend().lower()
