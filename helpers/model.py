"""A decoder-only transformer in the Llama style, small enough to train and run on a laptop CPU.

RMSNorm, rotary position embeddings (RoPE), grouped-query attention (GQA) with a configurable number
of key/value heads, and a SwiGLU MLP; input embedding and output head share one matrix. The same
`forward` runs in three modes:

- a whole sequence at once, with a causal mask (training, teacher forcing, prefill without a cache);
- against a `KVCache` (see kv_cache.py): the new tokens' keys and values are written into the cache
  at their positions, and the new queries attend to everything cached so far (prefill, decode,
  speculative verification);
- against a step view over a paged pool (serving/step_view.py): each token at its own position, and the
  cache's `attend` writes the new keys/values and attends each sequence over its own. The serving engine's
  steps, eager and compiled, run this same layer loop.

The weights match HuggingFace's `LlamaForCausalLM` one for one (see hf.py), which the tests use as an
oracle. Query/key/value projections are stored fused in one matrix, and so are the MLP's gate and up
projections: one matmul instead of three (or two) per step matters when a decode step is mostly
per-operation overhead, as it is for small models on a CPU. The projections are `Linear`, nn.Linear whose
products of many rows on a CPU take oneDNN's GEMM (many_rows.py): the same parameters and state dict.

Out of scope: dropout, biases, mixture-of-experts, multi-GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import many_rows


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 2048
    max_seq_len: int = 1024  # the context window: positions 0 .. max_seq_len-1
    n_layers: int = 6
    d_model: int = 256
    n_heads: int = 8
    n_kv_heads: int = 2  # = n_heads: multi-head attention; 1: multi-query; in between: grouped-query
    d_ff: int = 704  # hidden width of the SwiGLU MLP
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "max_seq_len", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int; got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def __repr__(self) -> str:
        """The dataclass repr, wrapped at 100 columns so a notebook prints it without breaking a number."""
        items = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)]
        lines, line = [], "ModelConfig("
        for i, item in enumerate(items):
            piece = item + (")" if i == len(items) - 1 else ", ")
            if len(line) + len(piece.rstrip()) > 100:
                lines.append(line.rstrip())
                line = " " * len("ModelConfig(")
            line += piece
        return "\n".join(lines + [line])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return replace(cls(), **{**PRESETS[name], **overrides})


# what every Llama-3 model shares (their published config.json): the vocabulary, context, 8 KV heads, RoPE base
LLAMA3_FAMILY = dict(vocab_size=128256, max_seq_len=8192, n_kv_heads=8, rope_theta=500000.0)

# Named configurations (overrides of the defaults above).
PRESETS: dict[str, dict] = {
    # the course model, shipped trained in helpers/checkpoints/target.safetensors
    "target": dict(n_layers=6, d_model=256, n_heads=8, n_kv_heads=2, d_ff=704),
    # the speculative-decoding draft: same tokenizer, one layer, ~1/5 of target's parameters
    "draft": dict(n_layers=1, d_model=192, n_heads=6, n_kv_heads=2, d_ff=512),
    # tiny configs for tests and in-notebook training
    "tiny": dict(vocab_size=256, max_seq_len=128, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128),
    # a random-weight config large enough that batch-1 decode is memory-bound on a CPU
    "bench-150m": dict(n_layers=13, d_model=1024, n_heads=16, n_kv_heads=4, d_ff=2816),
    # Llama-3-8B's and Llama-3-70B's shapes, for FLOP and memory accounting (build them on the meta device)
    "llama3-8b": dict(LLAMA3_FAMILY, n_layers=32, d_model=4096, n_heads=32, d_ff=14336),
    "llama3-70b": dict(LLAMA3_FAMILY, n_layers=80, d_model=8192, n_heads=64, d_ff=28672),
}


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (as Llama does) and cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(cfg: ModelConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position and rotary frequency, each (max_seq_len, head_dim)."""
    D = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))  # (D/2,)
    pos = torch.arange(cfg.max_seq_len, device=device, dtype=torch.float32)  # (S,)
    angles = torch.outer(pos, inv_freq)  # (S, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (S, D): the "rotate half" layout HF Llama uses
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate each (x_i, x_{i+D/2}) pair by its position's angle. x: (B, H, T, D); cos, sin: (T, D)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def attention_as_sums(q, k, v, mask):
    """Masked grouped-query attention written as explicit sums, for the static decode path under torch.compile.

    q (B, H, T, D); k, v (B, Hkv, S, D) with H a multiple of Hkv; mask (T, S) bool, True where a query may
    look -> (B, H, T, D), the same as F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
    enable_gqa=True) up to float rounding. The G = H / Hkv query heads that share a K/V head become G*T rows
    of one head, so K and V are never expanded. Eagerly this materialises a (B, Hkv, G*T, S, D) product
    (slow, memory-hungry); compiled on a CPU, inductor fuses the whole thing (scores, mask, softmax, the
    weighted sum of V) into one loop with no extern call, which for a decode step is cheaper than torch's
    CPU flash-attention kernel (chapter 07 measures it). Not for training: no dropout, no backward tuning."""
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    qg = q.reshape(B, Hkv, G * T, D)  # row g*T + t: query head kv*G + g at query t
    mask = mask.repeat(G, 1)  # (G*T, S)
    scores = (qg.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * D**-0.5  # (B, Hkv, G*T, S)
    weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    y = (weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)  # (B, Hkv, G*T, D)
    return y.view(B, H, T, D)


class Linear(nn.Linear):
    """nn.Linear without bias whose products of many rows on a CPU go through oneDNN's GEMM (many_rows.py:
    a prefill, teacher forcing); the same parameter, the same state dict."""

    def forward(self, x):  # (..., in) -> (..., out)
        return many_rows.linear(x, self.weight)


class Attention(nn.Module):
    # how the static path (fast_decode.py) attends when compiled: "sdpa" (torch's fused kernel) or "sums"
    # (attention_as_sums, which inductor fuses into one loop); FastGenerator sets it on its own copy
    static_attention = "sdpa"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.wqkv = Linear(cfg.d_model, q_dim + 2 * kv_dim, bias=False)  # fused W_q | W_k | W_v
        self.wo = Linear(q_dim, cfg.d_model, bias=False)
        self.split_sizes = (q_dim, kv_dim, kv_dim)

    def forward(
        self,
        x,
        cos,
        sin,
        layer_cache=None,
        start_pos: int = 0,
        attn_window: int | None = None,
        causal: bool = True,
        static_mask=None,
    ):
        B, T, C = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        rows = rowwise_of(layer_cache)
        q, k, v = rows(self.wqkv, x).split(self.split_sizes, dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        if static_mask is not None:
            # static shapes (fast_decode.py): write at the positions held in the tensor start_pos, then
            # attend over the whole buffer with a mask, so no shape depends on the position
            layer_cache.k.index_copy_(2, start_pos, k)
            layer_cache.v.index_copy_(2, start_pos, v)
            if self.static_attention == "sums" and torch.compiler.is_compiling():
                y = attention_as_sums(q, layer_cache.k, layer_cache.v, static_mask)  # (B, H, T, D)
            else:
                y = F.scaled_dot_product_attention(
                    q, layer_cache.k, layer_cache.v, attn_mask=static_mask, enable_gqa=Hkv != H
                )  # (B, H, T, D)
            return self.wo(y.transpose(1, 2).reshape(B, T, H * D))
        if hasattr(layer_cache, "attend"):
            # a cache that attends by itself (the serving engine's step over a paged pool, serving/step_view.py):
            # it writes the new keys/values where each sequence keeps them and attends each over its own
            y = layer_cache.attend(q, k, v)  # (B, H, T, D)
            return rows(self.wo, y.transpose(1, 2).reshape(B, T, H * D))
        if layer_cache is not None:
            # write the new keys/values at their positions, read back everything cached so far
            k, v = layer_cache.update(start_pos, k, v)  # (B, Hkv, start_pos + T, D)
        S = k.shape[2]  # number of key positions the queries may look at

        if not causal:
            mask, is_causal = None, False  # every position sees the future too (chapter 03's experiment)
        elif T == 1 and attn_window is None:
            mask, is_causal = None, False  # one new query: everything cached is in its past
        elif S == T and attn_window is None:
            mask, is_causal = None, True  # the plain causal mask, built inside the kernel
        else:
            mask, is_causal = causal_mask(T, S, window=attn_window, device=x.device), False  # (T, S)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=Hkv != H
        )  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)
        return self.wo(y)


