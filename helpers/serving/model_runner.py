"""One forward pass over a ragged batch: every request brings its own new tokens at its own positions.

A serving step mixes requests in different phases: most decode one token, a few prefill a chunk of
their prompt, each at a different position and with a different amount of context. Nothing is padded
in the big matmuls: all new tokens are laid end to end,

    tokens   (N,)     request 0's chunk | request 1's token | request 2's token | ...
    x        (N, C)   one matmul per weight matrix for the whole step, whatever mix of requests

and only attention, the one operation that looks at other positions, goes by request:

- decoding requests together, read in place through their block tables (paged_attention.py: the C
  kernel walks each table block by block with the online softmax; no dense copy is made). With
  `decode_attention="gather"` they are gathered into a dense padded copy first and attended with SDPA
  and a mask instead: the path this engine used before, kept as the baseline chapter 13 measures;
- prefill chunks one at a time, gathered (a causal mask offset by the context already cached): a chunk
  of T queries reads each key T times, so one copy of its context is small next to its attention.

Batch-invariant mode (`row_widths=(lo, hi)`, set by `Engine(batch_invariant=True)`): every matmul (and
the norm before it) runs on tiles of lo to hi rows, the step's rows zero-padded up to lo where fewer,
for a range [lo, hi] in which the library gives each row the same bits whatever the number of rows
(row_tiles.py measures it; where it finds none, lo = hi = max_num_seqs: every call the same shape). A row's
arithmetic then never depends on how many neighbours it has. Attention is already one request at a
time (the kernel, or one SDPA per prefill chunk; on the gather path the mode attends each decoding
request over its own keys, no mask, instead of one padded batch).

This is the model's own forward (helpers/model.py) taken apart at the attention call, with the same
modules and weights; tests/test_serving.py checks it against `generate` token for token.

Out of scope (vLLM has them): CUDA graphs for the decode batch, a varlen attention kernel for prefill
chunks, tensor parallelism, LoRA adapters, and sampling on the device without a host round trip.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import apply_rope, causal_mask
from .paged_attention import PagedDecoder, kernel_available
from .paged_cache import PagedKVCache
from .row_tiles import padding, tiled


@dataclass
class SequenceChunk:
    """What one request contributes to a step."""

    token_ids: list[int]  # the new tokens (1 when decoding)
    start_pos: int  # position of the first of them = tokens already in the cache
    block_table: list[int]  # the request's blocks, covering positions 0 .. start_pos + len(token_ids) - 1
    want_logits: bool  # does this chunk end at the request's last known token (so a token is sampled)?
    seq_id: str | None = None  # the sequence's id in the cache: forward_step commits its new length under it


DECODE_ATTENTION = ("in_place", "gather")


def default_decode_attention(model, block_size: int = 16) -> str:
    """ "in_place" for a float32 model on the CPU where the C kernel builds (a C compiler is present), else
    "gather" (the kernel is CPU float32 only)."""
    cfg = model.cfg
    cpu32 = model.device.type == "cpu" and model.dtype == torch.float32
    built = cpu32 and kernel_available(cfg.head_dim, cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, block_size)
    return "in_place" if built else "gather"


def forward_step(
    model,
    cache: PagedKVCache,
    chunks: list[SequenceChunk],
    decode_attention: str | None = None,
    timings: dict | None = None,
    row_widths: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Run one step. Returns logits (n_wanted, V) for the last token of each chunk with want_logits, in order.

    decode_attention: "in_place" (read the blocks where they lie), "gather" (dense copy, then SDPA), or
    None for default_decode_attention(model). timings: a dict to which the seconds spent building the step's
    index tensors ("inputs") and in attention, gathers included ("attention"), are added (the engine's
    step breakdown; a clock read costs well under a microsecond). row_widths: None (each matmul sees all the
    step's rows at once) or (lo, hi): every matmul runs on tiles of lo to hi rows (the batch-invariant mode,
    row_tiles.py)."""
    with torch.inference_mode():  # no autograd bookkeeping on any op of the pass: less time per call
        x_last = _forward_rows(model, cache, chunks, decode_attention, timings, row_widths)  # (n_wanted, C)
    if x_last is None:
        return torch.empty(0, model.cfg.vocab_size, device=model.device)
    with torch.no_grad():  # outside inference mode, so the logits are a plain tensor a caller may change
        return tiled((model.norm, model.head), x_last, row_widths)  # (n_wanted, V)


