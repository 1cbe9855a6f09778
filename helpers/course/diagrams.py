"""Concept diagrams drawn with matplotlib (reproducible, saved to figures/ by the notebook).

    from helpers.course.diagrams import kv_cache_growth, draw_speculative_round
    fig = kv_cache_growth(["<bos>", "def", " f", "(x", "):", "\\n   ", " return"], n_prompt=4)   # chapter 05
    save_figure(draw_speculative_round(), "12_one_round")                                      # chapter 12

`kv_cache_growth`: the cache step by step. `draw_speculative_round`: one round of speculative decoding as a
schematic (token names, not model output): the draft proposes gamma tokens one cheap step at a time, the
target scores all of them in one pass, proposals are accepted left to right until the first rejection, which
is replaced by a draw from the residual; later proposals are thrown away.

Left out: anything measured. These pictures show a mechanism, never a number (chapter 12's section 3
computes the probabilities the round diagram leaves out).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle

__all__ = ["kv_cache_growth", "draw_speculative_round"]


def kv_cache_growth(tokens: list[str], n_prompt: int, n_steps: int | None = None):
    """The KV cache step by step: the prefill writes keys and values for the whole prompt, then each
    decode step writes one position. In every step the query of the *last token fed in* attends over
    all cached keys and predicts the token after it. `tokens` holds the prompt then the generated
    tokens (as strings); returns the figure."""
    if not 1 <= n_prompt < len(tokens):
        raise ValueError(f"n_prompt must be between 1 and len(tokens) - 1 = {len(tokens) - 1}, got {n_prompt}")
    n_steps = n_steps or len(tokens) - n_prompt
    if not 1 <= n_steps <= len(tokens) - n_prompt:
        raise ValueError(f"n_steps must be between 1 and {len(tokens) - n_prompt}, got {n_steps}")
    width = n_prompt + n_steps
    left, right = 3.2, 2.8  # room, in boxes, for the phase labels and for the query line past the last box
    fig, axes = plt.subplots(n_steps, 1, figsize=(0.95 * (width + left + right), 1.25 * n_steps + 0.3), squeeze=False)
    fig.subplots_adjust(left=0.01, right=0.99)
    for step, ax in enumerate(axes[:, 0]):
        filled = n_prompt + step  # cached positions after this step
        written = range(0, n_prompt) if step == 0 else range(filled - 1, filled)
        for pos in range(width):
            if pos < filled:
                color = "#f4a259" if pos in written else ("#9ec5e8" if pos < n_prompt else "#c9ddb0")
                edge = "black"
            else:
                color, edge = "white", "#bbbbbb"
            ax.add_patch(Rectangle((pos, 0), 0.9, 0.9, facecolor=color, edgecolor=edge, lw=1))
            if pos < filled:
                ax.text(pos + 0.45, 0.45, "K,V", ha="center", va="center", fontsize=8)
                ax.text(
                    pos + 0.45, -0.25, repr(tokens[pos])[1:-1], ha="center", va="center", fontsize=8, family="monospace"
                )
        last = filled - 1  # the query that predicts the next token
        ax.add_patch(
            FancyArrowPatch(
                (last + 0.45, 1.35), (last + 0.45, 0.95), arrowstyle="-|>", mutation_scale=10, color="crimson"
            )
        )
        nxt = repr(tokens[filled])[1:-1] if filled < len(tokens) else "?"
        ax.text(
            last + 0.45,
            1.5,
            f"query of '{repr(tokens[last])[1:-1]}' -> predicts '{nxt}'",
            ha="left",
            va="bottom",
            fontsize=8,
            color="crimson",
        )
        phase = (
            f"prefill: {n_prompt} positions written at once" if step == 0 else f"decode step {step}: 1 position written"
        )
        ax.text(-0.3, 0.45, phase, ha="right", va="center", fontsize=9)
        ax.set_xlim(-left, width + right)
        ax.set_ylim(-0.55, 2.0)
        ax.axis("off")
    fig.suptitle(
        "The KV cache, step by step (orange: written this step; blue: prompt; green: generated)", fontsize=10, y=1.0
    )
    return fig


_COLORS = {
    "prompt": "#e6e6e6",
    "draft": "#ffe0b3",
    "accepted": "#b7e4c7",
    "rejected": "#f4a6a6",
    "discarded": "#f2f2f2",
    "target": "#a9c9f5",
}


def draw_speculative_round(
    committed=("def", " f", "(x"), proposals=("):", "⏎", "return", "x"), n_accepted: int = 2, replacement: str = "pass"
):
    """One round with len(proposals) draft tokens, of which the first `n_accepted` are accepted.

    Rows, top to bottom: the draft's gamma sequential steps (an arrow from each proposal to the step that
    reads it, drawn in the gap between two boxes, never over a token); the target's single pass over the
    last committed token and every proposal (gamma + 1 output rows); the verdict per proposal; the text
    after the round. Boxes are spaced so that the longest label fits inside its box. Returns the figure."""
    gamma = len(proposals)
    if not 0 <= n_accepted <= gamma:
        raise ValueError(f"n_accepted must be between 0 and len(proposals) = {gamma}, got {n_accepted}")
    n_c = len(committed)
    width = n_c + gamma + 1  # columns: committed tokens, proposals, one extra (bonus) position
    pitch, box_w = 1.5, 1.1  # column spacing and box width, in data units: a 0.4-unit gap for the arrows
    left, right = 3.6, 3.6  # room for the row labels, and for the note after the last row
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.set(xlim=(-left, width * pitch + right), ylim=(-0.45, 4.5))
    ax.axis("off")

    def x0(col):  # left edge of column col's box
        return col * pitch

    def box(col, row, text, kind):
        ax.add_patch(Rectangle((x0(col), row - 0.32), box_w, 0.64, facecolor=_COLORS[kind], edgecolor="gray", lw=0.8))
        ax.text(
            x0(col) + box_w / 2,
            row,
            text,
            ha="center",
            va="center",
            family="DejaVu Sans Mono",
            fontsize=9,
            color="dimgray" if kind == "discarded" else "black",
        )

    labels = {
        4: "1. draft: γ cheap steps,\n    one token each",
        3: "2. target: ONE pass\n    over γ + 1 positions",
        2: "3. accept left to right",
        1: "4. text after the round",
    }
    for row, text in labels.items():
        ax.text(-left + 0.1, row, text, ha="left", va="center", fontsize=9)

    # row 4: the draft's sequential proposals, each feeding the next step (arrows in the gaps only)
    for j, t in enumerate(committed):
        box(j, 4, t, "prompt")
    for i, t in enumerate(proposals):
        box(n_c + i, 4, t, "draft")
        if i:
            ax.add_patch(
                FancyArrowPatch(
                    (x0(n_c + i - 1) + box_w + 0.04, 4),
                    (x0(n_c + i) - 0.04, 4),
                    arrowstyle="-|>",
                    mutation_scale=9,
                    color="darkorange",
                    lw=1.2,
                    shrinkA=0,
                    shrinkB=0,
                )
            )
    # row 3: one target pass, drawn as one wide bar under the last committed token and every proposal
    bar_left, bar_right = x0(n_c - 1), x0(n_c + gamma) + box_w
    ax.add_patch(
        Rectangle(
            (bar_left, 3 - 0.32), bar_right - bar_left, 0.64, facecolor=_COLORS["target"], edgecolor="gray", lw=0.8
        )
    )
    ax.text(
        (bar_left + bar_right) / 2,
        3,
        "one pass: p_target at every proposal, plus one more row",
        ha="center",
        va="center",
        fontsize=9,
    )
    # row 2: verdicts
    for i in range(gamma):
        if i < n_accepted:
            box(n_c + i, 2, "accept", "accepted")
        elif i == n_accepted:
            box(n_c + i, 2, "reject", "rejected")
        else:
            box(n_c + i, 2, "drop", "discarded")
    if n_accepted == gamma:
        box(n_c + gamma, 2, "bonus", "target")
    # row 1: committed text
    for j, t in enumerate(committed):
        box(j, 1, t, "prompt")
    for i in range(n_accepted):
        box(n_c + i, 1, proposals[i], "accepted")
    box(n_c + n_accepted, 1, replacement, "target")
    ax.text(
        x0(n_c + n_accepted + 1) + 0.1, 1, f"{n_accepted + 1} new tokens\nfor one target pass", va="center", fontsize=9
    )
    ax.text(
        -left + 0.1,
        0,
        "then: roll both KV caches back to the committed length; the next round starts there",
        ha="left",
        va="center",
        fontsize=9,
        style="italic",
    )
    handles = [
        Rectangle((0, 0), 1, 1, facecolor=_COLORS[k], edgecolor="gray")
        for k in ("prompt", "draft", "accepted", "rejected", "discarded", "target")
    ]
    fig.legend(
        handles,
        ["committed", "draft proposal", "accepted", "rejected", "dropped (after a rejection)", "from the target"],
        ncol=6,
        loc="lower center",
        fontsize=9,
        handlelength=1.2,
        columnspacing=1.0,
    )
    ax.set_title(
        f"One speculative round, γ = {gamma}: the draft guesses, the target checks every guess at once", fontsize=11
    )
    return fig
