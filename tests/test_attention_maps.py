"""Recomputed attention weights against the model's own attention and against HuggingFace's eager attention."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.course.attention_maps import attention_by_hand, capture_attention
from helpers.hf import to_hf_llama
from helpers.model import ModelConfig

CONFIGS = {
    "mha": ModelConfig.from_preset("tiny", n_kv_heads=4),
    "gqa": ModelConfig.from_preset("tiny", n_kv_heads=2),
    "mqa": ModelConfig.from_preset("tiny", n_kv_heads=1),
}
TOL = 1e-5  # fp32; the same math as scaled_dot_product_attention in a different order


@pytest.fixture(params=list(CONFIGS))
def model(request):
    return random_model(CONFIGS[request.param], seed=3)


def ids(model, T=40, B=2, seed=0):
    return torch.randint(0, model.cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def test_recomputed_output_matches_the_real_attention(model):
    cap = capture_attention(model, ids(model))
    assert cap.weights.shape == (model.cfg.n_layers, 2, model.cfg.n_heads, 40, 40)
    assert cap.max_abs_diff <= TOL
    with torch.no_grad():
        assert torch.equal(cap.logits, model(ids(model)))


def test_weights_are_causal_rows_summing_to_one(model):
    w = capture_attention(model, ids(model)).weights
    assert torch.allclose(w.sum(-1), torch.ones(()), atol=1e-5)
    future = torch.ones(40, 40, dtype=torch.bool).triu(1)
    assert w[..., future].abs().max().item() == 0.0
    assert w[..., ~future].min().item() > 0.0


def test_without_the_mask_the_future_gets_weight(model):
    cap = capture_attention(model, ids(model), causal=False)
    future = torch.ones(40, 40, dtype=torch.bool).triu(1)
    assert cap.max_abs_diff <= TOL
    assert cap.weights[..., future].min().item() > 0.0


def test_weights_match_transformers_eager_attention(model):
    hf = to_hf_llama(model, attn_implementation="eager")
    idx = ids(model)
    with torch.no_grad():
        theirs = torch.stack(hf(idx, output_attentions=True).attentions)  # (L, B, H, T, T)
    ours = capture_attention(model, idx).weights
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() <= TOL


def test_hooks_are_removed(model):
    capture_attention(model, ids(model))
    for layer in model.layers:
        assert not layer.attn_norm._forward_hooks and not layer.attn._forward_hooks


def test_bad_input_raises_value_error(model):
    attn = model.layers[0].attn
    cos, sin = model.rope_cos[:5], model.rope_sin[:5]
    with pytest.raises(ValueError, match="x must be a"):
        attention_by_hand(attn, torch.zeros(5, model.cfg.d_model), cos, sin)
    with pytest.raises(ValueError, match="width"):
        attention_by_hand(attn, torch.zeros(1, 5, model.cfg.d_model + 1), cos, sin)
    with pytest.raises(ValueError, match="cos and sin"):
        attention_by_hand(attn, torch.zeros(1, 5, model.cfg.d_model), cos[:4], sin[:4])
    with pytest.raises(ValueError, match="token ids"):
        capture_attention(model, torch.full((1, 4), model.cfg.vocab_size))
