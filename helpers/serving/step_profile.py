"""Where a serving step's time goes: one decode step timed three ways (four with it compiled), and an engine step
taken apart.

    t = paged_step_seconds(model, batch=32, context=512)    # medians: in_place, gather, dense; gather_calls
    parts = step_breakdown(model, ids, batch=32)             # mean seconds per step, by part

`paged_step_seconds` builds one decode step of `batch` requests with `context` cached tokens each, their
blocks scattered over the pool at random (a long-running server's pool looks like that), and times,
interleaved: the engine's step reading blocks in place, the same step gathering each request's blocks
into a dense copy first, and the dense `KVCache` batched step of the same shape (model.py's forward, no
paging at all); with `compiled="autotune"` (or "library") also the in-place step compiled
(compiled_step.py). It also counts the calls the in-place step makes to `PagedKVCache.gather` (0 by design).

`step_breakdown` runs an engine on `batch` requests that all decode at once (prompts cut from `ids`; with
`compile_step`, the engine's compiled step), and returns `Engine.step_breakdown()` over the decode steps:
scheduler, the step's index tensors, attention, the matmuls with the rest of the forward pass, sampling, and
the engine's own bookkeeping.

Left out: the profiler's per-operator view (helpers/measure/profiling.py answers that question) and
prefill-heavy steps (chunked prefill's cost is chapter 13's load-test question).
"""

from __future__ import annotations

import random

import torch

from ..generate import prefill
from ..kv_cache import KVCache
from ..measure.timing import median, time_interleaved
from .compiled_step import compiled_step_for
from .engine import Engine
from .model_runner import SequenceChunk, forward_step
from .paged_cache import PagedKVCache


def scattered_decode_batch(model, batch: int, context: int, block_size: int = 16, seed: int = 0):
    """A pool holding `batch` requests of `context` cached tokens (random values) in blocks scattered at
    random, and one decode chunk per request: (cache, chunks)."""
    per = -(-(context + 1) // block_size)  # blocks per request, the new token's slot included
    num_blocks = batch * per + 1
    cache = PagedKVCache.for_model(model, num_blocks, block_size)
    g = torch.Generator().manual_seed(seed)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    blocks = list(range(num_blocks))
    random.Random(seed).shuffle(blocks)
    chunks = [SequenceChunk([1 + i], context, blocks[i * per : (i + 1) * per], True) for i in range(batch)]
    return cache, chunks


def paged_step_seconds(
    model, batch: int = 32, context: int = 512, block_size: int = 16, repeats: int = 9, compiled: str | None = None
) -> dict:
    """Median seconds of one decode step: in place, gathered, and the dense KVCache step (and, with compiled a
    mode of compiled_step.py, the in-place step compiled, its compile not timed); plus the number of
    PagedKVCache.gather calls the in-place step made."""
    cache, chunks = scattered_decode_batch(model, batch, context, block_size)
    dense = KVCache.for_model(model, batch_size=batch, max_seq_len=context + 1)
    prefill(model, torch.randint(0, model.cfg.vocab_size, (batch, context)), dense)  # the cache sets its length
    token = torch.ones(batch, 1, dtype=torch.long)  # (B, 1)

    calls = []
    real_gather = cache.gather

    def counting_gather(*args):
        calls.append(1)
        return real_gather(*args)

    cache.gather = counting_gather
    forward_step(model, cache, chunks, "in_place")
    gather_calls = len(calls)
    cache.gather = real_gather

    steps = [
        lambda: forward_step(model, cache, chunks, "in_place"),
        lambda: forward_step(model, cache, chunks, "gather"),
        lambda: model(token, dense, start_pos=context),
    ]
    if compiled:
        step = compiled_step_for(model, compiled)
        if step.compile_seconds is None:
            step.warmup(block_size)
        steps.append(lambda: step(cache, chunks))
    with torch.no_grad():
        times = time_interleaved(steps, model.device, repeats=repeats)
    t = dict(zip(("in_place", "gather", "dense", "compiled"), (median(t) for t in times)))
    return dict(t, gather_calls=gather_calls)


def step_breakdown(
    model,
    ids: list[int],
    batch: int,
    prompt_len: int = 256,
    steps: int = 24,
    decode_attention: str | None = None,
    compile_step: bool | str = False,
) -> dict[str, float]:
    """Mean seconds per decode step by part, for `batch` requests decoding together (prompts of prompt_len
    tokens cut from ids; `steps` decode steps measured after every prompt is in the cache). With compile_step
    the compiled step's index tensors and attention fall under matmuls_and_rest (one graph: not split)."""
    if len(ids) < batch * prompt_len:
        raise ValueError(f"ids must hold batch * prompt_len = {batch * prompt_len} tokens; got {len(ids)}")
    per = -(-(prompt_len + steps + 2) // 16)
    e = Engine(
        model,
        num_blocks=batch * per + 1,
        block_size=16,
        max_num_seqs=batch,
        decode_attention=decode_attention,
        compile_step=compile_step,
    )
    for i in range(batch):
        e.submit(ids[i * prompt_len : (i + 1) * prompt_len], max_tokens=steps + 2)
    while any(r.num_computed < len(r.prompt) for r in e.requests.values()):
        e.step()  # prefill, not measured
    e.reset_timings()
    for _ in range(steps):
        e.step()
    return e.step_breakdown()
