"""One serving step as the model's forward sees it: a cache view over the paged pool that attends by itself.

The engine runs the model's own forward (helpers/model.py) on all of a step's new tokens laid end to end,
`idx` (1, N), whatever mix of decoding requests and prefill chunks they come from. What differs from a
contiguous cache is who owns which keys, so the view answers the model's two questions:

- `positions` (N,): each token's own position (its rotary angle), instead of one start_pos for all;
- `layer(i).attend(q, k, v)`: q (1, H, N, D), k, v (1, Hkv, N, D) after RoPE -> (1, H, N, D). It writes
  the new keys/values into their slots of the pool, then attends each request over its own keys:
  decoding requests together, read in place through their block tables (paged_attention.py's C kernel,
  no dense copy; or, with `decode_attention="gather"`, gathered into a padded dense copy and attended
  with SDPA and a mask: the path the engine used before, kept as chapter 13's baseline), and prefill
  chunks one at a time, gathered, with a causal mask offset by the context already cached (a chunk of T
  queries reads each key T times, so one copy of its context is small next to its attention).

Batch-invariant mode (`row_widths=(lo, hi)`): the view also offers `rowwise(module, x)`, which the model's
blocks use for every row-wise module (norms, projections, MLP): it runs the module on tiles of lo to hi
rows (row_tiles.py), so a row's arithmetic never depends on how many neighbours it has. Attention is
already one request at a time (the kernel, or one SDPA per prefill chunk; on the gather path the mode
attends each decoding request over its own keys, no mask, instead of one padded batch). Tiling each
module on its own gives the same bits as tiling a norm and the matmul after it together: the same rows
go through the same tiles.

The view builds its index tensors once per step from plain ints (no per-request tensors). The lengths stay
the pool's: after the forward, `commit()` tells the pool each sequence's new length (PagedKVCache.commit).

Left out: sliding windows, and prompt chunks read in place (the eager step gathers them; the compiled
step, compiled_step.py, sends every prompt row through the C kernel over its own blocks instead).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..model import causal_mask
from .paged_attention import PagedDecoder
from .paged_cache import PagedKVCache
from .row_tiles import tiled

DECODE_ATTENTION = ("in_place", "gather")


class LayerView:
    """Layer `index` of a step view: what the model's attention calls."""

    def __init__(self, step: "PagedStepView", index: int):
        self.step, self.index = step, index
        self.rowwise = step.rowwise

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.step.attend(self.index, q, k, v)