def _forward_rows(
    model,
    cache: PagedKVCache,
    chunks: list[SequenceChunk],
    decode_attention: str | None,
    timings: dict | None,
    row_widths: tuple[int, int] | None,
) -> torch.Tensor | None:
    """forward_step up to the final norm: the hidden state of each chunk's last token that wants logits
    (n_wanted, C), or None when none does."""
    if row_widths is not None and not (
        isinstance(row_widths, tuple)
        and len(row_widths) == 2
        and all(isinstance(w, int) and not isinstance(w, bool) for w in row_widths)
        and 1 <= row_widths[0] <= row_widths[1]
    ):
        raise ValueError(f"row_widths must be None or a pair of ints 1 <= lo <= hi; got {row_widths!r}")
    if decode_attention is None:
        decode_attention = default_decode_attention(model, cache.block_size)
    if decode_attention not in DECODE_ATTENTION:
        raise ValueError(f"decode_attention must be one of {DECODE_ATTENTION}; got {decode_attention!r}")
    device = model.device
    bs = cache.block_size
    t_start = time.perf_counter()
    # the step's index tensors, built from plain ints in one torch.tensor call each (no per-request tensors)
    ids, positions, slots, rows = [], [], [], []
    n = 0
    for c in chunks:
        T = len(c.token_ids)
        ids.extend(c.token_ids)
        positions.extend(range(c.start_pos, c.start_pos + T))
        table = c.block_table
        slots.extend(table[p // bs] * bs + p % bs for p in range(c.start_pos, c.start_pos + T))
        rows.append((n, T))
        n += T
    tokens = torch.tensor(ids, dtype=torch.long, device=device)  # (N,)
    pos = torch.tensor(positions, dtype=torch.long, device=device)  # (N,)
    slots = torch.tensor(slots, dtype=torch.long, device=device)  # (N,) where each new token's K/V goes

    decode = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
    prefill = [i for i, c in enumerate(chunks) if len(c.token_ids) > 1]
    all_decode = len(decode) == len(chunks)  # the common step: row i is request i, no reordering needed
    if decode:
        dec_rows = None if all_decode else torch.tensor([rows[i][0] for i in decode], device=device)  # (Bd,)
        lengths = [chunks[i].start_pos + 1 for i in decode]  # keys each decoding request reads
        dec_tables = cache.padded_tables([chunks[i].block_table for i in decode])  # (Bd, n_blocks)
        dec_len = torch.tensor(lengths, device=device)  # (Bd,)
        if decode_attention == "in_place":  # checked and converted once, called once per layer
            decoder = PagedDecoder(dec_tables, dec_len, bs, cache.k, cache.v)
        else:
            S = dec_tables.shape[1] * bs  # key positions read per request, padding included
            dec_mask = (torch.arange(S, device=device) < dec_len.unsqueeze(1))[:, None, None, :]  # (Bd, 1, 1, S)
            one_len = lengths[0] if len(decode) == 1 else None  # a batch of one needs no mask: cut instead
            if row_widths is not None:  # invariant: each request over its own keys, as if it were alone
                dec_mask = None
    pre_tables = [cache.padded_tables([chunks[i].block_table]) for i in prefill]  # each (1, n_blocks)

    t_attention = 0.0
    t_inputs = time.perf_counter() - t_start
    cos, sin = model.rope_cos[pos].unsqueeze(1), model.rope_sin[pos].unsqueeze(1)  # (N, 1, D): one per token
    x = model.embed(tokens)  # (N, C)
    N = x.shape[0]
    pad = 0 if row_widths is None else padding(N, row_widths)
    if pad:  # padded once for the whole pass: (P, C), P = N + pad rows, so every tile has lo to hi rows
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    for layer_idx, layer in enumerate(model.layers):
        attn = layer.attn
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        qkv = tiled((layer.attn_norm, attn.wqkv), x, row_widths)[:N]  # (N, (H + 2 * Hkv) * D)
        # q's and k's heads rotated in one call (the same elementwise arithmetic as one call each)
        qk = apply_rope(qkv[:, : (H + Hkv) * D].view(N, H + Hkv, D), cos, sin)  # (N, H + Hkv, D)
        q, k = qk[:, :H], qk[:, H:]  # (N, H, D), (N, Hkv, D): views
        cache.write(layer_idx, slots, k, qkv[:, (H + Hkv) * D :].view(N, Hkv, D))  # the cache owns the write

        t0 = time.perf_counter()
        if decode:
            qd = q.contiguous() if all_decode else q[dec_rows]  # (Bd, H, D), tokens first, as the kernel reads it
            if decode_attention == "in_place":
                yd = decoder(layer_idx, qd)  # (Bd, H, D)
            else:
                kd, vd = cache.gather(layer_idx, dec_tables)  # (Bd, Hkv, S, D): a dense copy
                qd = qd.unsqueeze(2)  # (Bd, H, 1, D)
                if one_len is not None:
                    yd = F.scaled_dot_product_attention(qd, kd[:, :, :one_len], vd[:, :, :one_len], enable_gqa=Hkv != H)
                elif dec_mask is None:  # the invariant mode: one request at a time, its own length
                    yd = torch.cat(
                        [
                            F.scaled_dot_product_attention(
                                qd[b : b + 1], kd[b : b + 1, :, :L], vd[b : b + 1, :, :L], enable_gqa=Hkv != H
                            )
                            for b, L in enumerate(lengths)
                        ]
                    )  # (Bd, H, 1, D)
                else:
                    yd = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=dec_mask, enable_gqa=Hkv != H)
                yd = yd[:, :, 0]  # (Bd, H, D)
        if all_decode:
            y = yd  # (N, H, D)
        else:
            y = q.new_empty(N, H, D)  # (N, H, D)
            if decode:
                y[dec_rows] = yd
        for i, table in zip(prefill, pre_tables):
            r0, T = rows[i]
            S = chunks[i].start_pos + T  # keys this chunk's queries may see
            kp, vp = cache.gather(layer_idx, table)  # (1, Hkv, n_blocks * block_size, D)
            kp, vp = kp[:, :, :S], vp[:, :, :S]  # (1, Hkv, S, D)
            qp = q[r0 : r0 + T].transpose(0, 1).unsqueeze(0)  # (1, H, T, D)
            if S == T:  # a whole prompt: the plain causal mask, as model.py's prefill uses
                yp = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=Hkv != H)
            else:  # a later chunk, or a prompt whose prefix came from the prefix cache
                yp = F.scaled_dot_product_attention(
                    qp, kp, vp, attn_mask=causal_mask(T, S, device=device), enable_gqa=Hkv != H
                )
            y[r0 : r0 + T] = yp[0].transpose(0, 1)  # (T, H, D)
        t_attention += time.perf_counter() - t0
        y = y.reshape(N, H * D)
        if x.shape[0] != N:  # the padding rows' attention output: zeros
            y = torch.cat([y, y.new_zeros(x.shape[0] - N, H * D)])  # (P, H * D)
        x = x + tiled((attn.wo,), y, row_widths)  # (N, C), or (P, C) padded
        x = x + tiled((layer.mlp_norm, layer.mlp), x, row_widths)

    for c in chunks:  # every layer wrote its slots: the cache records each sequence's new length
        if c.seq_id is not None:
            cache.commit(c.seq_id, c.start_pos + len(c.token_ids))
    if timings is not None:
        timings["inputs"] = timings.get("inputs", 0.0) + t_inputs
        timings["attention"] = timings.get("attention", 0.0) + t_attention
    last = [r0 + T - 1 for (r0, T), c in zip(rows, chunks) if c.want_logits]
    if not last:
        return None
    if len(last) == N:  # every row is a chunk's last (a decode-only step): no gather needed
        return x[:N]  # (N, C)
    return x[torch.tensor(last, device=device)]  # (n_wanted, C)
