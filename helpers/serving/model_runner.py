"""One forward pass over a ragged batch: every request brings its own new tokens at its own positions.

A serving step mixes requests in different phases: most decode one token, a few prefill a chunk of
their prompt, each at a different position and with a different amount of context. Nothing is padded
in the big matmuls: all new tokens are laid end to end,

    tokens   (N,)     request 0's chunk | request 1's token | request 2's token | ...
    x        (N, C)   one matmul per weight matrix for the whole step, whatever mix of requests

and only attention, the one operation that looks at other positions, goes request by request:
decoding requests together (their context gathered through their block tables, padded to the longest,
with a mask), prefill chunks one at a time (a causal mask offset by the context already cached).

This is the model's own forward (helpers/model.py) taken apart at the attention call, with the same
modules and weights; tests/test_serving.py checks it against `generate` token for token.

Out of scope (vLLM has them): CUDA graphs for the decode batch, a fused varlen/paged attention kernel,
tensor parallelism, LoRA adapters, and sampling on the device without a host round trip.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import apply_rope, causal_mask
from .paged_cache import PagedKVCache


@dataclass
class SequenceChunk:
    """What one request contributes to a step."""
    token_ids: list[int]  # the new tokens (1 when decoding)
    start_pos: int  # position of the first of them = tokens already in the cache
    block_table: list[int]  # the request's blocks, covering positions 0 .. start_pos + len(token_ids) - 1
    want_logits: bool  # does this chunk end at the request's last known token (so a token is sampled)?


@torch.no_grad()
def forward_step(model, cache: PagedKVCache, chunks: list[SequenceChunk]) -> torch.Tensor:
    """Run one step. Returns logits (n_wanted, V) for the last token of each chunk with want_logits, in order."""
    device = model.device
    ids, positions, write_slots, rows = [], [], [], []
    n = 0
    for c in chunks:
        T = len(c.token_ids)
        ids.extend(c.token_ids)
        positions.extend(range(c.start_pos, c.start_pos + T))
        write_slots.append(cache.slots(c.block_table, c.start_pos, c.start_pos + T))
        rows.append((n, T))
        n += T
    tokens = torch.tensor(ids, dtype=torch.long, device=device)  # (N,)
    pos = torch.tensor(positions, dtype=torch.long, device=device)  # (N,)
    slots = torch.cat(write_slots)  # (N,)

    decode = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
    prefill = [i for i, c in enumerate(chunks) if len(c.token_ids) > 1]
    if decode:
        dec_rows = torch.tensor([rows[i][0] for i in decode], device=device)  # (Bd,)
        dec_len = torch.tensor([chunks[i].start_pos + 1 for i in decode], device=device)  # (Bd,) keys to read
        dec_slots = cache.table_slots([chunks[i].block_table for i in decode])  # (Bd, S)
        if len(decode) == 1:  # a batch of one needs no padding, hence no mask
            dec_slots, dec_mask = dec_slots[:, :int(dec_len[0])], None
        else:
            dec_mask = (torch.arange(dec_slots.shape[1], device=device) < dec_len.unsqueeze(1))  # (Bd, S)
            dec_mask = dec_mask[:, None, None, :]  # (Bd, 1, 1, S): True = a real key of this request
    pre_slots = [cache.slots(chunks[i].block_table, 0, chunks[i].start_pos + len(chunks[i].token_ids)).unsqueeze(0)
                 for i in prefill]  # each (1, context)

    cos, sin = model.rope_cos[pos], model.rope_sin[pos]  # (N, D)
    x = model.embed(tokens)  # (N, C)
    for layer_idx, layer in enumerate(model.layers):
        attn = layer.attn
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        q, k, v = attn.wqkv(layer.attn_norm(x)).split(attn.split_sizes, dim=-1)
        q = apply_rope(q.view(-1, H, D).transpose(0, 1), cos, sin)  # (H, N, D)
        k = apply_rope(k.view(-1, Hkv, D).transpose(0, 1), cos, sin)  # (Hkv, N, D)
        cache.write(layer_idx, slots, k.transpose(0, 1), v.view(-1, Hkv, D))  # the cache owns the write

        y = torch.empty_like(q)  # (H, N, D)
        if decode:
            kd, vd = cache.gather(layer_idx, dec_slots)  # (Bd, Hkv, S, D)
            qd = q[:, dec_rows].transpose(0, 1).unsqueeze(2)  # (Bd, H, 1, D)
            yd = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=dec_mask, enable_gqa=Hkv != H)
            y[:, dec_rows] = yd[:, :, 0].transpose(0, 1)  # (H, Bd, D)
        for i, s in zip(prefill, pre_slots):
            r0, T = rows[i]
            kp, vp = cache.gather(layer_idx, s)  # (1, Hkv, context, D)
            S = kp.shape[2]
            qp = q[:, r0:r0 + T].unsqueeze(0)  # (1, H, T, D)
            if S == T:  # a whole prompt: the plain causal mask, as model.py's prefill uses
                yp = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=Hkv != H)
            else:  # a later chunk, or a prompt whose prefix came from the prefix cache
                yp = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=causal_mask(T, S, device=device),
                                                    enable_gqa=Hkv != H)
            y[:, r0:r0 + T] = yp[0]
        x = x + attn.wo(y.transpose(0, 1).reshape(-1, H * D))  # (N, C)
        x = x + layer.mlp(layer.mlp_norm(x))

    last = [r0 + T - 1 for (r0, T), c in zip(rows, chunks) if c.want_logits]
    if not last:
        return torch.empty(0, model.cfg.vocab_size, device=device)
    x_last = x[torch.tensor(last, device=device)]  # (n_wanted, C)
    return model.head(model.norm(x_last))  # (n_wanted, V)
