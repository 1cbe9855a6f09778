"""Attention weights made visible: recompute softmax(QK^T/sqrt(d) + M) from a layer's own projections.

The model's attention runs inside `F.scaled_dot_product_attention`, which never materialises the
(T, T) weight matrix. To look at it, `capture_attention` runs the model once with forward hooks that
record each layer's attention input (the output of `attn_norm`) and the attention module's output,
then recomputes every layer's weights by hand from that input, with the layer's fused `wqkv` weights
and the model's rotary tables, and checks the recomputation: weights @ V through `wo` must give back
the module's real output.

    from helpers.course.attention_maps import capture_attention
    cap = capture_attention(model, idx)        # idx (1, T)
    cap.weights                                # (L, B, H, T, T), rows sum to 1
    cap.max_abs_diff                           # recomputed vs real attention output, about 1e-6

Out of scope: cached (decode-time) attention and sliding windows; long sequences (the weights are
L * B * H * T * T floats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..model import apply_rope, causal_mask


def attention_by_hand(
    attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention module, step by step. x: (B, T, C), the normalised layer input; cos, sin: (T, D).

    Returns (weights (B, H, T, T), output (B, T, C)). Grouped-query attention: query head h reads
    key/value head h // (H / Hkv), as `scaled_dot_product_attention(enable_gqa=True)` does.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a (B, T, C) tensor; got {getattr(x, 'shape', type(x).__name__)}")
    B, T, C = x.shape
    H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    if C != attn.wqkv.in_features:
        raise ValueError(f"x has width C={C}; the layer expects C={attn.wqkv.in_features}")
    if cos.shape != (T, D) or sin.shape != (T, D):
        raise ValueError(f"cos and sin must have shape (T, D) = ({T}, {D}); got {tuple(cos.shape)}, {tuple(sin.shape)}")
    q, k, v = attn.wqkv(x).split(attn.split_sizes, dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    v = v.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k = k.repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D): each KV head serves H/Hkv query heads
    v = v.repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
    if causal:
        scores = scores.masked_fill(~causal_mask(T, T, device=x.device), float("-inf"))
    weights = scores.float().softmax(dim=-1).to(q.dtype)  # (B, H, T, T), every row sums to 1
    y = (weights @ v).transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)
    return weights, attn.wo(y)


@dataclass
class AttentionCapture:
    weights: torch.Tensor  # (L, B, H, T, T)
    logits: torch.Tensor  # (B, T, V): the model's ordinary output from the same run
    max_abs_diff: float  # max |recomputed attention output - real attention output| over all layers


@torch.no_grad()
def capture_attention(model, idx: torch.Tensor, causal: bool = True) -> AttentionCapture:
    """Run `model` on idx (B, T) and return every layer's attention weights, recomputed and checked."""
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.layers):
        hooks.append(layer.attn_norm.register_forward_hook(lambda mod, args, out, i=i: inputs.__setitem__(i, out)))
        hooks.append(layer.attn.register_forward_hook(lambda mod, args, out, i=i: outputs.__setitem__(i, out)))
    try:
        logits = model(idx, causal=causal)  # checks idx: ValueError on bad ids or shapes
    finally:
        for h in hooks:
            h.remove()
    T = idx.shape[1]
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]  # (T, D)
    weights, diff = [], 0.0
    for i, layer in enumerate(model.layers):
        w, y = attention_by_hand(layer.attn, inputs[i], cos, sin, causal=causal)
        diff = max(diff, (y - outputs[i]).abs().max().item())
        weights.append(w)
    return AttentionCapture(torch.stack(weights), logits, diff)
