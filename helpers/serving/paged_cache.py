"""The paged KV cache: one pool of fixed-size blocks shared by every request, read through block tables.

Keys and values for all requests live in one buffer per layer, cut into `num_blocks` blocks of
`block_size` token slots each:

    k[layer]: (num_blocks * block_size, n_kv_heads, head_dim)      slot = block * block_size + offset

A request's block table lists the blocks it holds, in order; its token at position p lives in slot
`table[p // block_size] * block_size + p % block_size`. The blocks need not be adjacent or in order,
which is the whole point: a request takes one block at a time as it grows, and hands them back when
it ends, so no memory is reserved for tokens it has not generated (block_pool.py keeps the books).

`write` stores new keys/values at their slots; `gather` reads a request's keys/values back in position
order, as the dense (B, Hkv, S, D) tensor that scaled_dot_product_attention takes. The cache owns its
writes; positions are the caller's (the scheduler knows how many tokens each request has computed).

Out of scope (vLLM has them): a fused paged-attention kernel that reads blocks in place instead of
gathering them into a dense copy first, quantized (fp8/int8) KV blocks, and CPU swap space.
"""
from __future__ import annotations

import torch


class PagedKVCache:
    def __init__(self, n_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype=torch.float32, device=None):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (n_layers, num_blocks * block_size, n_kv_heads, head_dim)  # (L, slots, Hkv, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16) -> "PagedKVCache":
        cfg = model.cfg
        return cls(cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim, model.dtype, model.device)

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

    def table_slots(self, block_tables: list[list[int]]) -> torch.Tensor:
        """Every slot of each request's blocks, padded with block 0 to the longest table: (B, S) long,
        S = longest table * block_size. Padded slots must be masked out by the reader."""
        width = max(len(t) for t in block_tables)
        table = torch.zeros(len(block_tables), width, dtype=torch.long)
        for i, t in enumerate(block_tables):
            table[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        offsets = torch.arange(self.block_size)
        return (table.unsqueeze(-1) * self.block_size + offsets).reshape(len(block_tables), -1).to(self.k.device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values (N, Hkv, D) of N new tokens at `slots` (N,)."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values at `slots` (B, S) as (B, Hkv, S, D), in the order given."""
        return self.k[layer][slots].transpose(1, 2), self.v[layer][slots].transpose(1, 2)