def causal_mask(T: int, S: int, window: int | None = None, device=None) -> torch.Tensor:
    """Boolean (T, S) mask for T new queries at positions S-T .. S-1 over S keys: True = may attend.

    With `window`, each query sees only the last `window` positions (itself included).
    """
    q_pos = torch.arange(S - T, S, device=device).unsqueeze(1)  # (T, 1)
    k_pos = torch.arange(S, device=device).unsqueeze(0)  # (1, S)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_ff = cfg.d_ff
        self.w_gate_up = Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.w_down = Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        gate, up = self.w_gate_up(x).split(self.d_ff, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, layer_cache=None, start_pos=0, attn_window=None, causal=True, static_mask=None):
        rows = rowwise_of(layer_cache)
        x = x + self.attn(rows(self.attn_norm, x), cos, sin, layer_cache, start_pos, attn_window, causal, static_mask)
        return x + rows(self.mlp, rows(self.mlp_norm, x))


def apply_module(module, x):
    """module(x): how a block applies its row-wise modules unless its cache says otherwise (rowwise_of)."""
    return module(x)


def rowwise_of(layer_cache):
    """How to apply a row-wise module (norm, projection, MLP) to (B, T, C) rows: the cache's `rowwise(module, x)`
    where it has one (the serving engine's batch-invariant mode runs them on tiles of rows), else module(x)."""
    return getattr(layer_cache, "rowwise", None) or apply_module


