"""Paged decode attention (helpers/serving/paged_attention.py) against the gather path and SDPA.

Three implementations of one request's decode attention over a paged pool must agree: the C kernel that
reads blocks where they lie, the torch loop that does the same with views (`attention_by_blocks`), and the
reference: gather the request's keys and values into a dense tensor, then F.scaled_dot_product_attention.
They sum in different orders (block by block with an online softmax against SDPA's own tiling), so they
agree to float32 rounding of sums of a few hundred terms: measured here below 2e-6 on outputs of size ~1;
the tolerance is 5e-5.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from helpers import load_model
from helpers.serving import Engine
from helpers.serving.model_runner import SequenceChunk, default_decode_attention, forward_step
from helpers.serving.paged_attention import attention_by_blocks, kernel_available, paged_decode_attention
from helpers.serving.paged_cache import PagedKVCache

TOL = 5e-5


def random_pool(H, Hkv, D, bs, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lengths]
    num_blocks = sum(need) + 3
    k = torch.randn(num_blocks * bs, Hkv, D, generator=g)  # (slots, Hkv, D)
    v = torch.randn(num_blocks * bs, Hkv, D, generator=g)
    blocks = list(range(num_blocks))
    random.Random(seed).shuffle(blocks)  # scattered, out of order: the point of a block table
    tables, i = [], 0
    for n in need:
        tables.append(blocks[i : i + n])
        i += n
    q = torch.randn(len(lengths), H, D, generator=g)
    return q, k, v, tables


def reference(q, k, v, table, length, bs):
    """Gather one request's keys/values into a dense copy, then SDPA: the path the kernel replaces."""
    slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(length)])
    kd, vd = k[slots].transpose(0, 1)[None], v[slots].transpose(0, 1)[None]  # (1, Hkv, S, D)
    H, Hkv = q.shape[0], k.shape[1]
    return F.scaled_dot_product_attention(q[None, :, None], kd, vd, enable_gqa=H != Hkv)[0, :, 0]  # (H, D)


SHAPES = [(8, 2, 32, 16), (8, 2, 32, 4), (4, 4, 16, 1), (6, 1, 8, 8), (8, 8, 64, 16)]  # (H, Hkv, D, block_size)


