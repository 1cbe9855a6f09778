"""Counting from the config: parameters, FLOPs, bytes moved, and memory budgets.

Everything here is arithmetic on a ModelConfig: no model is built, so it works for Llama-3-8B as
well as for the course model. The notebooks check these formulas against the real thing
(`Transformer.num_parameters()`, the allocated KV cache, torch's FlopCounterMode, and the tensors
autograd saves for the backward pass).

Conventions:
- one multiply-add = 2 FLOPs; only matrix multiplications are counted (norms, softmax, rotary and
  activations are a fraction of a percent at these shapes);
- attention is causal, so the query at position t looks at t + 1 keys. A dense attention kernel
  (and torch's FlopCounterMode, which counts the kernel's work) computes the masked-out scores
  too: pass `count_masked=True` to count every query-key pair;
- bytes are plain bytes: 1 GB = 1e9 bytes.

Out of scope: communication between devices, optimizers other than AdamW, quantization scales
(chapter 11), measured timings (roofline.py).
"""

from __future__ import annotations

import torch

from ..model import ModelConfig


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")


def _check_positive(name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a number > 0; got {value!r}")


def _elem_bytes(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ----------------------------------------------------------------------------------------------
# parameters


def parameter_count(cfg: ModelConfig, tied_embeddings: bool = True) -> int:
    """All parameters. The course model ties its input embedding to its output head (one matrix);
    Llama-3-8B does not (`tied_embeddings=False` counts two vocab x d_model matrices)."""
    C, Hq, Hkv, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    attn = C * (Hq * D + 2 * Hkv * D) + Hq * D * C  # W_qkv and W_o
    mlp = 3 * C * F  # gate, up, down
    norms = 2 * C
    embed = cfg.vocab_size * C * (1 if tied_embeddings else 2)
    return cfg.n_layers * (attn + mlp + norms) + C + embed  # + final norm


def layer_matmul_parameters(cfg: ModelConfig) -> int:
    """Weights one transformer layer multiplies each token by: W_q, W_k, W_v, W_o, gate, up, down."""
    C, Hq, Hkv, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return C * (Hq * D + 2 * Hkv * D) + Hq * D * C + 3 * C * F


def matmul_parameters(cfg: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (the embedding lookup is not a matmul,
    but the output head is, tied or not)."""
    return cfg.n_layers * layer_matmul_parameters(cfg) + cfg.vocab_size * cfg.d_model


# ----------------------------------------------------------------------------------------------
# FLOPs


def attention_flops(cfg: ModelConfig, n_queries: int, n_past: int = 0, count_masked: bool = False) -> int:
    """FLOPs of QK^T and (attention weights)V for `n_queries` new tokens after `n_past` cached ones.

    Every query head does its own dot products, so grouped-query attention does not reduce these
    FLOPs (it shrinks the K/V projections and the cache). `count_masked=True` counts the full
    n_queries x (n_past + n_queries) score matrix, as a dense kernel computes it.
    """
    _check_int("n_queries", n_queries, 1)
    _check_int("n_past", n_past, 0)
    if count_masked:
        keys_seen = n_queries * (n_past + n_queries)
    else:  # causal: query t sees n_past + t + 1 keys
        keys_seen = n_queries * n_past + n_queries * (n_queries + 1) // 2
    return cfg.n_layers * 2 * 2 * cfg.n_heads * cfg.head_dim * keys_seen


def forward_flops(
    cfg: ModelConfig,
    n_tokens: int,
    n_past: int = 0,
    batch_size: int = 1,
    count_masked: bool = False,
    all_logits: bool = True,
) -> int:
    """Matmul FLOPs of one forward pass over `n_tokens` new tokens per sequence (prefill: n_past=0;
    a decode step: n_tokens=1, n_past=position). `all_logits=False` scores only the last position
    (what prefill needs before generating)."""
    _check_int("n_tokens", n_tokens, 1)
    _check_int("batch_size", batch_size, 1)
    layers = 2 * cfg.n_layers * layer_matmul_parameters(cfg) * n_tokens
    head = 2 * cfg.vocab_size * cfg.d_model * (n_tokens if all_logits else 1)
    return batch_size * (layers + head + attention_flops(cfg, n_tokens, n_past, count_masked))


def gpt_forward_flops(cfg: ModelConfig, n_tokens: int) -> int:
    """The classic estimate for a GPT-style layer (multi-head attention, a two-matrix MLP of width
    4d): each of the L layers costs 24*n*d^2 + 4*n^2*d, the output head 2*n*d*V. Ignores GQA, SwiGLU
    and the real d_ff of `cfg`, and counts the full (unmasked) n x n attention square."""
    _check_int("n_tokens", n_tokens, 1)
    n, d = n_tokens, cfg.d_model
    return cfg.n_layers * (24 * n * d * d + 4 * n * n * d) + 2 * n * d * cfg.vocab_size


def training_flops(cfg: ModelConfig, n_tokens: int, batch_size: int = 1, checkpointing: bool = False) -> int:
    """One training step: forward + backward, where the backward of every matmul is two matmuls of
    the same size (gradient with respect to the input and to the weight): 3x the forward.
    Activation checkpointing of every transformer layer runs the layers' forward once more during
    the backward (the output head is not recomputed): a little under 4x. Attention is counted as a
    dense kernel computes it (count_masked=True)."""
    fwd = forward_flops(cfg, n_tokens, batch_size=batch_size, count_masked=True)
    if not checkpointing:
        return 3 * fwd
    head = batch_size * 2 * cfg.vocab_size * cfg.d_model * n_tokens
    return 4 * fwd - head


# ----------------------------------------------------------------------------------------------
# bytes: weights, KV cache, traffic of one forward pass


def kv_cache_bytes(cfg: ModelConfig, seq_len: int, batch_size: int = 1, dtype=torch.float16) -> int:
    """2 (K and V) * layers * batch * kv_heads * head_dim * seq_len * bytes per element."""
    elem = _elem_bytes(dtype)
    return 2 * cfg.n_layers * batch_size * cfg.n_kv_heads * cfg.head_dim * seq_len * elem


def weight_bytes(cfg: ModelConfig, bits_per_weight: float = 16, tied_embeddings: bool = True) -> float:
    """Bytes of all weights at `bits_per_weight` (quantization scales not included)."""
    _check_positive("bits_per_weight", bits_per_weight)
    return parameter_count(cfg, tied_embeddings) * bits_per_weight / 8


def forward_bytes(cfg: ModelConfig, n_tokens: int, n_past=0, batch_size=1, bytes_per_weight=2, bytes_per_kv=2) -> float:
    """The least memory traffic of one forward pass: every matmul weight read once (the output
    head included; the embedding lookup reads only n_tokens rows, ignored), the cached keys/values
    read, and the new ones written. Activations are ignored: at batch 1 they are tiny next to the
    weights, and in a long prefill the pass is compute-bound anyway."""
    _check_int("n_tokens", n_tokens, 1)
    _check_int("n_past", n_past, 0)
    _check_int("batch_size", batch_size, 1)
    weights = matmul_parameters(cfg) * bytes_per_weight
    kv_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * bytes_per_kv
    return weights + batch_size * kv_per_token * (n_past + n_tokens)


def arithmetic_intensity(
    cfg: ModelConfig, n_tokens: int, n_past=0, batch_size=1, all_logits=False, **bytes_per
) -> float:
    """FLOPs per byte moved (forward_flops / forward_bytes) for one forward pass with causal
    attention; by default only the last position is scored, as in prefill before generating.
    bytes_per: forward_bytes's bytes_per_weight and bytes_per_kv (2 each unless given)."""
    flops = forward_flops(cfg, n_tokens, n_past, batch_size, all_logits=all_logits)
    return flops / forward_bytes(cfg, n_tokens, n_past, batch_size, **bytes_per)


# ----------------------------------------------------------------------------------------------
# memory budgets


def _activation_bytes_per_token(cfg: ModelConfig, e: int) -> tuple[int, int]:
    """(bytes per token saved by one layer, bytes per token saved by the final norm and the loss)."""
    if e not in (1, 2, 4, 8):
        raise ValueError(f"bytes_per_element must be 1, 2, 4 or 8; got {e!r}")
    d, H, F, V = cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.vocab_size
    d_kv = cfg.n_kv_heads * cfg.head_dim
    norm = 4 * d + 4 + 2 * e * d  # float32 input and 1/rms, normalised x, weighted output
    per_layer = 2 * norm + e * (3 * d + 3 * d_kv) + 4 * H + e * 4 * F
    head = norm + 4 * V  # final norm, float32 log-probabilities
    return per_layer, head


def layer_activation_bytes(cfg: ModelConfig, batch_size: int, seq_len: int, bytes_per_element: int = 2) -> int:
    """Bytes one transformer layer saves for its backward pass (see activation_bytes)."""
    _check_int("batch_size", batch_size, 1)
    _check_int("seq_len", seq_len, 1)
    return batch_size * seq_len * _activation_bytes_per_token(cfg, bytes_per_element)[0]


def activation_bytes(
    cfg: ModelConfig, batch_size: int, seq_len: int, bytes_per_element: int = 2, checkpointing: bool = False
) -> int:
    """Bytes autograd keeps for the backward pass of one training step of the course Transformer.

    Counted tensor by tensor from what the implementation saves (the notebook and the tests check
    it exactly against torch's saved-tensor hooks, in float32 and bfloat16), per token:

    - each RMSNorm (two per layer, one at the end): its float32 input (4*d bytes) and 1/rms (4),
      the normalised x and the weighted output (2 * e * d);
    - attention: the fused QKV output (d + 2*d_kv), the rotated q (d) and k (d_kv), the attention
      output (d), all at e bytes, plus the kernel's float32 log-sum-exp per head (4*H). A fused
      (flash) kernel stores no T x T score matrix;
    - SwiGLU: the gate|up output (2*d_ff), silu(gate) (d_ff) and the product (d_ff);
    - the loss: float32 log-probabilities over the vocabulary (4*V).

    where e = `bytes_per_element` (2 for bf16, 4 for fp32), d = d_model, d_kv = n_kv_heads * head_dim.
    With full activation checkpointing only each layer's input (e*d per token and layer) and the
    head's tensors are kept; during the backward one layer at a time is recomputed, so the peak
    adds one layer's activations. Not included: parameters, token ids, activation gradients in
    flight, allocator slack.
    """
    _check_int("batch_size", batch_size, 1)
    _check_int("seq_len", seq_len, 1)
    per_layer, head = _activation_bytes_per_token(cfg, bytes_per_element)
    tokens = batch_size * seq_len
    if checkpointing:
        return tokens * (cfg.n_layers * bytes_per_element * cfg.d_model + per_layer + head)
    return tokens * (cfg.n_layers * per_layer + head)


def training_memory_bytes(
    cfg: ModelConfig,
    batch_size: int,
    seq_len: int,
    *,
    bytes_per_weight: int = 4,
    bytes_per_grad: int = 4,
    optimizer_bytes_per_param: int = 8,
    bytes_per_activation: int = 2,
    checkpointing: bool = False,
    tied_embeddings: bool = True,
) -> dict[str, float]:
    """Memory of one training step with AdamW, in bytes, by component.

    Defaults follow the common mixed-precision accounting: float32 weights (4 B/param), float32
    gradients (4), AdamW's two float32 moments m and v (8), bf16 activations (see activation_bytes).
    Returns {"weights", "gradients", "optimizer", "activations", "total"}.
    """
    P = parameter_count(cfg, tied_embeddings)
    parts = {
        "weights": P * bytes_per_weight,
        "gradients": P * bytes_per_grad,
        "optimizer": P * optimizer_bytes_per_param,
        "activations": activation_bytes(cfg, batch_size, seq_len, bytes_per_activation, checkpointing),
    }
    parts["total"] = sum(parts.values())
    return {k: float(v) for k, v in parts.items()}


def inference_activation_bytes(cfg: ModelConfig, n_tokens: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
    """An estimate of the largest transient working set of a forward pass without gradients:
    tensors are freed layer by layer, and the widest moment is inside the SwiGLU MLP, where the
    residual stream and the normalised input (2*d), the gate|up output (2*d_ff) and the product
    (d_ff) are alive together. Logits of the last position only."""
    _check_int("n_tokens", n_tokens, 1)
    _check_int("batch_size", batch_size, 1)
    per_token = bytes_per_element * (2 * cfg.d_model + 3 * cfg.d_ff)
    return batch_size * (n_tokens * per_token + 4 * cfg.vocab_size)


def inference_memory_bytes(
    cfg: ModelConfig,
    seq_len: int,
    batch_size: int = 1,
    *,
    bits_per_weight: float = 16,
    kv_dtype=torch.bfloat16,
    bytes_per_activation: int = 2,
    tied_embeddings: bool = True,
) -> dict[str, float]:
    """Memory to serve `batch_size` sequences of `seq_len` tokens, in bytes, by component:
    {"weights", "kv_cache", "activations", "total"}. No gradients, no optimizer state."""
    _check_int("seq_len", seq_len, 1)
    parts = {
        "weights": weight_bytes(cfg, bits_per_weight, tied_embeddings),
        "kv_cache": kv_cache_bytes(cfg, seq_len, batch_size, kv_dtype),
        "activations": inference_activation_bytes(cfg, seq_len, batch_size, bytes_per_activation),
    }
    parts["total"] = sum(parts.values())
    return {k: float(v) for k, v in parts.items()}
