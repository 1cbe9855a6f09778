"""The sampling chapter's live panel: sliders for temperature, top-p and top-k over a real model.

    view = sampling_view(model, tok, "def main():\n", temperature=0.8, top_p=0.9, top_k=0, seed=0)
    view.figure, view.kept, view.text      # a bar chart, the kept token ids, a sampled continuation
    print(view.summary())
    sampling_panel(model, tok, "def main():\n")   # the same view, redrawn whenever a slider moves

All the logic is in the plain function `sampling_view`, so a notebook can check it at fixed settings
and a test can call it without a browser; `sampling_panel` only wires it to ipywidgets sliders.

A saved notebook cannot keep a live panel: its sliders need the kernel that made them. The panel's model
always has the id PANEL_MODEL_ID, and `saved_notebook_state()` is a one-line stand-in under that id which
scripts/run_notebooks.py stores in the notebook's metadata. JupyterLab restores saved widget state when it
opens a notebook (keeping any live model of the same id), so a notebook the learner saved and reopens shows
that line where the panel was, instead of "Error displaying widget: model not found".

Out of scope: penalties and min-p on the panel (the notebook shows them in cells), batched prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..generate import as_prompt_tensor, generate
from ..options import keyword_options
from ..sampling import SamplingConfig, filtered_logits

PANEL_FIGSIZE = (8.5, 3.4)  # inches: the chart the panel shows, drawn by plot_view
PANEL_DPI = 100  # so the chart is always 850 x 340 pixels
PANEL_MODEL_ID = "llm-course-sampling-panel"  # the panel's widget model id, the same in every run
PANEL_TEXT = "Sampling panel: its sliders need a running kernel. Run the notebook to get them back."


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class SamplingView:
    settings: SamplingConfig
    seed: int
    prompt: str
    shown_probs: torch.Tensor  # (V,) the distribution the filters see: softmax(logits / T) (T=1 when greedy)
    final_probs: torch.Tensor  # (V,) what the next token is drawn from: the kept set, renormalised
    kept: list[int]  # ids of the kept tokens, most likely first
    kept_mass: float  # probability of the kept set under shown_probs
    text: str  # a continuation sampled with these settings and this seed
    token_strings: list[str]  # readable strings of the kept tokens
    figure: object = None  # matplotlib Figure (None when drawn with plot=False)

    def settings_line(self) -> str:
        s = self.settings
        return f"temperature={s.temperature:.2f}  top_p={s.top_p:.2f}  top_k={s.top_k}  seed={self.seed}"

    def kept_line(self) -> str:
        """What the next token is drawn from; at temperature 0, that greedy keeps the argmax alone."""
        if self.settings.greedy:
            return (
                f"greedy (temperature 0): always the most likely token, {self.token_strings[0]!r}; "
                f"the bars show the distribution at temperature 1, where it has {self.kept_mass:.1%}"
            )
        return (
            f"kept {plural(len(self.kept), 'token')} of {self.shown_probs.numel()}, "
            f"{self.kept_mass:.1%} of the probability"
        )

    def kept_tokens(self, n_tokens: int = 8) -> list[str]:
        """'token' probability, for the n_tokens most likely kept tokens (renormalised), and how many more."""
        items = [
            f"{t!r} {self.final_probs[i].item():.1%}"
            for i, t in zip(self.kept[:n_tokens], self.token_strings[:n_tokens])
        ]
        if len(self.kept) > n_tokens:
            items.append(f"... (+{len(self.kept) - n_tokens} more)")
        return items

    def summary(self, n_tokens: int = 8) -> str:
        return (
            f"{self.settings_line()}\n{self.kept_line()}: {', '.join(self.kept_tokens(n_tokens))}\n"
            f"sampled continuation:\n{self.prompt}{self.text}"
        )

    def summary_html(self, n_tokens: int = 8) -> str:
        """The summary for the panel's text box: it wraps only between kept tokens and at the spaces of the
        continuation, never inside a token."""
        import html

        tokens = ", ".join(
            f"<span style='display: inline-block; white-space: pre'>{html.escape(t)}</span>"
            for t in self.kept_tokens(n_tokens)
        )
        return (
            f"<div style='font-family: monospace; line-height: 1.35'>"
            f"<div style='white-space: pre'>{html.escape(self.settings_line())}</div>"
            f"<div>{html.escape(self.kept_line())}: {tokens}</div>"
            f"<div>sampled continuation:</div>"
            f"<pre style='margin: 0; white-space: pre-wrap; word-break: normal'>"
            f"{html.escape(self.prompt + self.text)}</pre></div>"
        )


@torch.no_grad()
def next_token_logits(model, tok, prompt: str) -> torch.Tensor:
    """The model's logits for the token after `prompt` (encoded with a begin-of-text token), (V,)."""
    ids = as_prompt_tensor(tok.encode(prompt, bos=True), model)  # (1, T)
    return model(ids, last_only=True)[0, -1].float()


