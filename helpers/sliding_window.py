"""Sliding-window attention with a rolling (ring-buffer) KV cache: memory fixed at `window` positions.

With a window of W, the query at position t attends to positions t-W+1 .. t only. Keys and values
older than that are never read again, so the cache needs W slots per layer instead of max_seq_len:
position p lives in slot p % W, and each new token overwrites the oldest one. Without a cache,
`model(idx, attn_window=W)` computes the same thing with a banded causal mask over the whole sequence;
the tests check that the two agree.

    cache = RollingKVCache.for_model(model, window=64)
    logits = model(idx, cache=cache)                  # the window comes from the cache (cache.attn_window)
    ids = generate_sliding_window(model, prompt, max_new_tokens=100, window=64)   # generate.py: generate() on one

Why slot order does not matter for one new token: each key carries its position inside it (the
rotary embedding rotated it when it was written), and attention is a weighted sum over a *set* of
keys, so a single query may see them in any order. A chunk of several new tokens needs a mask, so
for those the cache hands back the keys in position order.

This only changes which keys are kept: positions are still limited by the model's rotary table
(max_seq_len), and a model trained with full attention loses quality when it sees less (chapter 05
measures how much).

`SinkKVCache` (chapter 08) adds the StreamingLLM variant: the first `n_sink` positions stay for
good ("attention sinks"), the last `window` positions roll, and positions are counted *inside the
cache*, so a stream can run past the model's context window:

    cache = SinkKVCache.for_model(model, n_sink=4, window=508)
    for t in range(5000):                                   # one token at a time once it is full
        logits = model(ids[:, t:t + 1], cache=cache)        # no attn_window: the cache decides what is kept

It stores keys *before* the rotary embedding and rotates them at their place in the cache every step
(sinks at 0..n_sink-1, the window after them, oldest first), so no position ever exceeds n_sink +
window - 1. With n_sink=0 it is a plain sliding window that never runs out of positions.

Out of scope: rolling back (speculative decoding would need the overwritten slots); chunks of several
tokens once a SinkKVCache is full (each query of a chunk would need its own set of keys).
"""

from __future__ import annotations

import torch

from .cache_layout import CacheLayout
from .model import apply_rope


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
            raise ValueError(
                f"a rolling cache only appends: start_pos must be {self.parent.length} "
                f"(the number of positions seen); got {start_pos}"
            )
        W, T = self.window, k_new.shape[2]
        if T == 1:  # decode: overwrite the oldest slot, attend to every filled slot (any order is fine)
            slot = start_pos % W
            self.k[:, :, slot : slot + 1] = k_new
            self.v[:, :, slot : slot + 1] = v_new
            n = min(start_pos + 1, W)
            return self.k[:, :, :n], self.v[:, :, :n]  # (B, Hkv, n, D)
        # a chunk: the W-1 positions before it (in order) are all its first query can still see
        n_prev = min(start_pos, W - 1)
        prev = torch.arange(start_pos - n_prev, start_pos, device=k_new.device) % W
        k_all = torch.cat([self.k[:, :, prev], k_new], dim=2)  # (B, Hkv, n_prev + T, D), position order
        v_all = torch.cat([self.v[:, :, prev], v_new], dim=2)
        keep = min(T, W)  # only the chunk's last W positions stay in the ring
        slots = torch.arange(start_pos + T - keep, start_pos + T, device=k_new.device) % W
        self.k[:, :, slots] = k_new[:, :, T - keep :]
        self.v[:, :, slots] = v_new[:, :, T - keep :]
        return k_all, v_all


class WindowSlots:
    """What both window caches share: (L, B, Hkv, slots, D) key and value buffers allocated once, and one
    view of them per layer for the attention to write through."""

    k: torch.Tensor
    v: torch.Tensor
    _layers: list
    sizes: tuple[str, ...]  # the attributes that set the number of slots, as the repr shows them
    counter: str  # the attribute that counts the positions fed so far

    def layer(self, i: int):
        return self._layers[i]

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values: fixed by the slots, however long the sequence."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def __repr__(self):
        L, B, Hkv, _, D = self.k.shape  # (L, B, Hkv, slots, D)
        sizes = ", ".join(f"{name}={getattr(self, name)}" for name in self.sizes)
        return (
            f"{type(self).__name__}(layers={L}, batch={B}, kv_heads={Hkv}, {sizes}, head_dim={D}, "
            f"dtype={self.k.dtype}, {self.counter}={getattr(self, self.counter)}, nbytes={self.nbytes:,})"
        )


