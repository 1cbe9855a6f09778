"""Sliding-window attention with a rolling (ring-buffer) KV cache: memory fixed at `window` positions.

With a window of W, the query at position t attends to positions t-W+1 .. t only. Keys and values
older than that are never read again, so the cache needs W slots per layer instead of max_seq_len:
position p lives in slot p % W, and each new token overwrites the oldest one. Without a cache,
`model(idx, attn_window=W)` computes the same thing with a banded causal mask over the whole sequence;
the tests check that the two agree.

    cache = RollingKVCache.for_model(model, window=64)
    logits = model(idx, cache=cache, attn_window=cache.window)    # always pass the window
    ids = generate_sliding_window(model, prompt, max_new_tokens=100, window=64)

Why slot order does not matter for one new token: each key carries its position inside it (the
rotary embedding rotated it when it was written), and attention is a weighted sum over a *set* of
keys, so a single query may see them in any order. A chunk of several new tokens needs a mask, so
for those the cache hands back the keys in position order.

This only changes which keys are kept: positions are still limited by the model's rotary table
(max_seq_len), and a model trained with full attention loses quality when it sees less (chapter 05
measures how much).

Out of scope: attention sinks (keeping the first few tokens, as StreamingLLM does), rolling back
(speculative decoding would need the overwritten slots), positions beyond the model's context window.
"""
from __future__ import annotations

import torch

from .generate import _setup
from .sampling import next_token


class RollingLayerCache:
    """One layer's ring of `window` key/value slots; `update` is what the attention module calls."""

    def __init__(self, parent: "RollingKVCache", k: torch.Tensor, v: torch.Tensor):
        self.parent = parent
        self.k, self.v = k, v  # each (B, Hkv, W, D)
        self.window = k.shape[2]

    def update(self, start_pos: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Store (B, Hkv, T, D) keys/values for positions start_pos.. and return the keys/values the new
        queries may attend to: the window's slots for one token, or position-ordered keys for a chunk."""
        if start_pos != self.parent.length:
            raise ValueError(f"a rolling cache only appends: start_pos must be {self.parent.length} "
                             f"(the number of positions seen); got {start_pos}")
        W, T = self.window, k_new.shape[2]
        if T == 1:  # decode: overwrite the oldest slot, attend to every filled slot (any order is fine)
            slot = start_pos % W
            self.k[:, :, slot:slot + 1] = k_new
            self.v[:, :, slot:slot + 1] = v_new
            n = min(start_pos + 1, W)
            return self.k[:, :, :n], self.v[:, :, :n]  # (B, Hkv, n, D)
        # a chunk: the W-1 positions before it (in order) are all its first query can still see
        n_prev = min(start_pos, W - 1)
        prev = torch.arange(start_pos - n_prev, start_pos, device=k_new.device) % W
        k_all = torch.cat([self.k[:, :, prev], k_new], dim=2)  # (B, Hkv, n_prev + T, D), position order
        v_all = torch.cat([self.v[:, :, prev], v_new], dim=2)
        keep = min(T, W)  # only the chunk's last W positions stay in the ring
        slots = torch.arange(start_pos + T - keep, start_pos + T, device=k_new.device) % W
        self.k[:, :, slots] = k_new[:, :, T - keep:]
        self.v[:, :, slots] = v_new[:, :, T - keep:]
        return k_all, v_all


class RollingKVCache:
    """Key/value slots for the last `window` positions of every layer: (L, B, Hkv, W, D) each.

    Duck-types KVCache for `Transformer.forward`: `length` counts the positions seen so far (the next
    token goes to position `length`), `max_seq_len` is the position limit (the model's context window).
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, window: int, head_dim: int,
                 max_seq_len: int, dtype=torch.float32, device=None, model_cfg=None):
        if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= max_seq_len:
            raise ValueError(f"window must be an int in [1, {max_seq_len}] (the context window); got {window!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        shape = (n_layers, batch_size, n_kv_heads, window, head_dim)  # (L, B, Hkv, W, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.window, self.batch_size, self.max_seq_len = window, batch_size, max_seq_len
        self.model_cfg = model_cfg  # the ModelConfig it was built for, as in KVCache (kv_cache.check_cache)
        self.length = 0
        self._layers = [RollingLayerCache(self, self.k[i], self.v[i]) for i in range(n_layers)]

    @classmethod
    def for_model(cls, model, window: int, batch_size: int = 1, dtype=None) -> "RollingKVCache":
        cfg = model.cfg
        return cls(cfg.n_layers, batch_size, cfg.n_kv_heads, window, cfg.head_dim, cfg.max_seq_len,
                   dtype=dtype or model.dtype, device=model.device, model_cfg=cfg)

    def layer(self, i: int) -> RollingLayerCache:
        return self._layers[i]

    def reset(self) -> None:
        self.length = 0

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values: fixed by the window, whatever the sequence length."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def __repr__(self):
        L, B, Hkv, W, D = self.k.shape
        return (f"RollingKVCache(layers={L}, batch={B}, kv_heads={Hkv}, window={W}, head_dim={D}, "
                f"dtype={self.k.dtype}, length={self.length}, nbytes={self.nbytes:,})")


@torch.no_grad()
def generate_sliding_window(model, prompt, max_new_tokens: int, window: int, *, temperature: float = 0.0,
                            sampling=None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Like generate(), but every token attends only to the last `window` positions, and the cache
    holds `window` slots. Returns (B, T + max_new_tokens) ids. Same results as running the model
    without a cache with attn_window=window."""
    prompt, sampling = _setup(model, prompt, max_new_tokens, sampling, temperature, generator)
    B, T = prompt.shape
    cache = RollingKVCache.for_model(model, window, batch_size=B)  # before returning early: it checks `window`
    if max_new_tokens == 0:
        return prompt
    out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=prompt.device)
    out[:, :T] = prompt
    logits = model(prompt, cache=cache, attn_window=window, last_only=True)[:, -1]  # (B, V)
    for n in range(max_new_tokens):
        tok = next_token(logits, sampling, generator, out[:, :T + n])  # (B, 1)
        out[:, T + n] = tok[:, 0]
        if n + 1 < max_new_tokens:
            logits = model(tok, cache=cache, attn_window=window, check=False)[:, -1]
    return out
