"""Concept diagrams drawn with matplotlib (reproducible, saved to figures/ by the notebook).

    from helpers.diagrams import kv_cache_growth
    fig = kv_cache_growth(["<bos>", "def", " f", "(x", "):", "\\n   ", " return"], n_prompt=4)

Left out: anything measured. These pictures show a mechanism, never a number.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle


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
    fig, axes = plt.subplots(n_steps, 1, figsize=(1.05 * width + 3.2, 1.25 * n_steps + 0.3), squeeze=False)
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
                ax.text(pos + 0.45, -0.25, repr(tokens[pos])[1:-1], ha="center", va="center", fontsize=8,
                        family="monospace")
        last = filled - 1  # the query that predicts the next token
        ax.add_patch(FancyArrowPatch((last + 0.45, 1.35), (last + 0.45, 0.95), arrowstyle="-|>",
                                     mutation_scale=10, color="crimson"))
        nxt = repr(tokens[filled])[1:-1] if filled < len(tokens) else "?"
        ax.text(last + 0.45, 1.5, f"query of '{repr(tokens[last])[1:-1]}' -> predicts '{nxt}'", ha="left",
                va="bottom", fontsize=8, color="crimson")
        phase = (f"prefill: {n_prompt} positions written at once" if step == 0
                 else f"decode step {step}: 1 position written")
        ax.text(-0.3, 0.45, phase, ha="right", va="center", fontsize=9)
        ax.set_xlim(-0.2, width + 0.2)
        ax.set_ylim(-0.55, 2.0)
        ax.axis("off")
    fig.suptitle("The KV cache, step by step (orange: written this step; blue: prompt; green: generated)",
                 fontsize=10, y=1.0)
    return fig
