"""The rolling KV cache against the naive path: the model without a cache and a banded mask (attn_window)."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.generate import generate, generate_sliding_window
from helpers.kv_cache import KVCache
from helpers.model import ModelConfig
from helpers.sliding_window import RollingKVCache, SinkKVCache

CONFIGS = {
    name: ModelConfig.from_preset("tiny", n_kv_heads=h, max_seq_len=256)
    for name, h in [("mha", 4), ("gqa", 2), ("mqa", 1)]
}
TOL = 1e-5  # fp32: the same math as the masked full-sequence pass, in a different order


def ids(n, seed=0, vocab=256):
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("window", [1, 7, 16])
def test_token_by_token_matches_the_windowed_mask(name, window):
    model = random_model(CONFIGS[name], seed=1)
    seq = ids(70)
    with torch.no_grad():
        reference = model(seq, attn_window=window)  # (1, 70, V): banded mask, no cache
        cache = RollingKVCache.for_model(model, window)
        steps = [model(seq[:, t : t + 1], cache=cache, attn_window=window)[:, -1] for t in range(70)]
    assert cache.length == 70
    assert torch.allclose(torch.stack(steps, 1), reference, atol=TOL, rtol=0)


@pytest.mark.parametrize("chunks", [[40, 7, 7, 16], [5, 30, 1, 1, 33], [70]])
def test_chunks_longer_and_shorter_than_the_window_match(chunks):
    model, window = random_model(CONFIGS["gqa"], seed=2), 16
    seq = ids(sum(chunks), seed=1)
    with torch.no_grad():
        reference = model(seq, attn_window=window)
        cache, outs, pos = RollingKVCache.for_model(model, window), [], 0
        for n in chunks:
            outs.append(model(seq[:, pos : pos + n], cache=cache, attn_window=window))
            pos += n
    assert torch.allclose(torch.cat(outs, 1), reference, atol=TOL, rtol=0)


def test_ring_holds_the_last_window_positions():
    model, window = random_model(CONFIGS["gqa"], seed=3), 16
    seq = ids(53, seed=2)
    full, ring = KVCache.for_model(model), RollingKVCache.for_model(model, window)
    with torch.no_grad():
        model(seq, cache=full, attn_window=window)  # the same windowed attention, every position kept
        model(seq[:, :20], cache=ring, attn_window=window)
        for t in range(20, 53):
            model(seq[:, t : t + 1], cache=ring, attn_window=window)
    for p in range(53 - window, 53):
        assert torch.allclose(ring.k[:, :, :, p % window], full.k[:, :, :, p], atol=TOL, rtol=0)
        assert torch.allclose(ring.v[:, :, :, p % window], full.v[:, :, :, p], atol=TOL, rtol=0)


def test_memory_is_fixed_by_the_window():
    cfg = CONFIGS["gqa"]
    model = random_model(cfg, seed=4)
    cache = RollingKVCache.for_model(model, 32, batch_size=3)
    expected = 2 * cfg.n_layers * 3 * cfg.n_kv_heads * 32 * cfg.head_dim * 4
    assert cache.nbytes == expected
    with torch.no_grad():
        model(ids(3 * 100).view(3, 100), cache=cache, attn_window=32)
    assert cache.nbytes == expected and cache.length == 100


def test_generate_matches_the_naive_windowed_loop():
    model, window = random_model(CONFIGS["gqa"], seed=5), 12
    prompt = ids(20, seed=3)
    out = generate_sliding_window(model, prompt, 40, window=window)
    seq = prompt
    with torch.no_grad():
        for _ in range(40):
            nxt = model(seq, attn_window=window)[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_a_window_as_long_as_the_sequence_is_ordinary_generation():
    model = random_model(CONFIGS["mqa"], seed=6)
    prompt = ids(10, seed=4)
    assert torch.equal(generate_sliding_window(model, prompt, 50, window=60), generate(model, prompt, 50))


def test_the_cache_supplies_its_window_and_refuses_another():
    model, window = random_model(CONFIGS["gqa"], seed=9), 8
    seq = ids(30, seed=5)
    with torch.no_grad():
        reference = model(seq, attn_window=window)  # (1, 30, V)
        cache = RollingKVCache.for_model(model, window)
        out = torch.cat(
            [model(seq[:, :20], cache=cache), model(seq[:, 20:21], cache=cache), model(seq[:, 21:], cache=cache)], 1
        )  # no attn_window: the cache's
        assert torch.allclose(out, reference, atol=TOL, rtol=0)
        # a longer window would need keys the ring dropped; a shorter one would mask a decode step's keys as
        # if they were in position order, which ring slots are not: both would be silently wrong
        for other in (window - 1, window + 1, 1024):
            with pytest.raises(ValueError, match="keeps the last 8 positions: attn_window must be 8"):
                model(seq[:, :1], cache=cache, attn_window=other)
    assert cache.length == 30  # the refused calls wrote nothing


def test_sliding_window_generation_is_generates_loop():
    """Stop conditions, logits processors and seeded sampling come from generate() itself."""
    model, window = random_model(CONFIGS["mha"], seed=10), 12
    prompt = ids(16, seed=6)
    gen = dict(temperature=1.0, generator=torch.Generator().manual_seed(3))
    sampled = generate_sliding_window(model, prompt, 30, window=window, **gen)
    seq, g = prompt, torch.Generator().manual_seed(3)
    with torch.no_grad():  # the naive path: the whole sequence every step, banded mask, the same draws
        for _ in range(30):
            probs = torch.softmax(model(seq, attn_window=window)[:, -1], -1)
            seq = torch.cat([seq, torch.multinomial(probs, 1, generator=g)], 1)
    assert torch.equal(sampled, seq)
    eos = int(sampled[0, 16 + 5])  # stop at the sixth sampled token (the earliest occurrence, if it repeats)
    stopped = generate_sliding_window(
        model, prompt, 30, window=window, eos_id=eos, **{**gen, "generator": torch.Generator().manual_seed(3)}
    )
    first = 16 + sampled[0, 16:].tolist().index(eos)
    assert torch.equal(stopped, sampled[:, : first + 1])

    def ban_sampled(ids_, logits):
        return logits.index_fill(-1, sampled[0, 16:], -1e9)

    banned = generate_sliding_window(model, prompt, 10, window=window, logits_processors=[ban_sampled])
    assert not set(banned[0, 16:].tolist()) & set(sampled[0, 16:].tolist())


@pytest.mark.parametrize("bad", [0, -3, 257, 2.0, True])
def test_bad_window(bad):
    model = random_model(CONFIGS["gqa"], seed=7)
    with pytest.raises(ValueError, match=r"window must be an int in \[1, 256\]"):
        RollingKVCache.for_model(model, bad)


def test_rolling_cache_only_appends():
    model = random_model(CONFIGS["gqa"], seed=8)
    cache = RollingKVCache.for_model(model, 8)
    with torch.no_grad():
        model(ids(10), cache=cache, attn_window=8)
        with pytest.raises(ValueError, match="only appends: start_pos must be 10"):
            model(ids(1), cache=cache, start_pos=4, attn_window=8)


# --- SinkKVCache: attention sinks plus a rolling window, positions counted inside the cache (StreamingLLM)


def test_sink_cache_without_sinks_is_the_banded_mask():
    # n_sink=0: every query sees the last `window` tokens at their true distances, as the banded mask does
    model, window = random_model(CONFIGS["gqa"], seed=9), 16
    seq = ids(70, seed=5)
    with torch.no_grad():
        reference = model(seq, attn_window=window)  # (1, 70, V)
        cache = SinkKVCache.for_model(model, n_sink=0, window=window)
        outs = [model(seq[:, :10], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(10, 70)]
    assert cache.seen == 70 and cache.length == window - 1
    assert torch.allclose(torch.cat(outs, 1), reference, atol=TOL, rtol=0)


def test_sink_cache_before_it_is_full_is_ordinary_attention():
    model = random_model(CONFIGS["mha"], seed=10)
    seq = ids(24, seed=6)
    with torch.no_grad():
        reference = model(seq)
        cache = SinkKVCache.for_model(model, n_sink=4, window=20)  # holds exactly 24 positions
        outs = [model(seq[:, :5], cache=cache), model(seq[:, 5:17], cache=cache)]
        outs += [model(seq[:, t : t + 1], cache=cache) for t in range(17, 24)]
    assert torch.allclose(torch.cat(outs, 1), reference, atol=TOL, rtol=0)


def test_one_layer_sink_cache_sees_the_sinks_then_the_window_at_cache_positions():
    # with one layer a token's key and value depend only on the token and its position, so the sink
    # cache at step t must equal a plain pass over [first n_sink tokens] + [last window tokens]
    cfg = ModelConfig.from_preset("tiny", n_layers=1, max_seq_len=64)
    model, n_sink, window = random_model(cfg, seed=11), 3, 9
    seq = ids(150, seed=7)  # more than twice the context window of 64
    cache = SinkKVCache.for_model(model, n_sink=n_sink, window=window)
    with torch.no_grad():
        for t in range(150):
            got = model(seq[:, t : t + 1], cache=cache)[:, -1]
            if t >= n_sink + window:
                kept = torch.cat([seq[:, :n_sink], seq[:, t - window + 1 : t + 1]], dim=1)  # (1, n_sink + window)
                assert torch.allclose(got, model(kept)[:, -1], atol=TOL, rtol=0), t
    assert cache.seen == 150 and cache.length == n_sink + window - 1


def test_sink_cache_runs_past_the_context_window_in_fixed_memory():
    model = random_model(CONFIGS["mqa"], seed=12)  # max_seq_len 256
    cache = SinkKVCache.for_model(model, n_sink=4, window=28, batch_size=2)
    cfg = model.cfg
    assert cache.nbytes == 2 * cfg.n_layers * 2 * cfg.n_kv_heads * 32 * cfg.head_dim * 4
    seq = ids(2 * 300).view(2, 300)
    with torch.no_grad():
        model(seq[:, :32], cache=cache)
        for t in range(32, 300):
            out = model(seq[:, t : t + 1], cache=cache)
    assert cache.seen == 300 and torch.isfinite(out).all()
    assert "n_sink=4, window=28" in repr(cache)


def test_sink_cache_bad_arguments():
    model = random_model(CONFIGS["gqa"], seed=13)
    for kwargs, message in [
        (dict(n_sink=-1, window=8), "n_sink must be an int >= 0"),
        (dict(n_sink=1.0, window=8), "n_sink must be an int >= 0"),
        (dict(n_sink=2, window=0), "window must be an int >= 1"),
        (dict(n_sink=4, window=253), r"n_sink \+ window must be at most 256"),
    ]:
        with pytest.raises(ValueError, match=message):
            SinkKVCache.for_model(model, **kwargs)
    cache = SinkKVCache.for_model(model, n_sink=2, window=6)
    with torch.no_grad():
        with pytest.raises(ValueError, match="does not fit the 8 free places"):
            model(ids(9), cache=cache)
        model(ids(8), cache=cache)
        with pytest.raises(ValueError, match="one token at a time once it is full"):
            model(ids(2), cache=cache)
        with pytest.raises(ValueError, match="only appends"):
            model(ids(1), cache=cache, start_pos=3)
    cache.reset()
    assert cache.seen == 0 and cache.length == 0
