"""The paged KV cache: one pool of fixed-size blocks shared by every request, read through block tables.

Keys and values for all requests live in one buffer per layer, cut into `num_blocks` blocks of
`block_size` token slots each:

    k[layer]: (num_blocks * block_size, n_kv_heads, head_dim)      slot = block * block_size + offset

A request's block table lists the blocks it holds, in order; its token at position p lives in slot
`table[p // block_size] * block_size + p % block_size`. The blocks need not be adjacent or in order,
which is the whole point: a request takes one block at a time as it grows, and hands them back when
it ends, so no memory is reserved for tokens it has not generated (block_pool.py keeps the books).

`write` stores new keys/values at their slots; `gather` reads requests' blocks back in position
order, as the dense (B, Hkv, S, D) tensor that scaled_dot_product_attention takes (prefill chunks, and
the dense-copy baseline); decode attention reads the blocks in place instead (paged_attention.py).

The cache contract of helpers/kv_cache.py, per sequence: the attention writes through `write`; whoever
ran the forward then calls `commit(seq_id, end)` to say that sequence's positions [0, end) are filled
(step_view.PagedStepView.commit does, for every chunk that names its sequence); `release(seq_id)` forgets a
sequence whose blocks went back to the pool. Only the cache assigns its `lengths`. The scheduler keeps
its own count (`Request.num_computed`, what to compute next); tests/test_serving.py checks the two agree.

Out of scope (vLLM has them): quantized (fp8/int8) KV blocks, and CPU swap space.
"""

from __future__ import annotations

import torch

from ..cache_layout import CacheLayout


class PagedKVCache:
    def __init__(self, layout: CacheLayout, num_blocks: int, block_size: int):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (layout.n_layers, num_blocks * block_size, layout.n_kv_heads, layout.head_dim)  # (L, slots, Hkv, D)
        self.k, self.v = layout.buffers(shape)
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)  # per-layer views, made once
        self.lengths: dict[str, int] = {}  # sequence id -> positions filled; written by commit/release only

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16) -> "PagedKVCache":
        return cls(CacheLayout.of(model), num_blocks, block_size)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def bytes_per_block(self) -> int:
        return self.nbytes // self.num_blocks

    def slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Slot ids of positions start .. end-1 of a request with this block table. (end - start,) long."""
        pos = torch.arange(start, end)
        table = torch.tensor(block_table, dtype=torch.long)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.k.device)

    def padded_tables(self, block_tables: list[list[int]]) -> torch.Tensor:
        """Block tables padded with block 0 to the longest: (B, n_blocks) long. A reader sees
        n_blocks * block_size key positions per request and must mask the padding out."""
        width = max(len(t) for t in block_tables)
        rows = [t + [0] * (width - len(t)) for t in block_tables]  # padded as Python lists: one tensor call
        return torch.tensor(rows, dtype=torch.long, device=self.k.device)

    def commit(self, seq_id: str, end: int) -> None:
        """Sequence seq_id's positions [0, end) now hold keys and values (a forward wrote their slots, in every
        layer); any later ones are forgotten, as a contiguous cache's commit forgets them."""
        if not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise ValueError(f"end must be an int >= 0; got {end!r}")
        self.lengths[seq_id] = end

    def length(self, seq_id: str) -> int:
        """Positions filled for seq_id (0 for a sequence never committed or released)."""
        return self.lengths.get(seq_id, 0)

    def release(self, seq_id: str) -> None:
        """Forget seq_id (its blocks went back to the pool: finished, cancelled or preempted)."""
        self.lengths.pop(seq_id, None)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values (N, Hkv, D) of N new tokens at `slots` (N,)."""
        self.k_layers[layer].index_copy_(0, slots, k)
        self.v_layers[layer].index_copy_(0, slots, v)

    def gather(self, layer: int, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values of whole blocks, (B, n_blocks) block ids -> (B, Hkv, n_blocks * block_size, D).

        Copies whole blocks (block_size * Hkv * D values at a time), not single slots: a few large copies
        are faster than many small ones. The result is a strided view, which attention reads as it is."""
        B, n = tables.shape
        bs = self.block_size
        flat = tables.reshape(-1)  # index_select copies whole rows: ~6x faster here than k[tables]
        k = self.k[layer].view(self.num_blocks, bs, *self.k.shape[2:]).index_select(0, flat)  # (B*n, bs, Hkv, D)
        v = self.v[layer].view(self.num_blocks, bs, *self.v.shape[2:]).index_select(0, flat)
        return k.view(B, n * bs, *k.shape[2:]).transpose(1, 2), v.view(B, n * bs, *v.shape[2:]).transpose(1, 2)
