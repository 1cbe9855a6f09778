"""Convert between this course's Transformer and HuggingFace's LlamaForCausalLM (same weights).

Used as an oracle: the tests check that both produce the same logits and the same greedy tokens,
and the benchmark times HuggingFace's `generate` on identical weights.

Out of scope: loading real Llama checkpoints (the course never downloads weights).
"""

from __future__ import annotations

import torch

from .model import ModelConfig, Transformer


def hf_config(cfg: ModelConfig, attn_implementation: str = "sdpa"):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation=attn_implementation,
    )


@torch.no_grad()
def to_hf_llama(model: Transformer, attn_implementation: str = "sdpa"):
    """A LlamaForCausalLM carrying exactly `model`'s weights (fused matrices split back apart)."""
    from transformers import LlamaForCausalLM

    cfg = model.cfg
    hf = LlamaForCausalLM(hf_config(cfg, attn_implementation)).to(dtype=model.dtype, device=model.device).eval()
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    hf.model.embed_tokens.weight.copy_(model.embed.weight)
    hf.model.norm.weight.copy_(model.norm.weight)
    for ours, theirs in zip(model.layers, hf.model.layers):
        wq, wk, wv = ours.attn.wqkv.weight.split([q_dim, kv_dim, kv_dim], dim=0)
        theirs.self_attn.q_proj.weight.copy_(wq)
        theirs.self_attn.k_proj.weight.copy_(wk)
        theirs.self_attn.v_proj.weight.copy_(wv)
        theirs.self_attn.o_proj.weight.copy_(ours.attn.wo.weight)
        gate, up = ours.mlp.w_gate_up.weight.split(cfg.d_ff, dim=0)
        theirs.mlp.gate_proj.weight.copy_(gate)
        theirs.mlp.up_proj.weight.copy_(up)
        theirs.mlp.down_proj.weight.copy_(ours.mlp.w_down.weight)
        theirs.input_layernorm.weight.copy_(ours.attn_norm.weight)
        theirs.post_attention_layernorm.weight.copy_(ours.mlp_norm.weight)
    hf.tie_weights()
    return hf
