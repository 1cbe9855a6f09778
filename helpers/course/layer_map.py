"""A drawn map of one transformer block of helpers.model, with the shape of every tensor on it.

    fig = draw_layer_map(cfg, T=16)
    save_figure(fig, "01_layer_map")

The map is drawn from the config (names and shapes as in model.py's Block, Attention and MLP), so it
changes with the config rather than being a picture that can go stale.

Out of scope: the embedding and head (one box each, drawn around the block), the KV cache, batching.
"""

from __future__ import annotations

from ..model import ModelConfig


def layer_map_steps(cfg: ModelConfig, T: int, B: int = 1) -> list[tuple[str, str, str]]:
    """(operation, the weight it uses with its shape, output shape) for one block, top to bottom."""
    C, H, Hkv, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    qkv = (H + 2 * Hkv) * D
    return [
        ("x: the residual stream", "", f"({B}, {T}, {C})"),
        ("attn_norm: RMSNorm", f"weight ({C},)", f"({B}, {T}, {C})"),
        ("wqkv: one matmul for q | k | v", f"({qkv}, {C})", f"({B}, {T}, {qkv})"),
        (f"split, heads: q {H} heads, k and v {Hkv} each", "", f"q ({B}, {H}, {T}, {D})  k, v ({B}, {Hkv}, {T}, {D})"),
        ("RoPE: rotate q and k by position", f"cos, sin ({T}, {D})", "same shapes"),
        (f"causal attention ({H // Hkv} q heads per k/v head)", "", f"({B}, {H}, {T}, {D})"),
        ("merge heads, wo", f"({C}, {H * D})", f"({B}, {T}, {C})"),
        ("x = x + attention", "", f"({B}, {T}, {C})"),
        ("mlp_norm: RMSNorm", f"weight ({C},)", f"({B}, {T}, {C})"),
        ("w_gate_up: gate | up in one matmul", f"({2 * F}, {C})", f"({B}, {T}, {2 * F})"),
        ("silu(gate) * up", "", f"({B}, {T}, {F})"),
        ("w_down", f"({C}, {F})", f"({B}, {T}, {C})"),
        ("x = x + mlp", "", f"({B}, {T}, {C})"),
    ]


def draw_layer_map(cfg: ModelConfig, T: int = 16, B: int = 1):
    """One block as a column of boxes (operation), with weight shapes on the left and output shapes
    on the right; the two residual connections drawn as arcs. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    steps = layer_map_steps(cfg, T, B)
    n = len(steps)
    fig, ax = plt.subplots(figsize=(12, 0.55 * n + 0.8))
    ax.set_xlim(0, 13.8)  # room for the widest shape
    ax.set_ylim(-0.7, n - 0.3)
    ax.axis("off")
    residual = {0, 7, 12}  # rows that are the residual stream itself
    for row, (op, weight, shape) in enumerate(steps):
        y = n - 1 - row
        color = "#dde8f5" if row in residual else ("#f7e3cf" if row < 8 else "#dff0dc")
        ax.add_patch(FancyBboxPatch((3.4, y - 0.3), 4.8, 0.6, boxstyle="round,pad=0.02", fc=color, ec="0.4"))
        ax.text(5.8, y, op, ha="center", va="center", fontsize=9.5)
        if weight:
            ax.text(2.5, y, weight, ha="right", va="center", fontsize=9.5, color="0.3")
        ax.text(8.35, y, shape, ha="left", va="center", fontsize=9.5, family="monospace")
        if row:
            ax.annotate("", xy=(5.8, y + 0.3), xytext=(5.8, y + 0.7), arrowprops=dict(arrowstyle="->", color="0.4"))
    for start, end in [(0, 7), (7, 12)]:  # residual connections skip the sublayer
        ax.add_patch(
            FancyArrowPatch(
                (3.4, n - 1 - start),
                (3.4, n - 1 - end),
                connectionstyle="arc3,rad=0.12",
                arrowstyle="->",
                mutation_scale=10,
                color="tab:blue",
                lw=1.2,
            )
        )
    ax.text(0.0, n - 0.55, "weights", fontsize=10, weight="bold", color="0.3")
    ax.text(8.35, n - 0.55, "output shape (B, ...)", fontsize=10, weight="bold")
    ax.set_title(
        f"One block of the course model (d_model={cfg.d_model}, {cfg.n_heads} query heads, "
        f"{cfg.n_kv_heads} key/value heads, d_ff={cfg.d_ff}); blue arcs: residual connections",
        fontsize=10.5,
    )
    return fig
