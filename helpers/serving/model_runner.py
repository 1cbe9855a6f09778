"""One forward pass over a ragged batch: every request brings its own new tokens at its own positions.

A serving step mixes requests in different phases: most decode one token, a few prefill a chunk of
their prompt, each at a different position and with a different amount of context. Nothing is padded
in the big matmuls: all new tokens are laid end to end,

    tokens   (1, N)   request 0's chunk | request 1's token | request 2's token | ...
    x        (1, N, C) one matmul per weight matrix for the whole step, whatever mix of requests

and the model's own forward (helpers/model.py, `Transformer.hidden`) runs on them with a step view of the
paged pool as its cache (step_view.py): the view gives each token its position, and its layers' `attend`
writes the new keys/values into the pool and attends each request over its own blocks (decoding requests
read in place by the C kernel, or gathered: `decode_attention`; prefill chunks gathered one at a time).
The final norm and the head then run on the rows that are sampled from only.

Batch-invariant mode (`row_widths=(lo, hi)`, set by `Engine(batch_invariant=True)`): the view's `rowwise`
runs every norm and matmul on tiles of lo to hi rows, the step's rows zero-padded up to lo where fewer,
for a range [lo, hi] in which the library gives each row the same bits whatever the number of rows
(row_tiles.py measures it; where it finds none, lo = hi = max_num_seqs: every call the same shape). A row's
arithmetic then never depends on how many neighbours it has.

tests/test_serving.py checks the step against `generate` token for token.

Out of scope (vLLM has them): CUDA graphs for the decode batch, a varlen attention kernel for prefill
chunks in this eager step (the compiled step, compiled_step.py, reads prompt rows in place row by row),
tensor parallelism, LoRA adapters, and sampling on the device without a host round trip.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .paged_attention import kernel_available
from .paged_cache import PagedKVCache
from .row_tiles import tiled
from .step_view import PagedStepView


@dataclass
class SequenceChunk:
    """What one request contributes to a step."""

    token_ids: list[int]  # the new tokens (1 when decoding)
    start_pos: int  # position of the first of them = tokens already in the cache
    block_table: list[int]  # the request's blocks, covering positions 0 .. start_pos + len(token_ids) - 1
    want_logits: bool  # does this chunk end at the request's last known token (so a token is sampled)?
    seq_id: str | None = None  # the sequence's id in the cache: forward_step commits its new length under it


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
    t_start = time.perf_counter()
    view = PagedStepView(cache, chunks, decode_attention, row_widths)  # the step's index tensors, built once
    t_inputs = time.perf_counter() - t_start
    x = model.hidden(view.tokens, view, check=False)[0]  # (N, C): the model's own layers over the paged pool
    view.commit()  # every layer wrote its slots: the pool records each sequence's new length
    if timings is not None:
        timings["inputs"] = timings.get("inputs", 0.0) + t_inputs
        timings["attention"] = timings.get("attention", 0.0) + view.seconds_attending
    last = view.last_rows()
    if not last:
        return None
    if len(last) == x.shape[0]:  # every row is a chunk's last (a decode-only step): no gather needed
        return x  # (N, C)
    return x[torch.tensor(last, device=x.device)]  # (n_wanted, C)