class EmbeddedModel(nn.Module):
    """A model whose token embedding (`self.embed`) says where it lives: its device and dtype. Shared by
    Transformer and the tensor-parallel shard (parallel/tensor_parallel.py)."""

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype


class Transformer(EmbeddedModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied: one (V, C) matrix reads tokens in and scores them out
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, D)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init for the residual projections
            if name.endswith(("attn.wo.weight", "mlp.w_down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """Distinct parameters (the tied embedding/head matrix counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        idx,
        cache=None,
        start_pos: int | None = None,
        attn_window: int | None = None,
        last_only: bool = False,
        check: bool = True,
        causal: bool = True,
        input_pos=None,
    ):
        """Logits for every position of `idx` (B, T) -> (B, T, vocab_size).

        cache:       a KVCache built for this model (checked: check_cache, below); the T tokens are placed
                     at positions start_pos .. start_pos+T-1 (start_pos defaults to the number already cached).
                     Or a step view (serving/step_view.py: it has `positions`, one per token of idx (1, T)):
                     each token takes its own position, and the view's layers attend each sequence over its own.
        attn_window: attend only to the last `attn_window` positions (sliding-window attention). A cache
                     whose slots imply a window (sliding_window.RollingKVCache: its `attn_window`) supplies
                     it when none is passed, and refuses a different one: its slots hold that many positions.
        last_only:   compute logits for the last position only (B, 1, vocab): prefill needs no more.
        check:       validate idx (dtype, shape, id range). The decode loop turns this off for tokens
                     the model itself produced: the range check reads the tensor, a sync on a GPU.
        causal:      False removes the causal mask (every position attends to the future too). Only
                     for showing what goes wrong without it; never for generation.
        input_pos:   a (T,) long tensor of positions: the static-shape path used by fast_decode.py
                     (torch.compile, CUDA graphs). Attends over the whole cache buffer with a mask and
                     leaves cache.length alone; the caller tracks positions.
        """
        x = self.hidden(idx, cache, start_pos, attn_window, check, causal, input_pos)  # (B, T, C)
        if last_only and input_pos is None:
            x = x[:, -1:, :]  # (B, 1, C)
        return self.head(self.norm(x))  # (B, T, V)

    def hidden(self, idx, cache=None, start_pos=None, attn_window=None, check=True, causal=True, input_pos=None):
        """forward up to the final norm: the last block's output (B, T, C). The serving engine calls it with a
        step view and applies the norm and head to the rows it samples from only."""
        static_mask = None
        if getattr(cache, "positions", None) is not None:  # a step view: every token at its own position
            cos, sin = self.rope_cos[cache.positions], self.rope_sin[cache.positions]  # (T, D)
        elif input_pos is not None:
            # static shapes: every shape fixed by (B, T) and the cache's size, none by the position, so one
            # compiled graph (or one captured CUDA graph) serves every decode step
            if cache is None:
                raise ValueError("input_pos needs a cache")
            S = cache.max_seq_len
            static_mask = torch.arange(S, device=idx.device) <= input_pos.unsqueeze(1)  # (T, S): key j <= query pos
            cos, sin, start_pos = self.rope_cos[input_pos], self.rope_sin[input_pos], input_pos  # (T, D)
        else:
            start_pos, attn_window = self.check_inputs(idx, cache, start_pos, attn_window, check)
            cos = self.rope_cos[start_pos : start_pos + idx.shape[1]]  # (T, D)
            sin = self.rope_sin[start_pos : start_pos + idx.shape[1]]
        x = self.embed(idx)  # (B, T, C)
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layer(i) if cache is not None else None
            x = layer(x, cos, sin, layer_cache, start_pos, attn_window, causal, static_mask)
        if isinstance(start_pos, int) and cache is not None:
            cache.commit(start_pos + idx.shape[1])  # the cache owns its length
        return x

    def check_inputs(self, idx, cache, start_pos, attn_window, check) -> tuple[int, int | None]:
        """Validate forward's arguments for a contiguous cache (or none); returns (start_pos, attn_window)."""
        if check:
            check_token_ids(idx, self.cfg.vocab_size)
        B, T = idx.shape
        if cache is not None:
            check_cache(cache, self)
            implied = getattr(cache, "attn_window", None)  # a rolling cache keeps exactly that many positions
            if implied is not None and attn_window not in (None, implied):
                raise ValueError(
                    f"this cache keeps the last {implied} positions: attn_window must be {implied} "
                    f"(or None, to take it from the cache); got {attn_window!r}"
                )
            attn_window = implied if attn_window is None else attn_window
            start_pos = cache.length if start_pos is None else start_pos
            if not 0 <= start_pos <= cache.length:
                raise ValueError(f"start_pos must be in [0, {cache.length}] (the cached length); got {start_pos}")
            if start_pos + T > cache.max_seq_len:
                raise ValueError(
                    f"positions {start_pos}..{start_pos + T - 1} do not fit the cache "
                    f"(max_seq_len={cache.max_seq_len}): it holds positions 0..{cache.max_seq_len - 1}"
                )
            if cache.batch_size != B:
                # named by the cache, not by idx: prefill and generate pass their own `prompt` here
                raise ValueError(f"cache was built for batch size {cache.batch_size}; got a batch of {B} sequences")
        else:
            start_pos = 0 if start_pos is None else start_pos
        if start_pos + T > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {start_pos + T} tokens exceeds the context window max_seq_len={self.cfg.max_seq_len}"
            )
        return start_pos, attn_window


def check_token_ids(idx, vocab_size: int, name: str = "idx", check_range: bool = True) -> None:
    """Raise a ValueError that names the problem, instead of a traceback from deep inside torch.

    name: the caller's parameter (generate passes "prompt"). check_range=False skips the id-range check,
    the only part that reads the tensor (a device sync on a GPU).
    """
    if not isinstance(idx, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of token ids with shape (B, T); got {type(idx).__name__}")
    if idx.dtype not in (torch.long, torch.int32, torch.int64):
        raise ValueError(f"{name} must hold integer token ids (torch.long); got dtype {idx.dtype}")
    if idx.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T); got shape {tuple(idx.shape)}")
    if idx.shape[0] < 1 or idx.shape[1] < 1:
        raise ValueError(f"{name} must hold at least one token (B >= 1, T >= 1); got shape {tuple(idx.shape)}")
    if not check_range:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"{name}: token ids must be in [0, {vocab_size - 1}]; got values in [{lo}, {hi}]")


