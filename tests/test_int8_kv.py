"""The int8 KV cache against the float cache: codes within half a step, logits close, bytes as counted."""

from __future__ import annotations

import pytest
import torch
from conftest import random_model

from helpers.generate import generate
from helpers.int8_kv import QMAX, Int8KVCache, dequantize, quantize_per_token
from helpers.kv_cache import KVCache
from helpers.model import ModelConfig

CFG = ModelConfig.from_preset("tiny", max_seq_len=128)


def test_rounding_error_is_at_most_half_a_step_per_vector():
    x = torch.randn(3, 2, 50, 16, generator=torch.Generator().manual_seed(0)) * 5  # (B, Hkv, T, D)
    codes, scale = quantize_per_token(x)
    assert codes.dtype == torch.int8 and scale.shape == (3, 2, 50, 1) and scale.dtype == torch.float16
    assert codes.abs().max() <= QMAX
    err = (dequantize(codes, scale) - x).abs()
    assert (err <= scale.float() / 2 + 1e-6).all()  # round to nearest: half a step at most
    assert torch.equal(quantize_per_token(torch.zeros(4, 8))[0], torch.zeros(4, 8, dtype=torch.int8))


def test_int8_cache_logits_are_close_to_the_float_cache():
    model = random_model(CFG, seed=0)
    seq = torch.randint(0, CFG.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(seq, cache=KVCache.for_model(model, 2))
        cache = Int8KVCache.for_model(model, 2)
        got = torch.cat(
            [model(seq[:, :30], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(30, 40)], dim=1
        )
    diff = (got - ref).abs().max().item()
    assert 0 < diff < 0.05 * ref.abs().max().item()  # not exact (it is quantized), but close
    assert cache.length == 40


def test_greedy_tokens_mostly_survive():
    model = random_model(CFG, seed=2)
    prompt = torch.randint(0, CFG.vocab_size, (1, 10), generator=torch.Generator().manual_seed(3))
    ref = generate(model, prompt, 20)
    cache = Int8KVCache.for_model(model)
    with torch.no_grad():
        logits = model(ref[:, :-1], cache=cache)  # teacher-forced over the float model's own tokens
    agree = (logits[0, 9:].argmax(-1) == ref[0, 10:]).float().mean().item()
    assert agree >= 0.8


def test_bytes():
    model = random_model(CFG, seed=4)
    cache = Int8KVCache.for_model(model, batch_size=3, max_seq_len=64)
    L, Hkv, D = CFG.n_layers, CFG.n_kv_heads, CFG.head_dim
    assert cache.bytes_per_token() == 2 * L * 3 * Hkv * (D + 2)
    assert cache.nbytes == 64 * cache.bytes_per_token()
    float_cache = KVCache.for_model(model, batch_size=3, max_seq_len=64)
    assert float_cache.bytes_per_token() / cache.bytes_per_token() == 4 * D / (D + 2)


def test_truncate_and_bad_arguments():
    model = random_model(CFG, seed=5)
    cache = Int8KVCache.for_model(model)
    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), cache=cache)
    cache.truncate(2)
    assert cache.length == 2
    with pytest.raises(ValueError, match=r"length must be in \[0, 2\]"):
        cache.truncate(3)
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 128\]"):
        Int8KVCache.for_model(model, max_seq_len=129)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        Int8KVCache.for_model(model, batch_size=0)
    with pytest.raises(ValueError, match="cache was built for another model"):
        random_model(ModelConfig.from_preset("tiny", max_seq_len=128, n_kv_heads=1))(
            torch.zeros(1, 2, dtype=torch.long), cache=cache
        )
