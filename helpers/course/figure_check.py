"""Text that collides in a figure: two labels drawn over each other, or a label that leaves its axes.

    problems = text_problems(fig)     # [] when every text has room; else one line per collision

save_figure runs this on every figure before saving it and raises FigureTextError when the variable
LLM_COURSE_CHECK_FIGURES is set (the test suite and scripts/run_notebooks.py set it), so a figure whose
labels overlap cannot reach the course.

What counts as a text: figure texts and the suptitle; each axes' title, axis labels, tick labels, texts
and annotations (`ax.text`, `ax.annotate`) and legend entries. Two texts collide when their drawn
boxes overlap by more than `pad` pixels both ways; a text or annotation placed in an axes must stay inside
that axes' box. Left out: texts over lines, markers or bars (a label may sit on a bar on purpose), and
texts that are not drawn (invisible or empty).
"""

from __future__ import annotations


class FigureTextError(ValueError):
    """A figure's labels overlap each other or leave their axes."""


def _in_view(location, limits) -> bool:
    """A tick is drawn only inside its axis' view limits (matplotlib still lists the labels of the ones beyond)."""
    low, high = sorted(limits)
    span = (high - low) * 1e-9
    return low - span <= location <= high + span


def _texts(fig) -> list:
    """(kind, axes or None, Text) for every visible, non-empty text the figure draws."""
    suptitle = getattr(fig, "_suptitle", None)
    found = [("figure text", None, t) for t in fig.texts if t is not suptitle]  # matplotlib lists it there too
    if suptitle is not None:
        found.append(("suptitle", None, suptitle))
    for ax in fig.axes:
        found.extend(("axis label", ax, t) for t in (ax.title, ax._left_title, ax._right_title))
        if ax.axison:  # ax.axis("off") draws no axis labels and no ticks
            found.extend(("axis label", ax, t) for t in (ax.xaxis.label, ax.yaxis.label))
            x_view, y_view = ax.get_xlim(), ax.get_ylim()
            found.extend(("tick label", ax, t) for t in ax.get_xticklabels() if _in_view(t.get_position()[0], x_view))
            found.extend(("tick label", ax, t) for t in ax.get_yticklabels() if _in_view(t.get_position()[1], y_view))
        for t in ax.texts:  # ax.text and ax.annotate
            found.append(("text", ax, t))
        legend = ax.get_legend()
        if legend is not None:
            found.extend(("legend entry", ax, t) for t in legend.get_texts())
    return [(kind, ax, t) for kind, ax, t in found if t.get_visible() and t.get_text().strip()]


def text_problems(fig, pad: float = 0.5) -> list[str]:
    """One line per pair of texts whose boxes overlap, and per axes text that leaves its axes."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    items = [(kind, ax, t, t.get_window_extent(renderer)) for kind, ax, t in _texts(fig)]
    problems = []
    for i, (kind1, _, t1, box1) in enumerate(items):
        for kind2, _, t2, box2 in items[i + 1 :]:
            overlap_x = min(box1.x1, box2.x1) - max(box1.x0, box2.x0)
            overlap_y = min(box1.y1, box2.y1) - max(box1.y0, box2.y0)
            if overlap_x > pad and overlap_y > pad:
                problems.append(f"{kind1} {t1.get_text()!r} overlaps {kind2} {t2.get_text()!r}")
    for kind, ax, t, box in items:
        if kind == "text":
            inside = ax.get_window_extent(renderer)
            if (
                box.x0 < inside.x0 - pad
                or box.x1 > inside.x1 + pad
                or box.y0 < inside.y0 - pad
                or box.y1 > inside.y1 + pad
            ):
                problems.append(f"text {t.get_text()!r} leaves its axes")
    return problems


def check_figure_text(fig, name: str) -> None:
    """Raise FigureTextError naming the figure and every collision, if there is any."""
    problems = text_problems(fig)
    if problems:
        listed = "; ".join(problems[:8]) + (f"; and {len(problems) - 8} more" if len(problems) > 8 else "")
        raise FigureTextError(f"figure {name!r}: {listed}")
