"""A KV cache stored in int8: one code per element, one scale per (token, KV head).

Each key or value vector of one head at one position (head_dim numbers) is stored as int8 codes
round(x / s) in [-127, 127] with its own scale s = max|x| / 127, kept in float16. Scales per token
fit a cache that is written one position at a time: a new token never changes the codes already
stored. Attention reads the cache dequantized (codes * scale, in the model's dtype); a real kernel
does that inside the attention loop, here it is a plain tensor expression.

    cache = Int8KVCache.for_model(model, batch_size=1)
    logits = model(idx, cache=cache)          # the same calls as with a KVCache
    cache.bytes_per_token()                   # 2 * layers * kv_heads * (head_dim + 2) per sequence

Out of scope: int4 codes, per-channel key scales (KIVI), fused dequantize-in-attention kernels, a
quantized sliding window.
"""

from __future__ import annotations

import torch

from .cache_layout import CacheLayout
from .kv_cache import PositionalCache
from .model import check_cache_size

QMAX = 127  # symmetric int8: -127..127, so that the code of -max|x| is exact too


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., D) float -> int8 codes (..., D) and float16 scales (..., 1), one scale per vector."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / QMAX).to(torch.float16)  # (..., 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero vector: any scale is exact
    codes = torch.round(x.float() / scale.float()).clamp_(-QMAX, QMAX).to(torch.int8)  # (..., D)
    return codes, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (codes.to(torch.float32) * scale.to(torch.float32)).to(dtype)


class Int8LayerCache:
    """One layer's codes and scales; `update` quantizes the new positions and returns the dequantized cache."""

    def __init__(self, k_codes, v_codes, k_scale, v_scale, dtype):
        self.k_codes, self.v_codes = k_codes, v_codes  # each (B, Hkv, S, D) int8
        self.k_scale, self.v_scale = k_scale, v_scale  # each (B, Hkv, S, 1) float16
        self.dtype = dtype

    def update(self, start_pos: int, k_new: torch.Tensor, v_new: torch.Tensor):
        end = start_pos + k_new.shape[2]
        self.k_codes[:, :, start_pos:end], self.k_scale[:, :, start_pos:end] = quantize_per_token(k_new)
        self.v_codes[:, :, start_pos:end], self.v_scale[:, :, start_pos:end] = quantize_per_token(v_new)
        k = dequantize(self.k_codes[:, :, :end], self.k_scale[:, :, :end], self.dtype)  # (B, Hkv, end, D)
        v = dequantize(self.v_codes[:, :, :end], self.v_scale[:, :, :end], self.dtype)
        return k, v


class Int8KVCache(PositionalCache):
    """A KVCache (kv_cache.py) for `Transformer.forward` whose slots hold int8 codes: it shares length,
    truncate, reset and layer with KVCache through PositionalCache.

    `k` and `v` are the dequantized keys and values, computed afresh on every read (for inspection and
    for `check_cache`, not for speed). The stored bytes are k_codes/v_codes and k_scale/v_scale.
    """

    def __init__(self, layout: CacheLayout, batch_size: int, max_seq_len: int):
        shape = (layout.n_layers, batch_size, layout.n_kv_heads, max_seq_len, layout.head_dim)  # (L, B, Hkv, S, D)
        self.k_codes, self.v_codes = layout.buffers(shape, torch.int8)
        self.k_scale = torch.ones(shape[:-1] + (1,), dtype=torch.float16, device=layout.device)  # (L, B, Hkv, S, 1)
        self.v_scale = torch.ones(shape[:-1] + (1,), dtype=torch.float16, device=layout.device)
        self.dtype, self.batch_size, self.max_seq_len = layout.dtype, batch_size, max_seq_len
        self.model_cfg = layout.model_cfg
        self.length = 0
        self._layers = [
            Int8LayerCache(self.k_codes[i], self.v_codes[i], self.k_scale[i], self.v_scale[i], layout.dtype)
            for i in range(layout.n_layers)
        ]

    @classmethod
    def for_model(cls, model, batch_size: int = 1, max_seq_len: int | None = None) -> "Int8KVCache":
        return cls(CacheLayout.of(model), batch_size, check_cache_size(model.cfg, batch_size, max_seq_len))

    @property
    def k(self) -> torch.Tensor:
        return dequantize(self.k_codes, self.k_scale, self.dtype)

    @property
    def v(self) -> torch.Tensor:
        return dequantize(self.v_codes, self.v_scale, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes allocated: int8 codes plus float16 scales, for keys and values."""
        return sum(t.numel() * t.element_size() for t in (self.k_codes, self.v_codes, self.k_scale, self.v_scale))

    def bytes_per_token(self) -> int:
        """Bytes one more cached position costs: 2 * layers * batch * kv_heads * (head_dim codes + a 2-byte scale)."""
        L, B, Hkv, S, D = self.k_codes.shape
        return 2 * L * B * Hkv * (D * self.k_codes.element_size() + self.k_scale.element_size())

    def __repr__(self):
        L, B, Hkv, S, D = self.k_codes.shape
        return (
            f"Int8KVCache(layers={L}, batch={B}, kv_heads={Hkv}, max_seq_len={S}, head_dim={D}, "
            f"length={self.length}, nbytes={self.nbytes:,})"
        )
