"""What a model fixes about every KV cache built for it, whatever the cache's own layout of positions.

KVCache, Int8KVCache, RollingKVCache, SinkKVCache and the serving engine's PagedKVCache all hold one key
and one value buffer per layer, with the model's KV heads and head size, in its dtype and on its device,
and remember the ModelConfig they were built for (model.check_cache compares it). `CacheLayout.of(model)`
reads those off a model once; each cache adds its own batch and position dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheLayout:
    """What a model fixes about every cache built for it: the layers, KV heads and head size of the buffers,
    their dtype and device, and the ModelConfig they were built for (model.check_cache compares all of it).
    `CacheLayout.of(model)` reads them off a model; the cache variants (int8, rolling, sink, paged) take one.
    Leaves out the batch size and the positions: each cache lays those out its own way."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    device: torch.device | str | None = None
    model_cfg: object = None  # the ModelConfig (None for a cache built by hand)

    @classmethod
    def of(cls, model, dtype=None) -> "CacheLayout":
        """The layout of a cache for `model`, in `dtype` (the model's own when None)."""
        cfg = model.cfg
        return cls(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, dtype or model.dtype, model.device, cfg)

    def buffers(self, shape: tuple[int, ...], dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed key and value buffers of `shape` each, on this layout's device, in `dtype` (its own when None)."""
        dtype = dtype or self.dtype
        return torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device)