@pytest.mark.parametrize("H,Hkv,D,bs", SHAPES)
def test_kernel_and_block_loop_equal_the_gather_path(H, Hkv, D, bs):
    lengths = [1, bs, bs + 1, 3 * bs - 1, 137]  # one key, a full block, one past it, a part-full last block
    q, k, v, tables = random_pool(H, Hkv, D, bs, lengths)
    refs = torch.stack([reference(q[i], k, v, t, n, bs) for i, (t, n) in enumerate(zip(tables, lengths))])
    by_blocks = torch.stack(
        [attention_by_blocks(q[i], k, v, t, n, bs) for i, (t, n) in enumerate(zip(tables, lengths))]
    )
    assert (by_blocks - refs).abs().max() < TOL
    assert kernel_available(D, Hkv, H // Hkv, bs), "no C compiler: CI has one"
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    out = paged_decode_attention(q, k, v, padded, torch.tensor(lengths), bs)
    assert out.shape == (len(lengths), H, D)
    assert (out - refs).abs().max() < TOL


def test_nothing_past_a_length_changes_the_output():
    """NaN in every slot nobody attends to leaves the output bit for bit the same. (The kernel may load the
    rest of a part-full last block, its 16 scores summed together, but never uses what lies past a length.)"""
    H, Hkv, D, bs = 8, 2, 32, 16
    lengths = [5, 20, 33]
    q, k, v, tables = random_pool(H, Hkv, D, bs, lengths, seed=1)
    clean = paged_decode_attention(
        q, k, v, torch.tensor([t + [0] * (3 - len(t)) for t in tables]), torch.tensor(lengths), bs
    )
    used = {t[p // bs] * bs + p % bs for t, n in zip(tables, lengths) for p in range(n)}
    unused = torch.tensor([s for s in range(k.shape[0]) if s not in used])
    k[unused], v[unused] = float("nan"), float("nan")  # every slot nobody attends to, padding block included
    dirty = paged_decode_attention(
        q, k, v, torch.tensor([t + [0] * (3 - len(t)) for t in tables]), torch.tensor(lengths), bs
    )
    assert torch.equal(clean, dirty)


def test_kernel_names_what_is_wrong():
    q, k, v, tables = random_pool(8, 2, 32, 16, [4])
    t, n = torch.tensor(tables), torch.tensor([4])
    with pytest.raises(ValueError, match="q must be a contiguous float32"):
        paged_decode_attention(q.double(), k, v, t, n, 16)
    with pytest.raises(ValueError, match="does not fit a pool"):
        paged_decode_attention(q[:, :, :16].contiguous(), k, v, t, n, 16)
    with pytest.raises(ValueError, match="tables must be"):
        paged_decode_attention(q, k, v, t, torch.tensor([4, 4]), 16)


@pytest.fixture(scope="module")
def model_and_tok():
    return load_model("target")


@pytest.fixture(scope="module")
def model(model_and_tok):
    return model_and_tok[0]


def test_in_place_step_equals_gather_step(model):
    """A whole model step, both attention paths, 12 decoding requests and 2 prefill chunks in one pass."""
    bs = 16
    cache = PagedKVCache.for_model(model, 200, bs)
    g = torch.Generator().manual_seed(0)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    blocks = list(range(200))
    random.Random(2).shuffle(blocks)
    chunks, i = [], 0
    for j, n in enumerate([1, 15, 16, 17, 40, 64, 100, 130, 3, 250, 77, 31]):
        need = -(-(n + 1) // bs)
        chunks.append(SequenceChunk([j + 7], n, blocks[i : i + need], True))
        i += need
    chunks.insert(3, SequenceChunk(list(range(9, 29)), 0, blocks[i : i + 2], True))  # a whole 20-token prompt
    chunks.append(SequenceChunk(list(range(40, 50)), 30, blocks[i + 2 : i + 5], True))  # a later chunk
    gather = forward_step(model, cache, chunks, "gather")
    in_place = forward_step(model, cache, chunks, "in_place")
    assert gather.shape == in_place.shape == (len(chunks), model.cfg.vocab_size)
    assert (gather - in_place).abs().max() < 1e-3  # logits: rounding of the attention carried through 6 layers
    assert torch.equal(gather.argmax(-1), in_place.argmax(-1))


def test_engine_paths_give_the_same_tokens(model_and_tok):
    from helpers.data import validation_text

    model, tok = model_and_tok
    ids = tok.encode(validation_text()[:20_000])
    outs = {}
    for path in ("gather", "in_place"):
        e = Engine(model, num_blocks=128, block_size=16, max_num_seqs=6, decode_attention=path)
        rids = [e.submit(ids[300 * i : 300 * i + 20 + 13 * i], max_tokens=24) for i in range(8)]
        e.run()
        outs[path] = [e.get(r).output for r in rids]
    assert outs["gather"] == outs["in_place"]


def test_default_path_and_bad_names(model):
    assert default_decode_attention(model) == "in_place"  # a float32 CPU model, a compiler present
    assert default_decode_attention(model.to(torch.bfloat16)) == "gather"  # the kernel is float32 only
    model.to(torch.float32)
    with pytest.raises(ValueError, match="decode_attention"):
        Engine(model, num_blocks=8, decode_attention="flash")


def test_step_profile_counts_no_gather_and_sums_its_parts(model_and_tok):
    from helpers.data import validation_text
    from helpers.serving.step_profile import paged_step_seconds, step_breakdown

    model, tok = model_and_tok
    t = paged_step_seconds(model, batch=4, context=40, repeats=1)
    assert t["gather_calls"] == 0 and min(t["in_place"], t["gather"], t["dense"]) > 0
    parts = step_breakdown(model, tok.encode(validation_text()[:20_000]), batch=3, prompt_len=20, steps=3)
    assert set(parts) == {"schedule", "inputs", "attention", "matmuls_and_rest", "sample", "bookkeeping"}
    assert all(v >= 0 for v in parts.values()) and parts["matmuls_and_rest"] > 0


def test_the_paged_cache_owns_each_sequences_length(model_and_tok):
    """After every step the cache's length of each running request is what the scheduler counts as
    computed; preempted and finished requests are forgotten (a tight pool forces preemptions)."""
    from helpers.data import validation_text

    model, tok = model_and_tok
    ids = tok.encode(validation_text()[:20_000])
    e = Engine(model, num_blocks=24, block_size=4, max_num_seqs=8)
    for i in range(8):
        e.submit(ids[200 * i : 200 * i + 9 + 3 * i], max_tokens=16)
    while e.has_unfinished():
        e.step()
        for r in e.scheduler.running:
            assert e.cache.length(r.request_id) == r.num_computed
        assert all(e.cache.length(r.request_id) == 0 for r in e.scheduler.waiting)
    assert e.metrics()["preemptions"] > 0 and e.cache.lengths == {}
    with pytest.raises(ValueError, match="end must be"):
        e.cache.commit("x", -1)