def sampling_view(
    model, tok, prompt: str, temperature=0.8, top_p=0.9, top_k=0, seed=0, max_new_tokens=30, n_bars=24, plot=True
) -> SamplingView:
    """Next-token distribution, kept set and a sampled continuation for one setting of the sliders.

    Raises ValueError for settings outside their ranges (SamplingConfig checks them).
    """
    cfg = SamplingConfig(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k))
    logits = next_token_logits(model, tok, prompt)  # (V,)
    if cfg.greedy:
        shown = logits.softmax(-1)
        kept_mask = torch.zeros_like(shown, dtype=torch.bool)
        kept_mask[logits.argmax()] = True
    else:
        shown = (logits / cfg.temperature).softmax(-1)
        kept_mask = ~torch.isinf(filtered_logits(logits[None], cfg)[0])
    final = torch.where(kept_mask, shown, torch.zeros_like(shown))
    final = final / final.sum()
    kept = [i for i in torch.argsort(shown, descending=True, stable=True).tolist() if kept_mask[i]]
    ids = tok.encode(prompt, bos=True)
    generator = torch.Generator(device=model.device).manual_seed(int(seed))
    out = generate(model, ids, max_new_tokens, sampling=cfg, generator=generator, eos_id=tok.eos_id)
    view = SamplingView(
        settings=cfg,
        seed=int(seed),
        prompt=prompt,
        shown_probs=shown.cpu(),
        final_probs=final.cpu(),
        kept=kept,
        kept_mass=float(shown[kept_mask].sum()),
        text=tok.decode(out[0, len(ids) :].tolist()),
        token_strings=tok.token_strings(kept),
    )
    if plot:
        view.figure = plot_view(view, tok, n_bars)
    return view


def plot_view(view: SamplingView, tok, n_bars: int = 24):
    """Bars: the n_bars most likely tokens under softmax(logits/T); kept ones coloured, dropped ones grey."""
    import matplotlib.pyplot as plt

    order = torch.argsort(view.shown_probs, descending=True, stable=True)[:n_bars].tolist()
    kept = set(view.kept)
    labels = [ascii(s)[1:-1].replace(" ", "\u00b7") for s in tok.token_strings(order)]  # ASCII: no missing glyphs
    fig, ax = plt.subplots(figsize=PANEL_FIGSIZE)
    ax.bar(
        range(len(order)),
        [view.shown_probs[i].item() for i in order],
        color=["C0" if i in kept else "lightgray" for i in order],
        label="kept (before renormalising)",
    )
    ax.scatter(
        [j for j, i in enumerate(order) if i in kept],
        [view.final_probs[i].item() for i in order if i in kept],
        marker="_",
        s=160,
        color="C3",
        zorder=3,
        label="sampled from (renormalised)",
    )
    ax.set_xticks(range(len(order)), labels, rotation=90, fontsize=9)
    s = view.settings
    if s.greedy:
        title = "T=0 (greedy): the most likely token, always; bars at T=1"
    else:
        title = (
            f"T={s.temperature:.2f}, top-p={s.top_p:.2f}, top-k={s.top_k}: "
            f"{plural(len(view.kept), 'token')} kept ({view.kept_mass:.1%} of the probability)"
        )
    ax.set(ylabel="probability", title=title)
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def _png(fig) -> bytes:
    """The figure as PNG bytes at the panel's fixed size (no tight bounding box: the pixels never change)."""
    import io

    import matplotlib.pyplot as plt

    fig.set_size_inches(*PANEL_FIGSIZE)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PANEL_DPI)
    plt.close(fig)
    return buf.getvalue()


_live_panel = None  # the panel this kernel shows now: its model id is PANEL_MODEL_ID, so at most one lives