class PagedStepView:
    """A step's chunks (model_runner.SequenceChunk) over a PagedKVCache, as a cache the model's forward takes."""

    def __init__(
        self, cache: PagedKVCache, chunks: list, decode_attention: str, row_widths: tuple[int, int] | None = None
    ):
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {DECODE_ATTENTION}; got {decode_attention!r}")
        self.cache, self.chunks, self.decode_attention = cache, chunks, decode_attention
        self.row_widths = row_widths
        self.rowwise = None if row_widths is None else self.tiled
        self.seconds_attending = 0.0  # attention, gathers included (the engine's step breakdown)
        device = cache.k.device
        bs = cache.block_size
        ids, positions, slots, self.rows = [], [], [], []
        n = 0
        for c in chunks:
            T = len(c.token_ids)
            ids.extend(c.token_ids)
            positions.extend(range(c.start_pos, c.start_pos + T))
            table = c.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(c.start_pos, c.start_pos + T))
            self.rows.append((n, T))
            n += T
        self.tokens = torch.tensor([ids], dtype=torch.long, device=device)  # (1, N)
        self.positions = torch.tensor(positions, dtype=torch.long, device=device)  # (N,)
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)  # (N,) where each new token's K/V goes

        self.decode = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
        self.prefill = [i for i, c in enumerate(chunks) if len(c.token_ids) > 1]
        self.all_decode = len(self.decode) == len(chunks)  # the common step: row i is request i, no reordering
        if self.decode:
            dec = self.decode
            self.dec_rows = None if self.all_decode else torch.tensor([self.rows[i][0] for i in dec], device=device)
            self.lengths = [chunks[i].start_pos + 1 for i in dec]  # keys each decoding request reads
            tables = cache.padded_tables([chunks[i].block_table for i in dec])  # (Bd, n_blocks)
            dec_len = torch.tensor(self.lengths, device=device)  # (Bd,)
            self.dec_tables = tables
            if decode_attention == "in_place":  # checked and converted once, called once per layer
                self.decoder = PagedDecoder(tables, dec_len, bs, cache.k, cache.v)
            else:
                S = tables.shape[1] * bs  # key positions read per request, padding included
                self.dec_mask = (torch.arange(S, device=device) < dec_len.unsqueeze(1))[:, None, None, :]  # (Bd,1,1,S)
                if row_widths is not None:  # invariant: each request over its own keys, as if it were alone
                    self.dec_mask = None
        self.pre_tables = [cache.padded_tables([chunks[i].block_table]) for i in self.prefill]  # each (1, n_blocks)

    def layer(self, i: int) -> LayerView:
        return LayerView(self, i)

    def tiled(self, module, x: torch.Tensor) -> torch.Tensor:
        """module on x (1, N, C_in) in tiles of lo to hi rows (row_tiles.tiled) -> (1, N, C_out)."""
        return tiled((module,), x[0], self.row_widths).unsqueeze(0)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k, v (1, Hkv, N, D) at the step's slots of `layer`, attend q (1, H, N, D) -> (1, H, N, D)."""
        q = q[0].transpose(0, 1)  # (N, H, D): tokens first, as the pool and the kernel hold them
        N, H, D = q.shape
        Hkv = k.shape[1]
        self.cache.write(layer, self.slots, k[0].transpose(0, 1), v[0].transpose(0, 1))  # the cache owns the write
        t0 = time.perf_counter()
        if self.decode:
            yd = self.attend_decoding(layer, q.contiguous() if self.all_decode else q[self.dec_rows])  # (Bd, H, D)
        if self.all_decode:
            y = yd  # (N, H, D)
        else:
            y = q.new_empty(N, H, D)  # (N, H, D)
            if self.decode:
                y[self.dec_rows] = yd
        for i, table in zip(self.prefill, self.pre_tables):
            r0, T = self.rows[i]
            S = self.chunks[i].start_pos + T  # keys this chunk's queries may see
            kp, vp = self.cache.gather(layer, table)  # (1, Hkv, n_blocks * block_size, D)
            kp, vp = kp[:, :, :S], vp[:, :, :S]  # (1, Hkv, S, D)
            qp = q[r0 : r0 + T].transpose(0, 1).unsqueeze(0)  # (1, H, T, D)
            if S == T:  # a whole prompt: the plain causal mask, as model.py's prefill uses
                yp = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=Hkv != H)
            else:  # a later chunk, or a prompt whose prefix came from the prefix cache
                mask = causal_mask(T, S, device=q.device)  # (T, S)
                yp = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, enable_gqa=Hkv != H)
            y[r0 : r0 + T] = yp[0].transpose(0, 1)  # (T, H, D)
        self.seconds_attending += time.perf_counter() - t0
        return y.transpose(0, 1).unsqueeze(0)  # (1, H, N, D)

    def attend_decoding(self, layer: int, qd: torch.Tensor) -> torch.Tensor:
        """The decoding requests' attention, qd (Bd, H, D) -> (Bd, H, D)."""
        if self.decode_attention == "in_place":
            return self.decoder(layer, qd)
        H, Hkv = qd.shape[1], self.cache.k.shape[2]
        kd, vd = self.cache.gather(layer, self.dec_tables)  # (Bd, Hkv, S, D): a dense copy
        qd = qd.unsqueeze(2)  # (Bd, H, 1, D)
        if len(self.lengths) == 1:  # a batch of one needs no mask: cut instead
            L = self.lengths[0]
            yd = F.scaled_dot_product_attention(qd, kd[:, :, :L], vd[:, :, :L], enable_gqa=Hkv != H)
        elif self.dec_mask is None:  # the invariant mode: one request at a time, its own length
            yd = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        qd[b : b + 1], kd[b : b + 1, :, :L], vd[b : b + 1, :, :L], enable_gqa=Hkv != H
                    )
                    for b, L in enumerate(self.lengths)
                ]
            )  # (Bd, H, 1, D)
        else:
            yd = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=self.dec_mask, enable_gqa=Hkv != H)
        return yd[:, :, 0]  # (Bd, H, D)

    def commit(self) -> None:
        """Every layer wrote the step's slots: the pool records each named sequence's new length."""
        for c in self.chunks:
            if c.seq_id is not None:
                self.cache.commit(c.seq_id, c.start_pos + len(c.token_ids))

    def last_rows(self) -> list[int]:
        """Row of each chunk's last token that wants logits, in order."""
        return [r0 + T - 1 for (r0, T), c in zip(self.rows, self.chunks) if c.want_logits]
