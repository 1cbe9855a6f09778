"""The sampling chapter's live panel: sliders for temperature, top-p and top-k over a real model.

    view = sampling_view(model, tok, "def main():\n", temperature=0.8, top_p=0.9, top_k=0, seed=0)
    view.figure, view.kept, view.text      # a bar chart, the kept token ids, a sampled continuation
    print(view.summary())
    sampling_panel(model, tok, "def main():\n")   # the same view, redrawn whenever a slider moves

All the logic is in the plain function `sampling_view`, so a notebook can check it at fixed settings
and a test can call it without a browser; `sampling_panel` only wires it to ipywidgets sliders.

Out of scope: penalties and min-p on the panel (the notebook shows them in cells), batched prompts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..generate import as_prompt_tensor, generate
from ..sampling import SamplingConfig, filtered_logits

PANEL_FIGSIZE = (8.5, 3.4)  # inches: the chart the panel shows, drawn by plot_view
PANEL_DPI = 100  # so the chart is always 850 x 340 pixels


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

    def summary(self, n_tokens: int = 8) -> str:
        s = self.settings
        head = ", ".join(f"{t!r} {self.final_probs[i].item():.1%}" for i, t in
                         zip(self.kept[:n_tokens], self.token_strings[:n_tokens]))
        more = f", ... (+{len(self.kept) - n_tokens} more)" if len(self.kept) > n_tokens else ""
        return (f"temperature={s.temperature:.2f}  top_p={s.top_p:.2f}  top_k={s.top_k}  seed={self.seed}\n"
                f"kept {len(self.kept)} of {self.shown_probs.numel()} tokens, "
                f"{self.kept_mass:.1%} of the probability: {head}{more}\n"
                f"sampled continuation:\n{self.prompt}{self.text}")


@torch.no_grad()
def next_token_logits(model, tok, prompt: str) -> torch.Tensor:
    """The model's logits for the token after `prompt` (encoded with a begin-of-text token), (V,)."""
    ids = as_prompt_tensor(tok.encode(prompt, bos=True), model)  # (1, T)
    return model(ids, last_only=True)[0, -1].float()


def sampling_view(model, tok, prompt: str, temperature: float = 0.8, top_p: float = 0.9, top_k: int = 0,
                  seed: int = 0, max_new_tokens: int = 30, n_bars: int = 24, plot: bool = True) -> SamplingView:
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
    view = SamplingView(settings=cfg, seed=int(seed), prompt=prompt, shown_probs=shown.cpu(), final_probs=final.cpu(),
                        kept=kept, kept_mass=float(shown[kept_mask].sum()), text=tok.decode(out[0, len(ids):].tolist()),
                        token_strings=tok.token_strings(kept))
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
    ax.bar(range(len(order)), [view.shown_probs[i].item() for i in order],
           color=["C0" if i in kept else "lightgray" for i in order], label="kept (before renormalising)")
    ax.scatter([j for j, i in enumerate(order) if i in kept], [view.final_probs[i].item() for i in order if i in kept],
               marker="_", s=160, color="C3", zorder=3, label="sampled from (renormalised)")
    ax.set_xticks(range(len(order)), labels, rotation=60, ha="right", fontsize=8)
    s = view.settings
    ax.set(ylabel="probability", title=f"T={s.temperature:.2f}, top-p={s.top_p:.2f}, top-k={s.top_k}: "
           f"{len(view.kept)} tokens kept ({view.kept_mass:.1%} of the probability)")
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


def sampling_panel(model, tok, prompt: str, temperature: float = 0.8, top_p: float = 0.9, top_k: int = 0,
                   seed: int = 0, max_new_tokens: int = 30):
    """Sliders (temperature, top-p, top-k, seed) over `sampling_view`: whenever one is released, ONE chart
    image and one text box are updated in place. Both have fixed sizes, so the panel never changes height
    and nothing is cleared and redrawn (which JupyterLab's notebook windowing can catch half-way).

    The panel's plain-text form, which a saved notebook keeps, says how to get the sliders."""
    import html

    import ipywidgets as w

    class SamplingPanel(w.VBox):
        def __repr__(self):
            return "Sampling panel: run the notebook in Jupyter to get the sliders"

    style = {"description_width": "90px"}
    layout = w.Layout(width="420px")
    sliders = dict(
        temperature=w.FloatSlider(value=temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                  continuous_update=False, style=style, layout=layout),
        top_p=w.FloatSlider(value=top_p, min=0.05, max=1.0, step=0.05, description="top-p",
                            continuous_update=False, style=style, layout=layout),
        top_k=w.IntSlider(value=top_k, min=0, max=50, step=1, description="top-k (0: off)",
                          continuous_update=False, style=style, layout=layout),
        seed=w.IntSlider(value=seed, min=0, max=20, step=1, description="seed", continuous_update=False,
                         style=style, layout=layout),
    )
    width_px, height_px = int(PANEL_FIGSIZE[0] * PANEL_DPI), int(PANEL_FIGSIZE[1] * PANEL_DPI)
    chart = w.Image(format="png", layout=w.Layout(width=f"{width_px}px", height=f"{height_px}px"))
    summary = w.HTML(layout=w.Layout(width=f"{width_px}px", height="15em", overflow="auto"))

    def redraw(_change=None):
        values = {name: s.value for name, s in sliders.items()}
        view = sampling_view(model, tok, prompt, round(values["temperature"], 4), round(values["top_p"], 4),
                             values["top_k"], values["seed"], max_new_tokens=max_new_tokens)
        chart.value = _png(view.figure)  # the same <img>, new pixels
        summary.value = f"<pre style='margin: 0'>{html.escape(view.summary())}</pre>"

    for s in sliders.values():
        s.observe(redraw, names="value")
    redraw()
    panel = SamplingPanel([w.VBox(list(sliders.values())), chart, summary])
    panel.add_class("sampling-panel")  # what the browser test looks for
    return panel