def sampling_panel(model, tok, prompt: str, max_new_tokens: int = 30, **settings):
    """Sliders (temperature, top-p, top-k, seed) over `sampling_view`: whenever one is released, ONE chart
    image and one text box are updated in place, under a status line that reads "computing..." while the
    new setting is drawn (the old chart stays until the new one is ready). All three have fixed sizes, so
    the panel never changes height and nothing is cleared and redrawn (which JupyterLab's notebook
    windowing can catch half-way).

    The panel's plain-text form, and the stand-in a saved notebook keeps (see the module docstring), say
    how to get the sliders back. Calling it again closes the previous panel (they share one model id).

    settings: where the sliders start, as sampling_view's keywords temperature, top_p, top_k and seed (its
    defaults for those not given)."""
    import ipywidgets as w

    global _live_panel
    start = keyword_options(sampling_view, settings, take=("temperature", "top_p", "top_k", "seed"))

    class SamplingPanel(w.VBox):
        def __repr__(self):
            return PANEL_TEXT

    if _live_panel is not None:
        for child in _live_panel.children:
            child.close()
        _live_panel.close()
        _live_panel = None
    style = {"description_width": "90px"}
    layout = w.Layout(width="420px")

    def slider(kind, value, lo, hi, step, description):
        common = dict(continuous_update=False, style=style, layout=layout)
        return kind(value=value, min=lo, max=hi, step=step, description=description, **common)

    sliders = dict(
        temperature=slider(w.FloatSlider, start.temperature, 0.0, 2.0, 0.05, "temperature"),
        top_p=slider(w.FloatSlider, start.top_p, 0.05, 1.0, 0.05, "top-p"),
        top_k=slider(w.IntSlider, start.top_k, 0, 50, 1, "top-k (0: off)"),
        seed=slider(w.IntSlider, start.seed, 0, 20, 1, "seed"),
    )
    width_px, height_px = int(PANEL_FIGSIZE[0] * PANEL_DPI), int(PANEL_FIGSIZE[1] * PANEL_DPI)
    status = w.HTML(layout=w.Layout(width=f"{width_px}px", height="1.8em"))
    status.add_class("sampling-panel-status")
    chart = w.Image(format="png", layout=w.Layout(width=f"{width_px}px", height=f"{height_px}px"))
    summary = w.HTML(layout=w.Layout(width=f"{width_px}px", height="20em", overflow="auto"))
    summary.add_class("sampling-panel-summary")

    def redraw(_change=None):
        values = {name: s.value for name, s in sliders.items()}
        status.value = (
            "<b style='color: #b35900'>computing...</b> the chart and text below still show the previous setting"
        )
        try:
            setting = {name: round(v, 4) if isinstance(v, float) else v for name, v in values.items()}
            view = sampling_view(model, tok, prompt, max_new_tokens=max_new_tokens, **setting)
            chart.value = _png(view.figure)  # the same <img>, new pixels
            summary.value = view.summary_html()
        finally:
            status.value = "showing: " + ", ".join(f"{name} {v}" for name, v in values.items())

    for s in sliders.values():
        s.observe(redraw, names="value")
    redraw()
    panel = SamplingPanel([w.VBox(list(sliders.values())), status, chart, summary], model_id=PANEL_MODEL_ID)
    panel.add_class("sampling-panel")  # what the browser test looks for
    _live_panel = panel
    return panel


def saved_notebook_state() -> dict:
    """The notebook metadata that stands in for the panel once the notebook is saved and reopened: the
    widget state (in the form ipywidgets saves it) of one HTML line under the panel's model id."""
    import json

    import ipywidgets as w
    from ipywidgets.embed import dependency_state
    from ipywidgets.widgets.widget_string import HTMLStyle

    line = w.HTML(
        value=PANEL_TEXT,
        model_id=PANEL_MODEL_ID,
        layout=w.Layout(model_id=PANEL_MODEL_ID + "-layout"),
        style=HTMLStyle(model_id=PANEL_MODEL_ID + "-style"),
    )
    try:
        state = dependency_state([line], drop_defaults=True)
    finally:
        for widget in (line, line.layout, line.style):
            widget.close()
    state = json.loads(json.dumps(state))  # as stored: tuples become lists
    return {"application/vnd.jupyter.widget-state+json": {"version_major": 2, "version_minor": 0, "state": state}}
