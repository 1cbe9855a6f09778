"""The engine's compiled step (helpers/serving/compiled_step.py) against the eager step.

The same decode batch (blocks scattered over the pool), and a step mixing decodes with prompt chunks, run
through model_runner.forward_step and through the compiled graph: the logits agree within float32 rounding
(the compiled graph's matmuls are inductor's own GEMMs, which add in another order: measured differences 2e-5
to 4e-5 on the course model; the bound is test_serving.py's 1e-3), the greedy tokens are the same, each new
key and value lands in its slot (and nowhere else), and the cache commits the same lengths; in both modes (the
library's matmuls, and autotuned ones: compiled afresh in every process, tens of seconds on a small CPU).
Engines given compile_step=True are checked against generate in test_serving.py (with the count of compiled
steps).
"""

from __future__ import annotations

import pytest
import torch

from helpers import load_model
from helpers.serving import Engine
from helpers.serving.compiled_step import MODES, compiled_step_for, forget
from helpers.serving.model_runner import SequenceChunk, forward_step
from helpers.serving.paged_cache import PagedKVCache
from helpers.serving.step_profile import scattered_decode_batch

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def model():
    return load_model("target")[0]


@pytest.fixture(scope="module", params=MODES)
def model_and_step(model, request):
    step = compiled_step_for(model, request.param)
    step.warmup(16)
    assert step.error is None, f"the compiled step did not compile: {step.error!r}"
    return model, step


@pytest.mark.parametrize("batch,context", [(2, 1), (5, 37), (32, 300)])
def test_compiled_step_equals_eager_step(model_and_step, batch, context):
    model, step = model_and_step
    cache, chunks = scattered_decode_batch(model, batch, context, seed=batch)
    for i, c in enumerate(chunks):
        c.seq_id = f"s{i}"
    before_k = cache.k.clone()
    eager = forward_step(model, cache, chunks, "in_place")  # (B, V)
    eager_k = cache.k.clone()
    cache.k.copy_(before_k)
    cache.lengths.clear()
    calls = step.calls
    compiled = step(cache, chunks)  # (B, V)
    assert step.calls == calls + 1
    assert compiled.shape == eager.shape
    assert (compiled - eager).abs().max().item() < 1e-3
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert cache.lengths == {f"s{i}": context + 1 for i in range(batch)}
    written = torch.zeros(cache.k.shape[1], dtype=torch.bool)
    for c in chunks:
        p = c.start_pos
        written[c.block_table[p // 16] * 16 + p % 16] = True
    assert torch.equal(cache.k[:, ~written], before_k[:, ~written]), "the compiled step wrote a slot not its own"
    assert (cache.k[:, written] - eager_k[:, written]).abs().max().item() < 1e-3
    assert not torch.equal(cache.k[:, written], before_k[:, written]), "the new keys were not written"


def test_which_steps_run_compiled(model_and_step):
    step = model_and_step[1]
    decode = [SequenceChunk([1], 4, [0], True), SequenceChunk([2], 7, [1], True)]
    assert step.applies(decode, "in_place", None)
    assert not step.applies(decode[:1], "in_place", None)  # a batch of one runs eagerly
    assert not step.applies(decode, "gather", None)
    assert not step.applies(decode, "in_place", (4, 32))  # the batch-invariant mode's row tiles
    assert step.applies([decode[0], SequenceChunk([3, 4], 0, [2], True)], "in_place", None)  # a prefill chunk
    assert step.applies([decode[0], SequenceChunk([5], 0, [2], False)], "in_place", None)  # a prompt piece
    assert step.applies([SequenceChunk([3, 4], 0, [2], False)], "in_place", None)  # one chunk of two rows


def test_a_step_with_prompt_chunks_equals_the_eager_step(model_and_step):
    """Whole prompts, a later chunk of a prompt (its first part already cached), a piece that samples
    nothing, and decoding requests, in one step: each prompt row attends to its own request's keys up to
    its own position, reading its blocks in place."""
    model, step = model_and_step
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache.for_model(model, 32, 16)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    free = iter(torch.randperm(32, generator=g).tolist())  # blocks scattered over the pool
    decode = [SequenceChunk([7 + i], 40, [next(free) for _ in range(3)], True) for i in range(3)]  # 40 cached keys
    vocab = model.cfg.vocab_size

    def chunk(start, T, want, cached=0):
        table = [next(free) for _ in range(-(-(start + T) // 16))]
        if cached:  # positions 0 .. start-1 already in the pool (as a prefix cache or an earlier chunk leaves them)
            prefix = torch.randint(0, vocab, (1, start), generator=g)
            pieces = [SequenceChunk(prefix[0].tolist(), 0, table, False)]
            forward_step(model, cache, pieces, "in_place")
        ids = torch.randint(0, vocab, (T,), generator=g).tolist()
        return SequenceChunk(ids, start, table, want)

    chunks = [decode[0], chunk(0, 23, True), decode[1], chunk(19, 9, True, cached=True), chunk(0, 5, False)]
    chunks += [decode[2]]
    for i, c in enumerate(chunks):
        c.seq_id = f"s{i}"
    before_k, before_v = cache.k.clone(), cache.v.clone()
    eager = forward_step(model, cache, chunks, "in_place")  # (5, V): every chunk but the piece samples
    eager_k, eager_v = cache.k.clone(), cache.v.clone()
    cache.k.copy_(before_k)
    cache.v.copy_(before_v)
    cache.lengths.clear()
    compiled = step(cache, chunks)
    assert compiled.shape == eager.shape == (5, vocab)
    assert (compiled - eager).abs().max().item() < 1e-3
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert (cache.k - eager_k).abs().max().item() < 1e-3 and (cache.v - eager_v).abs().max().item() < 1e-3
    assert cache.lengths == {f"s{i}": c.start_pos + len(c.token_ids) for i, c in enumerate(chunks)}


def test_forget_recompiles_with_the_new_weights(model):
    step = compiled_step_for(model)
    step.warmup(16)
    assert compiled_step_for(model) is step  # one per model and mode: every engine on it shares the graph
    cache, chunks = scattered_decode_batch(model, 3, 20)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            model.head.weight.mul_(2.0)  # the graph holds the old weights: forget it, compile afresh
        forget(model)
        fresh = compiled_step_for(model)
        assert fresh is not step and fresh.mode == step.mode
        k0 = cache.k.clone()
        eager = forward_step(model, cache, chunks, "in_place")
        cache.k.copy_(k0)
        assert (fresh(cache, chunks) - eager).abs().max().item() < 2e-3  # logits twice as large: twice the bound
    finally:
        model.load_state_dict(saved)
        forget(model)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_engine_names_a_bad_compile_step(model, bad):
    with pytest.raises(ValueError, match="compile_step"):
        Engine(model, num_blocks=8, compile_step=bad)


def test_greedy_outputs_of_the_graph(model_and_step):
    """step(..., greedy=True) also returns each sampled row's argmax and whether its logits are finite,
    computed in the graph: the same as reading them from the logits; a row whose cached keys are NaN is
    flagged (the engine then fails that request alone) and its neighbours are not."""
    model, step = model_and_step
    cache, chunks = scattered_decode_batch(model, 4, 20, seed=7)
    first = chunks[0].block_table[0] * 16
    cache.k[:, first : first + 16] = float("nan")  # request 0's first block: its attention, then logits, NaN
    logits, argmax, finite = step(cache, chunks, greedy=True)
    assert finite == [False, True, True, True]
    assert argmax[1:] == logits[1:].argmax(dim=-1).tolist()
    assert torch.isnan(logits[0]).all() and torch.isfinite(logits[1:]).all()