class RollingKVCache(WindowSlots):
    """Key/value slots for the last `window` positions of every layer: (L, B, Hkv, W, D) each.

    Keeps the cache contract (kv_cache.PositionalCache): `length` counts the positions seen so far (the next
    token goes to position `length`), `max_seq_len` is the position limit (the model's context window).
    """

    sizes, counter = ("window",), "length"

    def __init__(self, layout: CacheLayout, batch_size: int, window: int, max_seq_len: int):
        if not isinstance(window, int) or isinstance(window, bool) or not 1 <= window <= max_seq_len:
            raise ValueError(f"window must be an int in [1, {max_seq_len}] (the context window); got {window!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        shape = (layout.n_layers, batch_size, layout.n_kv_heads, window, layout.head_dim)  # (L, B, Hkv, W, D)
        self.k, self.v = layout.buffers(shape)
        self.window, self.batch_size, self.max_seq_len = window, batch_size, max_seq_len
        self.model_cfg = layout.model_cfg  # the ModelConfig it was built for, as in KVCache (model.check_cache)
        self.length = 0
        self._layers = [RollingLayerCache(self, self.k[i], self.v[i]) for i in range(layout.n_layers)]

    @classmethod
    def for_model(cls, model, window: int, batch_size: int = 1, dtype=None) -> "RollingKVCache":
        return cls(CacheLayout.of(model, dtype), batch_size, window, model.cfg.max_seq_len)

    @property
    def attn_window(self) -> int:
        """The attention window these slots imply: Transformer.forward attends over the last `window`
        positions with this cache, and refuses any other attn_window (the older keys are gone)."""
        return self.window

    def commit(self, end: int) -> None:
        """Positions up to end - 1 have been seen (the slots keep the last `window` of them)."""
        if not self.length <= end <= self.max_seq_len:
            raise ValueError(
                f"a rolling cache only appends: end must be in [{self.length}, {self.max_seq_len}]; got {end}"
            )
        self.length = end

    def reset(self) -> None:
        self.length = 0


class SinkLayerCache:
    """One layer's un-rotated keys and values in cache order (sinks, then the window oldest first)."""

    def __init__(self, parent: "SinkKVCache", k: torch.Tensor, v: torch.Tensor):
        self.parent = parent
        self.k, self.v = k, v  # each (B, Hkv, n_sink + window, D); k before the rotary embedding

    def update(self, start_pos: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Store (B, Hkv, T, D) keys/values that the model rotated at cache positions start_pos.. and
        return every kept key, rotated at its current cache position, with its value."""
        p = self.parent
        if start_pos != p.length:
            raise ValueError(f"a sink cache only appends: start_pos must be {p.length}; got {start_pos}")
        T, C = k_new.shape[2], p.capacity
        cos, sin = p.rope_cos[start_pos : start_pos + T], p.rope_sin[start_pos : start_pos + T]  # (T, D)
        k_raw = apply_rope(k_new, cos, -sin)  # undo the model's rotation: a rotation by -position
        if p.seen + T <= C:  # still room: plain causal attention over everything so far
            self.k[:, :, p.seen : p.seen + T] = k_raw
            self.v[:, :, p.seen : p.seen + T] = v_new
            n = p.seen + T
        elif T == 1:  # full: evict the oldest window token, move the window up one place, append
            s = p.n_sink
            self.k[:, :, s : C - 1] = self.k[:, :, s + 1 : C].clone()  # clone: the two ranges overlap
            self.v[:, :, s : C - 1] = self.v[:, :, s + 1 : C].clone()
            self.k[:, :, C - 1 :] = k_raw
            self.v[:, :, C - 1 :] = v_new
            n = C
        else:
            raise ValueError(
                f"a chunk of {T} tokens does not fit the {C - p.seen} free places of the sink cache; "
                "feed one token at a time once it is full"
            )
        k_all = apply_rope(self.k[:, :, :n], p.rope_cos[:n], p.rope_sin[:n])  # (B, Hkv, n, D), cache positions
        return k_all, self.v[:, :, :n]


class SinkKVCache(WindowSlots):
    """The first `n_sink` positions for good plus a rolling window of the last `window`: StreamingLLM.

    Duck-types KVCache for `Transformer.forward`, with positions counted inside the cache: `length`
    is the cache position of the next token (it stops growing at n_sink + window - 1 once the cache is
    full) and `seen` counts every token fed so far. Use it without `attn_window`.
    """

    sizes, counter = ("n_sink", "window"), "seen"

    def __init__(
        self,
        layout: CacheLayout,
        batch_size: int,
        n_sink: int,
        window: int,
        rope_cos: torch.Tensor,
        rope_sin: torch.Tensor,
    ):
        max_seq_len = rope_cos.shape[0]
        for name, value, low in (("n_sink", n_sink, 0), ("window", window, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        if n_sink + window > max_seq_len:
            raise ValueError(
                f"n_sink + window must be at most {max_seq_len} (the context window); got {n_sink} + {window}"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        self.n_sink, self.window, self.capacity = n_sink, window, n_sink + window
        shape = (layout.n_layers, batch_size, layout.n_kv_heads, self.capacity, layout.head_dim)  # (L, B, Hkv, C, D)
        self.k, self.v = layout.buffers(shape)
        self.rope_cos, self.rope_sin = rope_cos, rope_sin  # (max_seq_len, D): the model's own tables
        self.batch_size, self.max_seq_len = batch_size, max_seq_len
        self.model_cfg = layout.model_cfg  # see model.check_cache
        self.seen = 0
        self._layers = [SinkLayerCache(self, self.k[i], self.v[i]) for i in range(layout.n_layers)]

    @classmethod
    def for_model(cls, model, n_sink: int, window: int, batch_size: int = 1, dtype=None) -> "SinkKVCache":
        return cls(CacheLayout.of(model, dtype), batch_size, n_sink, window, model.rope_cos, model.rope_sin)

    @property
    def length(self) -> int:
        """Cache position of the next token: seen until the cache is full, then n_sink + window - 1."""
        return min(self.seen, self.capacity - 1)

    def commit(self, end: int) -> None:
        """The tokens up to cache position end - 1 went in (Transformer.forward calls it after a forward)."""
        if end < self.length:
            raise ValueError(f"a sink cache cannot roll back (length {self.length} -> {end}); use reset()")
        self.seen += end - self.length

    def reset(self) -> None:
        self.seen = 0