# ----------------------------------------------------------------------------------------------
# What a cache must be for this model. The model states the contract and every cache class (kv_cache.py,
# int8_kv.py, sliding_window.py) implements it, so the caches import from here, never the reverse.


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _layout(n_layers, n_kv_heads, head_dim, dtype, device) -> str:
    return f"layers={n_layers}, kv_heads={n_kv_heads}, head_dim={head_dim}, dtype={dtype}, device={device}"


def check_cache(cache, model) -> None:
    """The cache contract, as the model sees it: raise a ValueError naming `cache` unless it was built for
    `model`: the same number of layers, KV heads, head dim, dtype and device, and, if it recorded the config it
    was built for (`for_model` does), the same ModelConfig. Works for any cache with a (L, B, Hkv, S, D) tensor
    `k` and a `layer(i)` view (KVCache, Int8KVCache, RollingKVCache, SinkKVCache). A model whose cache holds
    fewer KV heads than its config (a tensor-parallel shard holds its own) says how many as `cache_kv_heads`."""
    if not isinstance(getattr(cache, "k", None), torch.Tensor) or not hasattr(cache, "layer"):
        raise ValueError(f"cache must be a KVCache (KVCache.for_model(model, ...)); got {type(cache).__name__}")
    cfg = model.cfg
    L, _, Hkv, _, D = cache.k.shape
    have = (L, Hkv, D, cache.k.dtype, cache.k.device)
    need = (cfg.n_layers, getattr(model, "cache_kv_heads", cfg.n_kv_heads), cfg.head_dim, model.dtype, model.device)
    if have != need:
        raise ValueError(
            f"cache was built for another model ({_layout(*have)}); this model needs "
            f"{_layout(*need)}: build its cache with KVCache.for_model(model, ...)"
        )
    built_for = getattr(cache, "model_cfg", None)
    if built_for is not None and built_for is not cfg and built_for != cfg:
        differ = [k for k, v in cfg.to_dict().items() if built_for.to_dict()[k] != v]
        raise ValueError(
            f"cache was built for another model (its ModelConfig differs in {', '.join(differ)}): "
            f"build its cache with KVCache.for_model(model, ...)"
        )


def check_cache_size(cfg, batch_size, max_seq_len) -> int:
    """Validate a cache's batch size and length against the model config; returns max_seq_len (the context
    window when None). Shared by every cache built for a model."""
    max_seq_len = cfg.max_seq_len if max_seq_len is None else max_seq_len
    if not _is_int(max_seq_len) or not 1 <= max_seq_len <= cfg.max_seq_len:
        raise ValueError(
            f"max_seq_len must be in [1, {cfg.max_seq_len}] (the model's context window); got {max_seq_len!r}"
        )
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1; got {batch_size!r}")
    return max_seq_len
