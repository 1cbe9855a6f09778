"""Counting from the config: parameters, forward FLOPs, KV-cache and weight bytes.

Everything here is arithmetic on a ModelConfig: no model is built, so it works for Llama-3-8B as
well as for the course model. The notebooks check these formulas against the real thing
(`Transformer.num_parameters()`, the allocated KV cache, torch's FlopCounterMode).

Conventions: one multiply-add = 2 FLOPs; only matrix multiplications are counted (norms, softmax,
rotary and activations are a fraction of a percent at these shapes); attention is causal, so the
query at position t looks at t + 1 keys.

Out of scope: backward-pass FLOPs beyond the usual 2x-forward rule, communication.
"""
from __future__ import annotations

import torch

from .model import ModelConfig


def parameter_count(cfg: ModelConfig, tied_embeddings: bool = True) -> int:
    C, Hq, Hkv, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    attn = C * (Hq * D + 2 * Hkv * D) + Hq * D * C  # W_qkv and W_o
    mlp = 3 * C * F  # gate, up, down
    norms = 2 * C
    embed = cfg.vocab_size * C * (1 if tied_embeddings else 2)
    return cfg.n_layers * (attn + mlp + norms) + C + embed  # + final norm


def matmul_parameters(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (the embedding lookup is not a matmul,
    but the tied output head is)."""
    C, Hq, Hkv, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    per_layer = C * (Hq * D + 2 * Hkv * D) + Hq * D * C + 3 * C * F
    return cfg.n_layers * per_layer + cfg.vocab_size * C


def attention_flops(cfg: ModelConfig, n_queries: int, n_past: int = 0) -> int:
    """FLOPs of QK^T and (attention weights)V for `n_queries` new tokens after `n_past` cached ones."""
    keys_seen = sum(n_past + t + 1 for t in range(n_queries))  # causal: query t sees n_past + t + 1 keys
    return cfg.n_layers * 2 * 2 * cfg.n_heads * cfg.head_dim * keys_seen


def forward_flops(cfg: ModelConfig, n_tokens: int, n_past: int = 0) -> int:
    """Matmul FLOPs of one forward pass over `n_tokens` new tokens (prefill: n_past=0; a decode
    step: n_tokens=1, n_past=position)."""
    return 2 * matmul_parameters(cfg) * n_tokens + attention_flops(cfg, n_tokens, n_past)


def kv_cache_bytes(cfg: ModelConfig, seq_len: int, batch_size: int = 1, dtype=torch.float16) -> int:
    """2 (K and V) * layers * batch * kv_heads * head_dim * seq_len * bytes per element."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.n_layers * batch_size * cfg.n_kv_heads * cfg.head_dim * seq_len * elem


def weight_bytes(cfg: ModelConfig, bits_per_weight: float = 16) -> float:
    return parameter_count(cfg) * bits_per_weight / 8
