"""The serving step runs the model's own forward (model.py) with a step view of the paged pool as its cache.

Checked here: a mixed step (a prompt chunk and a decoding request) through the view gives the logits of the
model's dense forward over each sequence alone, to float32 rounding (the prefill is one SDPA over the same keys;
the decode goes through the C kernel or the gather path, summing in another order: below 1e-5 measured, 1e-4
allowed); the batch-invariant mode's tiles reach every row-wise module of every block through the view's
`rowwise` hook; and the pool records each sequence's length only when the view commits it.
"""

from __future__ import annotations

import pytest
import torch

from helpers import load_model
from helpers.kv_cache import KVCache
from helpers.serving.model_runner import SequenceChunk, forward_step
from helpers.serving.paged_cache import PagedKVCache
from helpers.serving.step_view import PagedStepView

TOL = 1e-4


@pytest.fixture(scope="module")
def model():
    return load_model("target", device="cpu")[0]


def dense_logits(model, ids):
    """Logits of the last position of `ids` run alone through the dense forward: (V,)."""
    with torch.no_grad():
        return model(torch.tensor([ids]), KVCache.for_model(model, max_seq_len=len(ids)))[0, -1]


@pytest.mark.parametrize("decode_attention", ["in_place", "gather"])
def test_mixed_step_through_the_view_equals_the_dense_forward(model, decode_attention):
    if decode_attention == "in_place":
        from helpers.serving.model_runner import default_decode_attention

        if default_decode_attention(model) != "in_place":
            pytest.skip("the C kernel does not build here (no C compiler)")
    cache = PagedKVCache.for_model(model, num_blocks=8, block_size=4)
    a, b = [5, 9, 13, 2, 7, 11], [3, 8, 1, 4, 6]
    # b's first four tokens are cached by one step, then one step holds a's prompt and b's decode
    forward_step(model, cache, [SequenceChunk(b[:4], 0, [6, 1], False, "b")], decode_attention)
    assert cache.length("b") == 4
    step = [SequenceChunk(a, 0, [3, 0], True, "a"), SequenceChunk(b[4:], 4, [6, 1], True, "b")]
    logits = forward_step(model, cache, step, decode_attention)  # (2, V)
    assert (cache.length("a"), cache.length("b")) == (6, 5)
    for row, ids in zip(logits, (a, b)):
        assert (row - dense_logits(model, ids)).abs().max() < TOL


def test_the_invariant_mode_tiles_every_row_wise_module(model):
    cache = PagedKVCache.for_model(model, num_blocks=4, block_size=4)
    view = PagedStepView(cache, [SequenceChunk([5, 9, 13], 0, [2], True, "a")], "gather", row_widths=(2, 2))
    seen = []
    tile = view.rowwise
    view.rowwise = lambda module, x: seen.append(module) or tile(module, x)
    with torch.no_grad():
        x = model.hidden(view.tokens, view, check=False)  # (1, 3, C): 3 rows, tiles of 2 (one zero-padded)
    per_block = lambda blk: [blk.attn_norm, blk.attn.wqkv, blk.attn.wo, blk.mlp_norm, blk.mlp]  # noqa: E731
    assert sorted(map(id, seen)) == sorted(id(m) for blk in model.layers for m in per_block(blk))
    assert cache.length("a") == 0  # the forward wrote the slots; only commit records the length
    view.commit()
    assert cache.length("a") == 3
    plain = PagedStepView(cache, [SequenceChunk([5, 9, 13], 0, [2], True, "a")], "gather")  # no tiles
    with torch.no_grad():
        assert (model.hidden(plain.tokens, plain, check=False) - x).abs().max() < TOL
