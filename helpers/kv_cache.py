"""The KV cache: preallocated key/value buffers, written by position.

Past keys and values never change (a token's K and V depend only on the tokens up to it), so
generation computes them once and stores them. This cache allocates its buffers for the whole
context window up front, one (B, n_kv_heads, max_seq_len, head_dim) pair per layer:

- prefill writes positions 0 .. T-1 in one call;
- each decode step writes one slot;
- rolling back (speculative decoding rejects draft tokens) is just `truncate(n)`: later slots are
  overwritten by the next write.

Preallocation means no tensor is ever re-allocated or concatenated while generating, and the memory
cost is known before the first token: `nbytes` is 2 * layers * batch * kv_heads * max_seq_len *
head_dim * bytes per element.

A cache remembers what it was built for (`KVCache.for_model` records the model's ModelConfig), and
the model refuses a cache built for another one (`model.check_cache`): with a different layout the error
would come from deep inside torch, and with the same layout it would silently attend to another
model's keys.

Out of scope: paged allocation and sliding-window eviction (chapter 05 builds both by hand).
"""

from __future__ import annotations

import torch

from .model import check_cache_size


class LayerCache:
    """A view of one layer's slice of the cache; `update` is what the attention module calls."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v  # each (B, Hkv, S, D)

    def update(self, start_pos: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write (B, Hkv, T, D) keys/values at start_pos .. start_pos+T-1; return all keys/values so far."""
        T = k_new.shape[2]
        end = start_pos + T
        self.k[:, :, start_pos:end] = k_new
        self.v[:, :, start_pos:end] = v_new
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, Hkv, end, D) views, no copy


class PositionalCache:
    """What every contiguous cache shares: `length` positions are filled (the next token goes to position
    `length`), one view per layer for the attention to write through, commit, truncate and reset.

    The cache contract (every cache the model or the engine uses keeps it): the attention writes through
    `layer(i).update(start_pos, k, v)`; whoever ran the forward then calls `commit(end)` to say positions
    [0, end) are filled; only the cache itself ever assigns `length`. (The serving engine's paged step view
    keeps the same contract per sequence, its layers attending by themselves: serving/step_view.py.)"""

    length: int
    max_seq_len: int
    _layers: list

    def layer(self, i: int):
        return self._layers[i]

    def commit(self, end: int) -> None:
        """Positions [0, end) now hold keys and values (a forward wrote start_pos..end-1); any later ones
        are forgotten. Transformer.forward calls it after every layer wrote its slice."""
        if not 0 <= end <= self.max_seq_len:
            raise ValueError(f"end must be in [0, {self.max_seq_len}] (max_seq_len); got {end}")
        self.length = end

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (their slots are overwritten by later writes)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in [0, {self.length}]; got {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0


class KVCache(PositionalCache):
    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype=torch.float32,
        device=None,
        model_cfg=None,
    ):
        shape = (n_layers, batch_size, n_kv_heads, max_seq_len, head_dim)  # (L, B, Hkv, S, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.model_cfg = model_cfg  # the ModelConfig it was built for (None if built by hand); see check_cache
        self.length = 0  # number of positions filled (the next token goes to position `length`)
        self._layers = [LayerCache(self.k[i], self.v[i]) for i in range(n_layers)]

    @classmethod
    def for_model(cls, model, batch_size: int = 1, max_seq_len: int | None = None, dtype=None) -> "KVCache":
        cfg = model.cfg
        max_seq_len = check_cache_size(cfg, batch_size, max_seq_len)
        return cls(
            cfg.n_layers,
            batch_size,
            cfg.n_kv_heads,
            max_seq_len,
            cfg.head_dim,
            dtype=dtype or model.dtype,
            device=model.device,
            model_cfg=cfg,
        )

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (the whole context window, filled or not)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def bytes_per_token(self) -> int:
        """Bytes one more cached position costs: 2 (K and V) * layers * batch * kv_heads * head_dim * bytes."""
        L, B, Hkv, S, D = self.k.shape
        return 2 * L * B * Hkv * D * self.k.element_size()

    def __repr__(self):
        L, B, Hkv, S, D = self.k.shape
        return (
            f"KVCache(layers={L}, batch={B}, kv_heads={Hkv}, max_seq_len={S}, head_dim={D}, "
            f"dtype={self.k.dtype}, length={self.length}, nbytes={self.nbytes:,})"
        )
